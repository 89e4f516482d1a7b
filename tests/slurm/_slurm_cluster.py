"""A real single-node Slurm for the tests in this folder: munged, slurmctld and slurmd.

(Not named conftest.py: the top-level tests/conftest.py is imported by name from test modules.)

The fixture starts private daemons in a temporary directory (their own munge
socket and key, free ports, state and logs), waits until the node is idle, and
stops them afterwards.  Where they cannot start (Slurm not installed, not root,
a daemon that dies) the tests are skipped with the reason and the daemon's log.
CI installs Debian's ``slurm-wlm`` and ``munge`` (see .ci/run).
"""

import os
import random
import shutil
import signal
import socket
import subprocess
import time

import pytest

_BINARIES = ("munged", "slurmctld", "slurmd", "srun", "salloc", "sinfo")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_line():
    """``NodeName=... CPUs=...`` as slurmd itself sees this machine (so the node is not drained)."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30).stdout
    line = out.splitlines()[0]
    line = line.replace(" Boards=1", "").replace("SocketsPerBoard=", "Sockets=")
    return line


def _tail(path, n=15):
    try:
        with open(path) as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no log)"


def _kill_pidfile(path):
    try:
        pid = int(open(path).read().strip())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        pass


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """Environment (a dict) in which ``srun``/``salloc`` reach a private single-node cluster."""
    missing = [b for b in _BINARIES if shutil.which(b) is None]
    if missing:
        pytest.skip(f"Slurm is not installed here (missing {', '.join(missing)}; "
                    "apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        pytest.skip("a private slurmd must run as root to start job steps; not root here")
    d = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool", "log", "run"):
        (d / sub).mkdir()
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    sock = d / "run" / "munge.sock"
    host = socket.gethostname().split(".")[0]
    conf = d / "slurm.conf"
    conf.write_text("\n".join([
        # job ids unique across sessions: MPICH names a step's shared memory after "<job>.<step>",
        # and a segment left by a killed step of an earlier session would hang MPI_Init
        "ClusterName=mpimltest", f"FirstJobId={random.randrange(1000, 60_000_000)}",
        f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={sock}",
        f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool",
        f"SlurmctldPidFile={d}/run/slurmctld.pid", f"SlurmdPidFile={d}/run/slurmd.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log", f"SlurmdLogFile={d}/log/slurmd.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "SwitchType=switch/none", "MpiDefault=pmi2", "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "ReturnToService=2",
        f"{_node_line()} State=UNKNOWN",
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8",
        ""]))
    env = dict(os.environ, SLURM_CONF=str(conf))
    for var in [v for v in env if v.startswith(("SLURM_", "PMI_", "PMIX_", "OMPI_"))]:
        if var != "SLURM_CONF":
            del env[var]
    procs = []
    try:
        procs.append(subprocess.Popen(["munged", "--force", "-F", f"--socket={sock}", f"--key-file={key}",
                                       f"--pid-file={d}/run/munged.pid", f"--log-file={d}/log/munged.log",
                                       f"--seed-file={d}/run/munge.seed"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        for _ in range(50):
            if sock.exists():
                break
            time.sleep(0.1)
        else:
            pytest.skip(f"munged did not start:\n{_tail(d / 'log' / 'munged.log')}")
        procs.append(subprocess.Popen(["slurmctld", "-D", "-c", "-f", str(conf)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        time.sleep(0.5)
        procs.append(subprocess.Popen(["slurmd", "-D", "-f", str(conf)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        deadline = time.time() + 30
        state = ""
        while time.time() < deadline:
            dead = [p for p in procs if p.poll() is not None]
            if dead:
                break
            state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True,
                                   timeout=10).stdout.strip()
            if state in ("idle", "mix", "alloc"):
                break
            time.sleep(0.3)
        if state not in ("idle", "mix", "alloc"):
            pytest.skip(f"the private Slurm did not come up (node state {state!r}):\n"
                        f"--- slurmctld\n{_tail(d / 'log' / 'slurmctld.log')}\n"
                        f"--- slurmd\n{_tail(d / 'log' / 'slurmd.log')}")
        yield env
    finally:
        # no job step outlives the cluster (slurmstepd and its ranks are not our children)
        if shutil.which("scancel"):
            subprocess.run(["scancel", "--user", str(os.getuid()), "--signal=KILL", "--full"], env=env,
                           capture_output=True, timeout=30)
            time.sleep(0.5)
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        for pidfile in ("slurmd.pid", "slurmctld.pid"):
            _kill_pidfile(d / "run" / pidfile)
