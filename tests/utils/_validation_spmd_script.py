"""Run under mpiexec for test_utils_validation.py (through _utils_launches.py): input problems agreed
across ranks."""

import numpy as np

from _spmd import check, guarded
from mpiml import DistributedInputError
from mpiml.comm import get_comm
from mpiml.utils import agree_on_error, global_row_offset, row_counts, validate_data, validate_sample_weight
from mpiml.utils._testing import MinimalSPMDTransformer

comm = get_comm()
rank, size, last = comm.rank, comm.size, comm.size - 1


def outcome(fn):
    try:
        fn()
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def expect(fn, what, wanted):
    """Every rank raises the same text, which contains ``wanted`` (on 1 rank: ValueError, as scikit-learn)."""
    got = outcome(fn)
    texts = comm.allgather_obj(got)
    check(len(set(texts)) == 1, f"{what}: ranks differ: {texts}")
    cls = "DistributedInputError" if size > 1 else "ValueError"
    check(got is not None and got.startswith(cls), f"{what}: expected {cls}, got {got!r}")
    check(got is not None and wanted in got, f"{what}: {wanted!r} not in {got!r}")


def fit(X, **kw):
    return lambda: MinimalSPMDTransformer().fit(X, **kw)


def main():
    base = np.arange(12.0).reshape(3, 4) + rank

    X = base.copy()
    if rank == last:
        X[1, 2] = np.nan
    expect(fit(X), "NaN on the last rank",
           f"Input X contains NaN on rank(s) [{last}]." if size > 1 else "Input X contains NaN.")

    X = base.copy()
    if rank == last:
        X[0, 0] = np.inf
    expect(fit(X), "inf on the last rank", "Input X contains infinity or a value too large for dtype('float64')")

    X = base[:, :3] if rank == last else base
    if size > 1:
        expect(fit(X), "features differ", f"X has 3 features on rank {last} but 4 on rank 0.")

    X = base.astype(np.float32) if rank == last else base
    if size > 1:
        expect(fit(X), "dtype differs", f"X has dtype float32 on rank {last} but float64 on rank 0.")

    expect(fit(np.empty((0, 4))), "empty everywhere",
           "Found array with 0 sample(s) on every rank (shape=(0, 4) on rank 0) while a minimum of 1 is required"
           if size > 1 else "Found array with 0 sample(s) (shape=(0, 4)) while a minimum of 1 is required")

    X = np.ones(4) if rank == last else base
    expect(fit(X), "1-D on one rank", "Expected 2D array, got 1D array instead")

    # one empty rank is valid; the mean is the global one
    X = np.empty((0, 4)) if (rank == 0 and size > 1) else base
    err = outcome(fit(X))
    check(err is None, f"an empty rank must be valid: {err}")
    est = MinimalSPMDTransformer().fit(X)
    rows = [np.arange(12.0).reshape(3, 4) + r for r in range(size) if not (r == 0 and size > 1)]
    check(np.allclose(est.mean_, np.concatenate(rows).mean(axis=0)), "global mean with an empty rank")
    check(est.n_samples_seen_ == 3 * len(rows), "global row count")

    # predict-time checks against the fitted number of features
    est = MinimalSPMDTransformer().fit(base)
    X = base[:, :3] if rank == last else base
    expect(lambda: est.transform(X), "transform with fewer features",
           "X has 3 features, but MinimalSPMDTransformer is expecting 4 features as input.")

    # dtype handling: ints become float64, float32 stays
    X32, xp = validate_data(MinimalSPMDTransformer(), base.astype(np.float32), comm=comm)
    check(X32.dtype == np.float32 and xp is np, "float32 kept")
    Xi, _ = validate_data(MinimalSPMDTransformer(), base.astype(np.int64).tolist(), comm=comm)
    check(Xi.dtype == np.float64, "lists of ints become float64")

    # sample weights: a local problem or all-zero weights raise everywhere
    sw = np.ones(3) if rank != last else np.ones(2)
    expect(fit(base, sample_weight=sw), "sample_weight shape", "sample_weight.shape == (2,), expected (3,)!")
    expect(fit(base, sample_weight=np.zeros(3)), "all-zero weights",
           "Sample weights must contain at least one non-zero number.")
    sw = np.zeros(3) if rank == 0 else np.ones(3)
    if size > 1:
        check(outcome(fit(base, sample_weight=sw)) is None, "zero weights on one rank are fine")
    w = validate_sample_weight(2.0, base, comm=comm)
    check(w.shape == (3,) and (w == 2.0).all(), "scalar weights")

    # helpers
    n_local = rank + 1
    check(global_row_offset(n_local, comm) == sum(range(1, rank + 1)), "global_row_offset")
    check(row_counts(n_local, comm).tolist() == list(range(1, size + 1)), "row_counts")
    text = outcome(lambda: agree_on_error(comm, ValueError("bad shard") if rank == last else None,
                                          prefix="Reading"))
    texts = comm.allgather_obj(text)
    check(len(set(texts)) == 1 and "bad shard" in text, f"agree_on_error: {texts}")
    if size > 1:
        check(f"Reading on rank(s) [{last}]: bad shard" in text, f"agree_on_error names the rank: {text}")
    check(outcome(lambda: agree_on_error(comm, None)) is None, "agree_on_error without errors")


if __name__ == "__main__":
    guarded(main, comm)
