"""Device collectives on the GPU host: staged MPI, NCCL, IPC; eager and in CUDA graphs.

Each test launches ``mpirun -n N`` (N = 1, 2, 3, 4, where that many GPUs exist)
on a script under ``tests/comm/`` that checks every op x dtype x size x backend
collectively.  On the GPU host set ``MPIML_TEST_MPIEXEC_ARGS="--allow-run-as-root
--bind-to none --oversubscribe"`` (``scripts/device_pass.sh`` does).
Skipped without a GPU.
"""

import os

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.mpi, pytest.mark.slow]

cupy = pytest.importorskip("cupy")

HERE = os.path.dirname(os.path.abspath(__file__))


def _gpus():
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def _need(n):
    if _gpus() < n:
        pytest.skip(f"needs {n} GPUs, found {_gpus()}")


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_collectives_every_backend(mpi, n):
    _need(n)
    backends = "mpi,nccl,ipc" if n != 3 else "nccl,ipc"
    proc = mpi(os.path.join(HERE, "gpu_collectives.py"), n, backends, "--graph", timeout=600,
               env={"MPIML_TIMEOUT": "60"})
    assert "OK" in proc.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_ranks_sharing_one_gpu(mpi, n):
    """n ranks on one GPU: nccl / ipc refused on every rank (by name, or skipped by auto), and every
    collective correct through the staged MPI path (auto, mpi/native, the pipelined mpi/ring)."""
    _need(1)
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    proc = mpi(os.path.join(HERE, "gpu_collectives.py"), n, "mpi,auto", "--shared", timeout=600,
               env={"MPIML_TIMEOUT": "60", "CUDA_VISIBLE_DEVICES": first})
    assert "OK" in proc.stdout


@pytest.mark.parametrize("mode", ["stall", "kill", "sync"])
@pytest.mark.parametrize("backend", ["nccl", "ipc"])
def test_peer_failure_raises_on_every_survivor(mpi, backend, mode):
    """A stalled or killed peer: every survivor raises within MPIML_TIMEOUT + 5 s, stream-ordered."""
    n = min(_gpus(), 4)
    if n < 2:
        pytest.skip("needs 2 GPUs")
    env = {"MPIML_TIMEOUT": "3", "MPIML_DEVICE_SYNC": "1" if mode == "sync" else "0"}
    if mode == "kill":
        # Open MPI: let the others go on when a rank exits without MPI_Finalize
        env["OMPI_MCA_orte_allowed_exit_without_sync"] = "1"
    proc = mpi(os.path.join(HERE, "gpu_timeout.py"), n, backend, mode, timeout=120, env=env,
               expect_ok=mode != "kill")
    assert "OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ipc_calls_across_streams_and_graph_replays(mpi, n):
    """3000 IPC collectives of every algorithm, hopping between three streams with no host wait, one rank
    made late at a time, graph replays between them; every result checked on the device. Two kernels of
    one workspace running at once on a rank (the 4-GPU hang of gpu_collectives.py --graph) hang or
    corrupt here within MPIML_TIMEOUT."""
    _need(n)
    proc = mpi(os.path.join(HERE, "gpu_stress_epochs.py"), n, "--calls", "3000", timeout=300,
               env={"MPIML_TIMEOUT": "30"})
    assert "OK" in proc.stdout


@pytest.mark.parametrize("n", [2, 4])
def test_repeated_calls_on_the_same_arrays_replay_pinned_graphs(mpi, n):
    """Every IPC collective repeated on the same arrays (pinned: one-node CUDA graphs replayed) over stream hops,
    an ExternalStream and a user's capture, every result checked; one replayed call too many on one rank is
    found at the next round on every rank and its kernel freed."""
    _need(n)
    proc = mpi(os.path.join(HERE, "gpu_replay.py"), n, timeout=300, env={"MPIML_TIMEOUT": "30"})
    assert "OK" in proc.stdout


def test_two_level_virtual_nodes(mpi):
    _need(4)
    proc = mpi(os.path.join(HERE, "gpu_collectives.py"), 4, "ipc", "--graph", timeout=600,
               env={"MPIML_TIMEOUT": "60", "MPIML_NODE_SIZE": "2"})
    assert "OK" in proc.stdout


@pytest.mark.parametrize("n", [2, 4])
def test_routes_per_mode_and_a_capture_on_the_previous_stream(mpi, n):
    """bcast / reduce of 256 KiB-1 MiB eagerly, in a replayed graph and eagerly again (a table of the script's
    own: the two-shot eagerly, NCCL in graphs; 4 ranks: one hot launcher per mode); an eager call on another stream while the previous
    call's stream is being captured: right, or a CommError saying to synchronize first."""
    _need(n)
    proc = mpi(os.path.join(HERE, "gpu_modes.py"), n, timeout=300, env={"MPIML_TIMEOUT": "60"})
    assert "OK" in proc.stdout


