"""The package's import graph has no circle and no arrow that points up a layer.

The graph is read from the source with ``ast``, without importing anything: every ``import`` and
``from ... import`` in a module is an edge, at module level or inside a function or a class alike
(an import moved into a function still ties the two modules together), and so is a call of
``importlib.import_module`` or ``__import__`` on a constant string. An edge goes to the deepest
module of the package that the statement names: ``from mpiml.comm import get_comm`` is an edge to
``mpiml.comm`` (the package's ``__init__.py``), ``from mpiml.comm._ops import X`` to
``mpiml.comm._ops``, and ``from . import _ops`` inside ``mpiml.comm`` to ``mpiml.comm._ops``.

Layers, top to bottom (DESIGN.md, "Layers", with the places of the shared modules decided here;
docs/architecture.md says what each owns). A module may import its own layer and any layer below
it, never one above:

====  =========================================================================================
 11   ``mpiml.__main__``, ``mpiml.cli``: the ``mpiml`` command, which dispatches to the benchmarks
 10   ``mpiml.bench``: the benchmark suites, and ``mpiml.cli._options`` (printing once, argument
      parsing, launching ranks), the one piece of the command line that the benchmarks use
  9   ``mpiml`` (the package's ``__init__.py``): the public face; it imports from the layers below
      (comm, _io, ...). The command line may use it as any client does; nothing below may.
      ``mpiml._init`` (``mpiml.init``: binds a GPU per local rank, sizes the thread pools) sits
      here too: it sets up what the layers below use, so it may call any of them.
  8   ``mpiml.dask``: the ``mpi://`` comm backend and the Dask-driven estimators
  7   ``mpiml.cluster``, ``neighbors``, ``linear_model``, ``decomposition``, ``ensemble``, and
      ``mpiml.utils._testing`` (a small estimator kept for the tests and as a template)
  6   ``mpiml.datasets``
  5   ``mpiml.base``, ``mpiml._io``: the estimators' base class; saving and loading models
  4   ``mpiml.utils``: parameter constraints, input validation (which agrees on errors across
      ranks, so it takes the world communicator when given none) and distributed linear algebra,
      shared by every estimator family
  3   ``mpiml.comm``
  2   ``mpiml.kernels``
  1   ``mpiml._array``, ``_config``, ``_errors``, ``_abort``, ``_version``: the array namespace,
      configuration, exceptions, the abort-on-error hook, the version
====  =========================================================================================

Within one package (``mpiml.dask``, ``mpiml.cli``, ...) any order is allowed, but no circle.
"""

import ast
import os

import pytest

from conftest import ROOT

SRC = os.path.join(ROOT, "src")
PACKAGE = "mpiml"

LAYERS = [
    (1, ["_array", "_config", "_errors", "_abort", "_version"]),
    (2, ["kernels"]),
    (3, ["comm"]),
    (4, ["utils"]),
    (5, ["base", "_io"]),
    (6, ["datasets"]),
    (7, ["cluster", "neighbors", "linear_model", "decomposition", "ensemble"]),
    (8, ["dask"]),
    (9, ["_init"]),
    (10, ["bench"]),
    (11, ["__main__", "cli"]),
]
FACADE = 9  # mpiml/__init__.py
#: Modules whose layer is not their package's (with the reason in the module docstring above).
OWN_LAYER = {"mpiml.utils._testing": 7, "mpiml.cli._options": 10}


def modules(src=SRC, package=PACKAGE):
    """``{dotted name: path}`` of every Python module of the package under ``src``."""
    found = {}
    for dirpath, _, files in os.walk(os.path.join(src, package)):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), src)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                found[".".join(rel)] = os.path.join(dirpath, f)
    return found


