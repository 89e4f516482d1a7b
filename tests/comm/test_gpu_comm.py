"""Device collectives on the GPU host: staged MPI, NCCL, IPC; eager and in CUDA graphs; peers that stall or die.

Each test checks one scenario: a script under ``tests/comm/`` that checks every op x dtype x size x backend
(or one path, or one failure) collectively, at N = 1, 2, 3, 4 ranks where that many GPUs exist.  The scripts
run in few launches (tests/comm/_gpu_jobs.py): the happy-path scenarios of one rank count share a launch
(``gpu_batch.py``: one start-up, a communicator and a verdict a scenario), launches on disjoint GPUs run at once
(the two 2-rank ones on GPUs 0,1 and 2,3, the 1-rank one beside the 3-rank one), and the peer-failure launches
and the ranks sharing one GPU run beside them; so ``pytest -m gpu tests/comm`` takes one start-up a launch, not
one a test (49 launches in series before, ~10 minutes on 4 x H100).  A scenario that fails fails its own test;
a launch that hangs is killed at ``MPIML_TEST_GPU_BUDGET`` seconds (default 220) and fails the scenarios it had
not finished.  ``MPIML_TEST_JOBS_DIR``: every launch's output and a timeline are written there.

On the GPU host set ``MPIML_TEST_MPIEXEC_ARGS="--allow-run-as-root --bind-to none --oversubscribe"``
(``scripts/device_pass.sh`` does).  Skipped without a GPU.
"""

import os
import sys

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.mpi, pytest.mark.slow]

cupy = pytest.importorskip("cupy")

HERE = os.path.dirname(os.path.abspath(__file__))
LL128 = ["ipc/llrelay", "ipc/ll128", "ipc/ll128direct", "ipc/ll128twoshot"]
FAULT_MODES = ["stall", "kill", "sync"]


def _gpus():
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def _need(n):
    if _gpus() < n:
        pytest.skip(f"needs {n} GPUs, found {_gpus()}")


# ---------------------------------------------------------------------- the scenarios and their launches
def scenarios(n):
    """``(name, script, args, env, cost)`` of the happy-path scenarios at ``n`` ranks, in the order a launch runs
    them (those that poison communicators of their own on purpose last); ``cost``: a guess in seconds, which
    splits the 2-rank ones in two launches."""
    t30, t60 = {"MPIML_TIMEOUT": "30"}, {"MPIML_TIMEOUT": "60"}
    mib = {"MPIML_TIMEOUT": "30", "MPIML_IPC_BYTES": "1048576"}  # 1 MiB staging buffers: several launches a call
    out = [("collectives", "gpu_collectives.py", ["mpi,nccl,ipc" if n != 3 else "nccl,ipc", "--graph"], t60, 20)]
    if n == 1:
        return out
    out += [("sendrecv", "gpu_sendrecv.py", [], t60, 2)]
    if n in (2, 4):
        out += [("modes", "gpu_modes.py", [], t60, 3)]
    if n == 4:
        out += [("two_level", "gpu_collectives.py", ["ipc", "--graph"], {**t60, "MPIML_NODE_SIZE": "2"}, 15)]
    if n in (2, 3):
        out += [("lltwoshot", "gpu_variants.py", [], t30, 8),
                ("ll128_lines", "gpu_ll128_lines.py", ["--calls", "500"], t30, 6),
                ("ipc/pipe", "gpu_variants.py", ["ipc/pipe"], t30, 6),
                ("ipc/pipe@chunks", "gpu_variants.py", ["ipc/pipe"],
                 {**mib, "MPIML_IPC_PIPE_BLOCKS": "3", "MPIML_IPC_PIPE_ROUNDS": "5"}, 6)]
        for algo in LL128:
            out += [(algo, "gpu_variants.py", [algo], t30, 6)]
            if algo != "ipc/llrelay":
                out += [(f"{algo}@1MiB", "gpu_variants.py", [algo], mib, 6)]
    out += [("stress", "gpu_stress_epochs.py", ["--calls", "3000"], t30, 6)]
    if n in (2, 4):
        out += [("replay", "gpu_replay.py", [], t30, 6),
                ("deferred", "gpu_deferred.py", ["ipc,nccl"], t30, 5)]
    return out


def _batch_of(n, name):
    """The launch of the scenario ``name`` at ``n`` ranks: one a rank count, two at 2 ranks (side by side)."""
    if n != 2:
        return f"batch{n}"
    return "batch2b" if name in _SECOND_2 else "batch2a"


# the 2-rank launch beside the first: most of the opt-in IPC paths, about half of the guessed cost
_SECOND_2 = {"ipc/llrelay", "ipc/ll128", "ipc/ll128@1MiB", "ipc/ll128direct", "ipc/ll128direct@1MiB",
             "ipc/ll128twoshot", "ipc/ll128twoshot@1MiB", "ll128_lines"}


