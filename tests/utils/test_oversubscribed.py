"""Ranks that outnumber the node's cores (mpiml.utils._threads.node_workers, quota_cpus;
mpiml.utils._node_memory.NodeBarrier): unit checks here, and under real mpiexec at 1-4 ranks
(``oversub_spmd_script.py``; on a 2-core machine 3 and 4 ranks leave ranks without a core)."""

import os
import threading

import numpy as np
import pytest

from mpiml.utils import _node_memory, _threads

HERE = os.path.dirname(os.path.abspath(__file__))


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_quota_cgroup_v2(tmp_path):
    root = tmp_path / "cg"
    _write(str(root / "cpu.max"), "max 100000\n")
    _write(str(root / "job" / "cpu.max"), "250000 100000\n")        # 2.5 CPUs: 3 threads can run
    _write(str(root / "job" / "step" / "cpu.max"), "max 100000\n")
    proc = tmp_path / "cgroup"
    _write(str(proc), "0::/job/step\n")
    assert _threads.quota_cpus(str(root), str(proc)) == 3
    _write(str(proc), "0::/\n")
    assert _threads.quota_cpus(str(root), str(proc)) is None


def test_quota_cgroup_v1(tmp_path):
    root = tmp_path / "cg"
    _write(str(root / "cpu,cpuacct" / "cpu.cfs_quota_us"), "-1\n")
    _write(str(root / "cpu,cpuacct" / "cpu.cfs_period_us"), "100000\n")
    _write(str(root / "cpu,cpuacct" / "docker" / "cpu.cfs_quota_us"), "200000\n")
    _write(str(root / "cpu,cpuacct" / "docker" / "cpu.cfs_period_us"), "100000\n")
    proc = tmp_path / "cgroup"
    _write(str(proc), "4:memory:/docker\n3:cpu,cpuacct:/docker\n")
    assert _threads.quota_cpus(str(root), str(proc)) == 2
    _write(str(proc), "3:cpu,cpuacct:/\n")
    assert _threads.quota_cpus(str(root), str(proc)) is None
    assert _threads.quota_cpus(str(root), str(tmp_path / "missing")) is None


class _Raw:
    """An mpi4py communicator's stand-in: ``allgather`` gives the ranks' affinity sets."""

    def __init__(self, sets):
        self.sets = sets

    def allgather(self, _):
        return self.sets


class _Comm:
    def __init__(self, size):
        self.size = size


@pytest.mark.parametrize("sets, quota, want", [
    ([[0, 1]] * 4, None, 2),                 # 4 unbound ranks on 2 cores: 2 compute
    ([[0, 1]] * 3, None, 2),
    ([[0, 1, 2, 3]] * 2, None, 2),           # more cores than ranks: every rank
    ([[0], [1], [2], [3]], None, 4),         # a launcher bound each rank to its own core: every rank
    ([list(range(64))] * 8, 2, 2),           # a container of 2 CPUs on a 64-core host
])
def test_node_workers(monkeypatch, sets, quota, want):
    monkeypatch.delenv("MPIML_OVERSUBSCRIBED", raising=False)
    monkeypatch.setattr(_threads, "quota_cpus", lambda: quota)
    raw = _Raw(sets)
    assert _threads.node_workers(_Comm(len(sets)), raw) == want
    monkeypatch.setenv("MPIML_OVERSUBSCRIBED", "compute")
    assert _threads.node_workers(_Comm(len(sets)), raw) == len(sets)
    _threads._WORKERS.pop(id(raw), None)


@pytest.mark.parametrize("futex", [True, False])
def test_node_barrier_threads(monkeypatch, futex):
    """Threads of one process stand in for ranks (the futex is the same word either way)."""
    if not futex:
        monkeypatch.setattr(_node_memory, "_FUTEX", ())
    n, rounds = 3, 200
    slot = np.zeros(8, dtype=np.int64)
    marks = np.full(n, -1, dtype=np.int64)
    early, errors = [], []

    def run(r):
        try:
            bar = _node_memory.NodeBarrier(slot[:1], n, {})
            for i in range(rounds):
                marks[r] = i
                bar.wait(idle=(r == n - 1))
                if np.any(marks < i):
                    early.append((r, i))
                bar.wait(idle=(r == n - 1))
        except Exception as exc:   # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not early
    assert slot[0] == 2 * rounds * n


def test_node_barrier_times_out(monkeypatch):
    from mpiml import CommTimeoutError

    monkeypatch.setenv("MPIML_TIMEOUT", "0.2")
    bar = _node_memory.NodeBarrier(np.zeros(1, dtype=np.int64), 2, {})
    with pytest.raises(CommTimeoutError):
        bar.wait(idle=True)                  # the other rank never arrives


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_oversubscribed_ranks_spmd(mpi, n):
    mpi(os.path.join(HERE, "oversub_spmd_script.py"), n, timeout=240)


