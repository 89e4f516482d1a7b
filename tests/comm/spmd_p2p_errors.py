"""Point-to-point, split, mismatch errors, timeouts, MPIML_COMM_ALGO and profiling.

Run by ``spmd_collectives.py`` in the same ``mpiexec`` launch (see its
docstring), or in-process on the size-1 ``self`` communicator.  The timeout
section comes last because it leaves requests behind on purpose.
"""

import asyncio
import contextlib
import os
import time
import traceback

import numpy as np

from _spmd import assert_close, check

import mpiml
from mpiml import CollectiveMismatchError, CommAbortedError, CommTimeoutError
from mpiml.comm import Communicator

DTYPES = ("float16", "float32", "float64", "int32", "int64", "bool")
# around the 128 bytes that travel inside the header: (16,) float64 is inline, (17,) is not
SHAPES = ((), (0,), (1,), (5,), (16,), (17,), (3, 4), (0, 3), (2, 0, 3), (40, 7))


def value(r, shape, dtype, k=0):
    n = int(np.prod(shape, dtype=np.int64))
    base = (np.arange(n) * 7 + 13 * r + k) % 61
    if np.dtype(dtype) == np.bool_:
        return (base % 3 == 0).reshape(shape)
    return base.astype(dtype).reshape(shape)


