"""Run under mpiexec by test_datasets_distributed.py: generators and loaders on N ranks.

argv[1] is a directory prepared by the test: reference arrays from one rank
(``ref_*.npy``) and the files to load.
"""

import os
import sys

import numpy as np

from _spmd import check, guarded
from mpiml import DistributedInputError
from mpiml.comm import get_comm
from mpiml.datasets import (load_csv, load_npy, load_svmlight, make_blobs, make_classification,
                            make_low_rank_matrix, make_regression, shard_bounds)
from mpiml.datasets._loaders import _read_my_lines

import _datasets_cases as cases

comm = get_comm()
d = sys.argv[1]


def gathered(a):
    parts = comm.allgather_obj(np.asarray(a))
    return np.concatenate(parts)


def same_error(fn, what, must_contain=()):
    try:
        fn()
        msg = None
    except DistributedInputError as exc:
        msg = str(exc)
    except Exception as exc:  # the wrong class is a failure, still agreed below
        msg = f"WRONG CLASS {type(exc).__name__}: {exc}"
    msgs = comm.allgather_obj(msg)
    check(msg is not None and not msg.startswith("WRONG"), f"{what}: expected DistributedInputError, got {msg!r}")
    check(len(set(msgs)) == 1, f"{what}: ranks raised different messages {msgs}")
    for text in must_contain:
        check(msg is not None and text in msg, f"{what}: {text!r} not in {msg!r}")


