"""Which backend and algorithm to use for a call: a table that is data, not code.

A table is a list of rules, read from JSON::

    {"version": 1, "machine": "...", "date": "...", "command": "...",
     "rules": [
        {"op": "allreduce", "memory": "device", "min_ranks": 2, "max_ranks": 8,
         "max_bytes": 65536, "backend": "ipc", "algorithm": "oneshot"},
        ...]}

The first rule whose op (or ``"*"``), memory kind (``"host"``/``"device"``/``"*"``),
mode (``"eager"``/``"graph"``/``"*"``, default ``"*"``), rank range and ``max_bytes``
(inclusive; ``null`` = no limit) match wins.  The mode of a call is ``"graph"``
while CuPy's current stream is being captured into a CUDA graph (device
buffers only), else ``"eager"`` (:func:`stream_mode`): a path whose host cost
dominates eagerly may lose to another once the launches are replayed from a graph.  The
machine's own table (written by ``mpiml tune`` to ``MPIML_TUNING_FILE``) is
consulted before the checked-in defaults.  Rank 0 reads the tables and
broadcasts them, so every rank decides from the same data; the inputs of a
decision (op, bytes, ranks, memory kind) are equal on every rank of a
well-formed collective.

``MPIML_COMM_ALGO="allreduce:ring;bcast:nccl/native"`` overrides the table for
the ops it names (``op:[backend/]algorithm``, ops separated by ``;``).

Tables travel with the hardware they were measured on.  A device table is
keyed by the GPU model and its links (:func:`machine_key`, e.g. ``"NVIDIA H100
80GB HBM3, 18 NVLinks"``): ``mpiml tune --device gpu`` writes
``<dir of the tuning file>/tuning-<slug>.json`` (:func:`machine_table_path`),
and tables measured by the project ship as ``mpiml/comm/tuning/<slug>.json``.
At a communicator's first device call its ranks agree on rank 0's key and put
that machine's rules (the user's file, then the shipped one) before the
generic defaults; a file named by ``MPIML_TUNING_FILE`` still comes first.
"""

import json
import os
import re
from importlib import resources

from .algorithms import ALGORITHM_NAMES, COLLECTIVES

__all__ = ["Rule", "TuningTable", "parse_override", "load_default_rules", "load_machine_rules", "stream_mode",
           "MODES", "machine_key", "machine_slug", "machine_table_path", "load_keyed_rules"]

MEMORY_KINDS = ("host", "device")
#: the execution modes a rule may name (besides "*")
MODES = ("eager", "graph")


def stream_mode(memory):
    """``"graph"`` while CuPy's current stream is capturing (device calls only), else ``"eager"``."""
    if memory != "device":
        return "eager"
    import cupy

    return "graph" if cupy.cuda.get_current_stream().is_capturing() else "eager"


class Rule(dict):
    """One row of the table (a dict with defaults filled in)."""

    FIELDS = {"op": "*", "memory": "*", "mode": "*", "min_ranks": 1, "max_ranks": None, "max_bytes": None,
              "backend": "mpi", "algorithm": "native"}

    def __init__(self, **kw):
        unknown = set(kw) - set(self.FIELDS) - {"note"}
        if unknown:
            raise ValueError(f"unknown tuning rule field(s) {sorted(unknown)}")
        if kw.get("mode", "*") not in ("*",) + MODES:
            raise ValueError(f"tuning rule mode must be one of {['*', *MODES]}; got {kw['mode']!r}")
        super().__init__({**self.FIELDS, **kw})

    def matches(self, op, nbytes, ranks, memory, mode="eager"):
        return (
            self["op"] in ("*", op)
            and self["memory"] in ("*", memory)
            and self["mode"] in ("*", mode)
            and ranks >= self["min_ranks"]
            and (self["max_ranks"] is None or ranks <= self["max_ranks"])
            and (self["max_bytes"] is None or nbytes <= self["max_bytes"])
        )


def parse_override(text):
    """Parse ``MPIML_COMM_ALGO``; returns ``{op: (backend or None, algorithm)}``.

    An unknown op, backend or algorithm token is a ``ValueError`` that names it.
    """
    from .backends import backend_names

    result = {}
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        if ":" not in part:
            raise ValueError(f"MPIML_COMM_ALGO: expected 'op:algorithm' but got {part!r}")
        op, _, choice = (s.strip() for s in part.partition(":"))
        if op not in COLLECTIVES:
            raise ValueError(f"MPIML_COMM_ALGO: unknown collective {op!r} (known: {list(COLLECTIVES)})")
        backend, _, algo = choice.rpartition("/")
        backend = backend or None
        if backend is not None and backend not in backend_names():
            raise ValueError(f"MPIML_COMM_ALGO: unknown backend {backend!r} in {part!r} (known: {backend_names()})")
        if algo not in ALGORITHM_NAMES and not (backend in ("ipc", "nccl")):
            raise ValueError(
                f"MPIML_COMM_ALGO: unknown algorithm {algo!r} in {part!r} (known: {list(ALGORITHM_NAMES)})"
            )
        result[op] = (backend, algo)
    return result


