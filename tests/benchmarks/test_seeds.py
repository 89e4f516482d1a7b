"""The seed experiments of ``benchmarks/seeds/`` (001 Dask, 002 broadcast, 003 k-NN ring) at ``--quick`` on CPU
ranks under a real mpiexec: each runs, checks its own results, writes its JSON (machine, date, command, the
peer, the document's figure and the ratio) and PNG, and prints its README row.  On the GPU host (marked
``gpu``) 002 and 003 run the same way at small sizes on the GPUs."""

import json
import os
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, _mpiexec, have_gpu, run_group

SEEDS = os.path.join(ROOT, "benchmarks", "seeds")


def _script(name):
    return os.path.join(SEEDS, name)


def _check_record(doc, seed, ranks=None):
    assert doc["seed"] == seed
    assert doc["machine"]["host"] and doc["date"] and doc["command"]
    assert doc["document"]["figure"] and doc["peer"]
    if ranks is not None:
        assert doc["ranks"] == ranks and f"-n {ranks} " in doc["command"]


def _row(stdout, seed):
    rows = [line for line in stdout.splitlines() if line.startswith(f"README row: | {seed} |")]
    assert rows, stdout[-2000:]
    return rows


# ---------------------------------------------------------------------- 002: broadcast
@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 3, 4])
def test_seed002_bcast_cpu_quick(mpi, tmp_path, n):
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    # one round of two steps (--quick: 2 rounds of 5): the same paths, sizes and models, timed fewer times
    proc = mpi(_script("seed002_bcast.py"), n, "--device", "cpu", "--quick", "--rounds", "1", "--steps", "2",
               "--json", out, "--plot", png, timeout=120)
    doc = json.loads(out.read_text())
    _check_record(doc, "002", n)
    assert doc["peer"] == "mpi_raw" and png.stat().st_size > 0
    rows = doc["rows"]
    assert not [r for r in rows if "error" in r], [r for r in rows if "error" in r]
    paths = {r["path"] for r in rows}
    assert {"mpi_raw", "auto", "native", "binomial", "knomial", "chain"} <= paths
    assert ("two_level" in paths) == (n == 4)  # two virtual nodes of 2 ranks need 4 ranks
    sizes = sorted({r["bytes"] for r in rows})
    assert sizes[0] == 4 and sizes[-1] == 64 << 10
    assert all(r["us"] > 0 and r["GBps"] > 0 for r in rows)
    a2a = doc["alltoall"]
    assert not [r for r in a2a if "error" in r] and sorted({r["bytes"] for r in a2a}) == [64, 4096]
    assert {r["path"] for r in a2a} == paths - {"two_level"} and all(r["us"] > 0 for r in a2a)
    models = {(r["model"], r["path"]): r for r in doc["streaming"]}
    assert {m for m, _ in models} == {"alexnet", "vgg16"}
    assert all(r["ms"] > 0 and "error" not in r for r in models.values())
    # the parameter counts of the two networks, scaled by --quick's 1e-3 tensor by tensor
    assert models[("alexnet", "auto")]["tensors"] == 16 and models[("vgg16", "auto")]["tensors"] == 32
    assert models[("vgg16", "fused:auto")]["parameters"] == models[("vgg16", "auto")]["parameters"]
    s = doc["summary"]
    assert s["doc_range_bytes"] == [4096, 2 << 20]
    assert all(p["peer_us"] > 0 and p["auto_over_peer"] > 0 for p in s["sizes"])
    assert s["auto_over_peer_median_doc_range"] > 0
    assert s["ours_vs_document"] == pytest.approx(min(a["auto_over_peer"] for a in s["alltoall_sizes"]) / 0.32)
    assert set(s["models"]) == {"alexnet", "vgg16"}
    _row(proc.stdout, "002")


def test_seed002_model_sizes():
    sys.path.insert(0, SEEDS)
    try:
        import seed002_bcast as s
    finally:
        sys.path.remove(SEEDS)
    assert sum(s.MODELS["alexnet"]()) == 61_100_840 and len(s.MODELS["alexnet"]()) == 16
    assert sum(s.MODELS["vgg16"]()) == 138_357_544 and len(s.MODELS["vgg16"]()) == 32


