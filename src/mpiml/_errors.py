"""Exceptions shared by every layer of mpiml.

``NotFittedError`` is scikit-learn's own class, looked up on first use: importing
scikit-learn costs ~2 s of CPU, which every rank of a communication-only job would
otherwise pay at ``import mpiml``.
"""

__all__ = [
    "MpimlError",
    "CommError",
    "CommTimeoutError",
    "CommAbortedError",
    "CollectiveMismatchError",
    "BackendUnavailableError",
    "DistributedInputError",
    "NotFittedError",
]


class MpimlError(Exception):
    """Base class of every mpiml error."""


class CommError(MpimlError, RuntimeError):
    """A communication call failed."""


class CommTimeoutError(CommError, TimeoutError):
    """A blocking wait ran past ``MPIML_TIMEOUT`` seconds.

    The message names the operation and the peer (or ``"all"`` for a collective).
    """

    def __init__(self, op, peer, seconds, detail="", *, message=None):
        self.op = op
        self.peer = peer
        self.seconds = seconds
        if message is None:  # (a message given: another rank's timeout, raised here as well)
            message = f"{op} timed out after {seconds:g} s waiting for {peer}"
            if detail:
                message += f" ({detail})"
            message += "; set MPIML_TIMEOUT to change the limit"
        super().__init__(message)


class CommAbortedError(CommError):
    """The communicator was aborted by an earlier failure (a timeout, a dead peer, a device error).

    Every later call on it, and on the communicators split from it, raises this
    error; ``__cause__`` is the first failure.
    """


class CollectiveMismatchError(CommError, ValueError):
    """Ranks called the same collective with different counts, dtypes, ops or roots."""


class BackendUnavailableError(CommError, ImportError):
    """A backend was asked for but cannot run here (missing package, no GPU, ...)."""


class DistributedInputError(MpimlError, ValueError):
    """Input data is invalid on at least one rank; raised identically on every rank."""


def __getattr__(name):
    if name == "NotFittedError":
        from sklearn.exceptions import NotFittedError

        return NotFittedError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