def neighbours(comm):
    return (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size


@contextlib.contextmanager
def env(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ------------------------------------------------------------------ point to point
def test_p2p_dtypes_shapes(comm):
    right, left = neighbours(comm)
    for dtype in DTYPES:
        for shape in SHAPES:
            req = comm.isend(value(comm.rank, shape, dtype), right, tag=5)
            got = comm.recv(left, tag=5)
            req.wait()
            assert_close(got, value(left, shape, dtype), f"send/recv {dtype} {shape}", exact=True)
            out = np.empty(shape, dtype=dtype)
            req = comm.isend(value(comm.rank, shape, dtype, 1), right, tag=6)
            res = comm.irecv(left, tag=6, out=out).wait()
            req.wait()
            check(res is out, f"irecv {dtype} {shape}: out= not returned")
            assert_close(out, value(left, shape, dtype, 1), f"irecv into out {dtype} {shape}", exact=True)


def test_p2p_order_and_tags(comm):
    right, left = neighbours(comm)
    # several messages with one tag arrive in the order sent (inline and separate payloads)
    shapes = [(3,), (100,), (0,), (17,), (1,), (1000,)]
    reqs = [comm.isend(value(comm.rank, s, "float64", k), right, tag=7) for k, s in enumerate(shapes)]
    for k, s in enumerate(shapes):
        assert_close(comm.recv(left, tag=7), value(left, s, "float64", k), f"message {k} out of order", exact=True)
    for q in reqs:
        q.wait()
    # tags are matched, not arrival order: receive the later tag first
    big, small = value(comm.rank, (500,), "int64"), value(comm.rank, (2,), "int32")
    reqs = [comm.isend(big, right, tag=10), comm.isend(small, right, tag=11)]
    got_small = comm.recv(left, tag=11)
    got_big = comm.recv(left, tag=10)
    for q in reqs:
        q.wait()
    assert_close(got_small, value(left, (2,), "int32"), "tag 11", exact=True)
    assert_close(got_big, value(left, (500,), "int64"), "tag 10", exact=True)
    # a wrong out= is a ValueError; the message is consumed and the next one is intact
    for bad in (np.empty(500, dtype=np.float32), np.empty(499, dtype=np.int64),
                np.empty((500, 2), dtype=np.int64)[:, 0]):
        reqs = [comm.isend(big, right, tag=12), comm.isend(small, right, tag=12)]
        try:
            comm.recv(left, tag=12, out=bad)
            check(False, f"recv into a wrong out {bad.shape} {bad.dtype} did not raise")
        except ValueError as exc:
            check("out" in str(exc), f"wrong out message: {exc}")
        assert_close(comm.recv(left, tag=12), value(left, (2,), "int32"), "message after a bad out", exact=True)
        for q in reqs:
            q.wait()
    # invalid peers and tags are ValueErrors before anything is sent
    for fn in (lambda: comm.send(small, comm.size), lambda: comm.recv(-1), lambda: comm.send(small, 0, tag=-1)):
        try:
            fn()
            check(False, "an invalid peer or tag did not raise")
        except ValueError:
            pass


def test_p2p_asyncio(comm):
    right, left = neighbours(comm)

    async def exchange():
        recvs = [comm.irecv(left, tag=20 + k) for k in range(3)]
        sends = [comm.isend(value(comm.rank, (k * 30,), "float32", k), right, tag=20 + k) for k in range(3)]
        got = await asyncio.gather(*recvs)
        for s in sends:
            await s
        return got

    got = asyncio.run(exchange())
    for k, g in enumerate(got):
        assert_close(g, value(left, (k * 30,), "float32", k), f"awaited irecv {k}", exact=True)


# ------------------------------------------------------------------ split
def test_split(comm):
    p, r = comm.size, comm.rank
    sub = comm.split(r % 2, key=-r)  # reversed order within each colour
    members = sorted((q for q in range(p) if q % 2 == r % 2), key=lambda q: -q)
    check(sub.size == len(members) and sub.rank == members.index(r),
          f"split: rank {sub.rank} of {sub.size}, want {members.index(r)} of {len(members)}")
    assert_close(sub.allgather(np.int64(r)), np.array(members, dtype=np.int64), "split order", exact=True)
    for algo in (None, "ring", "recursive_doubling"):
        got = sub.allreduce(np.array([r], dtype=np.int64), algorithm=algo)
        check(int(got[0]) == sum(members), f"allreduce[{algo}] on a split communicator")
    sub.close()
    same = comm.split(3)  # equal keys: old rank order
    check(same.size == p and same.rank == r, "split with equal keys reorders")
    same.close()
    part = comm.split(None if r == 0 else 1, key=r)
    if r == 0:
        check(part is None, "color=None should return None")
    else:
        check(part.size == p - 1 and part.rank == r - 1, "split with one rank out")
        check(int(part.allreduce(np.ones(1, dtype=np.int32))[0]) == p - 1, "allreduce without rank 0")
        part.close()
    try:
        comm.split(-1)
        check(False, "negative color did not raise")
    except ValueError:
        pass


# ------------------------------------------------------------------ errors agreed on every rank
def agreed_error(comm, fn, exc_type, *needles):
    """``fn`` must raise ``exc_type`` on every rank with the same text, containing ``needles``."""
    text = None
    try:
        fn()
    except exc_type as exc:
        text = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # the wrong kind of error
        text = f"unexpected {type(exc).__name__}: {exc}"
    texts = comm.allgather_obj(text)
    ok = check(all(t is not None and t == texts[0] for t in texts),
               f"errors differ across ranks or are missing: {texts}")
    if ok:
        check(texts[0].startswith(exc_type.__name__), f"wrong error: {texts[0]}")
        for needle in needles:
            check(needle in texts[0], f"error {texts[0]!r} does not mention {needle!r}")
    check(int(comm.allreduce(np.ones(1, dtype=np.int32))[0]) == comm.size, "communicator unusable after an error")


def test_mismatch(comm):
    p, r = comm.size, comm.rank
    if p == 1:
        return
    x = np.ones(6)
    with env(MPIML_CHECK=1):
        agreed_error(comm, lambda: comm.allreduce(np.ones(3 if r == 0 else 4)), CollectiveMismatchError,
                     "allreduce", "count", "3 on ranks [0]")
        agreed_error(comm, lambda: comm.allreduce(np.ones(3, dtype=np.float32 if r == 0 else np.float64)),
                     CollectiveMismatchError, "dtype", "float32 on ranks [0]")
        agreed_error(comm, lambda: comm.allreduce(x, op="max" if r == 0 else "sum"), CollectiveMismatchError,
                     "op", "max on ranks [0]")
        agreed_error(comm, lambda: comm.allreduce(np.ones((2, 3)) if r == 0 else np.ones((3, 2))),
                     CollectiveMismatchError, "shape", "(2, 3) on ranks [0]")
        agreed_error(comm, lambda: comm.bcast(x, root=0 if r == 0 else 1), CollectiveMismatchError, "root")
        agreed_error(comm, lambda: comm.reduce(x, root=p - 1 if r == 0 else 0), CollectiveMismatchError, "root")
        agreed_error(comm, lambda: comm.gather(x, root=0 if r else 1), CollectiveMismatchError, "root")
        agreed_error(comm, lambda: comm.scatter(x if r == 0 else None, root=0 if r == 0 else 1),
                     CollectiveMismatchError, "root")
        agreed_error(comm, lambda: comm.bcast(x) if r == 0 else comm.allreduce(x), CollectiveMismatchError,
                     "collective", "bcast on ranks [0]", "allreduce on ranks")
        agreed_error(comm, lambda: comm.allreduce(x, algorithm="ring") if r == 0 else comm.scan(x),
                     CollectiveMismatchError, "collective")
        agreed_error(comm, lambda: comm.alltoall(np.ones(p + (1 if r == p - 1 else 0))), CollectiveMismatchError,
                     "alltoall", f"rank {p - 1}", "does not divide")
        agreed_error(comm, lambda: comm.allgatherv(np.ones((2, 3 if r == 0 else 4))), CollectiveMismatchError,
                     "allgatherv", "trailing shape")
        agreed_error(comm, lambda: comm.gatherv(np.ones(2, dtype=np.int32 if r else np.int64)),
                     CollectiveMismatchError, "gatherv", "dtype")
    # a bad first dimension of alltoall is found even with the default (cheap) checking
    agreed_error(comm, lambda: comm.alltoall(np.ones(p + (1 if r == 0 else 0))), CollectiveMismatchError,
                 "does not divide")
    # and the root's scatter shape is checked by every rank
    agreed_error(comm, lambda: comm.scatter(np.ones(p + 1) if r == 0 else None), ValueError, "divide")


# ------------------------------------------------------------------ MPIML_COMM_ALGO
def test_override(comm):
    x = np.arange(10, dtype=np.float64)
    with env(MPIML_COMM_ALGO="allreduce:ring; bcast:chain ;scan:linear"):
        forced = Communicator(comm._world)
    with mpiml.profile() as prof:
        got = forced.allreduce(x)
        forced.bcast(x, root=comm.size - 1)
        forced.scan(x)
        forced.allgather(x)
        forced.allreduce(x, algorithm="recursive_doubling")  # an explicit algorithm= still wins
    assert_close(got, x * comm.size, "allreduce under MPIML_COMM_ALGO", exact=True)
    paths = [(c[0], c[3]) for c in prof.calls]
    # allgather is not overridden: a small host call travels inside its signature round ("inline")
    # under the default checking, on the table's path with MPIML_CHECK=0
    default = "inline" if comm.size > 1 and mpiml._config.check_level() != 0 else "native"
    check(paths == [("allreduce", "ring"), ("bcast", "chain"), ("scan", "linear"), ("allgather", default),
                    ("allreduce", "recursive_doubling")], f"MPIML_COMM_ALGO not followed: {paths}")
    forced.close()
    for bad, needle in (("allreduce:bogus", "bogus"), ("allreduce", "expected"), ("nonsense:ring", "nonsense"),
                        ("bcast:nowhere/chain", "nowhere")):
        def make():
            with env(MPIML_COMM_ALGO=bad):
                Communicator(comm._world)
        agreed_error(comm, make, ValueError, "MPIML_COMM_ALGO", needle)


# ------------------------------------------------------------------ profiling
def test_profile(comm):
    right, left = neighbours(comm)
    with mpiml.profile() as prof:
        for _ in range(3):
            comm.allreduce(np.ones(10))
        comm.bcast(np.ones(1000))
        req = comm.isend(np.ones(3), right, tag=30)
        comm.recv(left, tag=30)
        req.wait()
    s = prof.summary()
    check(s["ops"].get("allreduce", {}).get("calls") == 3, f"profile allreduce calls: {s['ops']}")
    check(s["ops"].get("bcast", {}).get("bytes") == 8000, "profile bcast bytes")
    check("send" in s["ops"] and "recv" in s["ops"], f"profile misses point-to-point: {list(s['ops'])}")
    check(set(s["histogram"]) >= {128, 8192}, f"histogram buckets {s['histogram']}")
    check(all(b & (b - 1) == 0 for b in s["histogram"]), "histogram buckets are not powers of two")
    check(s["calls"] == len(prof.calls) and s["total_seconds"] > 0, "profile totals")
    check(all(o["seconds"] >= 0 for o in s["ops"].values()), "negative time")
    text = prof.summary(as_text=True)
    check("allreduce" in text and "message sizes" in text, f"profile text:\n{text}")


# ------------------------------------------------------------------ timeouts (last)
def expect_timeout(fn, *needles, limit=1.0):
    """``fn`` under ``MPIML_TIMEOUT=limit`` must raise CommTimeoutError in about ``limit`` s."""
    start = time.perf_counter()
    try:
        with env(MPIML_TIMEOUT=limit):
            fn()
        check(False, f"no CommTimeoutError ({needles})")
        return None
    except CommTimeoutError as exc:
        took = time.perf_counter() - start
        check(limit * 0.9 <= took <= limit + 2.0, f"timed out after {took:.2f} s with a limit of {limit} s")
        for needle in needles:
            check(needle in str(exc), f"timeout message {str(exc)!r} lacks {needle!r}")
        return exc


def expect_dead(fn, what):
    """After a failure the communicator returns no data: ``fn`` raises CommAbortedError naming it."""
    try:
        fn()
        check(False, f"{what}: a call on a dead communicator returned")
    except CommAbortedError as exc:
        check("timed out" in str(exc), f"{what}: the abort does not name the first failure: {exc}")


def test_timeouts(comm):
    p, r = comm.size, comm.rank
    if p == 1:
        c = Communicator(comm._world)
        exc = expect_timeout(lambda: c.recv(0, tag=99), "recv", limit=0.5)
        check(exc is None or exc.peer == 0, "timeout names the wrong peer")
        expect_dead(lambda: c.allreduce(np.ones(1)), "allreduce after a timed-out recv")
        return
    # MPIML_TIMEOUT=1 only around the calls meant to time out; the others wait under the run's own.
    # A receive from a silent peer names the peer, and the communicator is dead from then on on the
    # rank that timed out: the message may still arrive later, so no call may return data
    c = Communicator(comm._world)
    if r == 0:
        exc = expect_timeout(lambda: c.recv(1, tag=99), "recv")
        check(exc is None or exc.peer == 1, f"recv timeout names peer {getattr(exc, 'peer', None)}")
        expect_dead(lambda: c.recv(1, tag=99), "recv after a timed-out recv")
        expect_dead(lambda: c.send(np.ones(1), 1), "send after a timed-out recv")
        expect_dead(lambda: c.allreduce(np.ones(1)), "allreduce after a timed-out recv")
        expect_dead(lambda: c.split(0), "split after a timed-out recv")
    comm.barrier()
    # the same inside asyncio
    c = Communicator(comm._world)
    if r == 0:
        async def wait_silent():
            return await c.irecv(1, tag=98)

        expect_timeout(lambda: asyncio.run(wait_silent()), "recv")
        expect_dead(lambda: c.bcast(np.ones(1)), "bcast after a timed-out await")
    comm.barrier()
    # a rank that is late for a native collective: the others raise, naming the op, and their
    # communicator is dead (native, ring and recursive doubling alike): no stale data later
    for algorithm in ("native", "ring", "recursive_doubling"):
        c = Communicator(comm._world)
        x = np.full(4, float(r))
        if r == p - 1:
            time.sleep(1.6)
        else:
            expect_timeout(lambda: c.allreduce(x, algorithm=algorithm), "allreduce", limit=0.8)
            expect_dead(lambda: c.allreduce(np.ones(1), algorithm=algorithm),
                        f"allreduce[{algorithm}] after a timed-out one")
        comm.barrier()
    check(comm.allreduce(np.ones(1))[0] == p, "another communicator stays usable")
    # a rank that never calls an algorithm's collective, on a throwaway communicator
    spare = Communicator(comm._world)
    if r != p - 1:
        expect_timeout(lambda: spare.allreduce(x, algorithm="ring"), "allreduce")
        expect_dead(lambda: spare.bcast(x, root=p - 1, algorithm="binomial"), "bcast after a timed-out ring")
    comm.barrier()


SECTIONS = (test_p2p_dtypes_shapes, test_p2p_order_and_tags, test_p2p_asyncio, test_split, test_mismatch,
            test_override, test_profile, test_timeouts)


def run(comm, sections=SECTIONS):
    """Run every section; an exception is a failure of that section, not of the run."""
    for section in sections:
        try:
            section(comm)
        except Exception:
            check(False, f"{section.__name__} raised on rank {comm.rank}:\n{traceback.format_exc()}")
