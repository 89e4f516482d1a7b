"""The machinery of the GPU comm tests on the CPU: gpu_batch.py (several scripts in one launch, a verdict each)
and tests/comm/_gpu_jobs.py's scheduler (launches side by side on the GPUs they hold, a deadline), with stand-in
scripts and GPU ids, so that test_gpu_comm.py's launches are right before a GPU host runs them."""

import os
import textwrap
import time

import pytest

from _gpu_jobs import Launch, Scheduler
from conftest import _child_env, mpiexec_cmd

HERE = os.path.dirname(os.path.abspath(__file__))

FIRST = """
import os, sys
from _spmd import check, guarded
from mpiml.comm import get_comm

comm = get_comm()
check(os.environ.get("MPIML_TEST_BATCH_X") == "1", "the scenario's environment is missing")
check(sys.argv[1:] == ["a", "b"], f"argv {sys.argv}")
comm.mark = True  # (the next scenario must get a communicator of its own)
os.environ["MPIML_TEST_BATCH_LEAK"] = "1"  # (put back after the scenario)
guarded(lambda: check(comm.allreduce_obj(1) == comm.size, "allreduce_obj"), comm)
"""

SECOND = """
import os
from _spmd import check, guarded
from mpiml.comm import get_comm

comm = get_comm()
check(not hasattr(comm, "mark"), "the communicator of the scenario before was reused")
check("MPIML_TEST_BATCH_X" not in os.environ and "MPIML_TEST_BATCH_LEAK" not in os.environ, "environment not restored")
check(comm.rank != 1, "wrong on purpose on rank 1")
guarded(lambda: None, comm)
"""

RAISES = """
raise RuntimeError("module-level failure on purpose")
"""

LAST = """
from _spmd import guarded
from mpiml.comm import get_comm

guarded(lambda: None, get_comm())
"""


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def _run(launches, gpus, **kw):
    mpiexec_cmd(1)
    sched = Scheduler(launches, gpus, mpiexec_cmd, _child_env, **kw)
    sched.start()
    for la in launches:
        sched.wait(la.name)
    sched.stop()
    return sched


@pytest.mark.mpi
def test_batch_gives_each_scenario_its_verdict_environment_and_communicator(tmp_path):
    scen = [{"name": "first", "script": _write(tmp_path, "first.py", FIRST), "args": ["a", "b"],
             "env": {"MPIML_TEST_BATCH_X": "1"}},
            {"name": "second", "script": _write(tmp_path, "second.py", SECOND)},
            {"name": "raises", "script": _write(tmp_path, "raises.py", RAISES)},
            {"name": "last", "script": _write(tmp_path, "last.py", LAST)}]
    la = Launch("batch", 2, ngpus=1, scenarios=scen)
    sched = _run([la], ["0"], deadline=150)
    res = la.results()
    assert set(res) == {"first", "second", "raises", "last"}, la.tail()
    assert res["first"][0] and res["last"][0], la.tail()
    assert not res["second"][0] and any("rank 1: wrong on purpose on rank 1" in f for f in res["second"][2]), res
    assert not res["raises"][0] and any("module-level failure on purpose" in f for f in res["raises"][2]), res
    assert la.rc == 1 and la.killed is None
    ok, msg = sched.verdict("batch", "second")
    assert not ok and "wrong on purpose" in msg
    ok, msg = sched.verdict("batch", "first")
    assert ok, msg


SLEEPER = """
import os, sys, time
print("gpus", os.environ["CUDA_VISIBLE_DEVICES"], "start", time.time(), flush=True)
time.sleep(float(sys.argv[1]))
print("OK end", time.time(), flush=True)
"""


def _span(la):
    words = la.stdout.split()
    return float(words[words.index("start") + 1]), float(words[words.index("end") + 1])


@pytest.mark.mpi
def test_scheduler_places_launches_on_gpus_of_their_own_then_shares_and_kills_at_the_deadline(tmp_path):
    sleeper = _write(tmp_path, "sleeper.py", SLEEPER)
    gpus = ["4", "5", "6", "7"]

    def job(name, ngpus, secs, **kw):
        return Launch(name, 1, ngpus=ngpus, argv=[sleeper, secs], **kw)

    # share=1: two 2-GPU launches at once on disjoint GPUs, the 4-GPU one after both
    a, b, c = job("a", 2, 1.5), job("b", 2, 1.5), job("c", 4, 0.3)
    _run([c, a, b], gpus, share=1, deadline=120)
    assert {a.gpus[0], b.gpus[0]} <= set(gpus) and not set(a.gpus) & set(b.gpus), (a.gpus, b.gpus)
    (a0, a1), (b0, b1), (c0, c1) = _span(a), _span(b), _span(c)
    assert a0 < b1 and b0 < a1, "the disjoint launches did not overlap"
    assert c0 >= max(a1, b1) - 0.5 or c1 <= min(a0, b0) + 0.5, "the 4-GPU launch overlapped a reserving one"
    assert all(la.rc == 0 and "OK" in la.stdout for la in (a, b, c))

    # share=2: a 3-GPU launch, a 1-GPU one beside it on the fourth, then a 2-GPU one on the least held
    d, e, f = job("d", 3, 1.5), job("e", 1, 1.5), job("f", 2, 0.3)
    _run([d, e, f], gpus, share=2, deadline=120)
    assert d.gpus == gpus[:3] and e.gpus == gpus[3:], (d.gpus, e.gpus)
    assert len(f.gpus) == 2 and f.gpus[0] in gpus

    # overlays: at most `lanes` at once, on the last GPUs, not counted as held
    g, h, k = (Launch(x, 1, ngpus=1, reserve=False, argv=[sleeper, 1]) for x in "ghk")
    _run([g, h, k], gpus, lanes=2, deadline=120)
    spans = sorted(_span(x) for x in (g, h, k))
    assert spans[2][0] >= min(spans[0][1], spans[1][1]) - 0.5, "three overlays ran at once with lanes=2"
    assert g.gpus == ["7"]

    # the deadline: a launch still running is killed, one not started says so
    slow, late = job("slow", 4, 60), job("late", 4, 1)
    sched = _run([slow, late], gpus, share=1, deadline=5)
    assert slow.killed and "deadline" in slow.killed and late.killed == "not started before the deadline"
    assert sched.now() < 40


