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

import fnmatch
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


# ---------------------------------------------------------------------- result files named by the docs
_RESULTS = os.path.join(ROOT, "benchmarks", "results")
_HISTORY = os.path.join(ROOT, "benchmarks", "HISTORY.md")
# a path under benchmarks/results/ as the docs write it (braces for alternatives: x_{a,b}.{json,png})
_RESULT_PATH = re.compile(r"benchmarks/results/([\w./{},*-]*[\w}*])")
# the source documents' runs (benchmarks/seeds/results/), as any doc writes them or as `results/...` in the seeds' README
_SEEDS_RESULTS = os.path.join(ROOT, "benchmarks", "seeds", "results")
_SEEDS_README = os.path.join("benchmarks", "seeds", "README.md")
_SEED_PATH = re.compile(r"benchmarks/seeds/results/([\w./{},*-]*[\w}*])")
_SEED_LOCAL_PATH = re.compile(r"(?<![\w/.])results/([\w./{},*-]*[\w}*])")
#: Most files in benchmarks/results/: the current result per benchmark and machine kind, not a lab notebook.
MAX_RESULTS = 40
_HISTORY_REF = re.compile(r"`history: ([^`]+)`")
_BRACES = re.compile(r"\{([^{}]*)\}")


def _doc_files():
    return ([os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
            + sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.md")))
            + sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*", "*.md"))))


def _expand(pattern):
    """``a_{x,y}.{json,png}`` -> the four names (shell brace expansion, no nesting)."""
    m = _BRACES.search(pattern)
    if not m:
        return [pattern]
    return [e for alt in m.group(1).split(",") for e in _expand(pattern[:m.start()] + alt + pattern[m.end():])]


def _history_names():
    text = open(_HISTORY, encoding="utf-8").read()
    return {os.path.basename(n) for n in re.findall(r"^\| `([^`]+)` \| \d{4}-", text, flags=re.M)}


def _result_references():
    """``(doc:line, kind, name)`` for every result path and every `history: NAME` in the docs.

    A path a command writes (in a fenced block, or after ``--out``/``--json``/``--plot``) names a
    result to come, not one the text relies on, and is left out.
    """
    for path in _doc_files():
        rel = os.path.relpath(path, ROOT)
        if rel == os.path.join("benchmarks", "HISTORY.md"):
            continue
        patterns = [(_RESULT_PATH, "path"), (_SEED_PATH, "seeds")]
        if rel == _SEEDS_README:
            patterns.append((_SEED_LOCAL_PATH, "seeds"))
        fenced = False
        for i, line in enumerate(open(path, encoding="utf-8"), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                continue
            for pattern, kind in patterns:
                for m in pattern.finditer(line):
                    if not re.search(r"--(out|json|plot)[ =]$", line[:m.start()]):
                        yield f"{rel}:{i}", kind, m.group(1)
            for m in _HISTORY_REF.finditer(line):
                yield f"{rel}:{i}", "history", m.group(1).strip()


def test_every_result_the_docs_name_exists():
    refs = list(_result_references())
    assert any(kind == "path" for _, kind, _ in refs), "no benchmarks/results/ path found: is the pattern wrong?"
    history = _history_names()
    assert len(history) > 100, "benchmarks/HISTORY.md lists no removed result"
    bad = []
    for where, kind, name in refs:
        for one in _expand(name):
            if kind in ("path", "seeds"):
                folder = _RESULTS if kind == "path" else _SEEDS_RESULTS
                if not glob.glob(os.path.join(folder, one)):
                    bad.append(f"{where}: {os.path.relpath(folder, ROOT)}/{one} does not exist")
            elif not any(fnmatch.fnmatch(h, one) for h in history):
                bad.append(f"{where}: `history: {one}` is not listed in benchmarks/HISTORY.md")
    assert not bad, "\n".join(bad)


def test_removed_results_are_cited_as_history():
    # a bare name of a removed result reads as if the file were there: cite it as `history: NAME`
    removed = _history_names()
    bare = re.compile(r"`((?:benchmarks/results/|results/)?[\w./-]+\.(?:json|png|log|txt))`")
    bad = [f"{os.path.relpath(p, ROOT)}:{i}: `{m.group(1)}`"
           for p in _doc_files() if not p.endswith("HISTORY.md")
           for i, line in enumerate(open(p, encoding="utf-8"), 1)
           for m in bare.finditer(line) if os.path.basename(m.group(1)) in removed]
    assert not bad, "removed results cited as if present (write `history: NAME`):\n" + "\n".join(bad)


def _cited(kind):
    return {os.path.basename(one) for _, k, name in _result_references() if k == kind for one in _expand(name)}


def test_results_are_curated():
    # the current result per benchmark and machine kind; experiments and logs stay in git history
    files = os.listdir(_RESULTS)
    assert len(files) <= MAX_RESULTS, (f"{len(files)} files in benchmarks/results (at most {MAX_RESULTS}: fold a "
                                       "benchmark's variants into one file, move superseded ones to HISTORY.md)")
    cited = _cited("path")
    uncited = [f for f in files if not any(fnmatch.fnmatch(f, c) for c in cited)]
    assert not uncited, f"results no doc cites (cite them or move them to HISTORY.md): {uncited}"


def test_no_log_in_the_tree():
    # logs go to the device pass's output ($OUT), not into git
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    names = tracked.stdout.split() if tracked.returncode == 0 else [
        os.path.relpath(os.path.join(d, f), ROOT) for d, _, fs in os.walk(os.path.join(ROOT, "benchmarks")) for f in fs]
    assert names, "no file found: is this a checkout?"
    logs = [n for n in names if n.endswith(".log")]
    assert not logs, f"logs in the tree (they go to the device pass's output): {logs}"


def test_seed_results_are_cited():
    # each document's runs (benchmarks/seeds/results/) back a cell of the seeds' table; none left uncited
    files = [f for f in os.listdir(_SEEDS_RESULTS) if not f.startswith(".")]
    assert files, "benchmarks/seeds/results/ is empty"
    cited = _cited("seeds")
    uncited = [f for f in files if not any(fnmatch.fnmatch(f, c) for c in cited)]
    assert not uncited, f"seed results no doc cites: {uncited}"


def test_the_reference_check_catches_a_missing_file_and_the_limit(tmp_path, monkeypatch):
    # the checks above are not vacuous: a doc naming an absent result, and one file too many, both fail
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "x.md").write_text("fast (`benchmarks/results/kmeans_{a,b}.json`)\n```\nbenchmarks/results/gone.json\n```\n")
    res = tmp_path / "results"
    res.mkdir()
    for i in range(MAX_RESULTS + 1):
        (res / f"kmeans_{'a' if i == 0 else i}.json").write_text("{}")
    monkeypatch.setattr(sys.modules[__name__], "_doc_files", lambda: [str(docs / "x.md")])
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    monkeypatch.setattr(sys.modules[__name__], "_RESULTS", str(res))
    refs = list(_result_references())
    assert refs == [("docs/x.md:1", "path", "kmeans_{a,b}.json")]  # the fenced path is a command's output
    with pytest.raises(AssertionError, match="kmeans_b.json does not exist"):
        monkeypatch.setattr(sys.modules[__name__], "_history_names", lambda: {f"h{i}" for i in range(101)})
        test_every_result_the_docs_name_exists()
    with pytest.raises(AssertionError, match=f"{MAX_RESULTS + 1} files"):
        test_results_are_curated()


# ---------------------------------------------------------------------- measured figures name their source
# a result file (benchmarks/results/, benchmarks/seeds/results/, `history: NAME`) or the script that measures it
_SOURCE = re.compile(r"benchmarks/(seeds/)?results/|`history: |`results/seed|scripts/\w+\.(py|sh)|benchmarks/[\w/]+\.py")
# a figure: a number with a unit of time, rate, share or ratio (not "4 x H100", a machine)
_FIGURE = re.compile(r"\d(\.\d+)?\s?(ms|s|us|µs|GB/s|MB/s|%|x|×)(?![\w/])(?! H\d)")
_CLAIM = re.compile(r"(?<![Nn]ot )\b[Mm]easured on\b")
#: Blocks whose figures may name no file (none: every figure names its source).
_UNSOURCED_PENDING = set()


def _blocks(path):
    """``(first line number, text)`` of each paragraph, bullet or table outside code fences."""
    out, cur, start, fenced = [], [], 0, False
    for i, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            if cur:
                out.append((start, " ".join(cur)))
                cur = []
            continue
        if fenced:
            continue
        if not line.strip() or line.startswith(("* ", "- ", "#")):
            if cur:
                out.append((start, " ".join(cur)))
                cur = []
            if not line.strip():
                continue
        if not cur:
            start = i
        cur.append(line.strip())
    if cur:
        out.append((start, " ".join(cur)))
    return out


def _unsourced(path, rel):
    """Blocks that claim a measurement ("measured on ...", or a bullet of README.md's "Where it stands") with a
    figure but name no source, in the block or the table right after it."""
    blocks = _blocks(path)
    bad = []
    for k, (line, text) in enumerate(blocks):
        claim = _CLAIM.search(text) or (rel == "README.md" and text.startswith("* **"))
        if not claim or not _FIGURE.search(text) or _SOURCE.search(text):
            continue
        after = blocks[k + 1][1] if k + 1 < len(blocks) else ""
        if after.startswith("|") and _SOURCE.search(after):
            continue
        if any(rel == f and text.startswith(head) for f, head in _UNSOURCED_PENDING):
            continue
        bad.append(f"{rel}:{line}: {text[:120]}")
    return bad


def test_measured_figures_name_their_source():
    bad = [b for p in [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
           for b in _unsourced(p, os.path.relpath(p, ROOT))]
    assert not bad, "figures that name no result file (nor the script that measured them):\n" + "\n".join(bad)


def test_the_source_check_flags_an_unsourced_figure(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("Measured on one GPU: 3.2 ms.\n\nMeasured on 4 x H100 (`benchmarks/results/a.json`): 2.0x.\n\n"
                   "Measured on two GPUs:\n\n| fit | s | file |\n| --- | --- | --- |\n| a | 0.5 s | "
                   "`benchmarks/results/b.json` |\n\nNot measured on GPUs yet: 20 KiB a level.\n")
    assert _unsourced(str(doc), "docs/x.md") == ["docs/x.md:1: Measured on one GPU: 3.2 ms."]
