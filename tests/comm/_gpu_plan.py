"""The scenarios of the GPU comm tests and the launches that run them (test_gpu_comm.py reads it; checked on the CPU by
test_gpu_jobs.py): which script, arguments and environment each test's scenario is, which launch it runs in, and
the launches a set of selected tests needs on a host with a given number of GPUs."""

import os
import sys

from _gpu_jobs import Launch

HERE = os.path.dirname(os.path.abspath(__file__))
LL128 = ["ipc/llrelay", "ipc/ll128", "ipc/ll128direct", "ipc/ll128twoshot"]
FAULT_MODES = ["stall", "kill", "sync"]


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
    if name == "two_level":
        # a launch of its own: after the other scenarios of a 4-rank batch had run in the same processes, its
        # 2-rank inter-node NCCL leg failed with NCCL_ERROR_INVALID_ARGUMENT on 4 x H200 (2026-11-28), while the
        # same script alone passed (11 s); the virtual nodes are set when the processes start, as a user sets them
        return "two_level4"
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
    launches = []
    for name, n in (("batch3", 3), ("batch4", 4), ("batch2a", 2), ("batch2b", 2), ("two_level4", 4), ("batch1", 1)):
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


def visible(ngpus):
    """The first ``ngpus`` visible GPU ids (``CUDA_VISIBLE_DEVICES``, else 0 .. ngpus - 1)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [g.strip() for g in env.split(",") if g.strip()] if env else []
    return ids[:ngpus] if len(ids) >= ngpus else [str(i) for i in range(ngpus)]
