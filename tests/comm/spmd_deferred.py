"""Deferred checking of repeated calls (run under mpiexec by test_deferred.py).

Repeated *device* calls run before their signatures are agreed; the ranks agree
on the whole sequence at the next round.  The logic lives in the communicator,
not in the device transports, so it is tested here on host calls, which a
communicator defers when ``_defer_memory`` names "host" (a test hook; by
default only device calls defer).  The mismatches chosen here complete under
MPI without hanging (same sizes, another reduction or dtype of equal width),
as mismatched device kernels of one shape do.
"""

import numpy as np

from _spmd import assert_close, check, guarded

from mpiml import CollectiveMismatchError, CommAbortedError
from mpiml.comm import Communicator, get_comm

world = get_comm()
R, P = world.rank, world.size
KEEP = []


def fresh(every=1024):
    c = Communicator(world._world)
    c._defer_memory = ("host", "device")
    c._check_every = every
    return c


def outcome(fn):
    try:
        fn()
        return "returned", ""
    except Exception as exc:  # noqa: BLE001 (recorded and compared)
        return type(exc).__name__, str(exc)


def agreed_results():
    c = fresh()
    x = np.arange(6, dtype=np.float64) + R
    want_sum = sum(np.arange(6, dtype=np.float64) + r for r in range(P))
    for k in range(5):
        assert_close(c.allreduce(x), want_sum, f"allreduce repeat {k}")
        got = c.reduce(x, "max", root=P - 1)
        if R == P - 1:
            assert_close(got, np.arange(6, dtype=np.float64) + P - 1, f"reduce repeat {k}")
        assert_close(c.bcast(x, root=0), np.arange(6, dtype=np.float64), f"bcast repeat {k}")
        assert_close(c.allgather(x), np.concatenate([np.arange(6) + r for r in range(P)]).astype(np.float64),
                     f"allgather repeat {k}")
        rs = c.reduce_scatter(np.ones((2 * P + 1, 3)))
        check(rs.shape[0] == len(np.array_split(np.arange(2 * P + 1), P)[R]) and np.all(rs == P),
              f"reduce_scatter repeat {k}: {rs}")
    # the first call of each of the five shapes was agreed; the 4 repeats of each were deferred
    check(len(c._deferred) == 20, f"deferred log holds {len(c._deferred)} calls, expected 20")
    c.barrier()  # a round: agrees on the log and empties it
    check(len(c._deferred) == 0, f"the log was not emptied by an agreed round: {len(c._deferred)}")
    c.close()
    c = fresh(every=3)  # a verification round every 3 deferred calls
    out = np.empty(6)
    for k in range(7):
        c.allreduce(x, out=out)
        check(len(c._deferred) < 3, f"log past MPIML_CHECK_EVERY=3: {len(c._deferred)}")
    assert_close(out, want_sum, "allreduce out= after verifications")
    c.close()


def mismatch(kind):
    """Ranks part among deferred calls; the next round raises the same error everywhere."""
    c = fresh(every=3 if kind == "every" else 1024)
    x = np.ones(8)
    c.allreduce(x, "sum")
    c.allreduce(x, "max")           # both shapes agreed once, in the same order
    c.allreduce(x, "sum")           # deferred, the same on every rank
    if kind == "dtype":
        y = np.ones(8, dtype=np.int64)
        c.allreduce(y)              # agreed once
        odd = (lambda: c.allreduce(y)) if R == 0 else (lambda: c.allreduce(x))
    else:
        odd = (lambda: c.allreduce(x, "sum")) if R == 0 else (lambda: c.allreduce(x, "max"))
    got = outcome(odd)               # runs: nothing agreed yet
    if kind == "every":
        check(got[0] == "returned", f"{kind}: the diverging call itself raised {got}")
        got = outcome(lambda: c.allreduce(x, "sum"))  # the 3rd deferred call posts the round
    else:
        check(got[0] == "returned", f"{kind}: the diverging call itself raised {got}")
        got = outcome(c.barrier)
    texts = world.allgather_obj(got)
    check(got[0] == "CollectiveMismatchError", f"{kind}: the next round gave {got}")
    check(len(set(texts)) == 1, f"{kind}: ranks raised different errors: {texts}")
    want = "mismatched dtype" if kind == "dtype" else "mismatched op"
    call = 5 if kind == "dtype" else 4  # the parting call's number on this communicator
    check(want in got[1] and "repeated device calls" in got[1] and f"at call {call} " in got[1],
          f"{kind}: unclear text {got[1]!r}")
    after = outcome(lambda: c.allreduce(x))
    check(after[0] == "CommAbortedError", f"{kind}: after a deferred mismatch the communicator gave {after}")
    KEEP.append(c)  # (not closed: its abort notices may still be in flight, and a new context could reuse its id)


def main():
    agreed_results()
    for kind in ("op", "dtype", "every"):
        mismatch(kind)
    # MPIML_CHECK=0: nothing is logged
    import os

    os.environ["MPIML_CHECK"] = "0"
    try:
        c = fresh()
        for _ in range(3):
            c.allreduce(np.ones(3))
        check(not c._deferred, "MPIML_CHECK=0 logged calls")
        c.close()
    finally:
        os.environ.pop("MPIML_CHECK")
    _ = CollectiveMismatchError, CommAbortedError


guarded(main, world)