def _fault_env(mode):
    env = {"MPIML_TIMEOUT": "3", "MPIML_DEVICE_SYNC": "1" if mode == "sync" else "0",
           "OMPI_MCA_mpi_yield_when_idle": "1"}  # (the survivors wait for the stalled rank beside other launches)
    if mode == "kill":
        # Open MPI: let the others go on when a rank exits without MPI_Finalize
        env["OMPI_MCA_orte_allowed_exit_without_sync"] = "1"
    return env


def needs(item_name, params):
    """``[(launch, scenario or None)]`` a test (its function's name and parameters) reads."""
    n = params.get("n")
    if item_name == "test_ranks_sharing_one_gpu":
        return [(f"shared{n}", "shared")]
    if item_name == "test_peer_failure_raises_on_every_survivor":
        return [(f"fault-{params['backend']}-{params['mode']}", None)]
    if item_name == "test_killed_peer_found_dead_without_a_timeout":
        return [(f"dead-{params['backend']}", None)]
    if item_name == "test_machine_key_names_the_gpu_and_its_links":
        return []
    if item_name == "test_two_level_virtual_nodes":
        n, names = 4, ["two_level"]
    elif item_name == "test_relay_and_ll128":
        algo = params["algo"]
        names = [algo] if algo == "ipc/llrelay" else [algo, f"{algo}@1MiB"]
    else:
        names = _TEST_SCENARIO[item_name]
        names = names if isinstance(names, list) else [names]
    return [(_batch_of(n, name), name) for name in names]


_TEST_SCENARIO = {
    "test_collectives_every_backend": "collectives",
    "test_ipc_calls_across_streams_and_graph_replays": "stress",
    "test_repeated_calls_on_the_same_arrays_replay_pinned_graphs": "replay",
    "test_routes_per_mode_and_a_capture_on_the_previous_stream": "modes",
    "test_device_sendrecv_rings": "sendrecv",
    "test_repeated_calls_that_part_raise_at_the_next_round": "deferred",
    "test_two_shot_ll_bcast_reduce_and_nccl_events": "lltwoshot",
    "test_ll128_lines_under_races": "ll128_lines",
    "test_pipelined_bcast_reduce_allreduce": ["ipc/pipe", "ipc/pipe@chunks"],
}


def plan(wanted, ngpus, fault_dir):
    """The launches that serve ``wanted`` (a set of ``(launch, scenario)``) on ``ngpus`` GPUs, in the order they
    should start (the longest first: the 3-rank batch, the 4-rank one, the two 2-rank ones; the 1-rank one where
    a GPU is left); the overlays (peer failures, ranks sharing a GPU) beside them from the start."""
    from _gpu_jobs import Launch

    launches = []
    for name, n in (("batch3", 3), ("batch4", 4), ("batch2a", 2), ("batch2b", 2), ("batch1", 1)):
        if n > ngpus:
            continue
        chosen = [s for s in scenarios(n) if (name, s[0]) in wanted and _batch_of(n, s[0]) == name]
        if chosen:
            launches.append(Launch(name, n, scenarios=[{"name": s[0], "script": s[1], "args": s[2], "env": s[3]}
                                                       for s in chosen]))
    nf = min(ngpus, 4)
    if nf >= 2:
        for backend in ("nccl", "ipc"):
            for mode in FAULT_MODES:
                if (f"fault-{backend}-{mode}", None) in wanted:
                    launches.append(Launch(f"fault-{backend}-{mode}", nf, reserve=False, timeout=120,
                                           env=_fault_env(mode), expect_ok=mode != "kill",
                                           argv=[os.path.join(HERE, "gpu_timeout.py"), backend, mode]))
            if (f"dead-{backend}", None) in wanted:
                out = os.path.join(fault_dir, backend)
                os.makedirs(out, exist_ok=True)
                keep = os.path.join(HERE, "..", "faults", "keep_survivors.py")
                launches.append(Launch(f"dead-{backend}", nf, reserve=False, timeout=180, expect_ok=False,
                                       env={"MPIML_TIMEOUT": "", "MPIML_FAULT_OUT": out,
                                            "OMPI_MCA_mpi_yield_when_idle": "1"},
                                       argv=[keep, out, str(nf - 1), sys.executable,
                                             os.path.join(HERE, "gpu_timeout.py"), backend, "dead"]))
    if ngpus >= 1:
        for n in (2, 3):  # n ranks on one GPU: staged through host memory (nccl and ipc refused)
            if (f"shared{n}", "shared") in wanted:
                launches.append(Launch(f"shared{n}", n, reserve=False, ngpus=1, scenarios=[
                    {"name": "shared", "script": "gpu_collectives.py", "args": ["mpi,auto", "--shared"],
                     "env": {"MPIML_TIMEOUT": "60"}}]))
    return launches