# ---------------------------------------------------------------------- 003: k-NN ring
@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 3])
def test_seed003_knn_cpu_quick(mpi, tmp_path, n):
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    proc = mpi(_script("seed003_knn.py"), n, "--device", "cpu", "--quick", "--json", out, "--plot", png,
               timeout=180)
    doc = json.loads(out.read_text())
    _check_record(doc, "003", n)
    assert png.stat().st_size > 0
    rows = {r["workload"]: r for r in doc["rows"]}
    assert set(rows) == {"kdd-xs", "dense"}
    sparse, dense = rows["kdd-xs"], rows["dense"]
    assert sparse["kind"] == "sparse" and sparse["nnz_per_row"] == 36 and dense["features"] == 36
    for r in rows.values():
        assert all(r["identical_predictions"].values())  # every exchange predicts the blocking ring's labels
        assert all(r[f"{ex}_s"] > 0 for ex in ("blocking", "overlap", "onesided"))
        assert r["overlap_saved_pct"] == pytest.approx(100 * (1 - r["overlap_s"] / r["blocking_s"]))
        if n > 1:
            assert r["comm_s"] > 0 and r["compute_s"] > 0 and 0 <= r["ideal_saved_pct"] <= 50
        else:
            assert "comm_s" not in r
    assert sparse["document_saved_pct"] == {"overlap": 5.9, "onesided": 27.6}
    assert sparse["ours_over_document"]["onesided"] == pytest.approx(sparse["onesided_saved_pct"] / 27.6)
    assert dense["document_saved_pct"] is None
    assert len(_row(proc.stdout, "003")) == 2


def test_seed003_rejects_a_malformed_workload():
    proc = subprocess.run([sys.executable, _script("seed003_knn.py"), "--device", "cpu", "--workloads", "x:dense:10"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")})
    assert proc.returncode == 2 and "expected name:sparse|dense" in proc.stderr


# ---------------------------------------------------------------------- 001: Dask
@pytest.mark.mpi
@pytest.mark.slow
def test_seed001_dask_cpu_quick(tmp_path):
    pytest.importorskip("distributed")
    exe = _mpiexec()
    if exe is None:
        pytest.skip("no mpiexec on PATH")
    launcher = shlex.join([exe, *os.environ.get("MPIML_TEST_MPIEXEC_ARGS", "").split()])
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src"), "OMP_NUM_THREADS": "1",
           "DASK_LOGGING__DISTRIBUTED": "error", "MPIML_TIMEOUT": "60"}
    proc = run_group([sys.executable, _script("seed001_dask.py"), "--device", "cpu", "--quick", "--mpiexec", launcher,
                      "--timeout", "100", "--json", str(out), "--plot", str(png)], timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    _check_record(doc, "001")
    assert png.stat().st_size > 0
    assert set(doc["comm"]["results"]) == {"mpi", "tcp"}
    assert max(r["bytes"] for r in doc["comm"]["results"]["mpi"]) == 4 << 20
    c = doc["summary"]["comm"]
    assert c["latency_1B_speedup"] > 0 and c["throughput_2MB_up_speedup_median"] > 0
    assert c["latency_vs_document"] == pytest.approx(c["latency_1B_speedup"] / 6.0)
    assert {(r["protocol"], r["workers"]) for r in doc["apps"]} == {("mpi", 1), ("tcp", 1)}
    apps = {a["app"]: a for a in doc["summary"]["apps"]}
    assert set(apps) == {"sum_transpose", "sum_transpose_rows", "sum"}
    assert all(a["values_agree"] and a["tcp_over_mpi"] > 0 for a in apps.values())
    assert apps["sum_transpose"]["vs_document"] == pytest.approx(apps["sum_transpose"]["tcp_over_mpi"] / 3.47)
    _row(proc.stdout, "001")


@pytest.mark.mpi
def test_seed001_refuses_to_run_on_every_rank(mpi):
    # a driver: under mpiexec -n 2 each rank would launch the same Dask jobs
    proc = mpi(_script("seed001_dask.py"), 2, "--device", "cpu", "--quick", timeout=60, expect_ok=False)
    assert proc.returncode != 0 and "run it as one process" in proc.stderr


# ---------------------------------------------------------------------- the GPU host
def _gpus():
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


@pytest.mark.gpu
@pytest.mark.mpi
def test_seed002_bcast_gpu_small(mpi, tmp_path):
    n = 2 if have_gpu() and _gpus() >= 2 else 1
    out = tmp_path / "s.json"
    mpi(_script("seed002_bcast.py"), n, "--device", "gpu", "--max-bytes", str(4 << 20), "--model-scale", "0.05",
        "--rounds", "1", "--steps", "2", "--json", out, timeout=240)
    doc = json.loads(out.read_text())
    _check_record(doc, "002", n)
    ok = {r["path"] for r in doc["rows"] if "error" not in r}
    assert {"nccl_raw", "auto", "nccl"} <= ok, [r for r in doc["rows"] if "error" in r][:5]
    if n > 1:
        assert {"ipc/pull", "mpi/chain"} <= ok
    assert all("error" not in r for r in doc["streaming"] if r["path"] in ("nccl_raw", "auto")), doc["streaming"]


@pytest.mark.gpu
@pytest.mark.mpi
def test_seed003_knn_gpu_small(mpi, tmp_path):
    n = 2 if have_gpu() and _gpus() >= 2 else 1
    out = tmp_path / "s.json"
    mpi(_script("seed003_knn.py"), n, "--device", "gpu", "--workloads",
        "kdd-xs:sparse:20000:20216830:36:500,dense:dense:50000:36:-:500", "--repeats", "1", "--json", out, timeout=240)
    doc = json.loads(out.read_text())
    _check_record(doc, "003", n)
    assert all(all(r["identical_predictions"].values()) for r in doc["rows"])


# ---------------------------------------------------------------------- 000: fits, auto vs forced
@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 3])
def test_seed000_estimators_cpu_quick(mpi, tmp_path, n):
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    proc = mpi(_script("seed000_estimators.py"), n, "--device", "cpu", "--quick", "--json", out, "--plot", png,
               timeout=240)
    doc = json.loads(out.read_text())
    _check_record(doc, "000", n)
    assert doc["forced"] == "native" and png.stat().st_size > 0
    assert set(doc["results"]) == {"kmeans", "knn", "linreg", "tsvd", "rf"}
    for algo, r in doc["results"].items():
        assert "error" not in r, (algo, r.get("error"))
        assert r["auto_s"] > 0 and r["auto_s"] == min(r["auto_all_s"])
        if n == 1:  # no collective to force: auto's fit times only (Fig. 10's one-GPU point)
            assert r["forced_s"] is None and r["forced_all_s"] == []
        else:
            assert r["forced_s"] > 0 and r["calls"] > 0, (algo, r)  # the histogram of Fig. 11 has something to show
        assert sum(r["histogram"].values()) == r["calls"]
    est = doc["summary"]["estimators"]
    if n == 1:
        assert doc["peer"].startswith("none") and all(v["forced_over_auto"] is None for v in est.values())
        assert "fit s (one rank" in _row(proc.stdout, "000")[0]
        return
    assert est["kmeans"]["vs_document"] == pytest.approx(est["kmeans"]["forced_over_auto"] / 1.6)
    assert est["rf"]["document"] is None and est["rf"]["vs_document"] is None  # not in the document's Fig. 10
    _row(proc.stdout, "000")


