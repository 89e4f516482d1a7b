"""``python -m mpiml.dask``: a Dask cluster made of the ranks of an MPI job.

Every test launches ``mpiexec`` itself with a timeout, so a hang fails the test.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, run_mpi

pytest.importorskip("distributed")

HERE = os.path.dirname(os.path.abspath(__file__))
APP = os.path.join(HERE, "_cluster_app.py")
LAUNCHER = os.path.join(ROOT, "src", "mpiml", "dask", "__main__.py")
QUIET = {"DASK_LOGGING__DISTRIBUTED": "error"}


def launch(n, *args, timeout=120, expect_ok=True):
    """``mpiexec -n n python -m mpiml.dask ARGS``."""
    return run_mpi(LAUNCHER, n, *args, timeout=timeout, env=QUIET, expect_ok=expect_ok)


def write_script(tmp_path, code):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(code))
    return path


@pytest.mark.mpi
@pytest.mark.slow
def test_same_results_over_mpi_and_tcp(tmp_path):
    """Scheduler, client and two workers compute the same things over both protocols.

    Covers dask.array, worker-to-worker transfers, scatter/gather, a task's
    exception reaching the client, a dask.dataframe merge and a worker retired
    mid-computation whose tasks are redone on the other worker.
    """
    results = {}
    for protocol in ("mpi", "tcp"):
        out = tmp_path / f"{protocol}.json"
        launch(4, "--protocol", protocol, APP, out)
        results[protocol] = json.loads(out.read_text())
    mpi, tcp = results["mpi"], results["tcp"]
    assert mpi.pop("schemes") == ["mpi"] and tcp.pop("schemes") == ["tcp"]
    assert mpi == tcp
    assert mpi["n_workers"] == 2 and mpi["gathered_equal"]
    assert mpi["error"] == "bad input 7"
    assert mpi["after_retire"] == sum(2 * i for i in range(60))


@pytest.mark.mpi
def test_exit_status_and_arguments(tmp_path):
    """The job's exit status is the script's; the script sees its own argv and the address."""
    script = write_script(tmp_path, """
        import os, sys
        from mpiml.dask import get_client
        client = get_client()
        assert client.submit(sum, [1, 2, 3]).result() == 6
        assert sys.argv[1:] == ["--flag", "x"], sys.argv
        assert os.environ["MPIML_DASK_SCHEDULER"] == client.scheduler.address
        assert client.scheduler.address.startswith("mpi://0:")
        print("script ran", flush=True)
        sys.exit(3)
    """)
    proc = launch(3, "--nthreads", "2", script, "--flag", "x", expect_ok=False)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "script ran" in proc.stdout


@pytest.mark.mpi
def test_exception_aborts_the_job(tmp_path):
    """An exception in the script prints its traceback and ends every rank (no hang)."""
    script = write_script(tmp_path, """
        from mpiml.dask import get_client
        get_client()
        raise RuntimeError("script failed on purpose")
    """)
    proc = launch(3, script, timeout=90, expect_ok=False)
    assert proc.returncode != 0
    assert "script failed on purpose" in proc.stderr
    assert "aborting the MPI job" in proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("protocol", ["mpi", "tcp"])
def test_killed_worker_ends_the_job(tmp_path, protocol):
    """A worker process killed mid-computation (SIGKILL).

    Under MPICH (and Open MPI) the launcher tears the whole job down when a rank
    dies, whatever Dask's protocol: so the check is that the job ends, with a
    failure status, well within the timeout instead of hanging.
    """
    script = write_script(tmp_path, """
        import os, signal, threading, time
        from mpiml.dask import get_client, worker_addresses
        client = get_client()
        workers = worker_addresses(client)
        futures = client.map(lambda i: (time.sleep(0.05), i)[1], range(200), pure=False)
        time.sleep(0.3)
        def die_soon():
            threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGKILL)).start()
        client.run(die_soon, workers=[workers[0]])
        print("gathered", sum(client.gather(futures)), flush=True)
        time.sleep(30)  # the launcher must not wait for this
    """)
    proc = launch(4, "--protocol", protocol, script, timeout=100, expect_ok=False)
    assert proc.returncode != 0


@pytest.mark.mpi
def test_needs_three_ranks(tmp_path):
    script = write_script(tmp_path, "print('never runs')\n")
    proc = launch(2, script, timeout=60, expect_ok=False)
    assert proc.returncode == 2
    assert "at least 3 MPI ranks" in proc.stderr
    assert proc.stderr.count("at least 3 MPI ranks") == 1  # rank 0 prints
    assert "never runs" not in proc.stdout


def test_usage_error_exits_2():
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    proc = subprocess.run([sys.executable, "-m", "mpiml.dask", "--protocol", "udp", "x.py"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2
    assert "invalid choice: 'udp'" in proc.stderr


def test_get_client_outside_the_launcher():
    from mpiml.dask import get_client

    with pytest.raises(RuntimeError, match="mpiml dask"):
        get_client()


def test_import_is_lazy():
    """``import mpiml.dask`` loads neither distributed nor MPI."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    code = ("import sys, mpiml.dask; "
            "print(sorted(m for m in ('distributed', 'mpi4py.MPI', 'cupy') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


WORKERS_RACE = """
    import sys
    from mpiml.dask import get_client, worker_addresses
    client = get_client()
    # the client refreshes its cached scheduler identity every millisecond (instead of every
    # 2 s), asking for no per-worker details: a read of the cache is then often empty
    client._periodic_callbacks["scheduler-info"].stop()
    from tornado.ioloop import PeriodicCallback
    cb = PeriodicCallback(client._update_scheduler_info, 1)
    client.loop.add_callback(cb.start)
    use_cache = sys.argv[1] == "cache"
    seen = set()
    for _ in range(300):
        if use_cache:
            got = sorted(client.scheduler_info(n_workers=-1)["workers"])
        else:
            got = worker_addresses(client)
        seen.add(len(got))
    client.loop.add_callback(cb.stop)
    print("worker counts seen:", sorted(seen))
    sys.exit(0 if seen == {2} else 3)
"""


@pytest.mark.mpi
def test_worker_addresses_are_never_a_stale_cache(tmp_path):
    """``worker_addresses`` (which the Dask-driven estimators use to notice a worker that left)
    asks the scheduler; the client's cached ``scheduler_info()`` can say that live workers are
    gone while the client's periodic refresh runs (it did, under load, in a CI run)."""
    script = write_script(tmp_path, WORKERS_RACE)
    proc = launch(4, script, "direct")
    assert "worker counts seen: [2]" in proc.stdout, proc.stdout + proc.stderr