def _read_rules(text, origin):
    try:
        data = json.loads(text)
        return [Rule(**r) for r in data["rules"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"malformed tuning table {origin}: {exc}") from None


def load_default_rules():
    text = resources.files("mpiml.comm").joinpath("tuning_defaults.json").read_text()
    return _read_rules(text, "mpiml/comm/tuning_defaults.json")


def load_machine_rules(path):
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return _read_rules(f.read(), path)


# ---------------------------------------------------------------- tables per machine kind
def _nvlink_count(bus_id):
    """Active NVLinks of the GPU at PCI ``bus_id`` (NVML through ctypes), 0 when NVML cannot tell."""
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return 0
    if nvml.nvmlInit_v2() != 0:
        return 0
    try:
        handle = ctypes.c_void_p()
        if nvml.nvmlDeviceGetHandleByPciBusId_v2(bus_id.encode(), ctypes.byref(handle)) != 0:
            return 0
        count, state = 0, ctypes.c_int()
        for link in range(18):  # NVML_NVLINK_MAX_LINKS
            if nvml.nvmlDeviceGetNvLinkState(handle, link, ctypes.byref(state)) == 0 and state.value == 1:
                count += 1
        return count
    finally:
        nvml.nvmlShutdown()


def machine_key():
    """``"<GPU name>, <n> NVLinks"`` of CuPy's current device (``"..., PCIe"`` without NVLink)."""
    import cupy

    rt = cupy.cuda.runtime
    dev = rt.getDevice()
    name = rt.getDeviceProperties(dev)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    links = _nvlink_count(rt.deviceGetPCIBusId(dev))
    return f"{name}, {links} NVLinks" if links else f"{name}, PCIe"


def machine_slug(key):
    """A file-name form of a :func:`machine_key`: ``"nvidia-h100-80gb-hbm3-18-nvlinks"``."""
    return re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")


def machine_table_path(key, tuning_file):
    """Where ``mpiml tune --device gpu`` writes the table of machine ``key`` (beside ``tuning_file``)."""
    return os.path.join(os.path.dirname(tuning_file) or ".", f"tuning-{machine_slug(key)}.json")


def load_keyed_rules(key, tuning_file):
    """The rules of machine ``key``: the user's table (:func:`machine_table_path`), then the shipped one."""
    rules = load_machine_rules(machine_table_path(key, tuning_file))
    shipped = resources.files("mpiml.comm").joinpath("tuning", f"{machine_slug(key)}.json")
    if shipped.is_file():
        rules += _read_rules(shipped.read_text(), f"mpiml/comm/tuning/{machine_slug(key)}.json")
    return rules


class TuningTable:
    """Rules in priority order, plus the parsed override.

    ``explicit`` leading rules come from a file the user named (``MPIML_TUNING_FILE``):
    they stay ahead of a machine's keyed rules (:meth:`with_machine`).  ``machine``
    is the agreed key once the keyed rules are in (None before).
    """

    def __init__(self, rules, override=None, explicit=0, machine=None):
        self.rules = list(rules)
        self.override = dict(override or {})
        self.explicit = explicit
        self.machine = machine

    @classmethod
    def from_config(cls, machine_path, override_text, explicit=False):
        own = load_machine_rules(machine_path)
        return cls(own + load_default_rules(), parse_override(override_text), len(own) if explicit else 0)

    def to_data(self):
        return {"rules": [dict(r) for r in self.rules],
                "override": {k: list(v) for k, v in self.override.items()},
                "explicit": self.explicit, "machine": self.machine}

    @classmethod
    def from_data(cls, data):
        return cls([Rule(**r) for r in data["rules"]],
                   {k: tuple(v) for k, v in data["override"].items()}, data.get("explicit", 0), data.get("machine"))

    def with_machine(self, key, rules):
        """This table with machine ``key``'s ``rules`` after the explicit ones, before the rest."""
        rules = [r if isinstance(r, Rule) else Rule(**r) for r in rules]
        return TuningTable(self.rules[:self.explicit] + rules + self.rules[self.explicit:], self.override,
                           self.explicit, key or "")

    def choose(self, op, nbytes, ranks, memory, available=("mpi",), mode="eager"):
        """``(backend, algorithm)`` for one call; rules naming unavailable backends are skipped."""
        if op in self.override:
            backend, algo = self.override[op]
            return backend or ("mpi" if "mpi" in available else available[0]), algo
        for rule in self.rules:
            if rule["backend"] in available and rule.matches(op, nbytes, ranks, memory, mode):
                return rule["backend"], rule["algorithm"]
        return available[0], "native"
