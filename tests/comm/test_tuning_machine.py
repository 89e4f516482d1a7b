"""Tuning tables keyed by the GPU model and its links: where they are written, how they are ordered."""

import json

from mpiml.comm._tuning import TuningTable, load_keyed_rules, machine_slug, machine_table_path

KEY = "NVIDIA H100 80GB HBM3, 18 NVLinks"
RULE = {"op": "allreduce", "memory": "device", "backend": "nccl", "algorithm": "native"}


def test_slug_and_path_name_the_model_and_links():
    assert machine_slug(KEY) == "nvidia-h100-80gb-hbm3-18-nvlinks"
    assert machine_slug("NVIDIA H200, PCIe") == "nvidia-h200-pcie"
    assert machine_table_path(KEY, "/x/y/tuning.json") == "/x/y/tuning-nvidia-h100-80gb-hbm3-18-nvlinks.json"


def test_the_machines_rules_come_before_the_defaults_and_after_an_explicit_file(tmp_path):
    own = tmp_path / "tuning.json"
    own.write_text(json.dumps({"rules": [{**RULE, "backend": "mpi", "algorithm": "ring"}]}))
    keyed = machine_table_path(KEY, str(own))
    with open(keyed, "w") as f:
        json.dump({"machine_key": KEY, "rules": [RULE]}, f)
    rules = load_keyed_rules(KEY, str(own))
    assert [dict(r)["backend"] for r in rules] == ["nccl"]
    avail = ("mpi", "nccl", "ipc")
    plain = TuningTable.from_config(str(tmp_path / "none.json"), "")
    assert plain.machine is None and plain.choose("allreduce", 8, 4, "device", avail) == ("ipc", "ll")
    keyed_table = plain.with_machine(KEY, rules)
    assert keyed_table.machine == KEY and keyed_table.choose("allreduce", 8, 4, "device", avail) == ("nccl", "native")
    explicit = TuningTable.from_config(str(own), "", explicit=True).with_machine(KEY, rules)
    assert explicit.choose("allreduce", 8, 4, "device", avail) == ("mpi", "ring")  # the named file wins
    again = TuningTable.from_data(explicit.to_data())  # what rank 0 broadcasts
    assert again.machine == KEY and again.explicit == 1 and again.rules == explicit.rules
    assert load_keyed_rules("Unknown GPU, PCIe", str(own)) == []


