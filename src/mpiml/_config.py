"""Run-time configuration read from ``MPIML_*`` environment variables.

Every value is read when it is needed (not cached at import), so tests and
launchers can set variables after ``import mpiml``.
"""

import os

__all__ = ["env_number", "timeout", "check_level", "comm_algo_override", "node_size", "tuning_file", "cuda_aware_mpi"]


def env_number(name, default, *, kind=int, minimum=None, maximum=None, unit=""):
    """The number in environment variable ``name`` (``default`` when unset or empty).

    ``kind`` is ``int`` or ``float``; a value that does not parse or lies outside
    ``[minimum, maximum]`` is a ``ValueError`` naming the variable, the unit and the range.
    """
    raw = os.environ.get(name, "").strip()
    if raw == "":
        return default
    what = f"{'an integer' if kind is int else 'a number'}{' (' + unit + ')' if unit else ''}"
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{name} must be {what}; got {raw!r}") from None
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bounds = f"in [{minimum}, {maximum}]" if maximum is not None else f"of at least {minimum}"
        raise ValueError(f"{name} must be {what} {bounds}; got {raw!r}")
    return value


DEFAULT_TIMEOUT = 600.0  # seconds, as PyTorch's process groups: finite, so a lost peer is an error


def timeout():
    """Seconds any blocking wait may take (``MPIML_TIMEOUT``, default 600); ``None`` (0) means forever."""
    value = env_number("MPIML_TIMEOUT", DEFAULT_TIMEOUT, kind=float, unit="seconds")
    return value if value > 0 else None


_CHECK_LEVELS = {}


def check_level():
    """Collective signature checking (``MPIML_CHECK``; the same on every rank).

    ``None`` (unset, the default): every host collective, and the first device
    collective of each call shape, agrees on its signature; later device calls
    of an agreed shape are agreed with the next round (deferred, see
    ``docs/comm.md``); small host calls carry their data inside the agreement,
    larger ones overlap it with the data (a mismatch found then also aborts the
    communicator).  ``1``: every call agrees
    before any data moves.  ``0``: no agreement for array collectives.  See
    ``docs/comm.md`` ("Checking collectives") for what each costs.
    """
    raw = os.environ.get("MPIML_CHECK", "")
    try:
        return _CHECK_LEVELS[raw]
    except KeyError:
        pass
    _CHECK_LEVELS[raw] = level = _parse_check_level(raw.strip().lower())
    return level


def _parse_check_level(raw):
    if raw == "":
        return None
    if raw in ("0", "false", "off", "no"):
        return 0
    if raw in ("1", "true", "on", "yes"):
        return 1
    raise ValueError(f"MPIML_CHECK must be 0 or 1; got {raw!r}")


#: device calls at least this large are checked even when a hot launcher could serve them
CHEAP_CHECK_BYTES = 1 << 20


def comm_algo_override():
    """The raw ``MPIML_COMM_ALGO`` string (parsed by :mod:`mpiml.comm._tuning`)."""
    return os.environ.get("MPIML_COMM_ALGO", "")


def node_size():
    """Ranks per (virtual) node from ``MPIML_NODE_SIZE``; ``None`` means detect."""
    return env_number("MPIML_NODE_SIZE", None, minimum=1, unit="ranks")


def tuning_file():
    """Path of this machine's tuning table (``MPIML_TUNING_FILE``, default under ~/.cache)."""
    return os.environ.get(
        "MPIML_TUNING_FILE",
        os.path.join(os.path.expanduser("~"), ".cache", "mpiml", "tuning.json"),
    )


def cuda_aware_mpi():
    """``MPIML_CUDA_AWARE_MPI``: "1" forces device buffers to MPI, "0" forbids, unset probes."""
    raw = os.environ.get("MPIML_CUDA_AWARE_MPI", "").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    return None
