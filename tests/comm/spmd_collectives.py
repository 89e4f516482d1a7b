"""Every collective x every algorithm x dtype x op x size, against NumPy.

Run under ``mpiexec -n N python spmd_collectives.py`` (driven by
``test_comm_spmd.py``) or in-process on the size-1 ``self`` communicator.  Rank
``r``'s input of a case is a pure function of ``(case, r)``, so every rank
computes the reference from all ranks' inputs locally.  Failures are recorded
with :func:`_spmd.check` and agreed at the end; the ranks never leave step.

Running this file also runs :mod:`spmd_p2p_errors` (point-to-point, split,
mismatch errors, timeouts, overrides, profiling) and :mod:`spmd_objects` (the
object collectives), so that one ``mpiexec`` launch per rank count covers the
whole communication core.
"""

import os
import zlib

import numpy as np

from _spmd import assert_close, check

import mpiml
from mpiml.comm import algorithm_names
from mpiml.comm._ops import identity

DTYPES = ("float16", "float32", "float64", "int32", "int64", "bool")
OPS = ("sum", "prod", "min", "max")
SIZES = (0, 1, 7, 1000)
BIG = 2 ** 20 + 3
BIG_CASES = (("float32", "sum"), ("int64", "max"))
_UFUNC = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def algos(op):
    """``None`` (the automatic choice) and every name that applies to ``op``."""
    return [None] + algorithm_names(op)


def seed_of(*key):
    return zlib.crc32(repr(key).encode())


def make(r, shape, dtype, op, *key):
    """Rank ``r``'s input: small floats (sums, products near 1), full-range ints for
    min/max, and an int sum that wraps around on purpose."""
    rng = np.random.default_rng([seed_of(*key, str(shape), dtype, op), r])
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.random(shape) < (0.75 if op in ("prod", "min") else 0.25)
    if dt.kind == "f":
        if op == "sum":
            return rng.uniform(-1, 1, shape).astype(dt)
        if op == "prod":
            return rng.uniform(0.8, 1.25, shape).astype(dt)
        return rng.uniform(-100, 100, shape).astype(dt)
    info = np.iinfo(dt)
    if op == "prod":
        return rng.choice(np.array([-2, -1, 1, 2], dtype=dt), shape)
    if op == "sum":
        x = rng.integers(-1000, 1000, shape, dtype=dt)
        if x.size:
            x.reshape(-1)[0] = info.max // 2 + 7 * r  # wraps with 3 and more ranks
        return x
    return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)


def reduce_ref(xs, op, dtype):
    stack = np.stack(xs)
    return _UFUNC[op].reduce(stack, axis=0, dtype=np.dtype(dtype))


def compare(got, want, dtype, op, p, msg):
    dt = np.dtype(dtype)
    if dt.kind != "f" or op in ("min", "max", None):
        return assert_close(got, want, msg, exact=True)
    tol = 8 * max(p, 2) * float(np.finfo(dt).eps)
    return assert_close(got, want, msg, rtol=tol, atol=tol)


def profiled(expect_op, algorithm, fn):
    """Run ``fn`` under :func:`mpiml.profile`; check the recorded algorithm was the forced one."""
    with mpiml.profile() as prof:
        result = fn()
    calls = [c for c in prof.calls if c[0] == expect_op]
    check(len(calls) == 1, f"{expect_op}[{algorithm}]: {len(calls)} profile records")
    if calls and algorithm is not None:
        check(calls[0][3] == algorithm, f"{expect_op}: forced {algorithm} but ran {calls[0][3]}")
    return result


def cases(op_names=OPS, sizes=SIZES, dtypes=DTYPES):
    for dtype in dtypes:
        for op in op_names:
            for n in sizes:
                yield dtype, op, n


