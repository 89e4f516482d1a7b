"""Shared test helpers: launching real ``mpiexec`` jobs with a timeout, GPU detection.

Multi-rank tests write (or name) a script, run it under ``mpiexec -n N`` with a
hard timeout, and assert on the exit status: the scripts agree on their verdict
collectively (see :func:`collective_assert` in ``tests/_spmd.py``), so all ranks
pass or fail together and a hang is a test failure, not a stalled CI.
"""

import glob
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")


def _mpiexec():
    here = os.path.dirname(sys.executable)   # a virtual environment used without activating it
    exe = (os.environ.get("MPIML_TEST_MPIEXEC") or shutil.which("mpiexec") or shutil.which("mpirun")
           or shutil.which("mpiexec", path=here) or shutil.which("mpirun", path=here))
    return exe


def have_gpu():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def mpiexec_cmd(n):
    exe = _mpiexec()
    if exe is None:
        pytest.skip("no mpiexec on PATH (pip install mpich)")
    _warm_kernels_wait()
    cmd = [exe, "-n", str(n)]
    extra = os.environ.get("MPIML_TEST_MPIEXEC_ARGS", "")
    return cmd + extra.split() if extra else cmd


def run_group(cmd, timeout, **kwargs):
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)``, in a
    new process group that is killed whole on timeout.

    Killing only the launcher (what ``subprocess.run`` does) leaves its ranks running: on a
    two-core CI machine, orphans spinning in MPI slow every later test.  Raises
    ``subprocess.TimeoutExpired`` with what the job printed before it was killed.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _child_env(env=None):
    """The environment of a launched job: this one, ``src`` and ``tests`` importable, one thread, ``env`` on top."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src"), TESTS, full_env.get("PYTHONPATH", "")])
    full_env.setdefault("MPIML_TIMEOUT", "60")
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.setdefault("OPENBLAS_NUM_THREADS", "1")
    if env:
        full_env.update(env)
    return full_env


def run_mpi(script, n, *args, timeout=120, env=None, expect_ok=True, code=None):
    """Run ``script`` (a path, or ``code`` text written to a temp file) on ``n`` ranks.

    Returns the CompletedProcess; with ``expect_ok`` a non-zero exit fails the
    test with both output streams shown.  A run past ``timeout`` seconds fails.
    """
    full_env = _child_env(env)
    if code is not None:
        import tempfile

        fd, script = tempfile.mkstemp(suffix=".py", prefix="mpiml_test_")
        with os.fdopen(fd, "w") as f:
            f.write(textwrap.dedent(code))
    cmd = mpiexec_cmd(n) + [sys.executable, script, *map(str, args)]
    try:
        proc = run_group(cmd, timeout, env=full_env)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")
        err = (exc.stderr or b"")
        out = out.decode() if isinstance(out, bytes) else out
        err = err.decode() if isinstance(err, bytes) else err
        pytest.fail(f"mpiexec -n {n} {os.path.basename(script)} hung past {timeout} s\n"
                    f"--- stdout\n{out[-4000:]}\n--- stderr\n{err[-4000:]}")
    finally:
        if code is not None:
            os.unlink(script)
    if expect_ok and proc.returncode != 0:
        pytest.fail(f"mpiexec -n {n} {os.path.basename(script)} exited {proc.returncode}\n"
                    f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    return proc


def forge_model_file(path, edit):
    """Rewrite a model file with ``edit(entries)`` applied to its ``{name: bytes}`` and a valid
    checksum: a forged file, which only the loader's own checks can refuse."""
    import zipfile

    from mpiml import _io

    with zipfile.ZipFile(path) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    entries.pop("SHA256SUM")
    edit(entries)
    entries["SHA256SUM"] = _io._digest(entries).encode()
    with zipfile.ZipFile(path, "w") as z:
        for n, d in entries.items():
            z.writestr(n, d)


@pytest.fixture
def mpi():
    """The :func:`run_mpi` helper as a fixture."""
    return run_mpi


#: The CPU kernel families (tests/_warm_kernels.py) whose compiles the multi-rank tests of a folder meet: those
#: folders' launches wait for one process to compile them first (a folder not named here: its ranks compile
#: what they meet, as before; tests/utils's thread checks meet theirs first on one rank).
WARM_FAMILIES = {"cluster": ("kmeans",), "neighbors": ("neighbors", "kmeans"), "ensemble": ("forest",),
                 "linear_model": ("linear",)}
_WARM = {}   # "proc": the warm-up process, "families" (in the order it warms them), "log" (its output), "start"


def _folder(path):
    return os.path.relpath(os.path.join(ROOT, path), TESTS).split(os.sep)[0]


