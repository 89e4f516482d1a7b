"""What every benchmark result records: the machine, the date, the command, the device's rates."""

import datetime
import json
import os
import platform
import socket
import sys
import time

import numpy as np

from ..comm._profile import human_bytes as _human_bytes

__all__ = ["machine_info", "stamp", "Progress", "parse_bytes", "human_bytes", "require_matplotlib",
           "measure_rates", "FirstRows", "best_seconds"]


def best_seconds(fn, repeats, sync):
    """The best of ``repeats`` timed calls of ``fn`` after one untimed call, each ended by ``sync()``."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


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


def write_result(base, result, plot, table):
    """``base.json`` and ``base.png`` (``plot(result, path)``), then the terminal table (``table(result)``)."""
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
    plot(result, base + ".png")
    table(result)
    print(f"wrote {base}.json and {base}.png")


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
    from ..cli._options import gpu_count as _gpu_count

    ngpu = _gpu_count() if device != "cpu" else 0
    if device == "gpu" and not ngpu:
        print(f"{prog}: --device gpu but CuPy sees no GPU", file=sys.stderr)
        return 2, 0
    return None, ngpu


def measure_rates(xp, dtype):
    """Memory bandwidth (bytes/s, read + write of a copy) and GEMM rate (flop/s) on this rank's device."""
    def timed(fn, reps):
        fn()
        if xp is not np:
            xp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        if xp is not np:
            xp.cuda.Device().synchronize()
        return (time.perf_counter() - t0) / reps

    nbytes = (1 << 31) if xp is not np else (1 << 28)
    a = xp.ones(nbytes // 4, dtype=xp.float32)
    b = xp.empty_like(a)
    t = timed(lambda: xp.copyto(b, a), 10 if xp is not np else 3)
    bw = 2 * nbytes / t
    del a, b
    m = 8192 if xp is not np else 1024
    A = xp.ones((m, m), dtype=dtype)
    B = xp.ones((m, m), dtype=dtype)
    t = timed(lambda: A @ B, 10 if xp is not np else 3)
    rates = {"copy_bandwidth_Bps": bw, "gemm_flops": 2 * m ** 3 / t, "gemm_dtype": str(np.dtype(dtype))}
    if xp is not np:
        try:  # the matrix-unit rate for float32 inputs (TF32), where torch is there to ask
            import torch

            torch.backends.cuda.matmul.allow_tf32 = True
            At = torch.ones((m, m), device="cuda", dtype=torch.float32 if dtype == np.float32 else torch.float64)
            At @ At
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(10):
                At @ At
            torch.cuda.synchronize()
            rates["matrix_unit_flops"] = 2 * m ** 3 / ((time.perf_counter() - t0) / 10)
            rates["matrix_unit"] = "tf32 tensor cores" if dtype == np.float32 else "fp64 tensor cores"
            del At
        except Exception as exc:
            rates["matrix_unit_note"] = f"not measured ({type(exc).__name__})"
    return rates


class FirstRows:
    """A stand-in communicator whose rank 0 holds the first ``n // (n // n_sub)`` >= ``n_sub`` rows of
    ``n``: the generators are rank-count independent and draw only a rank's rows, so scikit-learn's
    subsample is made without generating the whole dataset on the host."""

    rank = 0

    def __init__(self, n, n_sub):
        self.size = max(1, n // max(n_sub, 1))