# ------------------------------------------------------------------ reductions
def test_allreduce(comm):
    p, r = comm.size, comm.rank
    hashes = []
    for algo in algos("allreduce"):
        todo = list(cases())
        todo += [(d, o, BIG) for d, o in BIG_CASES]
        for dtype, op, n in todo:
            xs = [make(q, (n,), dtype, op, "allreduce") for q in range(p)]
            got = profiled("allreduce", algo, lambda: comm.allreduce(xs[r], op=op, algorithm=algo))
            compare(got, reduce_ref(xs, op, dtype), dtype, op, p, f"allreduce[{algo}] {dtype} {op} n={n}")
            check(np.array_equal(xs[r], make(r, (n,), dtype, op, "allreduce")),
                  f"allreduce[{algo}] modified its input")
            hashes.append(zlib.crc32(got.tobytes()))
    # every rank must hold the identical bits for every case
    allh = comm.allgather_obj(hashes)
    check(all(h == allh[0] for h in allh), "allreduce results differ bitwise across ranks")


def test_reduce(comm):
    p, r = comm.size, comm.rank
    for algo in algos("reduce"):
        todo = list(cases()) + [(d, o, BIG) for d, o in BIG_CASES]
        for i, (dtype, op, n) in enumerate(todo):
            root = i % p
            xs = [make(q, (n,), dtype, op, "reduce") for q in range(p)]
            got = profiled("reduce", algo, lambda: comm.reduce(xs[r], op=op, root=root, algorithm=algo))
            msg = f"reduce[{algo}] {dtype} {op} n={n} root={root}"
            if r == root:
                compare(got, reduce_ref(xs, op, dtype), dtype, op, p, msg)
            else:
                check(got is None, f"{msg}: non-root got {type(got)}")


def test_reduce_scatter(comm):
    p, r = comm.size, comm.rank
    for algo in algos("reduce_scatter"):
        for dtype, op, n in cases(sizes=(0, 1, 3, 7, 1000)):
            xs = [make(q, (n,), dtype, op, "reduce_scatter") for q in range(p)]
            got = profiled("reduce_scatter", algo, lambda: comm.reduce_scatter(xs[r], op=op, algorithm=algo))
            want = np.array_split(reduce_ref(xs, op, dtype), p)[r]
            compare(got, want, dtype, op, p, f"reduce_scatter[{algo}] {dtype} {op} n={n}")
        xs = [make(q, (BIG,), "float32", "sum", "reduce_scatter") for q in range(p)]
        got = comm.reduce_scatter(xs[r], algorithm=algo)
        compare(got, np.array_split(reduce_ref(xs, "sum", "float32"), p)[r], "float32", "sum", p,
                f"reduce_scatter[{algo}] big")


def test_scans(comm):
    p, r = comm.size, comm.rank
    for kind in ("scan", "exscan"):
        for algo in algos(kind):
            for dtype, op, n in cases():
                xs = [make(q, (n,), dtype, op, kind) for q in range(p)]
                fn = getattr(comm, kind)
                got = profiled(kind, algo, lambda: fn(xs[r], op=op, algorithm=algo))
                upto = r + 1 if kind == "scan" else r
                if upto:
                    want = reduce_ref(xs[:upto], op, dtype)
                else:
                    want = np.full(n, identity(op, dtype), dtype=dtype)
                compare(got, want, dtype, op, p, f"{kind}[{algo}] {dtype} {op} n={n}")