def test_seed000_rejects_an_unknown_estimator():
    proc = subprocess.run([sys.executable, _script("seed000_estimators.py"), "--device", "cpu", "--algos", "svm"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")})
    assert proc.returncode == 2 and "unknown ['svm']" in proc.stderr


# ---------------------------------------------------------------------- 004: reductions vs the cost model
@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_seed004_reductions_cpu_small(mpi, tmp_path, n):
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    proc = mpi(_script("seed004_reductions.py"), n, "--sizes", "8,4096,65536", "--rounds", "1", "--json", out,
               "--plot", png, timeout=120)
    doc = json.loads(out.read_text())
    _check_record(doc, "004", n)
    assert png.stat().st_size > 0
    got = {(r["op"], r["algorithm"], r["bytes"]) for r in doc["rows"]}
    for op in ("reduce", "allreduce", "scan"):
        assert {(op, a, b) for a in ("auto", "native") for b in (8, 4096, 65536)} <= got
    assert all(r["measured_s"] > 0 for r in doc["rows"])
    assert all(r["predicted_s"] is None for r in doc["rows"] if r["algorithm"] in ("auto", "native"))
    s = doc["summary"]
    t = {(r["op"], r["algorithm"], r["bytes"]): r["measured_s"] for r in doc["rows"]}
    assert s["native_over_auto_largest"]["allreduce"] == pytest.approx(
        t[("allreduce", "native", 65536)] / t[("allreduce", "auto", 65536)])
    assert s["vs_document"] == pytest.approx(s["native_over_auto_largest"]["allreduce"] / 1.7)
    assert 0 < doc["model_picks_fastest"]["agree"] <= doc["model_picks_fastest"]["points"] == 9
    _row(proc.stdout, "004")


# ---------------------------------------------------------------------- the README's table
def _table():
    sys.path.insert(0, SEEDS)
    try:
        import table
    finally:
        sys.path.remove(SEEDS)
    return table


def test_readme_table_is_the_one_the_runs_give():
    # after a GPU pass: copy the runs into benchmarks/seeds/results/, then python benchmarks/seeds/table.py --write
    t = _table()
    assert t.main(["--check"]) == 0
    assert t.superseded() == []


def test_table_from_the_committed_runs():
    # whatever runs are committed (before or after a GPU pass): one row per document, every cell either
    # measured (machine, date, its file in results/), "n/a" with its reason, or "not yet measured"
    t = _table()
    lines = t.rows()
    assert len(lines) == 2 + 5 and all(line.count(" | ") == 9 - 1 for line in lines[2:])
    by = {line.split(" | ")[0][2:]: line.split(" | ") for line in lines[2:]}
    assert sorted(by) == ["000", "001", "002", "003", "004"]
    found = t.cells()
    for seed, row in by.items():
        for col, n in zip((3, 4, 5), t.GPUS):
            cell = row[col]
            if found.get((seed, n)):
                for c in found[(seed, n)]:
                    assert f"`results/{c.name[:-5]}" in cell and c.date in cell
            elif (seed, n) in t.NOT_APPLICABLE:
                assert cell == t.NOT_APPLICABLE[(seed, n)] and cell.startswith("n/a: ")
            else:
                assert cell == "not yet measured"
        worse = any(c.worse for n in t.GPUS for c in found.get((seed, n), []))
        assert (row[7] == t.WHY[seed]) == worse  # worse than the document: the row says why
        assert row[8].startswith("`") and "\n" not in row[8]  # one command line
    assert ("000", 1) not in t.NOT_APPLICABLE  # one GPU: 000's fit times (Fig. 10's first point)
    for seed in ("002", "003", "004"):  # measured on 4 x H100 before this wave's last pass
        assert "4 x H100" in by[seed][5] and f"`results/seed{seed}_n4_4xh100" in by[seed][5]


def _write(folder, name, doc):
    (folder / name).write_text(json.dumps(doc))


def test_table_cells_from_new_runs(tmp_path):
    # what each document's runs become: the ratio against the document, the GPU count, the newest run
    t = _table()
    fig1 = {"ranks": 2, "date": "2026-11-28T10:00:00", "rows": [
        {"op": op, "path": p, "mode": "eager", "bytes": b, "us": us}
        for op in ("allreduce", "reduce", "bcast") for b in (4, 16384)
        for p, us in (("raw", 10.0), ("auto", 5.0))] + [
        {"op": "allreduce", "path": "raw", "mode": "eager", "bytes": 1 << 20, "us": 1.0}]}
    fits = {"seed": "000", "device": "gpu", "ranks": 2, "date": "2026-11-28T10:01:00",
            "results": {"tsvd": {"error": "ValueError: ..."}}, "summary": {"estimators": {
        "kmeans": {"forced_over_auto": 1.2, "vs_document": 0.75}, "rf": {"forced_over_auto": 1.0, "vs_document": None}}}}
    dask = {"seed": "001", "device": "gpu", "date": "2026-11-28", "summary": {
        "comm": {"latency_1B_speedup": 3.0, "throughput_2MB_up_speedup_median": 8.0, "latency_vs_document": 0.5,
                 "throughput_vs_document": 2.0},
        "apps": [{"app": a, "workers": w, "tcp_over_mpi": 2.0, "vs_document": 2.0 / 3.47 if a != "sum" else None}
                 for w in (1, 2) for a in ("sum_transpose", "sum_transpose_rows", "sum")]}}
    old = {"seed": "003", "device": "gpu", "ranks": 2, "date": "2026-11-27T10:00:00",
           "document": {"saved_pct": {"kdd-xs": {"overlap": 5.9}}},
           "rows": [{"workload": "kdd-xs", "overlap_saved_pct": 1.0, "onesided_saved_pct": -5.0}]}
    new = dict(old, date="2026-11-28T10:00:00",
               rows=[{"workload": "kdd-xs", "overlap_saved_pct": 11.8, "onesided_saved_pct": 2.0, "comm_share_pct": 20}])
    cpu = dict(new, device="cpu", rows=[{"workload": "kdd-xs", "overlap_saved_pct": 50.0, "onesided_saved_pct": 0}])
    _write(tmp_path, "seed000_fig1_n2_4xh200.json", fig1)
    _write(tmp_path, "seed000_n2_4xh200.json", fits)
    _write(tmp_path, "seed001_4xh200.json", dask)
    h100 = dict(old, rows=[{"workload": "kdd-xs", "overlap_saved_pct": 5.9, "onesided_saved_pct": 1.0}])
    _write(tmp_path, "seed003_4xh200.json", old)  # an older name of the same document, GPUs and machine kind
    _write(tmp_path, "seed003_n2_4xh200.json", new)
    _write(tmp_path, "seed003_n2_4xh100.json", h100)  # another machine kind: its own current run
    _write(tmp_path, "seed003_n2_vm.json", cpu)
    (tmp_path / "seed003_n2_4xh200.png").write_bytes(b"png")
    cells = t.cells(str(tmp_path))
    assert sorted(cells) == [("000", 2), ("001", 1), ("001", 2), ("003", 2)]
    f1, f10 = sorted(cells[("000", 2)], key=lambda c: c.name)
    assert "allreduce 2.00x" in f1.text  # the smallest against the document: bcast, 85 % lower = 6.67x
    assert f1.vs_document == pytest.approx(2.0 * (1 - 0.85))
    assert f10.vs_document == 0.75 and f10.worse and "kmeans 1.20x" in f10.text and "(tsvd failed" in f10.text
    (w1,), (w2,) = cells[("001", 1)], cells[("001", 2)]
    assert "comm" not in w1.text and "latency at 1 B 3.00x" in w2.text
    assert w1.vs_document == pytest.approx(2.0 / 3.47) and w2.vs_document == 0.5
    # per machine kind the newest GPU run; the CPU harness's run is not in the table
    c3h100, c3 = sorted(cells[("003", 2)], key=lambda c: c.name)
    assert c3.name == "seed003_n2_4xh200.json" and c3.vs_document == pytest.approx(2.0) and not c3.worse
    assert c3h100.name == "seed003_n2_4xh100.json" and c3h100.vs_document == pytest.approx(1.0)
    assert t.superseded(str(tmp_path)) == ["seed003_4xh200.json"]
    lines = t.rows(str(tmp_path))
    row3 = next(line for line in lines if line.startswith("| 003 |")).split(" | ")
    assert "`results/seed003_n2_4xh200.{json,png}`" in row3[4] and "vs the document **2.00**" in row3[4]
    assert "4 x H100, 2026-11-27 (`results/seed003_n2_4xh100.json`)" in row3[4] and "<br>" in row3[4]
    assert row3[7] == "-"  # as good as the document: no excuse needed
    assert row3[5] == "not yet measured"
    row0 = next(line for line in lines if line.startswith("| 000 |")).split(" | ")
    assert row0[7] == t.WHY["000"] and "<br>" in row0[4] and row0[3] == "not yet measured"
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{t.BEGIN}\nold\n{t.END}\nafter\n")
    assert t.main(["--results", str(tmp_path), "--readme", str(readme), "--check"]) == 1
    assert t.main(["--results", str(tmp_path), "--readme", str(readme), "--write"]) == 0
    assert t.main(["--results", str(tmp_path), "--readme", str(readme), "--check"]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith(f"{t.END}\nafter\n") and "old" not in text


def test_table_cells_of_one_gpu_hpo_and_failed_runs(tmp_path):
    # what the one-call pass can leave: 000 on one GPU, its HPO, a run whose every part failed, a file cut short,
    # 001 stopped before its last worker count; each gets a cell that says what happened (never a crash)
    t = _table()
    one = {"seed": "000", "device": "gpu", "ranks": 1, "date": "2026-11-28T10:00:00", "results": {"kmeans": {}},
           "summary": {"estimators": {"kmeans": {"auto_s": 0.123, "forced_over_auto": None, "vs_document": None}}}}
    hpo = {"benchmark": "hpo_higgs", "device": "gpu", "n_workers": 4, "n_samples": 11000000, "n_models": 143,
           "partial_fit_calls": 1894, "search_seconds": 31.5, "refit_seconds": 0.8, "majority_class_rate": 0.53,
           "purity_accuracy": {"hyperband_best": 0.534, "spmd_refit": 0.531}, "date": "2026-11-28 10:02:00"}
    failed = {"seed": "000", "device": "gpu", "ranks": 4, "date": "2026-11-28T10:01:00",
              "results": {a: {"rows": 10, "error": f"CommError: {a} broke"} for a in ("kmeans", "knn")},
              "summary": {"estimators": {}}}
    dask = {"seed": "001", "device": "gpu", "date": "2026-11-28", "workers": "1,2,4", "comm": {"error": "exit 1: x"},
            "apps": [{"protocol": p, "workers": 1, "error": "timed out"} for p in ("mpi", "tcp")],
            "summary": {"comm": None, "apps": [{"app": "sum_transpose_rows", "workers": 2, "tcp_over_mpi": 1.5,
                                                "vs_document": 1.5 / 3.47, "separate_gpus": False}]}}
    _write(tmp_path, "seed000_n1_4xh100.json", one)
    _write(tmp_path, "seed000_hpo_n4_4xh100.json", hpo)
    _write(tmp_path, "seed000_n4_4xh100.json", failed)
    _write(tmp_path, "seed001_4xh100.json", dask)
    (tmp_path / "seed003_n2_4xh100.json").write_text('{"seed": "003", "rows": [')  # killed mid-write
    (tmp_path / "seed001_4xh200.json").write_text("")  # (every worker count's cell says so)
    cells = t.cells(str(tmp_path))
    (c1,) = cells[("000", 1)]
    assert "Fig. 10 at 1 GPU, fit s: kmeans 0.123" in c1.text and "do not apply" in c1.text and c1.vs_document is None
    h, f10 = sorted(cells[("000", 4)], key=lambda c: c.name)
    assert h.name == "seed000_hpo_n4_4xh100.json" and "143 models, 1894 partial_fit calls in 31.5 s" in h.text
    assert "0.534 (best model) / 0.531" in h.text and h.vs_document is None
    assert f10.text.startswith("run: measured nothing (CommError: kmeans broke (+1 more errors))")
    w1, w2, w4 = (next(c for c in cells[("001", n)] if c.name == "seed001_4xh100.json") for n in (1, 2, 4))
    assert w1.text == "1 worker(s): measured nothing (timed out (+1 more errors))"
    assert w4.text == "4 worker(s): measured nothing (the run stopped before it (its time limit))"
    assert "tcp / mpi 1.50x (blocks by rows)" in w2.text and "shared GPUs" in w2.text and "sweep failed" in w2.text
    (c3,) = cells[("003", 2)]
    assert c3.text.startswith("run: measured nothing (unreadable JSON (JSONDecodeError") and c3.date == "undated"
    assert all(any(c.name == "seed001_4xh200.json" and "unreadable" in c.text for c in cells[("001", n)])
               for n in (1, 2, 4))
    lines = t.rows(str(tmp_path))
    assert all(line.count(" | ") == 8 for line in lines[2:])


@pytest.mark.gpu
@pytest.mark.mpi
def test_seed000_estimators_gpu_small(mpi, tmp_path):
    # the two world communicators on the device: auto and every collective forced onto NCCL
    n = 2 if have_gpu() and _gpus() >= 2 else 1
    out = tmp_path / "s.json"
    mpi(_script("seed000_estimators.py"), n, "--device", "gpu", "--scale", "0.02", "--repeats", "1", "--json", out,
        timeout=240)
    doc = json.loads(out.read_text())
    _check_record(doc, "000", n)
    assert doc["forced"] == "nccl/native"
    assert not [a for a, r in doc["results"].items() if "error" in r], doc["results"]
    assert set(doc["summary"]["estimators"]) == {"kmeans", "knn", "linreg", "tsvd", "rf"}


@pytest.mark.gpu
@pytest.mark.mpi
def test_seed004_reductions_gpu_small(mpi, tmp_path):
    n = 2 if have_gpu() and _gpus() >= 2 else 1
    if n < 2:
        pytest.skip("the cost model's ping-pong needs 2 ranks on 2 GPUs")
    out = tmp_path / "s.json"
    mpi(_script("seed004_reductions.py"), n, "--device", "gpu", "--sizes", "8,65536", "--rounds", "1", "--json", out,
        timeout=180)
    doc = json.loads(out.read_text())
    _check_record(doc, "004", n)
    assert doc["summary"]["native_over_auto_largest"]["allreduce"] > 0
