"""mpiml: machine learning on many GPUs from Python, with the fastest communication there is."""

import os as _os

# Before NumPy loads OpenBLAS (which reads it once): its idle threads sleep after 2**4 cycles instead of
# spinning 2**28 (~0.1 s) after every call; see mpiml.utils._threads.  The user's value wins.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

from ._version import __version__  # noqa: E402
from ._errors import (  # noqa: E402
    BackendUnavailableError,
    CollectiveMismatchError,
    CommAbortedError,
    CommError,
    CommTimeoutError,
    DistributedInputError,
    MpimlError,
)
from .comm._profile import profile  # noqa: E402
from ._init import device_info, init  # noqa: E402
from ._abort import install_abort_hook as _install_abort_hook  # noqa: E402

_install_abort_hook()  # under an MPI launch of several ranks: an unhandled exception aborts the job

__all__ = [
    "__version__", "init", "device_info", "profile", "save", "load", "get_comm",
    "MpimlError", "CommError", "CommTimeoutError", "CommAbortedError", "CollectiveMismatchError",
    "BackendUnavailableError", "DistributedInputError", "NotFittedError", "ModelFileError",
]


def __getattr__(name):
    if name == "NotFittedError":  # scikit-learn's, imported on first use (see mpiml._errors)
        from ._errors import NotFittedError

        return NotFittedError
    if name == "ModelFileError":  # defined with the file format, imported on first use
        from ._io import ModelFileError

        return ModelFileError
    raise AttributeError(f"module 'mpiml' has no attribute {name!r}")


def get_comm(backend="auto"):
    """Shortcut for :func:`mpiml.comm.get_comm`."""
    from .comm import get_comm as _get

    return _get(backend)


def save(model, path, *, comm=None):
    """Save a fitted estimator to ``path`` (arrays + JSON, no pickle); see :mod:`mpiml._io`.

    Collective over ``comm`` (default: the model's communicator, else the world):
    rank 0 writes, every rank returns once the file is complete, and an error is
    raised on every rank.  Pass ``comm=mpiml.get_comm("self")`` to save from one rank.
    """
    from ._io import save as _save

    return _save(model, path, comm=comm)


def load(path, *, device=None):
    """Load an estimator saved by :func:`save`; see :mod:`mpiml._io`."""
    from ._io import load as _load

    return _load(path, device=device)
