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
"""

import json
import os
from importlib import resources

from .algorithms import ALGORITHM_NAMES, COLLECTIVES

__all__ = ["Rule", "TuningTable", "parse_override", "load_default_rules", "load_machine_rules", "stream_mode",
           "MODES"]

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


class TuningTable:
    """Rules in priority order, plus the parsed override."""

    def __init__(self, rules, override=None):
        self.rules = list(rules)
        self.override = dict(override or {})

    @classmethod
    def from_config(cls, machine_path, override_text):
        return cls(load_machine_rules(machine_path) + load_default_rules(), parse_override(override_text))

    def to_data(self):
        return {"rules": [dict(r) for r in self.rules],
                "override": {k: list(v) for k, v in self.override.items()}}

    @classmethod
    def from_data(cls, data):
        return cls([Rule(**r) for r in data["rules"]],
                   {k: tuple(v) for k, v in data["override"].items()})

    def choose(self, op, nbytes, ranks, memory, available=("mpi",), mode="eager"):
        """``(backend, algorithm)`` for one call; rules naming unavailable backends are skipped."""
        if op in self.override:
            backend, algo = self.override[op]
            return backend or ("mpi" if "mpi" in available else available[0]), algo
        for rule in self.rules:
            if rule["backend"] in available and rule.matches(op, nbytes, ranks, memory, mode):
                return rule["backend"], rule["algorithm"]
        return available[0], "native"
