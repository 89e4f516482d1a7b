"""The hot path of repeated device collectives: a few Python operations, then one kernel launch.

The first call of a shape goes through :meth:`Communicator._run` (validation,
the tuning table, the signature check); a device transport that can repeat
that call with one kernel returns a *launcher* for it, which the communicator
keeps per call shape.  A launcher holds everything that does not change from
call to call: the kernel handles (16- or 8-byte aligned and unaligned
variants), the grid, and its own pre-packed argument block of five 64-bit
words (context, in, out, count, extra), of which only the two pointers are
written per call before ``cuLaunchKernel``.

A launcher returns None, and the communicator takes the full path, whenever
anything would make the result differ from the full path: an ``out`` of
another type, dtype or shape, a non-contiguous array, overlapping (but not
identical) input and output, profiling, strict checking (``MPIML_CHECK=1``)
or a call of 1 MiB or more under the default checking, or a failure recorded
by the transport (so that the full path raises it).

Signature checking: under the default ``MPIML_CHECK`` a hot call (below
1 MiB, after its shape's first call, which was checked) is *not* checked, on
whichever path it ends up served: the host-side agreement costs a host round
of the control communicator (``benchmarks/results/check_cost_vm.json``:
about 25 us at 2 ranks on the 2-core test machine, against 5-7 us for the
whole eager device call), and ranks must agree on whether a round is posted,
which depends only on the call shape.  The device-side check (the signature
carried in the kernels' flags, designed in ``benchmarks/gpu/README.md``) is
not built: it needs several GPUs, which were not available.  ``MPIML_CHECK=1``
checks every call on the host.
"""

import ctypes
import os
import time

from .. import _config
from . import _profile

__all__ = ["ArgBlock", "allreduce_launcher", "bcast_launcher", "nccl_launcher", "check_level"]

# MPIML_CHECK is read per call (a test or a user may change it at run time), but
# os.environ.get costs ~0.5-2 us; the raw bytes of CPython's environment mapping
# are read in ~0.1 us and mapped to the level _config parsed for that value.
try:
    _ENV, _KEY = os.environ._data, os.environ.encodekey("MPIML_CHECK")
except AttributeError:  # not CPython's os.environ: the plain way
    _ENV = _KEY = None
_LEVELS = {}


def check_level():
    """``mpiml._config.check_level()``, cheaper."""
    if _ENV is None:
        return _config.check_level()
    raw = _ENV.get(_KEY)
    try:
        return _LEVELS[raw]
    except KeyError:
        level = _LEVELS[raw] = _config.check_level()
        return level


class ArgBlock:
    """Five 64-bit kernel arguments and the array of pointers to them that ``cuLaunchKernel`` takes."""

    __slots__ = ("words", "argv", "argv_ptr")

    def __init__(self, ctx_ptr, n, extra):
        self.words = (ctypes.c_uint64 * 5)(ctx_ptr, 0, 0, n, extra)
        base = ctypes.addressof(self.words)
        self.argv = (ctypes.c_void_p * 5)(*[base + 8 * i for i in range(5)])
        self.argv_ptr = ctypes.addressof(self.argv)


def _guards(transport, x):
    """What every launcher checks per call, bound once."""
    return (x.__class__, x.dtype, x.shape, x.nbytes, getattr(transport, "_err_code", None), _profile._ACTIVE,
            check_level, x.nbytes >= _config.CHEAP_CHECK_BYTES)


