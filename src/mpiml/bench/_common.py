"""What every benchmark result records: the machine, the date, the command."""

import datetime
import os
import platform
import socket
import sys

from ..comm._profile import human_bytes as _human_bytes

__all__ = ["machine_info", "stamp", "Progress", "parse_bytes", "human_bytes", "require_matplotlib"]


def require_matplotlib(option="--plot"):
    """An error message when matplotlib is missing (checked before a long run), else None."""
    try:
        import matplotlib  # noqa: F401  (only whether it imports)
    except ImportError:
        return f"{option} needs matplotlib: pip install 'mpiml[bench]'"
    return None


def machine_info(comm=None):
    info = {"host": socket.gethostname(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "python": sys.version.split()[0]}
    try:
        from mpi4py import MPI

        info["mpi"] = " ".join(MPI.Get_library_version().strip().splitlines()[0].split())
    except Exception:
        pass
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        info["gpus"] = f"{n} x {name}"
    except Exception:
        info["gpus"] = "none"
    if comm is not None:
        info["ranks"] = comm.size
    return info


def stamp(argv):
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["mpiml"] + list(argv)),
            "launcher_ranks": os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or "1"}


def parse_bytes(text):
    """'64MiB', '4k', '1048576' -> int bytes."""
    t = str(text).strip().lower().replace("ib", "").replace("b", "")
    mult = 1
    for suffix, m in (("k", 1 << 10), ("m", 1 << 20), ("g", 1 << 30)):
        if t.endswith(suffix):
            t, mult = t[:-1], m
            break
    return int(float(t) * mult)


def human_bytes(n):
    """``1536`` -> ``"1.5K"`` (the compact form of :func:`mpiml.comm._profile.human_bytes`)."""
    return _human_bytes(n, compact=True)


class Progress:
    """A one-line progress bar on stderr (rank 0 only; silent when not a terminal unless forced)."""

    def __init__(self, total, label, enabled=True):
        self.total = max(total, 1)
        self.done = 0
        self.label = label
        self.enabled = enabled

    def step(self, note=""):
        self.done += 1
        if not self.enabled:
            return
        width = 30
        filled = int(width * self.done / self.total)
        bar = "#" * filled + "-" * (width - filled)
        end = "\n" if self.done >= self.total else ""
        sys.stderr.write(f"\r{self.label} [{bar}] {self.done}/{self.total} {note:<40}{end}")
        sys.stderr.flush()


def bench_launch_check(device, prog="mpiml bench ml"):
    """The checks every benchmark driver makes before it launches its MPI jobs.

    Returns ``(status, n_gpus)``: ``status`` is None when the driver may go on, else the
    exit status (2) after a one-line message on stderr: run from a plain process (the
    driver launches its own jobs), matplotlib for the plot, a GPU for ``--device gpu``.
    """
    import sys

    from ..comm import launched_by_mpi

    if launched_by_mpi():
        print(f"{prog}: run it from a plain process; it launches its own MPI jobs", file=sys.stderr)
        return 2, 0
    missing = require_matplotlib("its plot")
    if missing:
        print(f"{prog}: {missing}", file=sys.stderr)
        return 2, 0
    from ..cli.run import _gpu_count

    ngpu = _gpu_count() if device != "cpu" else 0
    if device == "gpu" and not ngpu:
        print(f"{prog}: --device gpu but CuPy sees no GPU", file=sys.stderr)
        return 2, 0
    return None, ngpu
