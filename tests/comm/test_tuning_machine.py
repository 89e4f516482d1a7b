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
    """The checked-in 4-rank device rules (vs_nccl.py on 4 x H100, 2026-11-27): LL to 256 KiB, the pushed
    two-shot allreduce to 16 MiB, the two-shot bcast to 1 MiB, the pushed allgather to 16 MiB and the pull
    to 64 MiB, reduce_scatter's IPC kernels to 16 MiB; NCCL beyond; every other rank count unchanged."""
    from mpiml.comm._tuning import TuningTable, load_default_rules

    table = TuningTable(load_default_rules())
    avail = ("mpi", "nccl", "ipc")
    want = {
        ("allreduce", 4): ("ipc", "ll"), ("allreduce", 256 << 10): ("ipc", "ll"),
        ("allreduce", 1 << 20): ("ipc", "twoshot"), ("allreduce", 16 << 20): ("ipc", "twoshot"),
        ("allreduce", 64 << 20): ("nccl", "native"),
        ("bcast", 256 << 10): ("ipc", "ll"), ("bcast", 1 << 20): ("ipc", "twoshot"), ("bcast", 4 << 20): ("nccl", "native"),
        ("reduce", 256 << 10): ("ipc", "ll"), ("reduce", 1 << 20): ("nccl", "native"),
        ("allgather", 256 << 10): ("ipc", "ll"), ("allgather", 1 << 20): ("ipc", "push"),
        ("allgather", 16 << 20): ("ipc", "push"), ("allgather", 64 << 20): ("ipc", "pull"),
        ("allgather", 256 << 20): ("nccl", "native"),
        ("reduce_scatter", 16 << 20): ("ipc", "native"), ("reduce_scatter", 64 << 20): ("nccl", "native"),
    }
    for (op, nbytes), route in want.items():
        for mode in ("eager", "graph"):
            assert table.choose(op, nbytes, 4, "device", avail, mode) == route, (op, nbytes, mode)
    # 3 ranks keep the generic rules (nothing measured there)
    assert table.choose("allreduce", 1 << 20, 3, "device", avail) == ("nccl", "native")
    assert table.choose("allgather", 1 << 20, 3, "device", avail) == ("ipc", "pull")
