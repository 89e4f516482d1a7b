"""The documentation does not rot: the API reference builds with warnings as errors, and every
Python example in README.md and docs/*.md runs.

An example is a fenced ``python`` block. The HTML comment on the line just before the fence
says how it runs:

* none: one process, as a script (``python example.py``);
* ``<!-- run: mpiexec -n N -->``: under ``mpiexec -n N``;
* ``<!-- run: gpu -->`` / ``<!-- run: gpu, mpiexec -n N -->``: only where a GPU is present;
* ``<!-- run: dask -n N -->``: as the client script of ``mpiml dask`` on N ranks;
* ``<!-- fragment: why -->``: a piece of a larger program (names defined elsewhere); not run.
"""

import glob
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, have_gpu, mpiexec_cmd

_FENCE = re.compile(r"^```python\s*$")
_MARK = re.compile(r"^<!--\s*(run|fragment):\s*(.*?)\s*-->\s*$")


def _examples():
    files = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    for path in files:
        lines = open(path, encoding="utf-8").read().splitlines()
        i = 0
        while i < len(lines):
            if _FENCE.match(lines[i]):
                mark = _MARK.match(lines[i - 1]) if i else None
                j = i + 1
                while j < len(lines) and lines[j].strip() != "```":
                    j += 1
                code = "\n".join(lines[i + 1:j]) + "\n"
                name = f"{os.path.relpath(path, ROOT)}:{i + 1}"
                yield pytest.param(code, mark.groups() if mark else ("run", ""), id=name)
                i = j
            i += 1


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src"), env.get("PYTHONPATH", "")])
    env.setdefault("MPIML_TIMEOUT", "60")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@pytest.mark.timeout(300)
@pytest.mark.parametrize("code, how", list(_examples()))
def test_example_runs(code, how, tmp_path):
    kind, arg = how
    if kind == "fragment":
        assert arg, "a fragment must say why it is not run"
        pytest.skip(f"fragment: {arg}")
    opts = [a.strip() for a in arg.split(",") if a.strip()]
    if "gpu" in opts and not have_gpu():
        pytest.skip("needs a GPU")
    script = tmp_path / "example.py"
    script.write_text(code)
    ranks = next((int(o.split("-n")[1]) for o in opts if o.startswith(("mpiexec", "dask"))), 1)
    if any(o.startswith("dask") for o in opts):  # the client script of a Dask cluster over mpi://
        pytest.importorskip("distributed")
        cmd = mpiexec_cmd(ranks) + [sys.executable, "-m", "mpiml", "dask", str(script)]
    else:
        cmd = (mpiexec_cmd(ranks) if ranks > 1 else []) + [sys.executable, str(script)]
    try:  # in a scratch directory: examples write files (models, plots)
        proc = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail(f"example hung past 240 s: {' '.join(cmd)}")
    assert proc.returncode == 0, f"example failed\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"


@pytest.mark.timeout(300)
def test_api_reference_builds_without_warnings(tmp_path):
    pytest.importorskip("sphinx")
    pytest.importorskip("numpydoc")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-W", "-b", "html", os.path.join(ROOT, "docs", "api"),
                           str(tmp_path / "html")], env=_env(), capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, f"sphinx-build -W failed\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert (tmp_path / "html" / "index.html").exists()
