"""Helpers for scripts that run under mpiexec: collective verdicts, uneven shards, a GPU per rank.

A script calls :func:`check` for every comparison and :func:`finish` at the end;
the verdict is agreed across ranks so every rank exits with the same status.
"""

import sys
import traceback

import numpy as np

_failures = []


def check(cond, msg):
    """Record a failure (does not raise, so the ranks stay in step)."""
    if not cond:
        _failures.append(msg)
    return cond


def uneven_bounds(n, size, skip_last=False):
    """Row bounds of an uneven contiguous split of ``n`` rows: rank r holds a share proportional to
    r + 1 (``skip_last``: the last rank holds none, when there are more than two)."""
    w = np.arange(1, size + 1, dtype=np.float64)
    if skip_last and size > 2:
        w[-1] = 0
    return np.concatenate([[0], np.round(np.cumsum(w) / w.sum() * n).astype(int)])


def uneven_shard(a, rank, size, skip_last=False):
    """This rank's rows of ``a`` under :func:`uneven_bounds`."""
    b = uneven_bounds(a.shape[0], size, skip_last)
    return a[b[rank]:b[rank + 1]]


def local_rows(arrays, rank, size, skip_last=False, sparse=False, gpu=False):
    """This rank's rows of each of ``arrays`` (``X`` first) under :func:`uneven_bounds`: ``X`` as a CSR
    matrix when ``sparse``, and all of them on the current GPU (CuPy, cupyx CSR) when ``gpu``."""
    X, *rest = [uneven_shard(a, rank, size, skip_last) for a in arrays]
    if sparse:
        import scipy.sparse as sp

        X = sp.csr_matrix(X)
    if gpu:
        import cupy as cp
        import cupyx.scipy.sparse as cps

        X = cps.csr_matrix(X) if sparse else cp.asarray(X)
        rest = [cp.asarray(a) for a in rest]
    return (X, *rest)


def gpu_shards(comm):
    """The preamble of a GPU script: bind this rank to GPU ``rank % count`` (ranks may share one)
    and return its ``shard(a, skip_last=False)``, this rank's rows of ``a`` under
    :func:`uneven_bounds` (NumPy arrays and SciPy sparse matrices alike)."""
    import cupy

    cupy.cuda.Device(comm.rank % cupy.cuda.runtime.getDeviceCount()).use()

    def shard(a, skip_last=False):
        return uneven_shard(a, comm.rank, comm.size, skip_last)

    return shard


def _host(a):
    """A NumPy copy of a host or device (CuPy) array."""
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def assert_close(got, want, msg, rtol=1e-6, atol=0.0, exact=False):
    got, want = _host(got), _host(want)
    if got.shape != want.shape:
        return check(False, f"{msg}: shape {got.shape} != {want.shape}")
    if got.dtype != want.dtype:
        return check(False, f"{msg}: dtype {got.dtype} != {want.dtype}")
    if exact:
        ok = np.array_equal(got, want)
    else:
        ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)
    if not ok:
        bad = np.argwhere(~np.isclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)) \
            if not exact else np.argwhere(got != want)
        return check(False, f"{msg}: differs at {bad[:3].tolist()} (got {got.ravel()[:4]}, want {want.ravel()[:4]})")
    return True


def finish(comm):
    """Agree on the verdict; print failures on the ranks that had them; exit 0 or 1 on all."""
    mine = len(_failures)
    total = comm.allreduce_obj(mine) if comm.size > 1 else mine
    if mine:
        for f in _failures[:20]:
            print(f"rank {comm.rank}: FAIL {f}", file=sys.stderr)
    if comm.rank == 0:
        print(f"{'OK' if total == 0 else 'FAILED'}: {total} failure(s) over {comm.size} rank(s)")
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(0 if total == 0 else 1)


def guarded(main, comm):
    """Run ``main()``; an exception on one rank is a failure, not a hang of the others."""
    try:
        main()
    except Exception:
        _failures.append(traceback.format_exc())
    finish(comm)
