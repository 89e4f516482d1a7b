"""Every registered algorithm on 1 to 9 in-process ranks (threads over an in-memory
transport), plus the registry, the cost formulas and the override grammar.

The threads make non-powers of two with several folded ranks (5, 6, 7, 9) cheap to
cover; the same code runs under real ``mpiexec`` in ``test_comm_spmd.py``.
"""

import threading
from collections import deque

import numpy as np
import pytest

from mpiml.comm import Request
from mpiml.comm._request import CompletedRequest
from mpiml.comm._tuning import parse_override
from mpiml.comm.algorithms import ALGORITHMS, COLLECTIVES, Channel, CostModel, algorithm_names, get_algorithm
from mpiml.comm.algorithms._channel import ceil_log, offsets, split_counts
from mpiml.comm.algorithms.chain import CHAIN_SEGMENT_BYTES, chain_segment_bytes
from mpiml.comm.algorithms.recursive_doubling import Fold
from mpiml.comm.backends._base import Transport

RANKS = range(1, 10)
_UFUNC = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


class _Mailboxes:
    def __init__(self):
        self.lock = threading.Lock()
        self.boxes = {}

    def box(self, key):
        with self.lock:
            return self.boxes.setdefault(key, deque())


class ThreadTransport(Transport):
    """Point-to-point between threads of one process: eager sends, matched receives."""

    name = "threads"

    def __init__(self, mail, rank, size):
        self.mail, self.rank, self.size = mail, rank, size

    def isend(self, buf, dest, tag):
        assert 0 <= dest < self.size
        self.mail.box((self.rank, dest, tag)).append(buf.copy())
        return CompletedRequest(op="send", peer=dest)

    def irecv(self, buf, source, tag):
        assert 0 <= source < self.size
        box = self.mail.box((source, self.rank, tag))

        def test():
            try:
                data = box.popleft()
            except IndexError:
                return False
            assert data.size == buf.size, f"rank {self.rank}: {data.size} elements for a {buf.size} buffer"
            buf[...] = data
            return True

        return Request(test, op="recv", peer=source)