# every test of test_gpu_comm.py with its parameters (that module is skipped without CuPy)
GPU_TESTS = {
    "test_peer_failure_raises_on_every_survivor": [{"backend": b, "mode": m} for b in ("nccl", "ipc")
                                                   for m in ("stall", "kill", "sync")],
    "test_killed_peer_found_dead_without_a_timeout": [{"backend": "nccl"}, {"backend": "ipc"}],
    "test_ranks_sharing_one_gpu": [{"n": 2}, {"n": 3}],
    "test_machine_key_names_the_gpu_and_its_links": [{}],
    "test_collectives_every_backend": [{"n": n} for n in (1, 2, 3, 4)],
    "test_device_sendrecv_rings": [{"n": n} for n in (2, 3, 4)],
    "test_routes_per_mode_and_a_capture_on_the_previous_stream": [{"n": 2}, {"n": 4}],
    "test_two_level_virtual_nodes": [{}],
    "test_ipc_calls_across_streams_and_graph_replays": [{"n": n} for n in (2, 3, 4)],
    "test_repeated_calls_on_the_same_arrays_replay_pinned_graphs": [{"n": 2}, {"n": 4}],
    "test_repeated_calls_that_part_raise_at_the_next_round": [{"n": 2}, {"n": 4}],
    "test_two_shot_ll_bcast_reduce_and_nccl_events": [{"n": 2}, {"n": 3}],
    "test_relay_and_ll128": [{"n": n, "algo": a} for a in ("ipc/llrelay", "ipc/ll128", "ipc/ll128direct",
                                                           "ipc/ll128twoshot") for n in (2, 3)],
    "test_ll128_lines_under_races": [{"n": 2}, {"n": 3}],
    "test_pipelined_bcast_reduce_allreduce": [{"n": 2}, {"n": 3}],
}


def test_gpu_test_source_lists_the_tests_here():
    with open(os.path.join(HERE, "test_gpu_comm.py")) as fh:
        src = fh.read()
    names = {line.split("(")[0][4:] for line in src.splitlines() if line.startswith("def test_")}
    assert names == set(GPU_TESTS)


@pytest.mark.parametrize("ngpus", [1, 2, 3, 4])
def test_plan_runs_every_scenario_once_in_a_launch_that_fits(ngpus, tmp_path):
    """Each scenario a test reads is in exactly one planned launch, with its script's arguments; 49 launches (one a
    scenario) became 16 on 4 GPUs (the virtual-node one alone); every rank count the GPUs allow is covered; poisoning scenarios go last."""
    from _gpu_plan import needs, plan

    wanted = set()
    for name, cases in GPU_TESTS.items():
        for params in cases:
            wanted |= set(needs(name, params))
    assert len(wanted) == 49  # (the launches before: one per scenario)
    launches = plan(wanted, ngpus, str(tmp_path))
    ran = {}
    for la in launches:
        assert la.ngpus <= ngpus and (la.reserve or la.ngpus <= ngpus)
        for sc in la.scenarios or [{"name": None}]:
            key = (la.name, sc["name"])
            assert key not in ran
            ran[key] = la
            if sc["name"] is not None:
                assert os.path.exists(os.path.join(HERE, sc["script"]))
        if la.scenarios:
            names = [sc["name"] for sc in la.scenarios]
            assert "deferred" not in names or names[-1] == "deferred"
            assert "replay" not in names or names.index("replay") >= len(names) - 2
    fits = {key for key in wanted if key[0] in {la.name for la in launches}}
    assert fits <= set(ran)
    ranks = {la.n for la in launches if la.reserve}
    assert ranks == set(range(1, min(ngpus, 4) + 1))
    if ngpus == 4:
        assert set(ran) == wanted and len(launches) == 16
        assert sorted(la.n for la in launches if la.reserve) == [1, 2, 2, 3, 4, 4]