# ------------------------------------------------------------------ data movement
def test_bcast(comm):
    p, r = comm.size, comm.rank
    for algo in algos("bcast"):
        todo = list(cases(op_names=(None,))) + [("float32", None, BIG)]
        for i, (dtype, _, n) in enumerate(todo):
            root = (i + 1) % p
            xs = [make(q, (n,), dtype, "max", "bcast") for q in range(p)]
            mine = xs[r].copy()
            got = profiled("bcast", algo, lambda: comm.bcast(mine, root=root, algorithm=algo))
            msg = f"bcast[{algo}] {dtype} n={n} root={root}"
            assert_close(got, xs[root], msg, exact=True)
            check(np.array_equal(mine, xs[r]), f"{msg}: input modified")
            if r == root:
                check(got is mine, f"{msg}: the root should get its own array back")
    # the pipelined chain with segments smaller than the message
    os.environ["MPIML_CHAIN_SEGMENT"] = "24"
    try:
        for root in range(p):
            x = np.arange(1001, dtype=np.float64) * (r + 1)
            got = comm.bcast(x, root=root, algorithm="chain")
            assert_close(got, np.arange(1001, dtype=np.float64) * (root + 1), f"bcast[chain] 24-byte segments root={root}",
                         exact=True)
    finally:
        del os.environ["MPIML_CHAIN_SEGMENT"]


def test_gathers(comm):
    p, r = comm.size, comm.rank
    for algo in algos("allgather"):
        for dtype, _, n in cases(op_names=(None,)):
            xs = [make(q, (n, 2), dtype, "max", "allgather") for q in range(p)]
            got = profiled("allgather", algo, lambda: comm.allgather(xs[r], algorithm=algo))
            assert_close(got, np.concatenate(xs), f"allgather[{algo}] {dtype} n={n}", exact=True)
    for algo in algos("gather"):
        for i, (dtype, _, n) in enumerate(cases(op_names=(None,))):
            root = (i + 2) % p
            xs = [make(q, (n,), dtype, "max", "gather") for q in range(p)]
            got = profiled("gather", algo, lambda: comm.gather(xs[r], root=root, algorithm=algo))
            msg = f"gather[{algo}] {dtype} n={n} root={root}"
            if r == root:
                assert_close(got, np.concatenate(xs), msg, exact=True)
            else:
                check(got is None, f"{msg}: non-root got an array")
    # uneven first dimensions, with ranks that contribute nothing
    patterns = [lambda q: (3 * q + 1) % 4, lambda q: 0 if q else 5, lambda q: q, lambda q: 0]
    for algo in algos("allgatherv"):
        for dtype in DTYPES:
            for k, rows in enumerate(patterns):
                xs = [make(q, (rows(q), 3), dtype, "max", "allgatherv", k) for q in range(p)]
                got = profiled("allgatherv", algo, lambda: comm.allgatherv(xs[r], algorithm=algo))
                assert_close(got, np.concatenate(xs), f"allgatherv[{algo}] {dtype} pattern {k}", exact=True)
    for algo in algos("gatherv"):
        for dtype in DTYPES:
            for k, rows in enumerate(patterns):
                root = (k + 1) % p
                xs = [make(q, (rows(q), 2), dtype, "max", "gatherv", k) for q in range(p)]
                got = profiled("gatherv", algo, lambda: comm.gatherv(xs[r], root=root, algorithm=algo))
                msg = f"gatherv[{algo}] {dtype} pattern {k} root={root}"
                if r == root:
                    assert_close(got, np.concatenate(xs), msg, exact=True)
                else:
                    check(got is None, f"{msg}: non-root got an array")


def test_scatter_alltoall(comm):
    p, r = comm.size, comm.rank
    for algo in algos("scatter"):
        for i, (dtype, _, n) in enumerate(cases(op_names=(None,))):
            root = i % p
            full = make(root, (n * p, 2), dtype, "max", "scatter")
            got = profiled("scatter", algo, lambda: comm.scatter(full if r == root else None, root=root,
                                                                 algorithm=algo))
            assert_close(got, full[r * n:(r + 1) * n], f"scatter[{algo}] {dtype} n={n} root={root}", exact=True)
    for algo in algos("alltoall"):
        for dtype, _, n in cases(op_names=(None,)):
            xs = [make(q, (n * p, 2), dtype, "max", "alltoall") for q in range(p)]
            got = profiled("alltoall", algo, lambda: comm.alltoall(xs[r], algorithm=algo))
            want = np.concatenate([xs[q][r * n:(r + 1) * n] for q in range(p)])
            assert_close(got, want, f"alltoall[{algo}] {dtype} n={n}", exact=True)