def _resolve(name, known):
    """The deepest known module that ``name`` (a dotted path, maybe ending in an attribute) names."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in known:
            return cand
        parts.pop()
    return None


def edges(known):
    """``{module: {imported module: first line}}`` over every import statement of every module."""
    graph = {}
    for mod, path in known.items():
        is_pkg = os.path.basename(path) == "__init__.py"
        tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
        out = graph.setdefault(mod, {})
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                # ``from pkg import sub`` names the submodule when there is one
                targets = [f"{stem}.{a.name}" for a in node.names if a.name != "*"] or [stem]
                if any(a.name == "*" for a in node.names):
                    targets.append(stem)
            elif isinstance(node, ast.Call) and _dynamic_import(node):
                targets = [node.args[0].value]
            for t in targets:
                if not t.startswith(PACKAGE):
                    continue
                dst = _resolve(t, known)
                if dst and dst != mod:
                    out.setdefault(dst, node.lineno)
    return graph


def _dynamic_import(call):
    """``importlib.import_module("mpiml.x")`` or ``__import__("mpiml.x", ...)``: a constant first argument."""
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    return (name in ("import_module", "__import__") and call.args and isinstance(call.args[0], ast.Constant)
            and isinstance(call.args[0].value, str))


def upward(graph):
    """Every edge that points to a higher layer, as a readable line."""
    return [f"{src} (layer {layer(src)}) -> {dst} (layer {layer(dst)}), line {line}"
            for src, dsts in sorted(graph.items()) for dst, line in sorted(dsts.items()) if layer(dst) > layer(src)]


def layer(mod):
    if mod in OWN_LAYER:
        return OWN_LAYER[mod]
    parts = mod.split(".")
    if len(parts) == 1:
        return FACADE
    for level, names in LAYERS:
        if parts[1] in names:
            return level
    raise AssertionError(f"{mod}: no layer; add it to LAYERS (and to docs/architecture.md)")


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _package(mod):
    return mod if mod in OWN_LAYER else ".".join(mod.split(".")[:2])


def _package_cycles(graph):
    """Circles between the packages of one layer's siblings (e.g. ``mpiml.cli`` <-> ``mpiml.bench``)."""
    top = {}
    for src, dsts in graph.items():
        a = _package(src)
        for dst in dsts:
            b = _package(dst)
            if a != b:
                top.setdefault(a, {})[b] = 1
    return cycles(top)


@pytest.fixture(scope="module")
def graph():
    return edges(modules())


def test_the_graph_sees_the_package(graph):
    # guard against a reader that finds nothing and so passes vacuously
    assert len(graph) > 50
    assert "mpiml.comm._communicator" in graph["mpiml.comm"]
    assert "mpiml.cluster._kmeans" in graph["mpiml.cluster"]


def test_no_import_circle_between_modules(graph):
    found = cycles(graph)
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_import_circle_between_packages(graph):
    found = _package_cycles(graph)
    assert not found, "package circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_arrow_points_up_a_layer(graph):
    up = upward(graph)
    assert not up, "imports that point up:\n" + "\n".join(up)


FAMILIES = LAYERS[6][1]


#: Family-to-family imports found at a merge, for their owners to move into utils/ (the lead empties this).
FAMILY_PENDING = set()


def test_no_estimator_family_imports_another(graph):
    # what two families share lives in utils/ or base.py, so a family can change alone
    fam = [f"{s} -> {d}, line {line}" for s, ds in sorted(graph.items()) for d, line in sorted(ds.items())
           if _family(s) and _family(d) and _family(s) != _family(d) and (s, d) not in FAMILY_PENDING]
    assert not fam, "\n".join(fam)


def _family(mod):
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FAMILIES and mod not in OWN_LAYER else None


def test_the_checker_finds_a_circle_and_an_upward_arrow(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "comm").mkdir(parents=True)
    (pkg / "cli").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "comm" / "__init__.py").write_text("def f():\n    from mpiml.cli import g\n")
    (pkg / "cli" / "__init__.py").write_text("from ..comm import f\n")
    g = edges(modules(str(tmp_path)))
    assert g["mpiml.comm"] == {"mpiml.cli": 2}
    assert g["mpiml.cli"] == {"mpiml.comm": 1}
    assert cycles(g) == [["mpiml.cli", "mpiml.comm"]]
    assert layer("mpiml.comm") < layer("mpiml.cli")
    assert upward(g) == ["mpiml.comm (layer 3) -> mpiml.cli (layer 11), line 2"]
    with pytest.raises(AssertionError, match="import circles"):
        test_no_import_circle_between_modules(g)
    with pytest.raises(AssertionError, match="imports that point up"):
        test_no_arrow_points_up_a_layer(g)


def test_the_checker_sees_package_circles_and_hidden_imports(tmp_path):
    # modules that do not import each other, but whose packages do (cluster._a -> neighbors, neighbors._b ->
    # cluster._c); a relative submodule import; an import by a constant string; none of them at module level
    pkg = tmp_path / PACKAGE
    for sub in ("cluster", "neighbors"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "cluster" / "_a.py").write_text("class A:\n    def f(self):\n        import mpiml.neighbors\n")
    (pkg / "cluster" / "_c.py").write_text("from . import _a\n")
    (pkg / "neighbors" / "_b.py").write_text("import importlib\nX = importlib.import_module('mpiml.cluster._c')\n")
    g = edges(modules(str(tmp_path)))
    assert g["mpiml.cluster._a"] == {"mpiml.neighbors": 3}
    assert g["mpiml.cluster._c"] == {"mpiml.cluster._a": 1}
    assert g["mpiml.neighbors._b"] == {"mpiml.cluster._c": 2}
    assert cycles(g) == []
    assert _package_cycles(g) == [["mpiml.cluster", "mpiml.neighbors"]]
    with pytest.raises(AssertionError, match="package circles"):
        test_no_import_circle_between_packages(g)
    with pytest.raises(AssertionError, match="mpiml.cluster._a -> mpiml.neighbors, line 3"):
        test_no_estimator_family_imports_another(g)