def main():
    # generators: the global dataset is the same on any number of ranks
    for name, (fn, kwargs) in cases.GENERATORS.items():
        out = fn(**kwargs)
        out = out if isinstance(out, tuple) else (out,)
        for i, part in enumerate(out):
            ref = np.load(os.path.join(d, f"ref_{name}_{i}.npy"))
            got = part if i == 2 else gathered(part)  # [2]: centres / coefficients, replicated
            check(got.dtype == ref.dtype, f"{name}[{i}] dtype {got.dtype} != {ref.dtype}")
            check(got.shape == ref.shape and np.array_equal(got, ref),
                  f"{name}[{i}] differs from the 1-rank dataset on {comm.size} ranks")
        total = int(np.sum(kwargs["n_samples"]))
        start, stop = shard_bounds(total, comm.size, comm.rank)
        check(out[0].shape[0] == stop - start, f"{name}: shard of {out[0].shape[0]} rows, not {stop - start}")

    # loaders: each rank reads only its rows, and the shards concatenate to the file
    full = np.load(os.path.join(d, "data.npy"))
    for mmap in (True, False):
        part = load_npy(os.path.join(d, "data.npy"), mmap=mmap)
        check(isinstance(part, np.memmap) == mmap, f"load_npy(mmap={mmap}) gave {type(part)}")
        check(part.shape[0] == np.array_split(full, comm.size)[comm.rank].shape[0], "load_npy rows")
        check(np.array_equal(gathered(part), full), f"load_npy(mmap={mmap}) shards != file")
    fort = np.load(os.path.join(d, "fortran.npy"))
    check(np.array_equal(gathered(load_npy(os.path.join(d, "fortran.npy"))), fort), "fortran-order npy")

    table = np.load(os.path.join(d, "table.npy"))
    X, y = load_csv(os.path.join(d, "table.csv"), header=True, target_column=-1)
    check(np.array_equal(gathered(X), table[:, :-1]) and np.array_equal(gathered(y), table[:, -1]),
          "load_csv shards != file")
    Xall = load_csv(os.path.join(d, "table.csv"), header=1)
    check(np.allclose(gathered(Xall), table) and Xall.shape[1] == table.shape[1], "load_csv without target")
    size = os.path.getsize(os.path.join(d, "table.csv"))
    chunk, _ = _read_my_lines(os.path.join(d, "table.csv"), comm, 1)
    check(len(chunk) <= size // comm.size + 200, f"rank read {len(chunk)} of {size} bytes")
    tiny = load_csv(os.path.join(d, "tiny.csv"))  # fewer lines than ranks: some ranks hold none
    check(tiny.shape[1] == 3 and np.array_equal(gathered(tiny), np.array([[1.0, 2, 3], [4, 5, 6]])), "tiny csv")

    Xs, ys = load_svmlight(os.path.join(d, "data.svm"))
    ref_sparse = np.load(os.path.join(d, "svm_dense.npy"))
    check(Xs.shape[1] == ref_sparse.shape[1], f"svmlight n_features {Xs.shape[1]} != {ref_sparse.shape[1]}")
    check(np.array_equal(gathered(Xs.toarray()), ref_sparse), "load_svmlight shards != file")
    check(np.array_equal(gathered(ys), np.load(os.path.join(d, "svm_y.npy"))), "load_svmlight targets")
    Xw, _ = load_svmlight(os.path.join(d, "data.svm"), n_features=ref_sparse.shape[1] + 5)
    check(Xw.shape[1] == ref_sparse.shape[1] + 5, "svmlight explicit n_features")

    # errors: the same DistributedInputError on every rank, naming the file
    same_error(lambda: load_npy(os.path.join(d, "truncated.npy")), "truncated npy", ["truncated.npy", "truncated"])
    same_error(lambda: load_npy(os.path.join(d, "garbage.npy")), "garbage npy", ["garbage.npy"])
    same_error(lambda: load_npy(os.path.join(d, "missing.npy")), "missing npy", ["missing.npy"])
    same_error(lambda: load_csv(os.path.join(d, "bad.csv")), "malformed csv", ["bad.csv"])
    same_error(lambda: load_csv(os.path.join(d, "truncated.csv")), "truncated csv", ["truncated.csv"])
    same_error(lambda: load_svmlight(os.path.join(d, "bad.svm")), "malformed svmlight", ["bad.svm", "line 201"])
    same_error(lambda: load_svmlight(os.path.join(d, "data.svm"), n_features=2), "svmlight n_features too small",
               ["n_features"])
    # the error names the file's line number (header, comments, blank lines counted), whichever rank holds it
    same_error(lambda: load_csv(os.path.join(d, "bad.csv")), "csv line", ["line 301:", "'oops'"])
    same_error(lambda: load_csv(os.path.join(d, "bad_late.csv"), header=True), "csv line after header/comments",
               ["line 504:", "'oops'", "column 3"])
    same_error(lambda: load_csv(os.path.join(d, "narrow_late.csv")), "csv narrow line",
               ["line 452:", "2 columns", "has 3"])
    same_error(lambda: load_csv(os.path.join(d, "truncated.csv")), "csv last line", ["line 401:"])
    same_error(lambda: load_svmlight(os.path.join(d, "bad_late.svm")), "svmlight unsorted indices",
               ["bad_late.svm", "line 502:", "sorted"])
    same_error(lambda: load_svmlight(os.path.join(d, "empty.svm")), "empty svmlight", ["no data rows"])
    same_error(lambda: load_svmlight(os.path.join(d, "comments.svm")), "comments-only svmlight", ["no data rows"])
    same_error(lambda: load_svmlight(os.path.join(d, "zero.svm"), zero_based=False), "index 0, one-based",
               ["line 301:", "zero_based=False"])

    # an index of 2**31 - 1 is accepted, as scikit-learn accepts it; n_features is agreed on every rank
    Xh, yh = load_svmlight(os.path.join(d, "huge_index.svm"))
    nf = int(np.load(os.path.join(d, "huge_index_nf.npy"))[0])
    check(Xh.shape[1] == nf == 2**31 - 1, f"huge index: n_features {Xh.shape[1]} (scikit-learn {nf})")
    nfs = comm.allgather_obj(Xh.shape[1])
    check(len(set(nfs)) == 1, f"n_features differs across ranks: {nfs}")
    check(comm.allreduce_obj(Xh.nnz) == 1 + 50 + 100, "huge index nnz")
    # CSR by default (as scikit-learn), dense on request
    import scipy.sparse as sp

    check(sp.issparse(Xs) and Xs.format == "csr", f"load_svmlight returned {type(Xs)}")
    Xd, yd = load_svmlight(os.path.join(d, "data.svm"), dense=True)
    check(isinstance(Xd, np.ndarray) and np.array_equal(gathered(Xd), ref_sparse), "load_svmlight(dense=True)")


guarded(main, comm)
