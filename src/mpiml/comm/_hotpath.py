"""The hot path of repeated device collectives: a few Python operations, then one launch.

The first call of a shape goes through :meth:`Communicator._run` (validation,
the tuning table, the signature agreement); a device transport that can repeat
that call with one kernel (``ipc``) or one NCCL call returns a *launcher* for
it, which the communicator keeps per call shape.  A launcher is built from two
parts, so every collective shares one per-call skeleton (:func:`launcher`):

* a *binding* of the collective (:func:`binding`): from the call's ``x`` and
  ``out`` it returns ``(result, in_ptr, out_ptr)``: the result array
  (allocated only when ``out`` is None and this rank receives), and the two
  pointers handed to the device, or None when the call must take the full
  path (an ``out`` of another type, dtype or shape, non-contiguous, or
  overlapping the input without being it);
* an *issue* function (:func:`ipc_issue`, :func:`nccl_issue`): the kernel
  handles, grid and pre-packed argument block of five 64-bit words (context,
  in, out, count, extra) of which only the two pointers are written per call
  before ``cuLaunchKernel``; or the NCCL call and its watchdog event.

A launcher returns None, and the communicator takes the full path, whenever
anything would make the result differ from the full path: the binding says
so, profiling is on, strict checking (``MPIML_CHECK=1``), or the transport
recorded a failure (so that the full path raises it).

Checking: under the default ``MPIML_CHECK`` a hot call is *deferred* (see
:meth:`Agreement._note_deferred`): it is launched at once, and its signature
joins this rank's log of unverified calls, which the ranks agree on at the
next signature round (every ``MPIML_CHECK_EVERY`` deferred calls at the
latest).  ``MPIML_CHECK=0`` logs nothing.
"""

import ctypes
import os
import weakref

from .. import _config
from . import _profile

__all__ = ["ArgBlock", "DEFERRED", "NOTHING", "binding", "launcher", "ipc_issue", "nccl_issue", "check_level"]

#: checking level of a call whose signature is agreed later, with its communicator's next round
DEFERRED = 2


class _Nothing:
    """What a launcher returns for a rank that receives nothing (reduce off the root)."""

    __slots__ = ()

    def __repr__(self):
        return "NOTHING"


NOTHING = _Nothing()

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


class _NoError:
    value = 0