def spmd(p, fn):
    """Run ``fn(ch)`` on ``p`` threads; returns the results in rank order."""
    mail = _Mailboxes()
    results, errors = [None] * p, []

    def body(r):
        try:
            results[r] = fn(Channel(ThreadTransport(mail, r, p), np, "test"))
        except BaseException as exc:  # noqa: B902 - reported below
            errors.append((r, exc))

    threads = [threading.Thread(target=body, args=(r,)) for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    leftovers = {k: len(v) for k, v in mail.boxes.items() if v}
    assert not leftovers, f"unreceived messages: {leftovers}"
    return results


def data(r, n, dtype="int64"):
    rng = np.random.default_rng([r, n])
    if dtype == "int64":
        return rng.integers(-50, 50, n)
    return rng.uniform(-1, 1, n).astype(dtype)


@pytest.fixture(autouse=True)
def _timeout(monkeypatch):
    monkeypatch.setenv("MPIML_TIMEOUT", "20")


@pytest.mark.parametrize("p", RANKS)
@pytest.mark.parametrize("name", sorted(ALGORITHMS["allreduce"]))
@pytest.mark.parametrize("op", ["sum", "min"])
def test_allreduce(p, name, op):
    run = get_algorithm("allreduce", name).run
    for n in (0, 1, 5, 37):
        xs = [data(r, n) for r in range(p)]

        def fn(ch):
            out = ch.empty(n, np.int64)
            run(ch, xs[ch.rank], out, op)
            return out

        for r, got in enumerate(spmd(p, fn)):
            np.testing.assert_array_equal(got, _UFUNC[op].reduce(np.stack(xs), axis=0), f"rank {r} n={n}")


@pytest.mark.parametrize("name", sorted(ALGORITHMS["allreduce"]))
def test_allreduce_bitwise_identical(name):
    run = get_algorithm("allreduce", name).run
    for p in (3, 5, 6, 8):
        xs = [data(r, 1001, "float32") for r in range(p)]

        def fn(ch):
            out = ch.empty(1001, np.float32)
            run(ch, xs[ch.rank], out, "sum")
            return out

        res = spmd(p, fn)
        for got in res[1:]:
            assert got.tobytes() == res[0].tobytes(), f"{name} p={p}: ranks differ bitwise"
        np.testing.assert_allclose(res[0], np.stack(xs).astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("p", RANKS)
@pytest.mark.parametrize("name", sorted(ALGORITHMS["reduce"]))
def test_reduce(p, name):
    run = get_algorithm("reduce", name).run
    for n in (0, 1, 7, 40):
        xs = [data(r, n) for r in range(p)]
        for root in {0, p - 1, p // 2}:
            def fn(ch):
                out = ch.empty(n, np.int64) if ch.rank == root else None
                run(ch, xs[ch.rank], out, "sum", root)
                return out

            np.testing.assert_array_equal(spmd(p, fn)[root], np.sum(xs, axis=0))


@pytest.mark.parametrize("p", RANKS)
@pytest.mark.parametrize("name", sorted(ALGORITHMS["bcast"]))
def test_bcast(p, name, monkeypatch):
    monkeypatch.setenv("MPIML_CHAIN_SEGMENT", "16")  # several segments for the chain
    run = get_algorithm("bcast", name).run
    for n in (0, 1, 9, 100):
        for root in {0, p - 1, p // 2}:
            def fn(ch):
                buf = data(ch.rank, n)
                run(ch, buf, root)
                return buf

            for got in spmd(p, fn):
                np.testing.assert_array_equal(got, data(root, n))


@pytest.mark.parametrize("p", RANKS)
@pytest.mark.parametrize("op", ["allgather", "allgatherv"])
def test_allgathers(p, op):
    for name in sorted(ALGORITHMS[op]):
        run = get_algorithm(op, name).run
        for k in range(3):
            counts = [(3 * r + k) % 4 if op == "allgatherv" else k * 3 for r in range(p)]
            xs = [data(r, counts[r]) for r in range(p)]

            def fn(ch):
                out = ch.empty(sum(counts), np.int64)
                run(ch, xs[ch.rank], out, *([counts] if op == "allgatherv" else []))
                return out

            for got in spmd(p, fn):
                np.testing.assert_array_equal(got, np.concatenate(xs), f"{op}[{name}] counts {counts}")


@pytest.mark.parametrize("p", RANKS)
@pytest.mark.parametrize("op", ["gather", "gatherv", "scatter"])
def test_rooted_data_movement(p, op):
    for name in sorted(ALGORITHMS[op]):
        run = get_algorithm(op, name).run
        for k in range(3):
            counts = [(2 * r + k) % 3 if op == "gatherv" else k * 2 for r in range(p)]
            xs = [data(r, counts[r]) for r in range(p)]
            for root in range(p):
                def fn(ch):
                    if op == "scatter":
                        out = ch.empty(counts[0], np.int64)
                        run(ch, data(root, counts[0] * p) if ch.rank == root else None, out, root)
                        return out
                    out = ch.empty(sum(counts), np.int64) if ch.rank == root else None
                    run(ch, xs[ch.rank], out, *([counts] if op == "gatherv" else []), root)
                    return out

                res = spmd(p, fn)
                if op == "scatter":
                    want = np.array_split(data(root, counts[0] * p), p)
                    for r, got in enumerate(res):
                        np.testing.assert_array_equal(got, want[r])
                else:
                    np.testing.assert_array_equal(res[root], np.concatenate(xs), f"{op}[{name}] root {root}")


@pytest.mark.parametrize("p", RANKS)
@pytest.mark.parametrize("name", sorted(ALGORITHMS["reduce_scatter"]))
def test_reduce_scatter(p, name):
    run = get_algorithm("reduce_scatter", name).run
    for n in (0, 1, 3, 11, 50):
        counts = split_counts(n, p)
        xs = [data(r, n) for r in range(p)]

        def fn(ch):
            out = ch.empty(counts[ch.rank], np.int64)
            run(ch, xs[ch.rank], out, counts, "max")
            return out

        want = np.array_split(np.max(xs, axis=0), p)
        for r, got in enumerate(spmd(p, fn)):
            np.testing.assert_array_equal(got, want[r])
    # uneven counts that do not follow array_split
    counts = [(5 * r) % 3 for r in range(p)]
    xs = [data(r, sum(counts)) for r in range(p)]

    def fn(ch):
        out = ch.empty(counts[ch.rank], np.int64)
        run(ch, xs[ch.rank], out, counts, "sum")
        return out

    bounds = offsets(counts)
    total = np.sum(xs, axis=0)
    for r, got in enumerate(spmd(p, fn)):
        np.testing.assert_array_equal(got, total[bounds[r]:bounds[r + 1]])


@pytest.mark.parametrize("p", RANKS)
@pytest.mark.parametrize("kind", ["scan", "exscan"])
def test_scans(p, kind):
    for name in sorted(ALGORITHMS[kind]):
        run = get_algorithm(kind, name).run
        for n in (0, 1, 6):
            xs = [data(r, n) for r in range(p)]

            def fn(ch):
                out = np.full(n, -999, dtype=np.int64)
                run(ch, xs[ch.rank], out, "sum")
                return out

            for r, got in enumerate(spmd(p, fn)):
                upto = r + 1 if kind == "scan" else r
                want = np.sum(xs[:upto], axis=0) if upto else np.full(n, -999)
                np.testing.assert_array_equal(got, want, f"{kind}[{name}] rank {r}")


@pytest.mark.parametrize("p", RANKS)
def test_alltoall(p):
    for name in sorted(ALGORITHMS["alltoall"]):
        run = get_algorithm("alltoall", name).run
        for b in (0, 1, 3):
            xs = [np.arange(p * b) + 1000 * r for r in range(p)]

            def fn(ch):
                out = ch.empty(p * b, np.int64)
                run(ch, xs[ch.rank], out)
                return out

            for r, got in enumerate(spmd(p, fn)):
                want = np.concatenate([xs[q][r * b:(r + 1) * b] for q in range(p)])
                np.testing.assert_array_equal(got, want, f"alltoall[{name}] b={b}")


@pytest.mark.parametrize("p", RANKS)
def test_barriers(p):
    for name in sorted(ALGORITHMS["barrier"]):
        spmd(p, get_algorithm("barrier", name).run)


def test_barrier_waits_for_the_last_rank():
    """Nobody leaves a barrier before the last rank has entered it."""
    import time

    for name in sorted(ALGORITHMS["barrier"]):
        for p in (3, 5):
            entered = []

            def fn(ch):
                if ch.rank == p - 1:
                    time.sleep(0.05)
                entered.append(ch.rank)
                get_algorithm("barrier", name).run(ch)
                return len(entered)

            assert spmd(p, fn) == [p] * p, name


# ------------------------------------------------------------------ registry and costs
def test_every_collective_has_algorithms_and_names_are_checked():
    for op in COLLECTIVES:
        names = algorithm_names(op)
        assert names[0] == "native" and len(names) >= 2, op
        assert get_algorithm(op, "native") is None
    with pytest.raises(ValueError, match="does not apply to bcast"):
        get_algorithm("bcast", "ring")
    with pytest.raises(ValueError, match="unknown algorithm"):
        get_algorithm("allreduce", "fastest")


def test_required_algorithms_present():
    want = {
        "bcast": {"binomial", "knomial", "chain", "linear"},
        "reduce": {"binomial", "knomial", "gather_first", "rabenseifner", "linear"},
        "allreduce": {"recursive_doubling", "ring", "rabenseifner", "gather_first", "binomial", "knomial"},
        "allgather": {"recursive_doubling", "ring"},
        "allgatherv": {"recursive_doubling", "ring"},
        "gather": {"binomial", "linear"},
        "scatter": {"binomial", "linear"},
        "reduce_scatter": {"ring", "rabenseifner"},
        "scan": {"recursive_doubling", "linear"},
        "exscan": {"recursive_doubling", "linear"},
        "alltoall": {"pairwise", "linear"},
        "barrier": {"binomial", "recursive_doubling", "linear"},
    }
    for op, names in want.items():
        assert names <= set(ALGORITHMS[op]), (op, names - set(ALGORITHMS[op]))


def test_costs_are_documented_and_sane():
    m = CostModel(alpha=2e-6, beta=1e-10, gamma=2e-10, launch=5e-6)
    for op, algos in ALGORITHMS.items():
        for name, algo in algos.items():
            assert "alpha" in algo.doc, f"{op}[{name}] documents no cost formula"
            for p in (1, 2, 3, 4, 8, 64):
                costs = [algo.cost(n, p, m) for n in (0, 8, 4096, 1 << 24)]
                assert all(c >= 0 and np.isfinite(c) for c in costs), (op, name, p, costs)
                assert costs == sorted(costs), (op, name, p, costs)  # more bytes never cost less
            assert algo.cost(8, 1, m) <= algo.cost(8, 64, m), (op, name)
    # the model orders the classic choices the textbook way
    big, small = 1 << 26, 8
    ar = ALGORITHMS["allreduce"]
    assert ar["ring"].cost(big, 64, m) < ar["recursive_doubling"].cost(big, 64, m)
    assert ar["rabenseifner"].cost(big, 64, m) < ar["recursive_doubling"].cost(big, 64, m)
    assert ar["recursive_doubling"].cost(small, 64, m) < ar["ring"].cost(small, 64, m)
    bc = ALGORITHMS["bcast"]
    assert bc["chain"].cost(big, 64, m) < bc["binomial"].cost(big, 64, m)
    assert bc["binomial"].cost(small, 64, m) < bc["linear"].cost(small, 64, m)


def test_helpers():
    assert split_counts(10, 4) == [3, 3, 2, 2] == [len(a) for a in np.array_split(np.arange(10), 4)]
    assert split_counts(2, 4) == [1, 1, 0, 0] and split_counts(0, 3) == [0, 0, 0]
    assert offsets([2, 0, 3]) == [0, 2, 2, 5]
    assert [ceil_log(p) for p in (1, 2, 3, 4, 5, 8, 9)] == [0, 1, 2, 2, 3, 3, 4]
    assert ceil_log(17, 4) == 3
    # the fold: 6 ranks -> 4 active, ranks 0 and 2 sit out
    folds = [Fold(r, 6) for r in range(6)]
    assert [f.newrank for f in folds] == [-1, 0, -1, 1, 2, 3]
    assert [folds[0].real(i) for i in range(4)] == [1, 3, 4, 5]
    assert [folds[0].first(i) for i in range(5)] == [0, 2, 4, 5, 6]


def test_chain_segment_env(monkeypatch):
    monkeypatch.delenv("MPIML_CHAIN_SEGMENT", raising=False)
    assert chain_segment_bytes() == CHAIN_SEGMENT_BYTES
    monkeypatch.setenv("MPIML_CHAIN_SEGMENT", "4096")
    assert chain_segment_bytes() == 4096
    for bad in ("0", "-3", "lots"):
        monkeypatch.setenv("MPIML_CHAIN_SEGMENT", bad)
        with pytest.raises(ValueError, match="MPIML_CHAIN_SEGMENT"):
            chain_segment_bytes()


def test_override_grammar():
    assert parse_override("") == {}
    assert parse_override(" allreduce:ring ; bcast:mpi/chain;") == {
        "allreduce": (None, "ring"), "bcast": ("mpi", "chain")}
    for bad in ("allreduce", "allreduce:fastest", "everything:ring", "bcast:carrier-pigeon/chain"):
        with pytest.raises(ValueError, match="MPIML_COMM_ALGO"):
            parse_override(bad)