def allreduce_launcher(transport, x, fn_aligned, fn_unaligned, grid, block, mask, extra=0):
    """``call(x, out)`` launching one allreduce kernel on CuPy's current stream, or returning None."""
    import cupy

    cls, dtype, shape, nb, err, active, check_level_, check_default = _guards(transport, x)
    args = ArgBlock(transport._ctx.data.ptr, x.size, extra)
    words, argv = args.words, args.argv_ptr
    launch = transport._launch_kernel
    stream = cupy.cuda.get_current_stream
    empty = cupy.empty

    def call(x, out):
        if not x._c_contiguous or err.value or active or transport._broken is not None or transport._sync:
            return None
        level = check_level_()
        if level == 1 or (level is None and check_default):
            return None
        if out is None:
            out = empty(shape, dtype)
        elif out.__class__ is not cls or out.dtype is not dtype or not out._c_contiguous or out.shape != shape:
            return None
        xp_ = x.data.ptr
        yp = out.data.ptr
        if xp_ != yp and xp_ < yp + nb and yp < xp_ + nb:
            return None
        words[1] = xp_
        words[2] = yp
        launch(fn_unaligned if (xp_ | yp) & mask else fn_aligned, grid, 1, 1, block, 1, 1, 0, stream().ptr, argv, 0)
        transport._last_op = "allreduce"
        return out

    call.args = args  # keeps the argument block alive with the launcher
    return call


def bcast_launcher(transport, rank, root, x, fn_aligned, fn_unaligned, grid, block, mask):
    """``call(x, None)`` launching one bcast kernel (the root's ``x``; a new array elsewhere), or None."""
    import cupy

    cls, dtype, shape, nb, err, active, check_level_, check_default = _guards(transport, x)
    args = ArgBlock(transport._ctx.data.ptr, x.size, root)
    words, argv = args.words, args.argv_ptr
    launch = transport._launch_kernel
    stream = cupy.cuda.get_current_stream
    empty = cupy.empty
    is_root = rank == root

    def call(x, _unused):
        if not x._c_contiguous or err.value or active or transport._broken is not None or transport._sync:
            return None
        level = check_level_()
        if level == 1 or (level is None and check_default):
            return None
        buf = x if is_root else empty(shape, dtype)
        p = buf.data.ptr
        words[1] = p
        words[2] = p
        launch(fn_unaligned if p & mask else fn_aligned, grid, 1, 1, block, 1, 1, 0, stream().ptr, argv, 0)
        transport._last_op = "bcast"
        return buf

    call.args = args
    return call


def nccl_launcher(transport, op, x, arg):
    """``call(x, out)`` issuing one NCCL allreduce or bcast, tracked for the watchdog, or returning None."""
    import cupy

    cls, dtype, shape, nb, _, active, check_level_, check_default = _guards(transport, x)
    nc = transport.comm
    dt = transport._dt(x)
    n = x.size
    stream = cupy.cuda.get_current_stream
    empty = cupy.empty
    runtime = cupy.cuda.runtime
    track = transport._timeout is not None
    inflight, free = transport._inflight, transport._free_events

    def done(s):
        if track and not runtime.streamIsCapturing(s):
            ev = free.pop() if free else runtime.eventCreateWithFlags(2)
            runtime.eventRecord(ev, s)
            inflight.append((time.monotonic(), ev, op))

    if op == "allreduce":
        red = transport._op(arg, dtype)
        reduce = nc.allReduce

        def call(x, out):
            if not x._c_contiguous or active or transport._broken is not None or transport._sync:
                return None
            level = check_level_()
            if level == 1 or (level is None and check_default):
                return None
            if out is None:
                out = empty(shape, dtype)
            elif out.__class__ is not cls or out.dtype is not dtype or not out._c_contiguous or out.shape != shape:
                return None
            xp_ = x.data.ptr
            yp = out.data.ptr
            if xp_ != yp and xp_ < yp + nb and yp < xp_ + nb:
                return None
            s = stream().ptr
            reduce(xp_, yp, n, dt, red, s)
            done(s)
            return out

        return call
    if op == "bcast":
        root = int(arg)
        is_root = transport.rank == root
        bcast = nc.bcast

        def call(x, _unused):
            if not x._c_contiguous or active or transport._broken is not None or transport._sync:
                return None
            level = check_level_()
            if level == 1 or (level is None and check_default):
                return None
            buf = x if is_root else empty(shape, dtype)
            s = stream().ptr
            bcast(buf.data.ptr, n, dt, root, s)
            done(s)
            return buf

        return call
    return None
