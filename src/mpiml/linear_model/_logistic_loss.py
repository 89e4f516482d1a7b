"""The distributed logistic objective and its solvers (L-BFGS, Newton-Cholesky, Newton-CG).

The objective is scikit-learn's: the weighted mean of the log loss over all
rows plus ``||W||² / (2 C Σw)``.  Every rank evaluates its rows' share of the
loss and gradient (and Hessian, or Hessian-vector products, for Newton) and
one packed allreduce sums them; the optimiser then runs identically on every
rank.  Shards may be dense or sparse (CSR): the row-wise work is ``X W`` and
``Xᵀ G``, and the Hessian of Newton-Cholesky comes from sparse products.

Keeping the ranks in lockstep
-----------------------------
An optimiser that runs on every rank must take the same decisions everywhere
(line-search steps, convergence tests, iteration counts), or the ranks stop
calling the same collectives and the job hangs.  Two things make sure of it:

1. every reduction is :func:`~mpiml.linear_model._base.allreduce_identical`
   (binomial reduce to rank 0, then broadcast), so every rank receives the
   same bits, and the optimisers (scipy's L-BFGS-B, the Newton loops below)
   are deterministic functions of those bits;
2. as a guard against what (1) cannot promise (different library builds or
   thread counts on different ranks), each packed reduction carries a 12-bit
   fingerprint ``f`` of the coefficients this rank evaluated at, as ``f`` and
   ``f²``.  The sums are exact integers, and ``p Σf² = (Σf)²`` holds exactly
   when all ranks sent the same ``f``; otherwise every rank raises the same
   :class:`mpiml.CommError` at the same evaluation instead of drifting apart.
"""

import contextlib
import os
import warnings
import zlib

import numpy as np
import scipy.linalg
import scipy.optimize
from sklearn.exceptions import ConvergenceWarning

from .._array import get_namespace, is_device_array
from .._errors import CommError
from ..utils._linalg import column_sums, is_sparse, sparse_gram, to_csr
from ._base import allreduce_identical, allreduce_identical_device, as_like, chunk_rows, pinned_buffer

__all__ = ["Objective", "EarlyPass", "lbfgs", "newton_cholesky", "newton_cg", "centre_multinomial", "expit",
           "softmax_stats"]


#: Dense binary host rows of at least this many values ``n d`` are evaluated by the compiled pass (below, the
#: NumPy path is as quick, and a process that fits only small shards, as most tests do, never loads Numba).
_HOST_PASS_MIN_VALUES = 1 << 16


def _fingerprint(*arrays):
    if len(arrays) == 1:   # (one vector, an optimiser's point: its bytes without the join)
        return float(zlib.crc32(np.ascontiguousarray(arrays[0], dtype=np.float64).tobytes()) & 0xFFF)
    data = b"".join(np.ascontiguousarray(a, dtype=np.float64).tobytes() for a in arrays)
    return float(zlib.crc32(data) & 0xFFF)


def softmax_stats(raw, xp):
    """``(log-sum-exp per row, probabilities)`` of a raw prediction matrix, overflow-safe."""
    m = raw.max(axis=1, keepdims=True)
    e = xp.exp(raw - m)
    s = e.sum(axis=1, keepdims=True)
    return (m + xp.log(s))[:, 0], e / s


def expit(raw, xp):
    return xp.exp(-xp.logaddexp(0.0, -raw))


def softplus_and_expit(raw, xp):
    """``(log(1 + exp(m)), 1 / (1 + exp(-m)))`` of the margins ``m``, overflow-safe, from one ``exp(-|m|)``.

    Two transcendental passes over the rows (``exp``, ``log1p``) instead of five (two ``logaddexp``
    and an ``exp``): most of a host evaluation's elementwise time.
    """
    e = xp.exp(-xp.abs(raw))
    softplus = xp.maximum(raw, 0) + xp.log1p(e)
    e1 = e + 1
    return softplus, xp.where(raw >= 0, 1 / e1, e / e1)


def _fused_kernel_takes(X, layout=True):
    from ..kernels import linear as kernels

    return (kernels.supported(X) and (X.flags.c_contiguous or not layout)
            and X.shape[1] <= kernels.LOGISTIC_MAX_FEATURES)


