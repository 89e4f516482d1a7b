"""Running a test file that scikit-learn ships against mpiml's classes (one process).

``adopt(module, swaps, ...)`` returns the module's test functions, each wrapped so that
for the duration of the test

- the module-level names in ``swaps`` (e.g. ``"LogisticRegression"``) are ours;
- an argument equal to a swapped scikit-learn class (``Estimator``, ``klass``, ...)
  becomes ours, and a test parametrized with a class mpiml does not have is skipped;
- a known deviation (``deviations``: a test name, or one parametrization of it such as
  ``"test_x[csr_matrix-1]"``, -> a reason, or -> ``(predicate, reason)`` where the
  predicate receives the bound arguments) must still fail: it is reported
  as xfail, and a deviation that starts passing fails the test (strict), so the list
  stays true.

Only tests whose source constructs one of the swapped classes are taken (the others
test scikit-learn, not us). Parametrize marks travel with the wrapper
(``functools.wraps`` copies them), so the test ids are scikit-learn's own.
"""

import functools
import inspect
import os
import types

import numpy as np
import pytest


_KNOWN_MARKS = {"parametrize", "filterwarnings", "skipif", "xfail", "skip", "usefixtures", "slow"}


@pytest.fixture
def global_random_seed():
    return 42


@pytest.fixture(params=[np.float32, np.float64], ids=["float32", "float64"])
def global_dtype(request):
    return request.param


def _current_id(name):
    """The parametrization id of the running test (``name[...]``), from pytest's environment."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    node = current.rsplit(" (", 1)[0].split("::")[-1]
    return node if node.startswith(name) else name


def _deviation(deviations, name, arguments):
    entry = deviations.get(_current_id(name), deviations.get(name))
    if entry is None:
        return None
    if isinstance(entry, str):
        return entry
    predicate, reason = entry
    return reason if predicate(arguments) else None


def _adapt(module, name, fn, swaps, skip_classes, deviations, namespaces, thin):
    sig = inspect.signature(fn)
    theirs = {id(getattr(module, n, None)): ours for n, ours in swaps.items() if hasattr(module, n)}
    theirs.update({id(k): v for k, v in namespaces.get("_by_class", {}).items()})

    def swap(value):
        if isinstance(value, type) and id(value) in theirs:
            return theirs[id(value)]
        if isinstance(value, type) and value in skip_classes:
            pytest.skip(f"{value.__name__}: {skip_classes[value]}")
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, type) for v in value):
            return type(value)(swap(v) for v in value)
        return value

    @functools.wraps(fn)
    def test(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        if thin is not None and thin(_current_id(name)):
            pytest.skip(thin.__doc__)
        reason = _deviation(deviations, name, dict(bound.arguments))
        for arg, value in list(bound.arguments.items()):
            bound.arguments[arg] = swap(value)
        mp = pytest.MonkeyPatch()
        for n, ours in swaps.items():
            mp.setattr(module, n, ours, raising=False)
        for n, ns in namespaces.items():
            if n != "_by_class":
                mp.setattr(module, n, ns)
        try:
            if reason is None:
                fn(*bound.args, **bound.kwargs)
                return
            try:
                fn(*bound.args, **bound.kwargs)
            except (Exception, pytest.fail.Exception) as exc:  # the known deviation, still there
                pytest.xfail(f"{reason} ({type(exc).__name__})")
            pytest.fail(f"[XPASS(strict)] listed deviation now passes: {reason}")
        finally:
            mp.undo()

    # scikit-learn's own markers (thread_unsafe, ...) are unknown to this repository's strict markers
    test.pytestmark = [m for m in getattr(fn, "pytestmark", []) if m.name in _KNOWN_MARKS]
    return test


def namespace(original, **ours):
    """A stand-in for a module such as ``sklearn.neighbors`` with some classes replaced."""
    ns = types.SimpleNamespace(**{k: getattr(original, k) for k in dir(original) if not k.startswith("__")})
    for k, v in ours.items():
        setattr(ns, k, v)
    return ns


def adopt(module, swaps, *, deviations=None, skip_classes=None, namespaces=None, uses=None, exclude=(),
          thin=None):
    """The adapted test functions of ``module``, as a ``{name: test}`` dict to put in globals().

    ``thin``, a predicate on the test id whose docstring says why, skips the parametrizations
    it selects (to keep a file's run short where many cases exercise the same code).
    """
    deviations = deviations or {}
    skip_classes = skip_classes or {}
    namespaces = namespaces or {}
    words = tuple(uses) if uses is not None else tuple(f"{n}(" for n in swaps)
    tests = {}
    for name, fn in sorted(vars(module).items()):
        if type(fn).__name__ == "FixtureFunctionDefinition" or hasattr(fn, "_pytestfixturefunction"):
            tests[name] = fn  # the module's own fixtures, which its tests ask for
            continue
        if not (name.startswith("test_") and callable(fn)) or name in exclude:
            continue
        try:
            src = inspect.getsource(fn)
        except (OSError, TypeError):
            continue
        if not any(w in src for w in words):
            continue
        tests[name] = _adapt(module, name, fn, swaps, skip_classes, deviations, namespaces, thin)
    unknown = {d.split("[")[0] for d in deviations} - {n for n in tests if n.startswith("test_")}
    assert not unknown, f"deviations listed for tests that were not collected: {sorted(unknown)}"
    return tests