def test_barrier(comm):
    for algo in algos("barrier"):
        for _ in range(3):
            profiled("barrier", algo, lambda: comm.barrier(algorithm=algo))


# ------------------------------------------------------------------ shapes and out=
def test_shapes_and_out(comm):
    p, r = comm.size, comm.rank
    for algo in algos("allreduce"):
        for shape in ((), (3, 4), (2, 0, 3), (2, 3, 2)):
            xs = [make(q, shape, "float64", "max", "shapes") for q in range(p)]
            got = comm.allreduce(xs[r], op="max", algorithm=algo)
            assert_close(got, reduce_ref(xs, "max", "float64"), f"allreduce[{algo}] shape {shape}", exact=True)
            out = np.empty(shape)
            res = comm.allreduce(xs[r], op="max", out=out, algorithm=algo)
            check(res is out, f"allreduce[{algo}] out= not returned")
            assert_close(out, reduce_ref(xs, "max", "float64"), f"allreduce[{algo}] out= shape {shape}", exact=True)
            inplace = xs[r].copy()
            res = comm.allreduce(inplace, op="max", out=inplace, algorithm=algo)
            check(res is inplace, f"allreduce[{algo}] in place not returned")
            assert_close(inplace, reduce_ref(xs, "max", "float64"), f"allreduce[{algo}] in place {shape}", exact=True)
    # a 0-d scalar and a NumPy scalar
    got = comm.allreduce(np.float64(r + 1), op="sum")
    check(got.shape == () and float(got) == p * (p + 1) / 2, f"allreduce of a scalar gave {got!r}")
    got = comm.allreduce(np.array(r + 1, dtype=np.int32), op="prod")
    check(got.shape == () and int(got) == int(np.prod(np.arange(1, p + 1))), f"allreduce of 0-d gave {got!r}")
    for algo in algos("bcast"):
        got = comm.bcast(np.array(float(r)), root=p - 1, algorithm=algo)
        check(got.shape == () and float(got) == p - 1, f"bcast[{algo}] 0-d gave {got!r}")
        got = comm.bcast(np.full((2, 3, 2), r, dtype=np.int64), root=p - 1, algorithm=algo)
        assert_close(got, np.full((2, 3, 2), p - 1, dtype=np.int64), f"bcast[{algo}] 3-d", exact=True)
    for algo in algos("reduce"):
        got = comm.reduce(np.array(r, dtype=np.int64), op="max", root=0, algorithm=algo)
        if r == 0:
            check(got.shape == () and int(got) == p - 1, f"reduce[{algo}] 0-d gave {got!r}")
    for algo in algos("scan"):
        got = comm.scan(np.array(1.0), algorithm=algo)
        check(got.shape == () and float(got) == r + 1, f"scan[{algo}] 0-d gave {got!r}")
        got = comm.exscan(np.ones((2, 2), dtype=np.int32), algorithm=algo)
        assert_close(got, np.full((2, 2), r, dtype=np.int32), f"exscan[{algo}] 2-d", exact=True)
    for algo in algos("allgather"):
        got = comm.allgather(np.int64(r), algorithm=algo)
        assert_close(got, np.arange(p, dtype=np.int64), f"allgather[{algo}] of scalars", exact=True)
    x = np.arange(5 * 3 * 2, dtype=np.float32).reshape(5, 3, 2) * (r + 1)
    for algo in algos("reduce_scatter"):
        got = comm.reduce_scatter(x, algorithm=algo)
        want = np.array_split(np.arange(30, dtype=np.float32).reshape(5, 3, 2) * (p * (p + 1) // 2), p)[r]
        assert_close(got, want, f"reduce_scatter[{algo}] 3-d", exact=True)
        out = np.full(want.shape, -1.0, dtype=np.float32)
        for _ in range(2):  # the first call and its repeat (the plan's replay)
            got = comm.reduce_scatter(x, out=out, algorithm=algo)
            check(got is out, f"reduce_scatter[{algo}] out= is not returned")
            assert_close(out, want, f"reduce_scatter[{algo}] 3-d out=", exact=True)
    # wrong out= is the same ValueError everywhere, before any communication
    try:
        comm.allreduce(np.zeros(3), out=np.zeros(4))
        check(False, "allreduce with a wrong out= did not raise")
    except ValueError as exc:
        check("out must have shape" in str(exc), f"wrong out= message: {exc}")
    try:
        comm.reduce_scatter(np.zeros(3 * comm.size), out=np.zeros(4))
        check(False, "reduce_scatter with a wrong out= did not raise")
    except ValueError as exc:
        check("out must have shape (3,)" in str(exc), f"reduce_scatter: wrong out= message: {exc}")


def test_algorithm_names(comm):
    """Names that do not apply are ValueErrors on every rank (and the comm stays usable)."""
    x = np.ones(4)
    for fn, bad in ((lambda a: comm.bcast(x, algorithm=a), "ring"),
                    (lambda a: comm.allreduce(x, algorithm=a), "chain"),
                    (lambda a: comm.alltoall(np.ones(comm.size), algorithm=a), "ring"),
                    (lambda a: comm.scan(x, algorithm=a), "bogus")):
        try:
            fn(bad)
            check(False, f"algorithm={bad!r} did not raise")
        except ValueError as exc:
            check(bad in str(exc), f"algorithm={bad!r}: message {exc}")
    check(comm.allreduce(x)[0] == comm.size, "communicator unusable after a bad algorithm name")


def test_sendrecv(comm):
    """isendrecv around a ring (host arrays: the host path), shapes and dtypes differing per rank."""
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(3):
        x = (np.arange(5 * (r + 1) + step) + r).astype(np.float64 if r % 2 else np.int32).reshape(-1, 1)
        got = comm.isendrecv(x, right, left, tag=7).wait()
        want = (np.arange(5 * (left + 1) + step) + left).astype(np.float64 if left % 2 else np.int32).reshape(-1, 1)
        assert_close(got, want, f"isendrecv step {step}", exact=True)
    big = np.full(1 << 20, r, dtype=np.float64)  # 8 MB: a rendezvous send completes only once the receive is posted
    got = comm.isendrecv(big, right, left, tag=8).wait()
    check(got.shape == big.shape and bool(np.all(got == left)), f"isendrecv of 8 MB from rank {left}")
    try:
        comm.isendrecv(np.ones(2), p, left)
        check(False, "isendrecv to a rank outside the communicator did not raise")
    except ValueError as exc:
        check("dest must be a rank" in str(exc), f"isendrecv bad dest: {exc}")


SECTIONS = (test_allreduce, test_reduce, test_reduce_scatter, test_scans, test_bcast, test_gathers,
            test_scatter_alltoall, test_barrier, test_shapes_and_out, test_algorithm_names, test_sendrecv)


def run(comm, sections=SECTIONS):
    """Run every section; an exception is a failure of that section, not of the run."""
    import traceback

    for section in sections:
        try:
            section(comm)
        except Exception:
            check(False, f"{section.__name__} raised on rank {comm.rank}:\n{traceback.format_exc()}")


if __name__ == "__main__":
    import time

    from _spmd import guarded

    import spmd_objects
    import spmd_p2p_errors
    from mpiml.comm import get_comm

    world = get_comm()

    def main():
        t0 = time.perf_counter()
        run(world)
        t1 = time.perf_counter()
        spmd_p2p_errors.run(world)
        spmd_objects.run(world)
        if world.rank == 0:
            print(f"collectives {t1 - t0:.1f} s, point-to-point and errors {time.perf_counter() - t1:.1f} s")

    guarded(main, world)