def _visible(ngpus):
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [g.strip() for g in env.split(",") if g.strip()] if env else []
    return ids[:ngpus] if len(ids) >= ngpus else [str(i) for i in range(ngpus)]


@pytest.fixture(scope="module")
def jobs(request, tmp_path_factory):
    """The scheduler of this module's launches: started at the first test that reads one, with the launches
    every selected test of this module needs."""
    from _gpu_jobs import Scheduler
    from conftest import _child_env, mpiexec_cmd

    mpiexec_cmd(1)  # (skips here, in the test, when there is no launcher)
    ngpus = _gpus()
    wanted = set()
    for item in request.session.items:
        if getattr(item, "module", None) is not request.module:
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        wanted |= set(needs(item.originalname, params))
    launches = plan(wanted, ngpus, str(tmp_path_factory.mktemp("faults")))
    sched = Scheduler(launches, _visible(ngpus), mpiexec_cmd, _child_env,
                      lanes=int(os.environ.get("MPIML_TEST_GPU_LANES", "3")),
                      share=int(os.environ.get("MPIML_TEST_GPU_SHARE", "2")),
                      deadline=float(os.environ.get("MPIML_TEST_GPU_BUDGET", "220")),
                      jobs_dir=os.environ.get("MPIML_TEST_JOBS_DIR") or None)
    sched.start()
    yield sched
    sched.stop()
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("")
        reporter.write_line(f"GPU comm launches ({len(launches)} on GPUs {','.join(sched.gpus)}):")
        for line in sched.log:
            reporter.write_line("  " + line)


def _scenarios_pass(jobs, item_name, **params):
    msgs, ok = [], True
    for launch, scenario in needs(item_name, params):
        good, msg = jobs.verdict(launch, scenario)
        ok &= good
        msgs.append(msg)
    assert ok, "\n".join(msgs)


def _plain_ok(jobs, launch):
    la = jobs.wait(launch)
    assert la.done.is_set() and la.proc is not None, la.describe()
    assert not la.killed, f"{la.describe()}\n{la.tail()}"
    if la.expect_ok:
        assert la.rc == 0, f"{la.describe()}\n{la.tail()}"
    assert "OK" in la.stdout, f"{la.describe()}\n{la.tail()}"


# ---------------------------------------------------------------------- the tests (in about the order they end)
@pytest.mark.parametrize("mode", FAULT_MODES)
@pytest.mark.parametrize("backend", ["nccl", "ipc"])
def test_peer_failure_raises_on_every_survivor(jobs, backend, mode):
    """A stalled or killed peer: every survivor raises within MPIML_TIMEOUT + 5 s, stream-ordered."""
    if min(_gpus(), 4) < 2:
        pytest.skip("needs 2 GPUs")
    _plain_ok(jobs, f"fault-{backend}-{mode}")


@pytest.mark.parametrize("backend", ["nccl", "ipc"])
def test_killed_peer_found_dead_without_a_timeout(jobs, backend):
    """SIGKILL with stream-ordered calls in flight, the launcher lets the job go on, MPIML_TIMEOUT
    unset: every survivor raises CommAbortedError naming the dead rank within 5 s."""
    if min(_gpus(), 4) < 2:
        pytest.skip("needs 2 GPUs")
    _plain_ok(jobs, f"dead-{backend}")


@pytest.mark.parametrize("n", [2, 3])
def test_ranks_sharing_one_gpu(jobs, n):
    """n ranks on one GPU: nccl / ipc refused on every rank (by name, or skipped by auto), and every
    collective correct through the staged MPI path (auto, mpi/native, the pipelined mpi/ring)."""
    _need(1)
    _scenarios_pass(jobs, "test_ranks_sharing_one_gpu", n=n)


def test_machine_key_names_the_gpu_and_its_links():
    """The key of this machine's tuning table: the GPU's name, then its NVLinks (or PCIe)."""
    _need(1)
    from mpiml.comm._tuning import machine_key, machine_slug

    key = machine_key()
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    assert key.startswith(name + ", ") and (key.endswith(" NVLinks") or key.endswith(", PCIe")), key
    if _gpus() > 1 and cupy.cuda.runtime.deviceCanAccessPeer(0, 1):
        print(key, machine_slug(key))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_collectives_every_backend(jobs, n):
    """Every op x dtype x size x backend (3 ranks: nccl and ipc; the staged MPI path elsewhere), graphs too."""
    _need(n)
    _scenarios_pass(jobs, "test_collectives_every_backend", n=n)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_device_sendrecv_rings(jobs, n):
    """comm.isendrecv of CuPy arrays goes over NCCL, stream-ordered, rank-specific shapes and dtypes."""
    _need(n)
    _scenarios_pass(jobs, "test_device_sendrecv_rings", n=n)


