"""The mpiml command: info, bench comm, tune, usage errors and aborting on exceptions."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, mpiexec_cmd, run_group


def _env(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src"), env.get("PYTHONPATH", "")])
    env["MPIML_TUNING_FILE"] = str(tmp_path / "tuning.json")
    env["MPIML_TIMEOUT"] = "60"
    return env


def _mpiml(args, n=None, tmp_path=None, timeout=180):
    cmd = [sys.executable, "-m", "mpiml", *args]
    if n is not None:
        cmd = mpiexec_cmd(n) + cmd
    try:
        return run_group(cmd, timeout, env=_env(tmp_path))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(cmd)} hung past {timeout} s")


def test_help_and_unknown_command(tmp_path):
    p = _mpiml(["--help"], tmp_path=tmp_path)
    assert p.returncode == 0 and "bench comm|ml" in p.stdout
    p = _mpiml(["frobnicate"], tmp_path=tmp_path)
    assert p.returncode == 2 and "unknown command 'frobnicate'" in p.stderr


@pytest.mark.mpi
def test_info_under_mpiexec(tmp_path):
    p = _mpiml(["info"], n=3, tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "job: 3 rank(s), communicator backend 'mpi'" in p.stdout
    assert "CUDA-aware:" in p.stdout and "backends:" in p.stdout
    assert p.stdout.count("job:") == 1  # rank 0 prints, the others do not
    p = _mpiml(["info", "--json"], n=2, tmp_path=tmp_path)
    doc = json.loads(p.stdout)
    assert doc["ranks"] == 2 and len(doc["per_rank"]) == 2 and doc["backends"]["mpi"]["ok"]


@pytest.mark.mpi
def test_usage_error_exits_2_on_every_rank(tmp_path):
    p = _mpiml(["bench", "comm", "--ops", "allreduce", "--rounds", "notanint"], n=2, tmp_path=tmp_path)
    assert p.returncode == 2
    assert p.stderr.count("invalid int value") == 1  # rank 0 prints it


@pytest.mark.mpi
def test_unhandled_exception_aborts_the_job(tmp_path):
    # rank 1 fails while rank 0 waits in a collective that would never complete
    script = tmp_path / "boom.py"
    script.write_text(
        "import numpy as np\n"
        "from mpiml.cli import abort_on_exception\n"
        "from mpiml.comm import get_comm\n"
        "def main(argv):\n"
        "    c = get_comm()\n"
        "    if c.rank == 1:\n"
        "        raise RuntimeError('boom on rank 1')\n"
        "    c.allreduce(np.ones(3))\n"
        "abort_on_exception(main, [])\n")
    env = _env(tmp_path)
    env["MPIML_TIMEOUT"] = ""  # no timeout: only the abort can end rank 0's wait
    try:
        p = run_group(mpiexec_cmd(2) + [sys.executable, str(script)], 90, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("the job hung instead of aborting")
    assert p.returncode != 0
    assert "boom on rank 1" in p.stderr and "aborting the job" in p.stderr


@pytest.mark.mpi
def test_bench_comm_and_tune(tmp_path):
    out = tmp_path / "bench.json"
    png = tmp_path / "bench.png"
    p = _mpiml(["tune", "--ops", "allreduce,bcast", "--max-bytes", "4K", "--rounds", "2", "--target-ms", "2",
                "--quiet"], n=3, tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr
    table = json.loads((tmp_path / "tuning.json").read_text())
    ops = {r["op"] for r in table["rules"]}
    assert ops == {"allreduce", "bcast"}
    assert all(r["min_ranks"] == 3 and r["memory"] == "host" for r in table["rules"])
    # the last rule of each op is open-ended
    for op in ops:
        assert [r for r in table["rules"] if r["op"] == op][-1]["max_bytes"] is None

    p = _mpiml(["bench", "comm", "--ops", "allreduce,bcast", "--max-bytes", "4K", "--rounds", "2",
                "--target-ms", "2", "--quiet", "--json", str(out), "--plot", str(png)], n=3, tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert doc["ranks"] == 3 and doc["machine"]["host"] and doc["date"] and "bench comm" in doc["command"]
    sizes = sorted({r["bytes"] for r in doc["results"] if r["op"] == "allreduce"})
    assert sizes == [2 ** i for i in range(13)]
    series = {r["series"] for r in doc["results"] if r["op"] == "allreduce"}
    assert {"auto", "mpi/native", "mpi/ring", "mpi/recursive_doubling"} <= series
    # auto follows the table that tune wrote
    rules = {(r["op"], r["max_bytes"]): f"{r['backend']}/{r['algorithm']}" for r in table["rules"]}
    autos = {(r["op"], r["bytes"]): r["algorithm"] for r in doc["results"] if r["series"] == "auto"}
    for (op, nbytes), path in autos.items():
        limits = sorted((mb for (o, mb) in rules if o == op and mb is not None))
        bound = next((mb for mb in limits if nbytes <= mb), None)
        assert path == rules[(op, bound)], (op, nbytes, path, rules)
    assert png.stat().st_size > 1000
    assert "auto/best" in p.stdout
