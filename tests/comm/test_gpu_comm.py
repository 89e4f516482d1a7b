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

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.mpi, pytest.mark.slow]

cupy = pytest.importorskip("cupy")

from _gpu_plan import FAULT_MODES, LL128, needs, plan, visible  # noqa: E402


def _gpus():
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def _need(n):
    if _gpus() < n:
        pytest.skip(f"needs {n} GPUs, found {_gpus()}")


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
    sched = Scheduler(launches, visible(ngpus), mpiexec_cmd, _child_env,
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