@pytest.mark.parametrize("n", [2, 4])
def test_routes_per_mode_and_a_capture_on_the_previous_stream(jobs, n):
    """bcast / reduce of 256 KiB-1 MiB eagerly, in a replayed graph and eagerly again (a table of the script's
    own: the two-shot eagerly, NCCL in graphs; 4 ranks: one hot launcher per mode); an eager call on another
    stream while the previous call's stream is being captured: right, or a CommError saying to synchronize
    first."""
    _need(n)
    _scenarios_pass(jobs, "test_routes_per_mode_and_a_capture_on_the_previous_stream", n=n)


def test_two_level_virtual_nodes(jobs):
    """MPIML_NODE_SIZE=2 at 4 ranks: the ipc collectives (graphs too) through the two-level transport."""
    _need(4)
    _scenarios_pass(jobs, "test_two_level_virtual_nodes")


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ipc_calls_across_streams_and_graph_replays(jobs, n):
    """3000 IPC collectives of every algorithm, hopping between three streams with no host wait, one rank
    made late at a time, graph replays between them; every result checked on the device. Two kernels of
    one workspace running at once on a rank (the 4-GPU hang of gpu_collectives.py --graph) hang or
    corrupt here within MPIML_TIMEOUT."""
    _need(n)
    _scenarios_pass(jobs, "test_ipc_calls_across_streams_and_graph_replays", n=n)


@pytest.mark.parametrize("n", [2, 4])
def test_repeated_calls_on_the_same_arrays_replay_pinned_graphs(jobs, n):
    """Every IPC collective repeated on the same arrays (pinned: one-node CUDA graphs replayed) over stream hops,
    an ExternalStream and a user's capture, every result checked; one replayed call too many on one rank is
    found at the next round on every rank and its kernel freed."""
    _need(n)
    _scenarios_pass(jobs, "test_repeated_calls_on_the_same_arrays_replay_pinned_graphs", n=n)


@pytest.mark.parametrize("n", [2, 4])
def test_repeated_calls_that_part_raise_at_the_next_round(jobs, n):
    """Repeats of agreed device calls run unchecked; their mismatch is raised on every rank at the next round."""
    _need(n)
    _scenarios_pass(jobs, "test_repeated_calls_that_part_raise_at_the_next_round", n=n)


@pytest.mark.parametrize("n", [2, 3])  # (4 ranks: in the comm part of scripts/device_pass.sh's runs)
def test_two_shot_ll_bcast_reduce_and_nccl_events(jobs, n):
    """ipc/lltwoshot bcast, reduce and allreduce (every dtype, root, chunking, the hot launcher, graphs) and the
    NCCL watchdog's events on a held stream (a handful for a burst, not one a call)."""
    _need(n)
    _scenarios_pass(jobs, "test_two_shot_ll_bcast_reduce_and_nccl_events", n=n)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("algo", LL128)
def test_relay_and_ll128(jobs, n, algo):
    """ipc/llrelay (reduce: the parts owned by the non-roots, reduced lines relayed to the root), ipc/ll128 (the
    relay and the LL two-shot allreduce in 128-byte lines of 120 payload bytes), ipc/ll128direct (reduce: the
    non-roots' LL128 lines straight to the root) and ipc/ll128twoshot (reduce: the LL128 two-shot, its parts
    gathered at the root): every dtype, op, root, chunking, offsets, the hot launcher, graphs, beside the LL
    two-shot's other ops; all but the relay also with 1 MiB staging buffers (several LL128 launches a call)."""
    _need(n)
    _scenarios_pass(jobs, "test_relay_and_ll128", n=n, algo=algo)


@pytest.mark.parametrize("n", [2, 3])
def test_ll128_lines_under_races(jobs, n):
    """Every LL128 path at sizes ending in a partial line, peers late by random spins, every result checked (the
    soak's wrong words of 2026-11-28: a diverged warp loaded a line in two groups)."""
    _need(n)
    _scenarios_pass(jobs, "test_ll128_lines_under_races", n=n)


@pytest.mark.parametrize("n", [2, 3])
def test_pipelined_bcast_reduce_allreduce(jobs, n):
    """ipc/pipe bcast, reduce and allreduce (every dtype, root, op, the hot launcher, graphs): once as shipped, once
    with a 1 MiB staging buffer (several chunks a call) and 3 blocks of 5 steps (a block takes several steps)."""
    _need(n)
    _scenarios_pass(jobs, "test_pipelined_bcast_reduce_allreduce", n=n)