def binding(op, x, *, rank, size, root=0, rows=None):
    """``bind(x, out) -> (result, in_ptr, out_ptr)`` or None for collective ``op`` on arrays like ``x``.

    ``rows`` is this rank's first dimension of a reduce_scatter result.
    """
    import cupy

    cls, dtype, shape, nb = x.__class__, x.dtype, x.shape, x.nbytes
    empty = cupy.empty
    if op == "bcast" and rank == root:
        def bind(x, out):
            p = x.data.ptr
            return x, p, p
        return bind
    if op == "reduce" and rank != root:
        def bind(x, out):
            return NOTHING, x.data.ptr, 0
        return bind
    if op == "allgather":
        oshape = (shape[0] * size,) + shape[1:]
    elif op == "reduce_scatter":
        oshape = (rows,) + shape[1:]
    else:  # allreduce, reduce (root), bcast (non-root): the shape of x
        oshape = shape
    # bytes of the result: an overlap of x with an ``out`` beyond them is none (a reduce_scatter result
    # is one part of x's size: the whole of x's would see overlaps that are not there, and take the full path)
    onb = nb * size if op == "allgather" else rows * (x.size // shape[0]) * x.itemsize if op == "reduce_scatter" \
        else nb
    if op == "bcast":  # non-root: receives into out (in and out are the same buffer)
        def bind(x, out):
            if out is None:
                out = empty(oshape, dtype)
            elif out.__class__ is not cls or out.dtype is not dtype or not out._c_contiguous or out.shape != oshape:
                return None
            p = out.data.ptr
            return out, p, p
        return bind

    def bind(x, out):
        if out is None:
            out = empty(oshape, dtype)
        elif out.__class__ is not cls or out.dtype is not dtype or not out._c_contiguous or out.shape != oshape:
            return None
        xp_ = x.data.ptr
        yp = out.data.ptr
        if xp_ != yp and xp_ < yp + onb and yp < xp_ + nb:
            return None
        return out, xp_, yp
    return bind


def launcher(comm, transport, plan, op, bind, issue, err=None):
    """``call(x, out)``: this collective repeated through ``bind`` and ``issue``, or None (full path).

    ``err`` is the transport's host-mapped error word (a failure makes the full path raise it).
    """
    err = err if err is not None else _NoError()
    active = _profile._ACTIVE
    check_level_ = check_level
    log = comm._deferred
    every = comm._check_every
    ref = weakref.ref(comm)

    def call(x, out):
        if not x._c_contiguous or err.value or active or transport._broken is not None or transport._sync:
            return None
        level = check_level_()
        if level == 1:
            return None
        bound = bind(x, out)
        if bound is None:
            return None
        res, ip, outp = bound
        issue(ip, outp)
        if level is None:  # deferred: logged, agreed at the next round (Agreement._note_deferred, inlined)
            if not log:
                c = ref()
                c._deferred_from = c._seq
            log.append(plan)
            if len(log) >= every:
                ref()._verify_sequence(op)
        return res

    return call


def ipc_issue(transport, op, x, fn_aligned, fn_unaligned, grid, block, mask, extra=0):
    """``issue(in_ptr, out_ptr)`` launching one IPC kernel on CuPy's current stream."""
    import cupy

    args = ArgBlock(transport._ctx.data.ptr, x.size, extra)
    words, argv = args.words, args.argv_ptr
    launch = transport._launch_kernel
    stream = cupy.cuda.get_current_stream
    order = transport._order  # one call at a time across streams (ipc.StreamOrder)

    def issue(ip, outp):
        words[1] = ip
        words[2] = outp
        st = stream()
        if st is not order.last:  # (the stream object: ipc.StreamOrder says why not its handle)
            order.before(st)
        launch(fn_unaligned if (ip | outp) & mask else fn_aligned, grid, 1, 1, block, 1, 1, 0, st.ptr, argv, 0)
        if order.eager:  # (only while the last stream is one the order cannot hold alive)
            order.after(st)
        transport._last_op = op

    issue.args = args  # keeps the argument block alive with the launcher
    return issue


def nccl_issue(transport, op, x, arg):
    """``issue(in_ptr, out_ptr)`` making one NCCL call (tracked for the watchdog), or None if ``op`` has none."""
    import cupy

    nc = transport.comm
    dt = transport._dt(x)
    n = x.size
    stream = cupy.cuda.get_current_stream
    capturing = cupy.cuda.runtime.streamIsCapturing
    tracked = transport._timeout is not None
    track = transport.track  # (one event per burst of calls on a stream, see NCCLTransport.track)

    def done(s):
        if tracked and not capturing(s):
            track(op, s)

    if op == "allreduce":
        red, call_ = transport._op(arg, x.dtype), nc.allReduce

        def issue(ip, outp):
            s = stream().ptr
            call_(ip, outp, n, dt, red, s)
            done(s)
    elif op == "bcast":
        root, call_ = int(arg), nc.bcast

        def issue(ip, outp):
            s = stream().ptr
            call_(outp, n, dt, root, s)
            done(s)
    elif op == "reduce":
        (red_op, root), call_ = arg, nc.reduce
        red = transport._op(red_op, x.dtype)

        def issue(ip, outp):
            s = stream().ptr
            call_(ip, outp or ip, n, dt, red, root, s)  # (NCCL ignores a non-root's receive buffer)
            done(s)
    elif op == "allgather":
        call_ = nc.allGather

        def issue(ip, outp):
            s = stream().ptr
            call_(ip, outp, n, dt, s)
            done(s)
    elif op == "reduce_scatter" and len(set(arg[0])) == 1 and arg[0][0]:  # equal parts only
        (counts, red_op), call_ = arg, nc.reduceScatter
        red, width = transport._op(red_op, x.dtype), int(counts[0])

        def issue(ip, outp):
            s = stream().ptr
            call_(ip, outp, width, dt, red, s)
            done(s)
    else:
        return None
    return issue