def _warm_kernels_start(items):
    """Start tests/_warm_kernels.py beside the session for the families its multi-rank CPU tests meet, in the
    order the session meets them (not with ``MPIML_TEST_WARM=0``): every rank of a launch meeting a kernel
    missing from Numba's cache compiled it too (tests/neighbors: 183 s with an empty cache, 65 s with a warm one
    on CI), where kernels met only on several ranks (a node's read-only shared windows) were compiled by all."""
    if os.environ.get("MPIML_TEST_WARM", "1") == "0" or _WARM:
        return
    families = []
    for item in items:
        if "mpi" in item.keywords and "gpu" not in item.keywords:
            families += [f for f in WARM_FAMILIES.get(_folder(item.nodeid.split("::")[0]), ()) if f not in families]
    if not families:
        return
    import tempfile

    fd, log = tempfile.mkstemp(prefix="mpiml_warm_", suffix=".log")
    proc = subprocess.Popen([sys.executable, os.path.join(TESTS, "_warm_kernels.py"), *families],
                            stdout=fd, stderr=subprocess.STDOUT, env=_child_env(), start_new_session=True)
    os.close(fd)
    _WARM.update(proc=proc, families=families, log=log, start=time.time())


def _warm_output():
    with open(_WARM["log"]) as f:
        return f.read()


def _warm_kernels_wait(timeout=600):
    """Before a launch: wait until the warm-up has warmed the families of the calling test's folder (none for
    a folder not in :data:`WARM_FAMILIES`; every family outside a test); past ``timeout`` seconds from its start
    it is killed and the ranks compile what they meet."""
    proc = _WARM.get("proc")
    if proc is None or proc.poll() is not None:
        return
    current = os.environ.get("PYTEST_CURRENT_TEST")
    need = WARM_FAMILIES.get(_folder(current.split("::")[0]), ()) if current else _WARM["families"]
    need = [f for f in need if f in _WARM["families"]]
    while need and proc.poll() is None:
        done = {line.split()[1] for line in _warm_output().splitlines() if line.startswith("warmed ")}
        if all(f in done for f in need):
            return
        if time.time() - _WARM["start"] > timeout:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return
        time.sleep(0.2)


def pytest_terminal_summary(terminalreporter):
    if _WARM:
        out = " | ".join(_WARM.get("output", "").split("\n")).strip(" |")
        terminalreporter.write_line(f"CPU kernel warm-up (tests/_warm_kernels.py {' '.join(_WARM['families'])}): "
                                    f"{_WARM.get('state')}; {out[-1500:]}")


def pytest_collection_finish(session):
    _warm_kernels_start(session.items)


def pytest_collection_modifyitems(config, items):
    if have_gpu():
        if any("gpu" in item.keywords for item in items):
            _ship_cupy_cache()
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _ship_cupy_cache():
    """CuPy's shipped kernel cache put in place once, before the GPU tests, as :func:`mpiml.init` does before a fit.

    A GPU host of the test passes starts with an empty CuPy cache, and most GPU tests and their scripts never call
    ``mpiml.init``: the first process to need a CuPy kernel compiled it with NVRTC, and ranks of a launch (and test
    groups run side by side) compiled the same ones at once.  The tests of the shipping itself use caches of their
    own (``CUPY_CACHE_DIR`` in a temporary folder).  ``MPIML_CUPY_SHIP=0`` leaves the cache alone, as for init.
    """
    from mpiml.kernels import _cupy_ship

    _cupy_ship.install()


# MPICH names a job's shared-memory segment after a hash of its PMI job name and unlinks it at
# MPI_Finalize; a rank killed before that (the fault tests kill ranks on purpose, a timed-out
# test kills its job) leaves /dev/shm/mpich_* behind.  A later job whose name hashes the same
# (Slurm names steps "<job>.<step>", the same in every fresh private cluster) attaches to the
# stale segment and hangs in MPI_Init.  So each session removes the segments it leaked.
_SHM_GLOBS = ("/dev/shm/mpich_shm_*", "/dev/shm/mpich_vci_*")
_session_start = [0.0]


def _mapped_files():
    mapped = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                for line in f:
                    if "/dev/shm/" in line:
                        mapped.add(line.split(None, 5)[-1].strip())
        except OSError:
            continue
    return mapped


def pytest_sessionstart(session):
    _session_start[0] = time.time() - 1.0


def pytest_sessionfinish(session, exitstatus):
    proc = _WARM.get("proc")
    if proc is not None and "state" not in _WARM:
        _WARM["state"] = f"exit {proc.returncode}" if proc.poll() is not None else "killed at the session's end"
        if proc.poll() is None:   # not left compiling after the session
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        _WARM["output"] = _warm_output()
        os.unlink(_WARM["log"])
    leaked = []
    for pattern in _SHM_GLOBS:
        for path in glob.glob(pattern):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if st.st_uid == os.getuid() and st.st_ctime >= _session_start[0]:
                leaked.append(path)
    if not leaked:
        return
    in_use = _mapped_files()
    for path in leaked:
        if path not in in_use:
            try:
                os.unlink(path)
            except OSError:
                pass
