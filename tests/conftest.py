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


#: The CPU kernel families (tests/_warm_kernels.py) that the tests of a folder compile: a session holding
#: multi-rank CPU tests of these folders has them compiled before its first test.  Only tests/neighbors: it meets
#: argument types on several ranks that one process does not (read-only shared windows).  tests/cluster,
#: tests/ensemble and tests/linear_model compile each kernel once anyway, in the test process or a launch's one
#: rank (warmed, none was faster with an empty cache on the loaded 2-core VM: 48 -> 53 s, 185 -> 396 s under a
#: load average of 3 then 6, 118 -> 115 s); a folder not named here compiles what it meets, as before.
WARM_FAMILIES = {"neighbors": ("neighbors", "neighbors_read_only", "kmeans")}
_WARM = {}   # "families", "seconds", "output" of the session's warm-up


def _folder(nodeid):
    return os.path.relpath(os.path.join(ROOT, nodeid.split("::")[0]), TESTS).split(os.sep)[0]


def warm_cpu_kernels(items, timeout=600):
    """Compile the CPU kernels of the folders whose multi-rank CPU tests the session holds before the session's first
    test, each family once (tests/_warm_kernels.py, as many processes at once as cores; not with
    ``MPIML_TEST_WARM=0``).

    With an empty Numba cache the test process compiled each kernel at its first single-process test, and every
    rank of a launch compiled those it met first (a node's read-only shared windows, for the neighbours), one
    compile after another: CI's tests/neighbors took 183 s with an empty cache against 65 s with a warm one.
    Compiled ahead, spread over the cores, every process loads them: tests/neighbors with an empty cache on the
    2-core VM, OMP_NUM_THREADS=1, took 125.6 -> 98.1 s and 99.9 -> 82.4 s in two pairs of runs (load averages 3-4
    and 1.5; 58.5 s with a warm cache), the same CPU time.  A warm cache costs 3.1 s (the scripts' start and
    loads); a kernel the warm-up misses is compiled where it is met, as before, and a warm-up that fails or times
    out fails no test."""
    if os.environ.get("MPIML_TEST_WARM", "1") == "0" or _WARM:
        return
    families = []
    for item in items:
        if "mpi" in item.keywords and "gpu" not in item.keywords:
            families += [f for f in WARM_FAMILIES.get(_folder(item.nodeid), ()) if f not in families]
    if not families:
        return
    # one process per family, as many at once as there are cores (Numba compiles on one thread)
    t0 = time.time()
    lanes = max(1, min(len(families), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))
    procs = [subprocess.Popen([sys.executable, os.path.join(TESTS, "_warm_kernels.py"), *families[i::lanes]],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_child_env(),
                              start_new_session=True) for i in range(lanes)]
    out = []
    for proc in procs:
        try:
            text = proc.communicate(timeout=max(1.0, timeout - (time.time() - t0)))[0]
            out.append(f"exit {proc.returncode}; {text}")
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            out.append(f"killed after {timeout} s")
    _WARM.update(families=families, seconds=time.time() - t0, output="\n".join(out))


def pytest_terminal_summary(terminalreporter):
    if _WARM:
        out = " | ".join(line for line in _WARM["output"].split("\n") if line.strip())
        terminalreporter.write_line(f"CPU kernel warm-up (tests/_warm_kernels.py {' '.join(_WARM['families'])}): "
                                    f"{_WARM['seconds']:.1f} s, {out[-1500:]}")


def pytest_collection_finish(session):
    warm_cpu_kernels(session.items)


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