KERNELS = os.path.join(SRC, PACKAGE, "kernels")
#: CUDA sources still directly in ``kernels/`` while their families move to folders (the collectives, the
#: histograms, the linear models). The lead empties this after merging those moves; nothing new goes here.
FLAT_CUDA_PENDING = set()


def test_cuda_sources_live_in_family_folders():
    # kernels/<family>/ holds a family's .cu/.cuh beside its launcher (docs/architecture.md, "Kernels by family")
    flat = sorted(f for f in os.listdir(KERNELS)
                  if f.endswith((".cu", ".cuh")) and os.path.isfile(os.path.join(KERNELS, f))
                  and f not in FLAT_CUDA_PENDING)
    assert not flat, f"CUDA sources directly in src/mpiml/kernels/ (move them to a family folder): {flat}"
    families = [d for d in os.listdir(KERNELS) if os.path.isdir(os.path.join(KERNELS, d))
                and any(f.endswith(".cu") for f in os.listdir(os.path.join(KERNELS, d)))]
    assert {"kmeans", "select"} <= set(families)


def test_the_build_lists_only_sources_that_exist():
    # build.py's programs name files relative to kernels/: a moved .cu must be moved there too
    from mpiml.kernels import build

    named = {f for files, _ in build.specs("sm_90") for f in files}
    missing = sorted(f for f in named if not os.path.isfile(os.path.join(KERNELS, f)))
    assert not missing, f"build.py names sources that do not exist: {missing}"
    # every CUDA source in a family folder is compiled by some program (none left behind by a split)
    in_folders = {os.path.relpath(os.path.join(d, f), KERNELS) for d, _, fs in os.walk(KERNELS)
                  for f in fs if f.endswith((".cu", ".cuh")) and d != KERNELS}
    assert in_folders <= named, sorted(in_folders - named)


#: Most lines a module (``.py``, ``.cu``, ``.cuh``) of ``src/`` has unless its head says why it needs more.
MAX_LINES = 800
#: What a longer module's head (docstring or first comment block, its first 40 lines) says, followed by why.
LONG_BECAUSE = "Longer than 800 lines because"
#: Over the limit, split by the helper that owns them; the lead empties this after merging.
LONG_PENDING = set()


def test_no_module_is_long_without_saying_why():
    long = []
    for d, _, fs in os.walk(os.path.join(SRC, PACKAGE)):
        for f in fs:
            if not f.endswith((".py", ".cu", ".cuh")):
                continue
            path = os.path.join(d, f)
            with open(path, encoding="utf-8") as fh:
                lines = fh.readlines()
            rel = os.path.relpath(path, SRC).replace(os.sep, "/")
            if len(lines) > MAX_LINES and rel not in LONG_PENDING and LONG_BECAUSE not in "".join(lines[:40]):
                long.append(f"{rel}: {len(lines)} lines")
    assert not long, (f"modules over {MAX_LINES} lines whose head does not say '{LONG_BECAUSE} ...' "
                      "(split them, or say why):\n" + "\n".join(long))


def test_every_cuda_source_is_package_data():
    # a wheel holds only what pyproject.toml's package-data names: a .cuh in a family folder must match too
    import fnmatch
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        globs = tomllib.load(f)["tool"]["setuptools"]["package-data"][PACKAGE]
    pkg = os.path.join(SRC, PACKAGE)
    sources = [os.path.relpath(os.path.join(d, f), pkg).replace(os.sep, "/") for d, _, fs in os.walk(KERNELS)
               for f in fs if f.endswith((".cu", ".cuh"))]
    assert len(sources) > 5
    # setuptools globs do not cross folders: '*' matches within one path part
    left = [s for s in sources if not any(fnmatch.fnmatch(s, g) and s.count("/") == g.count("/") for g in globs)]
    assert not left, f"CUDA sources missing from [tool.setuptools.package-data] in pyproject.toml: {left}"
