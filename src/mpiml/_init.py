"""``mpiml.init``: bind this rank to its GPU (or to the CPU) once, before any device work.

One call, made by every rank at the start of a job, the way PyTorch users call
``torch.cuda.set_device(local_rank)``: rank ``r`` of a host takes the visible device
``local_rank % device_count``.  "Visible" is whatever the launcher left in
``CUDA_VISIBLE_DEVICES``: under ``srun --gpus-per-task=1`` (or a site's own
binding) each task sees one device and takes it; under ``mpiexec`` every rank of
a host sees all of them and takes its own by local rank.
"""

import os

__all__ = ["init", "device_info"]

# environment variables that launchers set to a process's rank among the ranks of its host
_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK",
                    "SLURM_LOCALID", "PMI_LOCAL_RANK", "LOCAL_RANK")

_STATE = {}  # "device": "cpu" or an int, "how": a sentence


def _local_rank():
    for var in _LOCAL_RANK_VARS:
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value), var
    return 0, None


def _visible_gpus():
    try:
        import cupy
    except Exception:
        return 0, None
    try:
        return int(cupy.cuda.runtime.getDeviceCount()), cupy
    except Exception:
        return 0, cupy


def init(device="auto", *, warm=None):
    """Bind this process to a device, once; every later call returns the same binding.

    Parameters
    ----------
    device : {"auto", "gpu", "cpu"} or int, default="auto"
        ``"auto"``: the GPU ``local_rank % n_visible`` when CuPy sees a GPU, else the
        CPU. ``"gpu"``: the same, but raise when there is no GPU. ``"cpu"``: no GPU
        is touched. An int: that visible device.
    warm : list of str, str or False, default=None
        On a GPU, the workloads whose CuPy kernels are compiled ahead, in the background
        (:mod:`mpiml.kernels._cupy_warm`; tags such as ``"kmeans"``, ``"pca"``): None
        follows ``MPIML_CUPY_WARM`` (unset: none; ``1``: every estimator's), False compiles none.

    Returns
    -------
    device : int or "cpu"
        The CUDA device id (among the visible devices) this process uses, or ``"cpu"``.

    Raises
    ------
    RuntimeError
        ``device="gpu"`` (or an int) without a visible GPU, an int out of range, or a
        second call asking for another device than the first one bound.

    Notes
    -----
    Nothing is communicated. The local rank is read from the launcher's variables
    (Open MPI, MPICH/Hydra, MVAPICH, Slurm's ``SLURM_LOCALID``); outside a launcher it
    is 0. ``CUDA_VISIBLE_DEVICES`` (set by you, by ``srun --gpus-per-task`` or by a
    site's GPU binding) decides which devices count as visible.

    Examples
    --------
    >>> import mpiml
    >>> mpiml.init(device="cpu")
    'cpu'
    """
    if not (device in ("auto", "gpu", "cpu") or (isinstance(device, int) and not isinstance(device, bool))):
        raise ValueError(f"device must be 'auto', 'gpu', 'cpu' or an int, got {device!r}")
    from .utils._threads import limit_threads, note_gpu_rank

    # this rank's BLAS/OpenMP/Numba pools get its share of the node's cores (once); a CPU rank is pinned to
    # its block of them below, once the device is known (a GPU rank's threads stay free)
    limit_threads(place=False)
    bound = _bind_device(device, warm)
    if bound == "cpu":
        limit_threads(place=True)
    else:
        note_gpu_rank()
    return bound


def _bind_device(device, warm):
    """The device part of :func:`init` (see there)."""
    if _STATE:
        bound = _STATE["device"]
        wanted_cpu = device == "cpu"
        if (wanted_cpu and bound != "cpu") or (device == "gpu" and bound == "cpu") or \
                (isinstance(device, int) and device != bound):
            raise RuntimeError(f"mpiml.init: this process is already bound to {_describe(bound)} "
                               f"({_STATE['how']}); it cannot switch to {device!r}")
        return bound
    if device == "cpu":
        _STATE.update(device="cpu", how="asked for the CPU")
        return "cpu"
    n, cupy = _visible_gpus()
    if n == 0:
        if device == "auto":
            _STATE.update(device="cpu", how="no visible GPU" if cupy is not None else "CuPy is not installed")
            return "cpu"
        why = "CuPy sees no GPU" if cupy is not None else "CuPy is not installed (pip install 'mpiml[cuda13]' or [cuda12])"
        raise RuntimeError(f"mpiml.init(device={device!r}): {why}")
    local, var = _local_rank()
    if isinstance(device, int):
        if not 0 <= device < n:
            raise RuntimeError(f"mpiml.init(device={device}): {n} visible GPU(s), ids 0..{n - 1}")
        dev, how = device, "asked for explicitly"
    else:
        dev = local % n
        how = f"local rank {local} ({var or 'no launcher variable'}) mod {n} visible GPU(s)"
    cupy.cuda.Device(dev).use()
    _STATE.update(device=dev, how=how)
    _install_cupy_kernels(dev)
    _start_cupy_warm(dev, local, warm)
    return dev


def _install_cupy_kernels(dev):
    """CuPy's own kernels, compiled when the package was built, into CuPy's cache before any fit
    (:mod:`mpiml.kernels._cupy_ship`; ``MPIML_CUPY_SHIP=0`` turns it off; never fails ``init``)."""
    from .kernels import _cupy_ship

    _cupy_ship.install(dev)


def _start_cupy_warm(dev, local, warm):
    """CuPy's kernels that the fits use, compiled ahead on this node (never fails ``init``).

    Off unless asked for (``warm`` given, or ``MPIML_CUPY_WARM`` set): on 4 x H100 a background
    compile of every estimator's kernels made the cold first fit of LinearRegression 4.6 s and of
    LogisticRegression 13.7 s instead of 0.5 s and 8.2 s (its threads compete with the fit's own
    compiles, benchmarks/results/firstfit_4xh100.json); ``mpiml run`` asks for its one workload.
    """
    if warm is None and not os.environ.get("MPIML_CUPY_WARM", "").strip():
        return
    from .kernels import _cupy_warm
    from .utils._threads import thread_info

    info = thread_info()
    _cupy_warm.start(dev, tags=warm, node_rank=local, node_size=info.get("ranks_on_node") or 1,
                     cores=info.get("cores"))


def _describe(bound):
    return "the CPU" if bound == "cpu" else f"GPU {bound}"


def device_info():
    """How this process was bound by :func:`init`: ``{"device": ..., "how": ...}``, or ``{}`` before it."""
    return dict(_STATE)
