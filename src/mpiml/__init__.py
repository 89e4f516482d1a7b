"""mpiml: machine learning on many GPUs from Python, with the fastest communication there is."""

__version__ = "0.1.0"

from ._errors import (  # noqa: E402
    BackendUnavailableError,
    CollectiveMismatchError,
    CommError,
    CommTimeoutError,
    DistributedInputError,
    MpimlError,
    NotFittedError,
)
from .comm._profile import profile  # noqa: E402

__all__ = [
    "__version__", "profile", "save", "load", "get_comm",
    "MpimlError", "CommError", "CommTimeoutError", "CollectiveMismatchError",
    "BackendUnavailableError", "DistributedInputError", "NotFittedError",
]


def get_comm(backend="auto"):
    """Shortcut for :func:`mpiml.comm.get_comm`."""
    from .comm import get_comm as _get

    return _get(backend)


def save(model, path):
    """Save a fitted estimator to ``path`` (arrays + JSON, no pickle); see :mod:`mpiml._io`."""
    from ._io import save as _save

    return _save(model, path)


def load(path, *, device=None):
    """Load an estimator saved by :func:`save`; see :mod:`mpiml._io`."""
    from ._io import load as _load

    return _load(path, device=device)
