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