def test_node_barrier_finds_dead_peer(monkeypatch):
    """A peer whose process has exited (its pid in the barrier's list) is found in about a second, not at the
    timeout."""
    import subprocess
    import sys
    import time

    from mpiml import CommError

    monkeypatch.setenv("MPIML_TIMEOUT", "30")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()                             # exited and reaped: its pid is gone
    bar = _node_memory.NodeBarrier(np.zeros(1, dtype=np.int64), 2, {}, pids=[os.getpid(), child.pid])
    t0 = time.perf_counter()
    with pytest.raises(CommError, match="rank 1 of this node"):
        bar.wait(idle=True)
    assert time.perf_counter() - t0 < 5


@pytest.mark.mpi
@pytest.mark.parametrize("which", ["barrier", "sum"])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_dead_rank_found_spmd(tmp_path, which, n):
    """The last rank killed while the others wait in node memory: each survivor raises CommError within 5 s
    (mpiexec started so that it does not kill the survivors itself; Hydra still does at times, and a run whose
    survivors all were killed is skipped: test_node_barrier_finds_dead_peer checks the same without a launcher)."""
    import shutil
    import subprocess
    import sys

    from conftest import _child_env, mpiexec_cmd, run_group

    if which == "sum" and len(os.sched_getaffinity(0)) >= n:
        pytest.skip("node_sum applies where ranks outnumber the cores")
    cmd = mpiexec_cmd(n)
    if shutil.which(cmd[0]) is None or "hydra" not in subprocess.run([cmd[0], "--version"], capture_output=True,
                                                                     text=True).stdout.lower():
        pytest.skip("needs MPICH's mpiexec (Hydra) for -disable-auto-cleanup")
    cmd = [cmd[0], "-disable-auto-cleanup"] + cmd[1:] + [sys.executable, os.path.join(HERE, "dead_peer_script.py"),
                                                         str(tmp_path), which]
    proc = run_group(cmd, 60, env=_child_env({"MPIML_TIMEOUT": "60"}))
    # (Hydra sometimes kills the survivors itself, despite -disable-auto-cleanup: those write nothing)
    rows = [(tmp_path / f"rank{r}").read_text().split(" ", 3) for r in range(n - 1)
            if (tmp_path / f"rank{r}").exists()]
    if not rows:
        pytest.skip(f"the launcher killed every survivor first\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    for r, kind, seconds, message in rows:
        assert kind == "CommError" and f"rank {n - 1} of this node" in message, (r, kind, message)
        assert float(seconds) < 5, (r, seconds)


class _Placement:
    """mpiml.utils._placement's stand-in: every CPU its own core, all online."""

    def __init__(self, cpus):
        self.cpus = cpus

    def online_cpus(self):
        return self.cpus

    def node_cores(self, common):
        return [[c] for c in common]

    format_cpus = staticmethod(lambda cpus: ",".join(map(str, cpus)))


@pytest.mark.parametrize("ranks, sets, want", [
    (4, [[0, 1]] * 4, [[0], [1], [0], [1]]),        # 4 unbound ranks on 2 cores: two a core, round robin
    (6, [[0, 1, 2]] * 6, [[0], [1], [2], [0], [1], [2]]),
    (3, [[0, 1]] * 3, [[0], [1], None]),            # the rank beyond the multiple: free, its threads on both
    (2, [[0, 1]] * 2, [None] * 2),                  # no more ranks than cores: the placement's rules
    (4, [[0], [1], [0], [1]], [None] * 4),           # bound by the launcher
])
def test_round_robin(monkeypatch, ranks, sets, want):
    monkeypatch.setattr(_threads, "quota_cpus", lambda: None)
    monkeypatch.setattr(_threads.os, "sched_setaffinity", lambda *a: None, raising=False)
    got = [_threads._round_robin({"ranks": ranks, "sets": sets, "local_rank": i}, 1, _Placement([0, 1, 2]))[0]
           for i in range(ranks)]
    assert got == want
    if ranks % 2 and ranks > 2:                       # (the leftover rank's threads: limit_threads)
        assert _threads._leftover({"ranks": ranks, "local_rank": ranks - 1}, 2)
        assert not _threads._leftover({"ranks": ranks, "local_rank": 0}, 2)
    # more than one thread a rank, or a CPU quota below the cores: not pinned
    assert _threads._round_robin({"ranks": ranks, "sets": sets, "local_rank": 0}, 2, _Placement([0, 1, 2]))[0] is None
    monkeypatch.setattr(_threads, "quota_cpus", lambda: 1)
    assert _threads._round_robin({"ranks": ranks, "sets": sets, "local_rank": 0}, 1, _Placement([0, 1, 2]))[0] is None