class EarlyPass:
    """The first L-BFGS evaluation of a binary dense CuPy shard, launched before the ranks agree on the input.

    The optimiser starts at zero, and this rank's sums there need only ``X``, the 0/1 labels and the unit
    weights; for a rank whose labels are two values ``lo < hi``, ``y == hi`` are those labels once the
    ranks agree that the classes are ``[lo, hi]``.  So the kernel runs while they agree (a host round of
    the ranks) and while the fit sets up; :meth:`take` says whether the agreed input is what it read.
    Nothing is communicated: the reduction of these sums is the objective's first, on every rank alike.
    """

    def __init__(self, X, y, labels, fit_intercept):
        from ..kernels.linear import LogisticPass

        xp = get_namespace(X)
        self.X, self.y, self.labels = X, y, labels
        self.y01 = (y == labels[1]).astype(X.dtype)
        self.sw = xp.ones(X.shape[0], dtype=X.dtype)
        self.fi = int(bool(fit_intercept))
        self.pass_ = LogisticPass(X, self.y01, self.sw, fit_intercept=bool(fit_intercept))
        self.w0 = np.zeros(X.shape[1] + self.fi)
        self.local = self.pass_(np.zeros(X.shape[1]), 0.0, None, 0.0, _fingerprint(self.w0))

    @staticmethod
    def applies(X, labels, *, sample_weight, warm_coef):
        """Whether to launch it: a dense CuPy shard the kernel takes, two local labels, no weights, a zero start."""
        return (sample_weight is None and warm_coef is None and labels is not None and labels.size == 2
                and X.shape[0] > 0 and _fused_kernel_takes(X))

    def take(self, X, y, classes):
        """``(y01, LogisticPass)`` for :class:`Objective` when the validated input is what the kernel read and
        the agreed classes are its labels, else None."""
        if X is not self.X or y is not self.y or classes.size != 2:
            return None
        if not (classes[0] == self.labels[0] and classes[1] == self.labels[1]):
            return None
        return self.y01, self.pass_


