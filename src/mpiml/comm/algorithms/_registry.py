"""The algorithm registry and the cost model every algorithm documents itself with.

Cost model (per call, seconds): ``alpha`` latency per message, ``beta`` seconds
per byte on the wire, ``gamma`` seconds per byte reduced, ``launch`` fixed
overhead per local step (a kernel launch on a GPU).  Each algorithm's ``cost``
is a tiny pure function of (bytes, ranks, model); the tuner may use it where no
measurement exists.
"""

from dataclasses import dataclass
from typing import Callable

__all__ = ["CostModel", "Algorithm", "ALGORITHMS", "register", "get_algorithm", "algorithm_names", "ALGORITHM_NAMES", "COLLECTIVES"]

COLLECTIVES = (
    "barrier", "bcast", "reduce", "allreduce", "allgather", "allgatherv", "gather", "gatherv",
    "scatter", "reduce_scatter", "scan", "exscan", "alltoall",
)

ALGORITHM_NAMES = (
    "native", "binomial", "knomial", "gather_first", "recursive_doubling", "ring",
    "rabenseifner", "chain", "pairwise", "linear",
)


@dataclass(frozen=True)
class CostModel:
    alpha: float = 1.5e-6     # s per message (host MPI over shared memory)
    beta: float = 1.0 / 8e9   # s per byte moved
    gamma: float = 1.0 / 4e9  # s per byte reduced
    launch: float = 0.0       # s per local step (GPU kernel launch)


@dataclass(frozen=True)
class Algorithm:
    op: str
    name: str
    run: Callable
    cost: Callable  # cost(nbytes, p, model) -> seconds
    doc: str = ""


ALGORITHMS = {op: {} for op in COLLECTIVES}


def register(op, name, cost):
    """Decorator: register ``fn`` as algorithm ``name`` of collective ``op``."""
    if op not in ALGORITHMS:
        raise ValueError(f"unknown collective {op!r}")
    if name not in ALGORITHM_NAMES:
        raise ValueError(f"unknown algorithm name {name!r}")

    def deco(fn):
        ALGORITHMS[op][name] = Algorithm(op, name, fn, cost, (fn.__doc__ or "").strip())
        return fn

    return deco


def algorithm_names(op):
    """Names usable with ``algorithm=`` for ``op`` ("native" included)."""
    return ["native"] + sorted(ALGORITHMS[op])


def get_algorithm(op, name):
    if name == "native":
        return None
    if name not in ALGORITHM_NAMES:
        raise ValueError(f"unknown algorithm {name!r} (known: {list(ALGORITHM_NAMES)})")
    try:
        return ALGORITHMS[op][name]
    except KeyError:
        raise ValueError(
            f"algorithm {name!r} does not apply to {op} (for {op}: {algorithm_names(op)})"
        ) from None
