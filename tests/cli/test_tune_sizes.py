"""The sizes ``mpiml tune`` measures: powers of the step, and on GPUs the 1.5x midpoints where routes change."""

from mpiml.bench.comm import sizes_between
from mpiml.bench.tune import with_midpoints


def test_midpoints_from_64k_below_the_largest():
    sizes = with_midpoints(sizes_between(4, 16 << 20, 2))
    assert sizes == sorted(set(sizes))
    assert 3 << 20 in sizes and 768 << 10 in sizes and 96 << 10 in sizes
    assert 48 << 10 not in sizes            # below 64 KiB: powers of two only
    assert 24 << 20 not in sizes and max(sizes) == 16 << 20
    assert set(sizes_between(4, 16 << 20, 2)) <= set(sizes)


def test_no_midpoints_for_an_empty_or_small_range():
    assert with_midpoints([]) == []
    assert with_midpoints([4, 16, 64]) == [4, 16, 64]


def test_every_shipped_machine_table_parses_and_is_named_by_its_machine():
    from importlib import resources

    from mpiml.comm import _tuning

    tables = [p for p in resources.files("mpiml.comm").joinpath("tuning").iterdir() if p.name.endswith(".json")]
    assert tables, "no machine table shipped"
    for path in tables:
        rules = _tuning._read_rules(path.read_text(), path.name)
        assert rules and all(r.get("memory") == "device" for r in rules), path.name
        import json

        doc = json.loads(path.read_text())
        key = doc.get("machine_key") or doc["machine"].get("gpu_key")
        if key:  # a table written on the machine names it; the file name is its slug
            assert path.name == _tuning.machine_slug(key) + ".json"