@pytest.mark.parametrize("n", [2, 3, 4])
def test_device_sendrecv_rings(mpi, n):
    """comm.isendrecv of CuPy arrays goes over NCCL, stream-ordered, rank-specific shapes and dtypes."""
    _need(n)
    proc = mpi(os.path.join(HERE, "gpu_sendrecv.py"), n, timeout=300, env={"MPIML_TIMEOUT": "60"})
    assert "OK" in proc.stdout


@pytest.mark.parametrize("n", [2, 4])
def test_repeated_calls_that_part_raise_at_the_next_round(mpi, n):
    """Repeats of agreed device calls run unchecked; their mismatch is raised on every rank at the next round."""
    _need(n)
    proc = mpi(os.path.join(HERE, "gpu_deferred.py"), n, "ipc,nccl", timeout=300, env={"MPIML_TIMEOUT": "30"})
    assert "OK" in proc.stdout


@pytest.mark.parametrize("backend", ["nccl", "ipc"])
def test_killed_peer_found_dead_without_a_timeout(mpi, backend, tmp_path):
    """SIGKILL with stream-ordered calls in flight, the launcher lets the job go on, MPIML_TIMEOUT
    unset: every survivor raises CommAbortedError naming the dead rank within 5 s."""
    import sys

    n = min(_gpus(), 4)
    if n < 2:
        pytest.skip("needs 2 GPUs")
    keep = os.path.join(HERE, "..", "faults", "keep_survivors.py")
    env = {"MPIML_TIMEOUT": "", "MPIML_FAULT_OUT": str(tmp_path)}
    proc = mpi(keep, n, str(tmp_path), str(n - 1), sys.executable, os.path.join(HERE, "gpu_timeout.py"), backend,
               "dead", timeout=180, env=env, expect_ok=False)
    assert "OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


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


@pytest.mark.parametrize("n", [2, 3])  # (4 ranks: in the comm part of scripts/device_pass.sh's runs)
def test_two_shot_ll_bcast_reduce_and_nccl_events(mpi, n):
    """ipc/lltwoshot bcast, reduce and allreduce (every dtype, root, chunking, the hot launcher, graphs) and the
    NCCL watchdog's events on a held stream (a handful for a burst, not one a call)."""
    _need(n)
    proc = mpi(os.path.join(HERE, "gpu_variants.py"), n, timeout=300, env={"MPIML_TIMEOUT": "30"})
    assert "OK" in proc.stdout


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("algo", ["ipc/llrelay", "ipc/ll128", "ipc/ll128direct", "ipc/ll128twoshot"])
def test_relay_and_ll128(mpi, n, algo):
    """ipc/llrelay (reduce: the parts owned by the non-roots, reduced lines relayed to the root), ipc/ll128 (the
    relay and the LL two-shot allreduce in 128-byte lines of 120 payload bytes), ipc/ll128direct (reduce: the
    non-roots' LL128 lines straight to the root) and ipc/ll128twoshot (reduce: the LL128 two-shot, its parts
    gathered at the root): every dtype, op, root, chunking, offsets, the hot launcher,
    graphs, beside the LL two-shot's other ops."""
    _need(n)
    proc = mpi(os.path.join(HERE, "gpu_variants.py"), n, algo, timeout=300, env={"MPIML_TIMEOUT": "30"})
    assert "OK" in proc.stdout
    if algo != "ipc/llrelay":  # 1 MiB staging buffers: several LL128 launches a call
        proc = mpi(os.path.join(HERE, "gpu_variants.py"), n, algo, timeout=300,
                   env={"MPIML_TIMEOUT": "30", "MPIML_IPC_BYTES": "1048576"})
        assert "OK" in proc.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_ll128_lines_under_races(mpi, n):
    """Every LL128 path at sizes ending in a partial line, peers late by random spins, every result checked (the
    soak's wrong words of 2026-11-28: a diverged warp loaded a line in two groups)."""
    _need(n)
    proc = mpi(os.path.join(HERE, "gpu_ll128_lines.py"), n, "--calls", "500", timeout=300,
               env={"MPIML_TIMEOUT": "30"})
    assert "OK" in proc.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_pipelined_bcast_reduce_allreduce(mpi, n):
    """ipc/pipe bcast, reduce and allreduce (every dtype, root, op, the hot launcher, graphs): once as shipped, once
    with a 1 MiB staging buffer (several chunks a call) and 3 blocks of 5 steps (a block takes several steps)."""
    _need(n)
    script = os.path.join(HERE, "gpu_variants.py")
    proc = mpi(script, n, "ipc/pipe", timeout=300, env={"MPIML_TIMEOUT": "30"})
    assert "OK" in proc.stdout
    proc = mpi(script, n, "ipc/pipe", timeout=300, env={"MPIML_TIMEOUT": "30", "MPIML_IPC_BYTES": "1048576",
                                                        "MPIML_IPC_PIPE_BLOCKS": "3", "MPIML_IPC_PIPE_ROUNDS": "5"})
    assert "OK" in proc.stdout