class Objective:
    """The distributed logistic objective on validated shards.

    Parameters are laid out as ``W`` of shape ``(k, d + fit_intercept)``
    flattened in C order: one row for a binary problem (the positive class),
    one row per class for a multinomial one; the last column is the intercept,
    which multiplies a constant feature ``intercept_scaling`` (1 except for
    scikit-learn's ``"liblinear"`` objective, which also penalises it).
    """

    def __init__(self, X, y_idx, sw, *, n_classes, fit_intercept, l2, sw_sum, comm, xp, intercept_scaling=1.0,
                 penalise_intercept=False, prepared=None):
        self.X, self.y_idx, self.sw = X, y_idx, sw
        self.sparse = is_sparse(X)
        self.binary = n_classes == 2
        self.k = 1 if self.binary else n_classes
        self.n_classes = n_classes
        self.d = X.shape[1]
        self.fi = int(fit_intercept)
        self.scale = float(intercept_scaling)
        self.l2, self.sw_sum = l2, sw_sum
        self.comm, self.xp = comm, xp
        self.n_evals = 0
        self._kept = None  # (point, result) of an evaluation made ahead of the optimiser (see keep)
        self._kept_local = None  # (point, this rank's packed device sums) launched ahead (see keep_local)
        self._first_check = None  # called with the next evaluation's (loss, gradient) (see check_first)
        self._stash = None  # (fingerprint of w, local probabilities) for Hessian-vector products
        self._stream_synced = False   # the device stream waited for since the last fused launch (see _reduce)
        penalised = np.zeros((self.k, self.d + self.fi), dtype=bool)
        penalised[:, :self.d] = True
        if self.fi and penalise_intercept:
            penalised[:, self.d] = True
        self.penalised = penalised.ravel()
        if prepared is not None:   # (y01, LogisticPass) of a binary dense CuPy shard, made before validation ended
            self.y01 = prepared[0]
        elif self.binary:
            self.y01 = (y_idx == 1).astype(X.dtype)
        # dense binary CuPy shards: one kernel reads X once per evaluation (loss, gradient, or H v)
        self._fused = (self.binary and not self.sparse and xp is not np and X.shape[0] > 0
                       and _fused_kernel_takes(X))
        self._pass = self._host_out = None
        if self._fused:
            from ..kernels.linear import LogisticPass

            self._sw_x = xp.ascontiguousarray(sw.astype(X.dtype, copy=False))
            # the kernels, buffers and pinned staging of every evaluation, made once per fit
            self._pass = prepared[1] if prepared is not None else LogisticPass(
                X, self.y01, self._sw_x, fit_intercept=bool(self.fi), scale=self.scale)
        # dense binary host rows: one compiled read of X per evaluation of the loss and gradient (_cpu_kernels)
        self._host_pass = None
        if not self.sparse and xp is np and X.shape[0] * self.d >= _HOST_PASS_MIN_VALUES:
            from . import _cpu_kernels

            if self.binary:
                self._host_pass = _cpu_kernels.LogisticPass(X, self.y01, sw, fit_intercept=bool(self.fi),
                                                            scale=self.scale)
            else:
                self._host_pass = _cpu_kernels.MultinomialPass(X, y_idx, sw, n_classes, fit_intercept=bool(self.fi),
                                                               scale=self.scale)
        # every rank's reductions on the device (the same on every rank: whether X is a dense binary CuPy
        # shard the kernel takes is, its row count and layout are not); the fused ranks pack theirs there
        self._device_reduce = (comm.size > 1 and self.binary and not self.sparse and xp is not np
                               and _fused_kernel_takes(X, layout=False))

    @property
    def n_params(self):
        return self.k * (self.d + self.fi)

    def split(self, w):
        W = np.asarray(w, dtype=np.float64).reshape(self.k, self.d + self.fi)
        return W[:, :self.d], (W[:, self.d] * self.scale if self.fi else np.zeros(self.k))

    def raw(self, X, w):
        """Raw predictions ``X Wᵀ + b`` of shape (n,) (binary) or (n, n_classes)."""
        xp = self.xp
        coef, intercept = self.split(w)
        raw = X @ xp.asarray(coef.T.astype(X.dtype)) + xp.asarray(intercept.astype(X.dtype))
        return raw[:, 0] if self.binary else raw

    def _xt(self, G):
        """``Gᵀ X`` as host float64 of shape (k, d); ``G`` has one column per class (n, k)."""
        xp, X = self.xp, self.X
        if self.sparse:
            return as_like((X.T @ G.astype(X.dtype, copy=False)).astype(xp.float64, copy=False), np).T
        # in X's dtype (no float64 copy of a float32 shard per evaluation, as scikit-learn), float64 after
        return as_like((G.T.astype(X.dtype, copy=False) @ X).astype(xp.float64, copy=False), np)

    def _fused_local(self, w, v=None, fp=0.0):
        """``[Σ w·loss | gradient | fp, fp²]`` (or ``[H v | fp, fp²]`` when ``v`` is given) by one read of
        ``X`` on the device, packed there for the allreduce (a float64 CuPy vector)."""
        p = self._pass
        synced, self._stream_synced = self._stream_synced, False
        if v is None:   # (the binary point read in place: the coefficients, then the intercept's value)
            d = self.d
            p.launch(w[:d], float(w[d]) * self.scale if self.fi else 0.0, synced=synced)
        else:
            coef, intercept = self.split(w)
            vc, vb = self.split(v)
            p.launch(coef[0], float(intercept[0]), vc[0], float(vb[0]), synced=synced)
        return p.sums(fp)

    def _fused_evaluation(self, w):
        """``(_fused_local(w, fp=fp), fp)`` with ``fp`` the fingerprint of ``w``, computed once the kernel is
        launched (the device starts on the pass while the host hashes the point)."""
        p = self._pass
        synced, self._stream_synced = self._stream_synced, False
        d = self.d
        p.launch(w[:d], float(w[d]) * self.scale if self.fi else 0.0, synced=synced)
        fp = _fingerprint(w)
        return p.sums(fp), fp

    def _local(self, w, hessian, fp=0.0):
        """This rank's ``[Σ w·loss | gradient | (Hessian)]`` as host float64 (unscaled); on the fused path
        the same packed on the device with the fingerprint ``fp`` (see :meth:`_fused_local`)."""
        if self._fused and not hessian:
            return self._fused_local(w, fp=fp)
        if self._host_pass is not None and not hessian:
            coef, intercept = self.split(w)
            self._stash = (_fingerprint(w), None)   # (hessp makes the probabilities when it needs them)
            return self._host_pass(coef[0], intercept[0]) if self.binary else self._host_pass(coef, intercept)
        xp, X, sw = self.xp, self.X, self.sw
        n, D = X.shape[0], self.d + self.fi
        npar = self.n_params
        out = np.zeros(1 + npar + (npar * npar if hessian else 0))
        if n == 0:
            return out
        raw = self.raw(X, w)
        if self.binary:
            softplus, prob = softplus_and_expit(raw, xp)
            loss = softplus - self.y01 * raw
            G = (sw * (prob - self.y01))[:, None]
        else:
            lse, prob = softmax_stats(raw, xp)
            loss = lse - xp.take_along_axis(raw, self.y_idx[:, None], axis=1)[:, 0]
            G = prob.copy()
            G[xp.arange(n), self.y_idx] -= 1
            G *= sw[:, None]
        self._stash = (_fingerprint(w), prob)
        grad = np.zeros((self.k, D))
        if xp is np or self.sparse:
            # (copy=False: float64 rows are used as they are, not copied per evaluation)
            out[0] = float(sw.astype(xp.float64, copy=False) @ loss.astype(xp.float64, copy=False))
            grad[:, :self.d] = self._xt(G)
            if self.fi:
                grad[:, self.d] = self.scale * as_like(G.astype(xp.float64, copy=False).sum(axis=0), np)
        else:  # one transfer from the device: [loss | Gᵀ X | column sums of G]
            parts = [(sw.astype(xp.float64) @ loss.astype(xp.float64)).reshape(1),
                     (G.T.astype(X.dtype) @ X).astype(xp.float64).ravel(), G.astype(xp.float64).sum(axis=0)]
            host = as_like(xp.concatenate(parts), np)
            out[0] = host[0]
            grad[:, :self.d] = host[1:1 + self.k * self.d].reshape(self.k, self.d)
            if self.fi:
                grad[:, self.d] = self.scale * host[1 + self.k * self.d:]
        out[1:1 + npar] = grad.ravel()
        if hessian:
            out[1 + npar:] = self._local_hessian(prob).ravel()
        return out

    def _tilde_gram(self, block, h):
        """``Σ_rows h x̃ x̃ᵀ`` with ``x̃ = [x, scale]`` of a sparse row block (float64, host)."""
        xp, d = self.xp, self.d
        out = np.empty((d + self.fi, d + self.fi))
        out[:d, :d] = as_like(sparse_gram(block, h), np)
        if self.fi:
            c = as_like(column_sums(block, h), np) * self.scale
            out[:d, d] = out[d, :d] = c
            out[d, d] = float(h.sum()) * self.scale ** 2
        return out

    def _local_hessian(self, prob):
        """``Σ_rows w·x̃ x̃ᵀ ⊗ (diag(p) - p pᵀ)`` with ``x̃ = [x, scale]``, float64, chunked."""
        xp, X, sw = self.xp, self.X, self.sw
        D, k = self.d + self.fi, self.k
        if self.sparse:  # block (c, c') = Σ w (δ p_c - p_c p_c') x̃ x̃ᵀ by sparse products
            H = np.zeros((k * D, k * D))
            Xf = to_csr(X, np.float64)
            w = sw.astype(xp.float64)
            P = prob.astype(xp.float64)
            if self.binary:
                return self._tilde_gram(Xf, w * P * (1 - P))
            for c in range(k):
                for c2 in range(c, k):
                    h = w * ((P[:, c] if c == c2 else 0.0) - P[:, c] * P[:, c2])
                    block = self._tilde_gram(Xf, h)
                    H[c * D:(c + 1) * D, c2 * D:(c2 + 1) * D] = block
                    H[c2 * D:(c2 + 1) * D, c * D:(c + 1) * D] = block.T
            return H
        H = xp.zeros((k * D, k * D), dtype=xp.float64)
        step = max(1, chunk_rows(k * D, xp=xp) // max(1, k))
        for s in range(0, X.shape[0], step):
            Xa = X[s:s + step].astype(xp.float64)
            if self.fi:
                Xa = xp.concatenate([Xa, xp.full((Xa.shape[0], 1), self.scale, dtype=xp.float64)], axis=1)
            w = sw[s:s + step].astype(xp.float64)
            if self.binary:
                p = prob[s:s + step].astype(xp.float64)
                H += (Xa * (w * p * (1 - p))[:, None]).T @ Xa
                continue
            P = prob[s:s + step].astype(xp.float64)
            for c in range(k):  # block diagonal: Σ w p_c x̃ x̃ᵀ
                H[c * D:(c + 1) * D, c * D:(c + 1) * D] += (Xa * (w * P[:, c])[:, None]).T @ Xa
            B = ((w[:, None] * P)[:, :, None] * Xa[:, None, :]).reshape(Xa.shape[0], k * D)
            C = (P[:, :, None] * Xa[:, None, :]).reshape(Xa.shape[0], k * D)
            H -= B.T @ C
        return as_like(H, np)

    def _reduce(self, local, fp):
        if is_device_array(local):     # packed on the device with its fingerprint (the fused kernel)
            # (the pinned buffer itself: what the callers make of it are new arrays, before the next reduction)
            packed = allreduce_identical_device(self.comm, local, host=self._pinned(local.size), copy=False)
            self._stream_synced = True   # (the copy to the host waited for the stream: see LogisticPass.launch)
        elif self._device_reduce:      # a rank without rows (or a non-contiguous shard) among fused ones
            packed = allreduce_identical_device(self.comm, self.xp.asarray(np.concatenate([local, [fp, fp * fp]])))
            self._stream_synced = True
        else:
            packed = allreduce_identical(self.comm, np.concatenate([local, [fp, fp * fp]]))
        self.n_evals += 1
        s1, s2 = packed[-2], packed[-1]
        if self.comm.size * s2 != s1 * s1:
            raise CommError("LogisticRegression: the ranks evaluated the objective at different coefficients "
                            f"(evaluation {self.n_evals}); their optimisers diverged, which needs identical "
                            "numerical libraries on every rank")
        return packed[:-2]

    def _pinned(self, size):
        """A pinned host buffer of ``size`` float64 for the reduced result (made once per size and fit)."""
        if self._host_out is None:
            self._host_out = {}
        return pinned_buffer(self._host_out, size)

    def check_first(self, check):
        """Call ``check(loss, gradient)`` on the next evaluation's result (before the optimiser sees it)."""
        self._first_check = check

    def keep_local(self, w, local):
        """Have the next evaluation at ``w`` (without the Hessian) reduce ``local``: this rank's packed sums at
        ``w`` from this objective's kernel, launched ahead of the optimiser (the same bits it would compute)."""
        self._kept_local = (np.array(w, dtype=np.float64), local)

    def keep(self, w, result):
        """Have the next :meth:`evaluate` at ``w`` (without the Hessian) return ``result``, made ahead of it."""
        self._kept = (np.array(w, dtype=np.float64), result)

    def evaluate(self, w, hessian=False):
        """Global ``(loss, gradient[, Hessian])`` at ``w``: one packed allreduce, identical on every rank."""
        w = np.asarray(w, dtype=np.float64)
        if self._kept is not None:
            kept, self._kept = self._kept, None
            if not hessian and kept[0].shape == w.shape and np.array_equal(kept[0], w):
                return kept[1][0], kept[1][1].copy()
        local = None
        if self._kept_local is not None:
            kept, self._kept_local = self._kept_local, None
            if not hessian and kept[0].shape == w.shape and np.array_equal(kept[0], w):
                local = kept[1]
        if local is None and self._fused and not hessian:
            local, fp = self._fused_evaluation(w)
        else:
            fp = _fingerprint(w)
            if local is None:
                local = self._local(w, hessian, fp)
        packed = self._reduce(local, fp)
        npar = self.n_params
        reg = np.where(self.penalised, w, 0.0)
        loss = packed[0] / self.sw_sum + 0.5 * self.l2 * float(reg @ reg)
        grad = packed[1:1 + npar] / self.sw_sum + self.l2 * reg
        if self._first_check is not None:
            check, self._first_check = self._first_check, None
            check(loss, grad)
        if not hessian:
            return loss, grad
        H = packed[1 + npar:1 + npar + npar * npar].reshape(npar, npar) / self.sw_sum
        H[np.diag_indices(npar)] += self.l2 * self.penalised
        return loss, grad, H

    def hessp(self, w, v):
        """Global Hessian-vector product at ``w`` (the point of the last :meth:`evaluate`): one allreduce.

        Binary: ``X̃ᵀ (w p (1-p) ⊙ X̃ v)``; multinomial: ``Qᵀ X̃`` with
        ``Q = w ⊙ (P ⊙ X̃V - P (P ⊙ X̃V) 1)``, computed from the stashed
        probabilities without forming the Hessian.
        """
        xp, X, sw = self.xp, self.X, self.sw
        w = np.asarray(w, dtype=np.float64)
        v = np.asarray(v, dtype=np.float64)
        npar, D = self.n_params, self.d + self.fi
        local = np.zeros(npar)
        fp = _fingerprint(w, v)
        if X.shape[0] and self._fused:
            local = self._fused_local(w, v, fp)
        elif X.shape[0]:
            fp_w, prob = self._stash
            if fp_w != _fingerprint(w):
                raise RuntimeError("hessp needs the probabilities of its point: evaluate(w) first")
            if prob is None:   # the compiled host pass evaluated w: the probabilities once, for every product at w
                raw = self.raw(X, w)
                prob = expit(raw, xp) if self.binary else softmax_stats(raw, xp)[1]
                self._stash = (fp_w, prob)
            XV = self.raw(X, v)  # X̃ v with the same layout as the raw predictions
            if self.binary:
                Q = (sw * prob * (1 - prob) * XV)[:, None]
            else:
                PXV = prob * XV
                Q = sw[:, None] * (PXV - prob * PXV.sum(axis=1, keepdims=True))
            out = np.zeros((self.k, D))
            out[:, :self.d] = self._xt(Q)
            if self.fi:
                out[:, self.d] = self.scale * as_like(Q.astype(xp.float64).sum(axis=0), np)
            local = out.ravel()
        packed = self._reduce(local, fp)
        return packed / self.sw_sum + self.l2 * np.where(self.penalised, v, 0.0)


# ---------------------------------------------------------------------- solvers
def _verbose_callback(obj, verbose):
    if not verbose or obj.comm.rank != 0:
        return None
    state = {"it": 0}

    def callback(intermediate_result):
        state["it"] += 1
        print(f"iteration {state['it']}: loss {float(intermediate_result.fun):.10g}", flush=True)
    return callback


def _iteration_callback(obj, verbose, on_iteration):
    """scipy's per-iteration callback: the verbose print and/or ``on_iteration(w)`` (None if neither)."""
    printer = _verbose_callback(obj, verbose)
    if printer is None and on_iteration is None:
        return None

    def callback(intermediate_result):
        if printer is not None:
            printer(intermediate_result)
        if on_iteration is not None:
            on_iteration(np.asarray(intermediate_result.x))
    return callback


_CONTROLLER = []   # a threadpoolctl ThreadpoolController, made once (finding the libraries costs milliseconds)


def _optimiser_threads(obj):
    """``(context, fun)`` for scipy's L-BFGS-B on ``obj``: its own steps on one BLAS thread, ``fun`` the objective.

    Every BLAS call of scipy's step (the two-loop recursion, the small 2m x 2m factorisation) is tiny, and
    waking the rank's BLAS pool for each cost more than the call: ~0.14 ms a step on a GPU host of 16 cores
    a rank against ~0.015 ms on one thread; 3x in CPU time on 2 cores.  On host rows the objective's own
    products need the pool: ``fun`` restores it around each evaluation (two switches of the libraries'
    thread counts, microseconds).  A device objective keeps the pool: on the 4 x H100 host the fit at 4 GPUs
    took 23.7 ms with the pool against 25.1 ms with one thread (best of 5, same pass), the limit's own cost
    outweighing scipy's saving there.  ``MPIML_LINEAR_LBFGS_BLAS=pool`` or ``=one`` (read per fit) forces
    either way for an A/B.
    """
    plain = contextlib.nullcontext(), obj.evaluate
    choice = os.environ.get("MPIML_LINEAR_LBFGS_BLAS", "pool" if obj.xp is not np else "one")
    if choice == "pool":
        return plain
    if not _CONTROLLER:
        try:
            from threadpoolctl import ThreadpoolController

            _CONTROLLER.append(ThreadpoolController())
        except ImportError:   # without threadpoolctl nothing is changed
            _CONTROLLER.append(None)
    ctl = _CONTROLLER[0]
    if ctl is None:
        return plain
    pool = {lib.prefix: lib.num_threads for lib in ctl.select(user_api="blas").lib_controllers}
    if max(pool.values(), default=1) <= 1:
        return plain
    if obj.xp is not np or getattr(obj, "_host_pass", None) is not None:
        # rows on the device (MPIML_LINEAR_LBFGS_BLAS=one), or host rows evaluated by the compiled pass (no BLAS in
        # it; its own threads): every host BLAS call is tiny
        return ctl.limit(limits=1, user_api="blas"), obj.evaluate

    def evaluate(w):
        with ctl.limit(limits=pool):
            return obj.evaluate(w)
    return ctl.limit(limits=1, user_api="blas"), evaluate


def lbfgs(obj, w0, *, max_iter, tol, verbose=0, on_iteration=None):
    """scipy's L-BFGS-B on every rank with scikit-learn's options; returns ``(w, n_iter, result)``.

    ``on_iteration(w)``, if given, is called with the coefficients at the end of every
    iteration (the same on every rank: it is called by every rank with the same bits).
    """
    context, fun = _optimiser_threads(obj)   # scipy's steps on one BLAS thread for host rows
    options = {"maxiter": max_iter, "maxls": 50, "gtol": tol, "ftol": 64 * np.finfo(float).eps}
    callback = _iteration_callback(obj, verbose, on_iteration)
    with context:
        if obj.xp is not np and _direct_driver_agrees():   # rows on the device: scipy's steps without its wrappers
            res = _lbfgsb_direct(fun, w0, callback=callback, **options)
        else:
            res = scipy.optimize.minimize(fun, w0, method="L-BFGS-B", jac=True, callback=callback, options=options)
    n_iter = min(int(res.nit), max_iter)
    if res.status != 0:
        msg = (f"lbfgs failed to converge after {n_iter} iteration(s) (status={res.status}):\n{res.message}\n")
        if n_iter == max_iter:
            msg += f"\nIncrease the number of iterations to improve the convergence (max_iter={max_iter})."
        msg += ("\nYou might also want to scale the data as shown in:\n"
                "    https://scikit-learn.org/stable/modules/preprocessing.html")
        warnings.warn(msg, ConvergenceWarning, stacklevel=4)
    return res.x, n_iter, res


def _lbfgsb_direct(fun, x0, *, maxiter, maxls, gtol, ftol, callback=None, maxcor=10, maxfun=15000):
    """scipy's L-BFGS-B (``minimize(method="L-BFGS-B", jac=True)``) driven here: the same routine on the same
    values, so the same iterates, evaluations and result fields (``x``, ``fun``, ``jac``, ``nit``, ``nfev``,
    ``status``, ``message``).

    ``minimize`` wraps the objective in layers (a memoised Jacobian, a scalar-function object that copies and
    compares the point, counts and checks) that cost ~0.1 ms a evaluation on the GPU host, where the device
    waits for the next point: with 19 evaluations a fit, more than a millisecond of a 4-GPU fit's ~24 ms.
    This loop is ``scipy.optimize._lbfgsb_py._minimize_lbfgsb``'s without bounds: it calls scipy's
    ``setulb`` (a private routine), so it is used only where :func:`_direct_driver_agrees` found it
    reproducing ``minimize`` bit for bit in this process.
    """
    from scipy.optimize import _lbfgsb
    from scipy.optimize._lbfgsb_py import status_messages, task_messages

    m = maxcor
    x = np.array(np.asarray(x0).ravel(), dtype=np.float64)
    n = x.size
    f = np.array(0.0)
    g = np.zeros(n)
    nbd = np.zeros(n, np.int32)
    low, up = np.zeros(n), np.zeros(n)
    wa = np.zeros(2 * m * n + 5 * n + 11 * m * m + 8 * m)
    iwa = np.zeros(3 * n, np.int32)
    task, ln_task = np.zeros(2, np.int32), np.zeros(2, np.int32)
    lsave, isave, dsave = np.zeros(4, np.int32), np.zeros(44, np.int32), np.zeros(29)
    factr = ftol / np.finfo(float).eps
    nit = nfev = 0
    setulb = _lbfgsb.setulb
    while True:
        setulb(m, x, low, up, nbd, f, g, factr, gtol, wa, iwa, task, lsave, isave, dsave, maxls, ln_task)
        if task[0] == 3:            # f and g at x (``fun`` keeps nothing of x, which setulb rewrites: no copy)
            f, g = fun(x)
            g = np.asarray(g, dtype=np.float64)
            nfev += 1
        elif task[0] == 1:          # a new iterate
            nit += 1
            if callback is not None:
                try:
                    callback(scipy.optimize.OptimizeResult(x=x, fun=f))
                except StopIteration:
                    task[0], task[1] = 5, 505
            if nit >= maxiter:
                task[0], task[1] = 5, 504
            elif nfev > maxfun:
                task[0], task[1] = 5, 502
        else:
            break
    status = 0 if task[0] == 4 else (1 if nfev > maxfun or nit >= maxiter else 2)
    return scipy.optimize.OptimizeResult(fun=f, jac=g, nfev=nfev, njev=nfev, nit=nit, status=status,
                                         message=status_messages[task[0]] + ": " + task_messages[task[1]],
                                         x=x, success=status == 0)


_DIRECT_OK = []   # [bool] once checked in this process


def _direct_driver_agrees():
    """Whether :func:`_lbfgsb_direct` reproduces ``scipy.optimize.minimize``'s L-BFGS-B here (checked once per
    process on a small logistic problem, both ways, bit for bit: its iterates, counts, status and message);
    False with a SciPy whose private routine differs (any exception) or ``MPIML_LINEAR_LBFGS_DRIVER=scipy``."""
    if os.environ.get("MPIML_LINEAR_LBFGS_DRIVER", "") == "scipy":
        return False
    if not _DIRECT_OK:
        try:
            rs = np.random.RandomState(0)
            A = rs.randn(300, 12)
            y = (A @ rs.randn(12) + rs.randn(300) > 0).astype(np.float64)

            def fg(w):
                m = A @ w
                p = expit(m, np)
                return (float(np.mean(np.logaddexp(0.0, m) - y * m)) + 5e-4 * float(w @ w),
                        A.T @ (p - y) / 300 + 1e-3 * w)

            seen = []

            def cb(intermediate_result):
                seen.append(np.array(intermediate_result.x))
            ok = True
            for maxiter, gtol in ((100, 1e-10), (3, 1e-10), (100, 1e-3)):
                opts = {"maxiter": maxiter, "maxls": 50, "gtol": gtol, "ftol": 64 * np.finfo(float).eps}
                seen.clear()
                ref = scipy.optimize.minimize(fg, np.zeros(12), method="L-BFGS-B", jac=True, callback=cb,
                                              options=opts)
                ref_seen = list(seen)
                seen.clear()
                got = _lbfgsb_direct(fg, np.zeros(12), callback=cb, **opts)
                ok = ok and (np.array_equal(ref.x, got.x) and ref.nit == got.nit and ref.nfev == got.nfev
                             and ref.status == got.status and ref.message == got.message
                             and float(ref.fun) == float(got.fun) and len(ref_seen) == len(seen)
                             and all(np.array_equal(a, b) for a, b in zip(ref_seen, seen)))
        except Exception:   # noqa: BLE001 - another SciPy's private routine: minimize as before
            ok = False
        _DIRECT_OK.append(bool(ok))
    return _DIRECT_OK[0]


def _free_parameters(obj):
    """Parameters the Newton solvers move: the multinomial leaves one direction per invariance free."""
    k, D = obj.k, obj.d + obj.fi
    free = np.ones((k, D), dtype=bool)
    if not obj.binary:
        if obj.l2 == 0:
            free[-1, :] = False  # the multinomial is invariant to adding a vector to every class
        elif obj.fi and not obj.penalised.reshape(k, D)[0, -1]:
            free[-1, -1] = False  # ... and to adding a constant to every (unpenalised) intercept
    return free.ravel()


def _armijo(obj, w, f, g, step, *, hessian, it, name):
    """Backtracking line search with scikit-learn's Newton rules; ``(accepted, w, f, g, H or None)``."""
    eps = 16 * np.finfo(obj.X.dtype).eps
    gtn = float(g @ step)
    t = 1.0
    for _ in range(21):
        w_new = w + t * step
        res = obj.evaluate(w_new, hessian=hessian)
        f_new, g_new = res[0], res[1]
        improvement = f_new - f
        if improvement <= t * 0.00048828125 * gtn or (abs(improvement) <= abs(f * eps)
                                                      and np.abs(g_new).sum() < np.abs(g).sum()):
            return True, w_new, f_new, g_new, (res[2] if hessian else None)
        t *= 0.5
    warnings.warn(f"Line search of the {name} solver at iteration #{it} did not converge after 21 line search "
                  "refinement iterations. It will now resort to lbfgs instead.", ConvergenceWarning, stacklevel=5)
    return False, w, f, g, None


def newton_cholesky(obj, w0, *, max_iter, tol, verbose=0):
    """Damped Newton with symmetric-solver steps and Armijo backtracking (scikit-learn's rules).

    One allreduce of ``[loss | gradient | Hessian]`` per trial point; the
    accepted trial's Hessian serves the next step.  Falls back to L-BFGS on a
    singular Hessian, a non-descent step or a failed line search.
    """
    free = _free_parameters(obj)
    w = np.asarray(w0, dtype=np.float64).copy()
    f, g, H = obj.evaluate(w, hessian=True)
    it, converged, fallback = 1, False, False
    while it <= max_iter and not converged:
        try:
            step = np.zeros_like(w)
            with warnings.catch_warnings():
                warnings.simplefilter("error", scipy.linalg.LinAlgWarning)
                step[free] = scipy.linalg.solve(H[np.ix_(free, free)], -g[free], assume_a="sym",
                                                check_finite=False)
        except (np.linalg.LinAlgError, scipy.linalg.LinAlgWarning) as exc:
            warnings.warn("The inner solver of the Newton-Cholesky solver stumbled upon a singular or very "
                          f"ill-conditioned Hessian matrix at iteration {it}. It will now resort to lbfgs "
                          f"instead.\nThe original Linear Algebra message was:\n{exc}",
                          scipy.linalg.LinAlgWarning, stacklevel=4)
            fallback = True
            break
        if float(g @ step) > 0:
            fallback = True
            break
        H_old = H
        accepted, w, f, g, H = _armijo(obj, w, f, g, step, hessian=True, it=it, name="Newton-Cholesky")
        if not accepted:
            fallback = True
            break
        if verbose and obj.comm.rank == 0:
            print(f"Newton iteration {it}: loss {f:.10g}, max|gradient| {np.abs(g).max():.3g}", flush=True)
        if np.max(np.abs(g)) <= tol and 0.5 * float(step @ H_old @ step) <= tol:
            converged = True
        it += 1
    n_iter = it - 1
    if not converged:
        if fallback:
            # the iteration that failed counts against max_iter (scikit-learn's budget for the fallback)
            w, extra, _ = lbfgs(obj, w, max_iter=max(max_iter - it, 0), tol=tol, verbose=verbose)
            n_iter += extra
        else:
            warnings.warn(f"Newton solver did not converge after {n_iter} iterations.", ConvergenceWarning,
                          stacklevel=4)
    return w, n_iter


def _capped_cg(hessp, g, tol, maxiter, free):
    """Inner solve of ``H s = -g`` by conjugate gradients with curvature caps (scikit-learn's ``_cg``)."""
    eps = 16 * np.finfo(np.float64).eps
    x = np.zeros_like(g)
    r = g.copy()
    p = -r
    rr = float(r @ r)
    p_norm2 = rr
    for i in range(maxiter + 1):
        if np.abs(r).sum() <= tol:
            break
        Ap = np.where(free, hessp(p), 0.0)
        curv = float(p @ Ap)
        if 0 <= curv <= eps * p_norm2:
            break
        if curv < 0:
            if i == 0:
                x += rr / curv * p
            break
        a = rr / curv
        x += a * p
        r += a * Ap
        rr_new = float(r @ r)
        beta = rr_new / rr
        p = -r + beta * p
        p_norm2 = rr_new + beta * beta * p_norm2
        rr = rr_new
    return x


def newton_cg(obj, w0, *, max_iter, tol, verbose=0, max_inner=200):
    """Newton-CG: Newton steps from conjugate gradients on Hessian-vector products (no Hessian formed).

    The outer loop stops when ``max|g| <= tol`` (scikit-learn's rule); the
    inner CG stops at ``min(0.5, sqrt(|g|₁)) |g|₁`` or on small or negative
    curvature; the step is taken with Armijo backtracking.  One allreduce of
    ``[loss | gradient]`` per trial point and one of ``n_params`` values per
    Hessian-vector product.  Suits sparse data with many features.
    """
    free = _free_parameters(obj)
    w = np.asarray(w0, dtype=np.float64).copy()
    f, g = obj.evaluate(w)
    g = np.where(free, g, 0.0)
    k = 0
    while k < max_iter:
        absgrad = np.abs(g)
        if absgrad.max() <= tol:
            break
        total = float(absgrad.sum())
        termcond = min(0.5, np.sqrt(total)) * total
        step = _capped_cg(lambda v: obj.hessp(w, v), g, termcond, max_inner, free)
        if float(g @ step) >= 0:
            step = -g
        accepted, w_new, f_new, g_new, _ = _armijo(obj, w, f, g, step, hessian=False, it=k + 1, name="Newton-CG")
        if not accepted:
            w, extra, _ = lbfgs(obj, w, max_iter=max(max_iter - k, 0), tol=tol, verbose=verbose)
            return w, k + extra
        w, f, g = w_new, f_new, np.where(free, g_new, 0.0)
        # the stash now holds the accepted point's probabilities (its evaluation was the last one)
        k += 1
        if verbose and obj.comm.rank == 0:
            print(f"Newton-CG iteration {k}: loss {f:.10g}, max|gradient| {np.abs(g).max():.3g}", flush=True)
    else:
        if np.abs(g).max() > tol:
            warnings.warn(f"newton-cg failed to converge at loss = {f}. Increase the number of iterations.",
                          ConvergenceWarning, stacklevel=4)
    return w, k


def centre_multinomial(W, obj):
    """Fix the representation the multinomial leaves free (scikit-learn's convention)."""
    if obj.binary:
        return W
    if obj.l2 == 0:
        return W - W.mean(axis=0)
    if obj.fi and not obj.penalised.reshape(obj.k, -1)[0, -1]:
        W = W.copy()
        W[:, -1] -= W[:, -1].mean()
    return W
