"""Recording communication calls: ``with mpiml.profile() as p: ...; p.summary()``."""

import math
import time
from collections import defaultdict
from contextlib import contextmanager

__all__ = ["profile", "Profile", "record", "active", "human_bytes", "set_context"]

_ACTIVE = []
#: What the layers above say of this rank, shown with every summary (the CPU threads and their placement,
#: set by mpiml.utils._threads once per process).
_CONTEXT = {}


def set_context(**items):
    """Facts about this rank for every profile's summary (``summary()["rank"]``)."""
    _CONTEXT.update(items)


def active():
    """True when at least one profile is recording."""
    return bool(_ACTIVE)


def record(op, nbytes, backend, algorithm, seconds):
    for p in _ACTIVE:
        p.calls.append((op, int(nbytes), backend, algorithm, float(seconds)))


def _bucket(nbytes):
    """The power of two at or above ``nbytes`` (0 for empty messages)."""
    return 0 if nbytes <= 0 else 1 << max(0, math.ceil(math.log2(nbytes)))


def human_bytes(nbytes, compact=False):
    """``1536`` -> ``"1.5 KiB"`` (``compact``: ``"1.5K"``, as in benchmark tables)."""
    units = ("B", "K", "M", "G") if compact else ("B", "KiB", "MiB", "GiB")
    sep = "" if compact else " "
    for unit in units[:-1]:
        if nbytes < 1024:
            return f"{nbytes:g}{sep}{unit}"
        nbytes /= 1024
    return f"{nbytes:g}{sep}{units[-1]}"


class Profile:
    """Calls recorded while the profile was active.

    Attributes
    ----------
    calls : list of tuple
        ``(op, bytes, backend, algorithm, seconds)``, one per communication call.
    wall : float
        Seconds the ``with`` block took.
    """

    def __init__(self):
        self.calls = []
        self.wall = 0.0

    def summary(self, as_text=False):
        """Time per op and a message-size histogram.

        Returns a dict ``{"ops": {op: {...}}, "histogram": {bucket_bytes: count},
        "total_seconds": s, "calls": n}``; with ``as_text=True``, a printable table.
        """
        ops = defaultdict(lambda: {"calls": 0, "bytes": 0, "seconds": 0.0, "paths": defaultdict(int)})
        hist = defaultdict(int)
        for op, nbytes, backend, algo, secs in self.calls:
            o = ops[op]
            o["calls"] += 1
            o["bytes"] += nbytes
            o["seconds"] += secs
            o["paths"][f"{backend}/{algo}"] += 1
            hist[_bucket(nbytes)] += 1
        data = {
            "ops": {k: {**v, "paths": dict(v["paths"])} for k, v in sorted(ops.items())},
            "histogram": dict(sorted(hist.items())),
            "total_seconds": sum(c[4] for c in self.calls),
            "calls": len(self.calls),
            "wall_seconds": self.wall,
            "rank": dict(_CONTEXT),
        }
        return self.format(data) if as_text else data

    @staticmethod
    def format(data):
        lines = [f"{'op':<16}{'calls':>8}{'bytes':>14}{'seconds':>12}{'us/call':>10}  paths"]
        for op, o in data["ops"].items():
            per = 1e6 * o["seconds"] / max(o["calls"], 1)
            paths = ", ".join(f"{k} x{v}" for k, v in o["paths"].items())
            lines.append(f"{op:<16}{o['calls']:>8}{o['bytes']:>14}{o['seconds']:>12.6f}{per:>10.1f}  {paths}")
        lines.append(f"total: {data['calls']} calls, {data['total_seconds']:.6f} s in communication")
        for k, v in data.get("rank", {}).items():
            lines.append(f"{k}: {v}")
        if data["histogram"]:
            lines.append("message sizes (up to):")
            top = max(data["histogram"].values())
            for b, n in data["histogram"].items():
                bar = "#" * max(1, round(30 * n / top))
                lines.append(f"  {human_bytes(b):>10} {n:>8} {bar}")
        return "\n".join(lines)

    def __str__(self):
        return self.summary(as_text=True)


@contextmanager
def profile():
    """Record every communication call made inside the block (on this rank)."""
    p = Profile()
    _ACTIVE.append(p)
    start = time.perf_counter()
    try:
        yield p
    finally:
        p.wall = time.perf_counter() - start
        _ACTIVE.remove(p)
