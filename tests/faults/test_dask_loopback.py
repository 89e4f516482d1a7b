"""``mpiml dask`` listens on this host only, and starts no HTTP server, unless told otherwise.

A cluster is started under ``mpiexec -n 3 mpiml dask`` (scheduler, client, one worker); the script
asks every process which TCP sockets it listens on (its own socket inodes matched against
``/proc/net/tcp`` and ``/proc/net/tcp6``) and writes them to a JSON file that the test checks.

The MPI library has listening sockets of its own (MPICH's launcher and its libfabric tcp provider
bind 0.0.0.0 and the host's address at ``MPI_Init``): they are neither mpiml's nor Dask's, so a
small wrapper records each process's sockets after ``MPI_Init`` and before the launcher starts, and
the check is on the sockets opened after that.
"""

import json
import os
import sys

import pytest

from conftest import ROOT, run_mpi

pytest.importorskip("distributed")
if not os.path.exists("/proc/net/tcp"):
    pytest.skip("needs Linux /proc/net/tcp", allow_module_level=True)

LISTENING = r'''
import ipaddress
import os


def listening():
    """[(ip, port)] of the TCP sockets this process listens on (Linux /proc)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            hexip, hexport = local.split(":")
            raw = bytes.fromhex(hexip)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(raw)
            if ip.version == 6 and ip.ipv4_mapped:
                ip = ip.ipv4_mapped
            found.append([str(ip), int(hexport, 16)])
    return sorted(found)
'''

WRAPPER = LISTENING + r'''
import json, os, sys
from mpi4py import MPI  # MPI_Init: the MPI library opens its own sockets here

os.environ["FAULTS_MPI_SOCKETS"] = json.dumps(listening())
from mpiml.dask._launcher import main

sys.exit(main(sys.argv[1:]))
'''

APP = LISTENING + r'''
import json, os, sys, urllib.request
from mpiml.dask import get_client


def opened_by_dask_or_mpiml():
    """What this process listens on, less what it listened on right after MPI_Init."""
    before = [tuple(s) for s in json.loads(os.environ["FAULTS_MPI_SOCKETS"])]
    return [s for s in listening() if tuple(s) not in before]


def mpi_sockets():
    return json.loads(os.environ["FAULTS_MPI_SOCKETS"])


client = get_client()
info = client.sync(client.scheduler.identity, n_workers=-1)  # (not the cached scheduler_info())
report = {
    "scheduler_address": client.scheduler.address,
    "worker_addresses": sorted(info["workers"]),
    "services": info.get("services", {}),
    "scheduler": client.run_on_scheduler(opened_by_dask_or_mpiml),
    "workers": client.run(opened_by_dask_or_mpiml),
    "client": opened_by_dask_or_mpiml(),
    "mpi_sockets": [mpi_sockets(), client.run_on_scheduler(mpi_sockets)],
}
dash = info.get("services", {}).get("dashboard")
if dash is not None:
    with urllib.request.urlopen(f"http://127.0.0.1:{dash}/health", timeout=30) as r:
        report["health"] = r.read().decode()
with open(sys.argv[1], "w") as f:
    json.dump(report, f)
'''


def _cluster(tmp_path, *options, env=None):
    app, wrapper = tmp_path / "app.py", tmp_path / "launch.py"
    app.write_text(APP)
    wrapper.write_text(WRAPPER)
    out = tmp_path / "report.json"
    run_mpi(str(wrapper), 3, *options, app, out, timeout=240,
            env={"DASK_LOGGING__DISTRIBUTED": "error", **(env or {})})
    return json.loads(out.read_text())


def _port(address):
    return int(address.rsplit(":", 1)[1])


def _every_socket(report):
    return report["scheduler"] + [s for socks in report["workers"].values() for s in socks] + report["client"]


@pytest.mark.mpi
@pytest.mark.slow
def test_mpi_protocol_listens_on_no_tcp_socket(tmp_path):
    """Over mpi:// nothing listens at all: no comm port, no dashboard, no metrics server."""
    report = _cluster(tmp_path)
    assert report["scheduler_address"].startswith("mpi://")
    assert len(report["workers"]) == 1
    assert _every_socket(report) == [], report
    assert "dashboard" not in report["services"]


@pytest.mark.mpi
@pytest.mark.slow
def test_tcp_protocol_binds_loopback_and_starts_no_http_server(tmp_path):
    """Over tcp:// the scheduler and the worker each listen on their comm port only, on 127.0.0.1."""
    report = _cluster(tmp_path, "--protocol", "tcp", env={"MPIML_DASK_HOST": "", "MPIML_DASK_INTERFACE": ""})
    assert report["scheduler_address"].startswith("tcp://127.0.0.1:"), report
    assert report["scheduler"] == [["127.0.0.1", _port(report["scheduler_address"])]], report
    [(worker, socks)] = report["workers"].items()
    assert worker.startswith("tcp://127.0.0.1:") and socks == [["127.0.0.1", _port(worker)]], report
    assert report["client"] == []
    for ip, _ in _every_socket(report):
        assert ip not in ("0.0.0.0", "::"), report
    assert "dashboard" not in report["services"]


@pytest.mark.mpi
@pytest.mark.slow
def test_interface_and_dashboard_when_asked_for(tmp_path):
    """--interface lo binds the loopback interface's address; --dashboard-address starts the HTTP servers."""
    report = _cluster(tmp_path, "--protocol", "tcp", "--interface", "lo", "--dashboard-address", ":0")
    assert report["scheduler_address"].startswith("tcp://127.0.0.1:"), report
    dash = report["services"]["dashboard"]
    assert sorted(report["scheduler"]) == sorted([["127.0.0.1", _port(report["scheduler_address"])],
                                                  ["127.0.0.1", dash]]), report
    [(worker, socks)] = report["workers"].items()
    assert len(socks) == 2 and all(ip == "127.0.0.1" for ip, _ in socks), report  # comm + HTTP
    assert report["health"] == "ok"


def test_usage_errors_of_the_listen_options():
    import subprocess

    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    for args, text in [(["--host", "127.0.0.1", "--interface", "lo"], "not allowed with argument"),
                       (["--dashboard-address", "x:y"], "--dashboard-address must be [HOST]:PORT"),
                       (["--interface", "no-such-if0"], "no-such-if0")]:
        proc = subprocess.run([sys.executable, "-m", "mpiml.dask", *args, "x.py"], capture_output=True, text=True,
                              timeout=60, env=env)
        assert proc.returncode == 2, (args, proc.stderr)
        assert text in proc.stderr, (args, proc.stderr)