def test_four_rank_defaults_route_where_the_4xh100_run_measured_a_win():
    """The checked-in 4-rank device rules (vs_nccl.py on 4 x H100, 2026-11-27/28): LL to 256 KiB (allreduce: to
    64 KiB, then LL128 to 3 MiB and the pushed two-shot to 16 MiB; bcast: to 64 KiB, then the LL two-shot to 1 MiB,
    the pipelined two-shot to 4 MiB), reduce above 256 KiB the direct LL128 reduce to 768 KiB and the LL128 two-shot to
    4 MiB, then NCCL (pass 1 of 2026-11-28 04:25), the pushed allgather to 16 MiB and the pull to 64 MiB, reduce_scatter's
    LL kernel to 512 KiB, the LL128 one to 3 MiB (05:40), the one-shot to 16 MiB;
    NCCL beyond; every other rank count unchanged."""
    from mpiml.comm._tuning import TuningTable, load_default_rules

    table = TuningTable(load_default_rules())
    avail = ("mpi", "nccl", "ipc")
    want = {
        ("allreduce", 4): ("ipc", "ll"), ("allreduce", 64 << 10): ("ipc", "ll"),
        ("allreduce", (64 << 10) + 4): ("ipc", "ll128"), ("allreduce", 1 << 20): ("ipc", "ll128"),
        ("allreduce", 3 << 20): ("ipc", "ll128"), ("allreduce", (3 << 20) + 4): ("ipc", "twoshot"),
        ("allreduce", 4 << 20): ("ipc", "twoshot"),
        ("allreduce", 16 << 20): ("ipc", "twoshot"),
        ("allreduce", 64 << 20): ("nccl", "native"),
        ("bcast", 64 << 10): ("ipc", "ll"), ("bcast", (64 << 10) + 4): ("ipc", "lltwoshot"),
        ("bcast", 1 << 20): ("ipc", "lltwoshot"), ("bcast", (1 << 20) + 4): ("ipc", "pipe"),
        ("bcast", 4 << 20): ("ipc", "pipe"), ("bcast", (4 << 20) + 4): ("nccl", "native"),
        ("reduce", 256 << 10): ("ipc", "ll"), ("reduce", (256 << 10) + 4): ("ipc", "ll128direct"),
        ("reduce", 768 << 10): ("ipc", "ll128direct"), ("reduce", 1 << 20): ("ipc", "ll128twoshot"),
        ("reduce", 4 << 20): ("ipc", "ll128twoshot"), ("reduce", (4 << 20) + 4): ("nccl", "native"),
        ("allgather", 256 << 10): ("ipc", "ll"), ("allgather", 1 << 20): ("ipc", "push"),
        ("allgather", 16 << 20): ("ipc", "push"), ("allgather", 64 << 20): ("ipc", "pull"),
        ("allgather", 256 << 20): ("nccl", "native"),
        ("reduce_scatter", 512 << 10): ("ipc", "native"), ("reduce_scatter", 768 << 10): ("ipc", "ll128"),
        ("reduce_scatter", 1 << 20): ("ipc", "ll128"),
        ("reduce_scatter", 3 << 20): ("ipc", "ll128"), ("reduce_scatter", 4 << 20): ("ipc", "native"),
        ("reduce_scatter", 16 << 20): ("ipc", "native"), ("reduce_scatter", 64 << 20): ("nccl", "native"),
    }
    for (op, nbytes), route in want.items():
        for mode in ("eager", "graph"):
            assert table.choose(op, nbytes, 4, "device", avail, mode) == route, (op, nbytes, mode)
    # 2 ranks (the 2 x H100 run of 04:10, keys defaults_0410 and tuned_run_0410): LL to 256 KiB for every op (main's rules sent a 1 KiB
    # allreduce to NCCL and small reduces to the one-shot), NCCL for the 64 MiB allreduce and reduce
    two = {("allreduce", 1 << 10): ("ipc", "ll"), ("allreduce", 1 << 20): ("ipc", "ll128"),
           ("allreduce", 4 << 20): ("ipc", "oneshot"), ("allreduce", 16 << 20): ("ipc", "pipe"),
           ("allreduce", 64 << 20): ("nccl", "native"),
           ("reduce", 4): ("ipc", "ll"), ("reduce", 256 << 10): ("ipc", "ll"), ("reduce", 1 << 20): ("ipc", "ll128direct"),
           ("reduce", 4 << 20): ("ipc", "oneshot"), ("reduce", 64 << 20): ("nccl", "native"),
           ("bcast", 64 << 10): ("ipc", "ll"), ("bcast", 1 << 20): ("ipc", "lltwoshot"), ("bcast", 4 << 20): ("ipc", "pull"),
           ("bcast", 64 << 20): ("nccl", "native"),
           ("allgather", 1 << 10): ("ipc", "ll"), ("allgather", 4 << 20): ("ipc", "push"),
           ("allgather", 64 << 20): ("ipc", "pull"), ("allgather", 256 << 20): ("nccl", "native"),
           ("reduce_scatter", 16 << 20): ("ipc", "native"), ("reduce_scatter", 64 << 20): ("nccl", "native")}
    for (op, nbytes), route in two.items():
        for mode in ("eager", "graph"):
            assert table.choose(op, nbytes, 2, "device", avail, mode) == route, (op, nbytes, mode)
    # 3 ranks keep the generic rules (nothing measured there)
    assert table.choose("allreduce", 1 << 20, 3, "device", avail) == ("nccl", "native")
    assert table.choose("allgather", 1 << 20, 3, "device", avail) == ("ipc", "pull")


def test_mode_launchers_pick_the_launcher_of_the_current_mode():
    """A call shape routed differently in a CUDA graph keeps one hot launcher per mode; a mode without one
    yet takes the full path (None), which routes by mode and adds its launcher."""
    from mpiml.comm._communicator import _ModeLaunchers

    capturing = [False]
    hot = _ModeLaunchers(capturing=lambda: capturing[0])
    assert hot("x", None) is None
    hot.eager = lambda x, out: ("eager", x)
    assert hot("x", None) == ("eager", "x")
    capturing[0] = True
    assert hot("x", None) is None
    hot.graph = lambda x, out: ("graph", x)
    assert hot("x", None) == ("graph", "x")
    capturing[0] = False
    assert hot("y", None) == ("eager", "y")


