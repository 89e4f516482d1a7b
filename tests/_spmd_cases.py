"""Several multi-rank cases in one ``mpiexec`` launch, each still passing or failing on its own.

Starting a rank costs a Python, mpi4py, NumPy, scikit-learn and mpiml import (about 2 s of CPU
a rank on the 2-core CI machine), often more than the case it runs.  A test module that runs the
same scripts under different settings at one rank count can run them all in one launch:

- run as a script (``mpiexec -n N python _spmd_cases.py OUTDIR CASES.json``), this file runs the
  cases one after the other; a case is ``{"name", "script", "args", "env"}``: ``main(*args)`` of the
  script file (an argument ``"{out}"`` becomes the case's own folder, ``OUTDIR/<name>``), with the
  variables ``env`` set for that case only (the launch's environment is restored between cases).  Each rank writes ``OUTDIR/<name>/rank<r>.json``, its failures of that
  case (``_spmd.check`` records and exceptions), then the launch agrees on its exit status.
- in the test process, :class:`CaseLaunches` launches once per rank count (memoized for the test
  module) and :meth:`CaseLaunches.verdict` fails one test with one case's messages, or with the
  launch's output when the launch ended before that case finished.

A case that hangs still ends the whole launch at its timeout (then every later case fails with it).
"""

import importlib.util
import json
import os
import sys
import time
import traceback
import warnings


def _script_main(path):
    name = os.path.splitext(os.path.basename(path))[0]
    module = sys.modules.get(name)
    if module is None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module.main


def _run_cases(root, cases):
    import _spmd
    from mpiml.comm import get_comm

    comm = get_comm()
    for case in cases:
        out = os.path.join(root, case["name"])
        os.makedirs(out, exist_ok=True)
        start, t0, base = len(_spmd._failures), time.perf_counter(), dict(os.environ)
        os.environ.update(case.get("env", {}))
        try:
            with warnings.catch_warnings():    # a case's warning filters end with it
                _script_main(case["script"])(*(out if a == "{out}" else a for a in case.get("args", ())))
        except Exception:
            _spmd._failures.append(traceback.format_exc())
        finally:
            os.environ.clear()
            os.environ.update(base)
            # but not without the variables mpiml set for this process during the case (Numba's pool size): Numba
            # compares its launched pool with NUMBA_NUM_THREADS each time it compiles, and a kernel first compiled
            # in a later case (a cold cache) failed with "Cannot set NUMBA_NUM_THREADS to a different value"
            from mpiml.utils import _threads

            os.environ.update({k: v for k, v in _threads._OURS.items() if k not in base})
        failures = _spmd._failures[start:]
        with open(os.path.join(out, f"rank{comm.rank}.json"), "w") as f:
            json.dump({"failures": failures, "seconds": time.perf_counter() - t0}, f)
        if comm.rank == 0:
            print(f"{case['name']}: {'FAILED' if failures else 'ok'} on rank 0 [{time.perf_counter() - t0:.1f} s]",
                  flush=True)
    _spmd.finish(comm)


class CaseLaunches:
    """One launch per rank count of the cases ``cases[n]`` (lists of case dicts), in ``tmp_path_factory``'s
    folders; make one per group of tests that share launches (a module-scoped fixture, or a module's
    global that several test modules take, as tests/utils/_utils_launches.py does)."""

    def __init__(self, cases, tmp_path_factory, *, timeout=540, env=None):
        self.cases, self.tmp, self.timeout, self.env = cases, tmp_path_factory, timeout, env
        self._done = {}

    def _launch(self, n):
        import pytest

        from conftest import run_mpi

        if n not in self._done:
            root = self.tmp.mktemp(f"cases{n}")
            (root / "cases.json").write_text(json.dumps(self.cases[n]))
            try:
                proc = run_mpi(os.path.abspath(__file__), n, root, root / "cases.json", timeout=self.timeout,
                               env=self.env, expect_ok=False)
                log = (f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n"
                       f"--- stderr\n{proc.stderr[-6000:]}")
            except pytest.fail.Exception as exc:      # a hang: every case of the launch fails with it
                log = str(exc)
            self._done[n] = (root, log)
        return self._done[n]

    def verdict(self, n, name):
        """Fail (the calling test) with the messages of case ``name`` on ``n`` ranks, or return its folder."""
        import pytest

        root, log = self._launch(n)
        failures = []
        for r in range(n):
            path = root / name / f"rank{r}.json"
            if not path.exists():
                pytest.fail(f"case {name} on {n} ranks did not finish on rank {r}: the launch ended first\n{log}")
            failures += [f"rank {r}: FAIL {f}" for f in json.loads(path.read_text())["failures"]]
        if failures:
            pytest.fail(f"{name} on {n} ranks:\n" + "\n".join(failures[:20]))
        return root / name


_SESSION = {}


def session_launches(key, cases, tmp_path_factory, **kwargs):
    """The test session's one :class:`CaseLaunches` named ``key`` (made on first use): the launches that
    several test modules of a folder share, each module taking the verdicts of its own cases."""
    if key not in _SESSION:
        _SESSION[key] = CaseLaunches(cases, tmp_path_factory, **kwargs)
    return _SESSION[key]


if __name__ == "__main__":
    with open(sys.argv[2]) as f:
        _run_cases(sys.argv[1], json.load(f))
