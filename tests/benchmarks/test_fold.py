"""benchmarks/fold.py: a benchmark's runs under keys of its one result file."""

import json
import os
import subprocess
import sys

from conftest import ROOT

FOLD = os.path.join(ROOT, "benchmarks", "fold.py")


def _run(*args):
    return subprocess.run([sys.executable, FOLD, *map(str, args)], capture_output=True, text=True, timeout=60)


def test_fold_keeps_the_old_run_and_replaces_a_key(tmp_path):
    out = tmp_path / "linreg_4xh100.json"
    out.write_text(json.dumps({"rows": 4e7, "fit_s": 0.011}))
    n1, n4 = tmp_path / "linreg_n1.json", tmp_path / "linreg_n4.json"
    n1.write_text(json.dumps({"ranks": 1, "fit_s": 0.010}))
    n4.write_text(json.dumps({"ranks": 4, "fit_s": 0.005}))
    proc = _run(out, f"n1={n1}", f"n4={n4}", "--what", "LinearRegression, 1 and 4 GPUs")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert list(doc) == ["what", "folded", "previous", "n1", "n4"]
    assert doc["previous"] == {"rows": 4e7, "fit_s": 0.011} and doc["n4"]["fit_s"] == 0.005
    assert doc["folded"] == {"previous": "linreg_4xh100.json", "n1": "linreg_n1.json", "n4": "linreg_n4.json"}
    n4.write_text(json.dumps({"ranks": 4, "fit_s": 0.004}))  # a newer run of one key: replaced, the rest kept
    assert _run(out, f"n4={n4}").returncode == 0
    doc = json.loads(out.read_text())
    assert doc["n4"]["fit_s"] == 0.004 and doc["n1"]["fit_s"] == 0.010 and doc["what"].startswith("LinearRegression")
    assert _run(out, f"n1={n1}", "--replace").returncode == 0
    assert set(json.loads(out.read_text())) == {"folded", "n1"}


def test_fold_refuses_bad_arguments(tmp_path):
    out = tmp_path / "x.json"
    run = tmp_path / "r.json"
    run.write_text("{}")
    assert "expected KEY=FILE" in _run(out, str(run)).stderr
    assert "no such file" in _run(out, f"a={tmp_path / 'missing.json'}").stderr
    assert "is not a run's key" in _run(out, f"what={run}").stderr
    assert not out.exists()