def test_mode_split_follows_the_table_the_override_and_the_preference():
    import types

    from mpiml.comm._communicator import Communicator
    from mpiml.comm._tuning import Rule, TuningTable

    table = TuningTable([
        Rule(op="bcast", memory="device", mode="eager", max_bytes=1 << 20, backend="ipc", algorithm="twoshot"),
        Rule(op="*", memory="device", backend="nccl", algorithm="native"),
    ])
    fake = types.SimpleNamespace(_tuning=table, prefer="auto", _world=types.SimpleNamespace(name="mpi"), size=4,
                                 available_backends=lambda memory: ("mpi", "nccl", "ipc"))
    split = Communicator._mode_split
    assert split(fake, "bcast", 1 << 20) and not split(fake, "bcast", 4 << 20) and not split(fake, "allreduce", 4)
    fake.prefer = "nccl"  # a preferred backend routes alike in both modes
    assert not split(fake, "bcast", 1 << 20)
    fake.prefer, table.override = "auto", {"bcast": ("nccl", "native")}
    assert not split(fake, "bcast", 1 << 20)


def test_tune_writes_rules_per_mode_when_graphs_were_timed():
    """``mpiml tune --device gpu`` times every path eagerly and in CUDA graphs: each mode gets its own rules (a
    small call's eager winner, host-bound, is noise for the device time a graph replays); eager-only results
    (CPU) give mode-less rules as before."""
    from mpiml.bench.tune import rules_from_results
    from mpiml.comm._tuning import Rule

    def row(op, nbytes, series, us, mode):
        return {"op": op, "bytes": nbytes, "series": series, "latency_us": us, "mode": mode}

    results = []
    for nbytes, eager, graph in ((1024, {"ipc/twoshot": 8.4, "ipc/ll": 8.6, "nccl/native": 17.0},
                                  {"ipc/twoshot": 8.9, "ipc/ll": 2.7, "nccl/native": 5.2}),
                                 (1 << 20, {"ipc/twoshot": 16.0, "ipc/ll": 17.0, "nccl/native": 18.0},
                                  {"ipc/twoshot": 16.2, "ipc/ll": 17.5, "nccl/native": 11.4})):
        results += [row("bcast", nbytes, s, us, "eager") for s, us in eager.items()]
        results += [row("bcast", nbytes, s, us, "graph") for s, us in graph.items()]
    rules = rules_from_results(results, 4, "device", margin=0.03)
    table = TuningTable([Rule(**r) for r in rules])
    avail = ("mpi", "nccl", "ipc")
    assert {r["mode"] for r in rules} == {"eager", "graph"}
    assert table.choose("bcast", 1024, 4, "device", avail, "eager") == ("ipc", "twoshot")
    assert table.choose("bcast", 1024, 4, "device", avail, "graph") == ("ipc", "ll")
    assert table.choose("bcast", 1 << 20, 4, "device", avail, "graph") == ("nccl", "native")
    assert table.choose("bcast", 1 << 20, 4, "device", avail, "eager") == ("ipc", "twoshot")
    eager_only = rules_from_results([r for r in results if r["mode"] == "eager"], 4, "device", margin=0.03)
    assert eager_only and all("mode" not in r for r in eager_only)
    assert eager_only[-1]["max_bytes"] is None  # (the CPU tables' last rule: no upper limit)
    # a device table ends at the largest size measured: larger calls take the rules after it
    closed = rules_from_results(results, 4, "device", margin=0.03, open_end=False)
    assert max(r["max_bytes"] for r in closed) == 1 << 20 and all(r["max_bytes"] for r in closed)
    table = TuningTable([Rule(**r) for r in closed] + [Rule(op="bcast", memory="device", backend="nccl")])
    assert table.choose("bcast", (1 << 20) + 4, 4, "device", avail, "eager") == ("nccl", "native")
