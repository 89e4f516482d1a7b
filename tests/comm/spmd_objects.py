"""The object collectives (``allgather_obj``, ``bcast_obj``, ``allreduce_obj``) at every size, against the objects.

Run by ``spmd_collectives.py`` in its launch (``test_comm_spmd.py``, 1-4 ranks).  Rank ``r``'s object is a pure
function of ``r``, so every rank knows what each must receive.  Covered: objects that fit the round's slot,
large ones whose arrays travel out of band (C- and F-ordered, a bytearray, several arrays, one array referenced
twice) beside ranks whose large object has no buffer at all (a long string: an in-band pickle) or a small one in
the same call, arrays that are not contiguous (in band), the results writable and aligned, a later collective
that does not disturb them, and an object that does not pickle on one rank (the same error everywhere).
"""

import pickle

import numpy as np

from _spmd import check
from spmd_p2p_errors import agreed_error

from mpiml import CollectiveMismatchError

MB = 1 << 20


def small(r):
    return {"rank": r, "name": f"rank {r}", "a": np.arange(r + 3, dtype=np.int32)}


def large(r):
    """A large object of rank ``r``: its kind depends on ``r % 3`` (so 3 ranks hold each kind once)."""
    base = np.random.default_rng(r).standard_normal(MB // 8 + 13 * r)
    if r % 3 == 0:   # several arrays out of band, one of them twice, and small ones in band
        return {"x": base, "f": np.asfortranarray(base[:MB // 16].reshape(-1, 8)) * 2, "b": bytearray(b"%d" % r) * 5000,
                "again": base, "tiny": np.full(3, r), "strided": base[::2][:1000]}
    if r % 3 == 1:   # nothing out of band: a long string, in band
        return "x" * (MB // 2 + r)
    return small(r)  # small, in the same call as the large ones


def same(a, b):
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
    return type(a) is type(b) and a == b


def test_allgather(comm):
    p, r = comm.size, comm.rank
    got = comm.allgather_obj(small(r))
    check(len(got) == p and all(same(g, small(q)) for q, g in enumerate(got)), "allgather_obj of small objects")
    mine = large(r)
    got = comm.allgather_obj(mine)
    check(all(same(g, large(q)) for q, g in enumerate(got)), "allgather_obj of large objects (mixed kinds)")
    if r % 3 == 0 and p > 1:
        got[r]["x"][0] += 1.0               # this rank's entry is a copy: writing it leaves the object alone
        check(got[r]["x"] is not mine["x"] and mine["x"][0] == large(r)["x"][0], "this rank's entry is a copy")
        got[r]["x"][0] -= 1.0
    arrays = [g for q, g in enumerate(got) if q % 3 == 0]
    for q, g in zip(range(0, p, 3), arrays):
        x = g["x"]
        check(x.flags.writeable and (p == 1 or x.ctypes.data % 64 == 0), f"rank {q}'s array: writable, 64-byte aligned")
        check(g["again"] is x, "an array referenced twice arrives once")
        check(g["f"].flags.f_contiguous and isinstance(g["b"], bytearray), "F order and bytearray kept")
    if p > 1 or arrays:
        keep = [g["x"].copy() for g in arrays]
        comm.allgather_obj(large(r + 1))    # a later call: the earlier results stay as they were
        check(all(bool(np.array_equal(g["x"], k)) for g, k in zip(arrays, keep)), "results changed by a later call")


def test_bcast(comm):
    p, r = comm.size, comm.rank
    for root in sorted({0, p - 1, min(1, p - 1), min(2, p - 1)}):
        mine = large(root) if r == root else None
        got = comm.bcast_obj(mine, root=root)
        check(same(got, large(root)), f"bcast_obj of a large object from root {root}")
        check(r != root or got is mine, "bcast_obj returns the root's own object on the root")
    got = comm.bcast_obj(small(0) if r == 0 else None)
    check(same(got, small(0)), "bcast_obj of a small object")


def test_allreduce(comm):
    p, r = comm.size, comm.rank
    got = comm.allreduce_obj(np.full(MB // 8, float(r + 1)))
    check(got.shape == (MB // 8,) and bool(np.all(got == p * (p + 1) / 2)), "allreduce_obj of a large array")
    check(comm.allreduce_obj(r, op="max") == p - 1, "allreduce_obj max of ints")


def test_unpicklable(comm):
    r, p = comm.rank, comm.size
    if p == 1:                              # (one rank: nothing is pickled)
        return
    obj = (lambda: r) if r == p - 1 else np.zeros(MB)
    agreed_error(comm, lambda: comm.allgather_obj(obj), CollectiveMismatchError, "pickle")
    check(all(same(g, small(q)) for q, g in enumerate(comm.allgather_obj(small(r)))), "usable after the error")


def test_message_layout(comm):
    """The local frame: padding to 64 bytes, in-band pickles unframed (no communication)."""
    from mpiml.comm import _objects

    m, err = _objects._message(large(0), pad=True)
    check(err is None and m.size % 64 == 0 and bytes(m[:8]) == _objects._MAGIC, "a framed message")
    check(same(_objects._loads(bytearray(m)), large(0)), "a framed message read back")
    m, err = _objects._message("x" * 10, pad=False)
    check(m.tobytes() == pickle.dumps("x" * 10, protocol=5), "a message without buffers is the plain pickle")


SECTIONS = (test_allgather, test_bcast, test_allreduce, test_unpicklable, test_message_layout)


def run(comm):
    import traceback

    for section in SECTIONS:
        try:
            section(comm)
        except Exception:
            check(False, f"{section.__name__} raised on rank {comm.rank}:\n{traceback.format_exc()}")
