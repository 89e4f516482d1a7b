"""Transport registry: lowercase name -> factory, plus the ``mpiml.comm.backends`` entry points.

A factory is called as ``factory(world)`` where ``world`` is the host-side
:class:`~mpiml.comm.backends.mpi.MPITransport` (or the ``self`` transport) of
the communicator; device transports (``nccl``, ``ipc``) use it to exchange
their set-up data.
"""

__all__ = ["register_backend", "get_backend_factory", "backend_names"]

_FACTORIES = {}
_loaded_entry_points = False


def register_backend(name, factory):
    """Register ``factory`` under the lowercase ``name``."""
    _FACTORIES[name.lower()] = factory


def _load_entry_points():
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    _loaded_entry_points = True
    from importlib.metadata import entry_points  # on first use, not at import

    for ep in entry_points(group="mpiml.comm.backends"):
        if ep.name not in _FACTORIES:
            _FACTORIES[ep.name] = ep.load()


def backend_names():
    _load_entry_points()
    return sorted(_FACTORIES)


def get_backend_factory(name):
    _load_entry_points()
    try:
        return _FACTORIES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown comm backend {name!r} (known: {backend_names()})") from None


def _mpi(world):
    return world


def _self(world):
    from .self import SelfTransport

    return SelfTransport()


def _nccl(world):
    from .nccl import NCCLTransport

    return NCCLTransport(world)


def _ipc(world):
    from .ipc import IPCTransport

    return IPCTransport(world)


register_backend("mpi", _mpi)
register_backend("self", _self)
register_backend("nccl", _nccl)
register_backend("ipc", _ipc)
