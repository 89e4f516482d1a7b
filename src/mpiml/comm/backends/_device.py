"""Which physical GPU each rank uses, agreed across ranks, and what that allows.

Two ranks bound to one GPU (more ranks than GPUs, or ``mpiml.init`` not called
before the first allocation) cannot use the device transports:

* NCCL refuses a communicator in which two ranks share a GPU, and it finds out
  inside its own set-up, on the sharing ranks only, while a rank with a GPU of
  its own goes on into NCCL's next bootstrap exchange and waits there for ever;
* the IPC kernels spin on flags written by their peers: two processes' spinning
  kernels time-slicing on one GPU can wait on each other until the timeout.

So the device transports agree on the device of every rank *before* they touch
NCCL or the GPU, with one allgather over the host transport, and every rank
refuses alike (:class:`~mpiml.BackendUnavailableError`, the same text). Under
``backend="auto"`` the communicator then routes device buffers through the
staged MPI path; a backend asked for by name raises that error on every rank.

A device is identified by ``(hostname, PCI bus id)``: the same physical GPU has
the same bus id whatever ``CUDA_VISIBLE_DEVICES`` makes its ordinal.
The decisions are pure functions of the agreed ids (tested on the CPU).
"""

import socket

__all__ = ["DEVICE_BACKENDS", "local_device_id", "shared_device_groups", "shared_device_refusal",
           "auto_device_backends", "agree_device_ids", "require_exclusive_devices"]

#: the transports that need one GPU per rank
DEVICE_BACKENDS = ("nccl", "ipc")


def local_device_id():
    """``(hostname, PCI bus id)`` of CuPy's current device in this process."""
    import cupy

    runtime = cupy.cuda.runtime
    return socket.gethostname(), runtime.deviceGetPCIBusId(runtime.getDevice())


def shared_device_groups(ids):
    """Ranks that share a device: a list of rank lists (each of two or more), in rank order.

    ``ids`` holds one hashable device id per rank (``None`` for a rank without
    a device, which shares with nobody).
    """
    by_id = {}
    for rank, dev in enumerate(ids):
        if dev is not None:
            by_id.setdefault(tuple(dev) if isinstance(dev, list) else dev, []).append(rank)
    return [ranks for ranks in by_id.values() if len(ranks) > 1]


def _describe(ids, groups):
    parts = []
    for ranks in groups:
        dev = ids[ranks[0]]
        where = f"{dev[1]} on {dev[0]}" if isinstance(dev, (tuple, list)) and len(dev) == 2 else str(dev)
        parts.append(f"ranks {ranks} share GPU {where}")
    return "; ".join(parts)


def shared_device_refusal(backend, ids):
    """The error text for ``backend`` over ranks with device ``ids``, or None if it may run."""
    if backend not in DEVICE_BACKENDS:
        return None
    groups = shared_device_groups(ids)
    if not groups:
        return None
    return (f"the {backend!r} backend needs one GPU per rank, but {_describe(ids, groups)} "
            "(NCCL refuses duplicate GPUs; spinning IPC kernels of two processes on one GPU can "
            "deadlock). Use as many ranks per host as GPUs and call mpiml.init() before allocating, "
            "or let backend='auto' stage device buffers through MPI")


def auto_device_backends(ids, candidates=DEVICE_BACKENDS):
    """The device transports ``backend="auto"`` may use over ranks with device ``ids``."""
    return tuple(b for b in candidates if shared_device_refusal(b, ids) is None)


def agree_device_ids(world, local_id=None):
    """Every rank's device id, in rank order (one allgather over ``world``).

    ``local_id`` overrides this rank's id (tests); a rank whose id cannot be
    read contributes None, and its error travels with it so that every rank
    can raise the same error.
    """
    if local_id is None:
        try:
            local_id = local_device_id()
        except Exception as exc:  # no CuPy, no GPU
            local_id = ("error", f"{type(exc).__name__}: {exc}")
    return [tuple(i) for i in world.allgather_obj(tuple(local_id))]


def require_exclusive_devices(world, backend, local_id=None):
    """Agree on the devices; raise the same BackendUnavailableError on every rank if any is shared.

    Returns the agreed ids. A collective call: every rank of ``world`` makes it.
    """
    from ..._errors import BackendUnavailableError

    ids = agree_device_ids(world, local_id)
    failed = [(r, i[1]) for r, i in enumerate(ids) if i[0] == "error"]
    if failed:
        raise BackendUnavailableError(f"the {backend!r} backend needs CuPy and a GPU: "
                                      + "; ".join(f"rank {r}: {e}" for r, e in failed))
    why = shared_device_refusal(backend, ids)
    if why is not None:
        raise BackendUnavailableError(why)
    return ids
