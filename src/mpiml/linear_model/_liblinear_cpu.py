"""The compiled epoch of LIBLINEAR's dual coordinate descent for logistic regression (host, CSR rows).

See :mod:`._liblinear` for the algorithm (Yu, Huang and Lin 2011, Algorithm 5) and how the
epochs are driven; this module holds the one loop that must be compiled: a visit of every
row in the given order, each a short safeguarded Newton solve of its one-variable
subproblem followed by the update of ``w``.  Sequential by nature (each visit reads the
``w`` the previous one wrote), so it runs on one thread.
"""

import numpy as np

from ..utils._jit import numba

__all__ = ["dual_epoch"]

nb = numba()


@nb.njit(cache=True)
def dual_epoch(indptr, indices, data, bias, y, C, xtx, alpha, w, order, inner_tol):  # pragma: no cover - compiled
    """One epoch over the rows in ``order``; updates ``alpha`` (pairs ``α_i, C_i - α_i``) and ``w``
    in place and returns ``(largest |subproblem gradient| at the visits, Newton steps taken)``.

    ``bias > 0``: the last entry of ``w`` weighs a constant feature of that value.
    """
    d = w.shape[0] - (1 if bias > 0 else 0)
    gmax = 0.0
    newton_steps = 0
    for s in range(order.shape[0]):
        i = order[s]
        Ci = C[i]
        ywx = 0.0
        for p in range(indptr[i], indptr[i + 1]):
            ywx += w[indices[p]] * data[p]
        if bias > 0:
            ywx += w[d] * bias
        ywx *= y[i]
        a = xtx[i]
        # minimise over alpha_i, or over C_i - alpha_i when the minimiser lies on that side
        i1, i2, sign = 2 * i, 2 * i + 1, 1.0
        if 0.5 * a * (alpha[i2] - alpha[i1]) + ywx < 0:
            i1, i2, sign = 2 * i + 1, 2 * i, -1.0
        old = alpha[i1]
        z = old
        if Ci - z < 0.5 * Ci:
            z = 0.1 * z
        gp = a * (z - old) + sign * ywx + np.log(z / (Ci - z))
        gmax = max(gmax, abs(gp))
        inner = 0
        while inner <= 100:
            if abs(gp) < inner_tol:
                break
            gpp = a + Ci / (Ci - z) / z
            trial = z - gp / gpp
            z = z * 0.1 if trial <= 0 else trial  # (the log barrier keeps a positive trial below C_i)
            gp = a * (z - old) + sign * ywx + np.log(z / (Ci - z))
            newton_steps += 1
            inner += 1
        if inner > 0:
            alpha[i1] = z
            alpha[i2] = Ci - z
            step = sign * (z - old) * y[i]
            for p in range(indptr[i], indptr[i + 1]):
                w[indices[p]] += step * data[p]
            if bias > 0:
                w[d] += step * bias
    return gmax, newton_steps
