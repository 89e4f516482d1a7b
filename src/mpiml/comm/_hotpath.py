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


def _dead():
    """A weak reference that never matches (no array yet, or ``out`` was None)."""
    return None


_UNKNOWN = object()
#: how many times one launcher pins its call to new arrays (see :func:`launcher`)
_PIN_LIMIT = 8


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

    A call on the same arrays as the call before it (the same ``x`` and ``out`` objects, held
    by weak references, and a result that is ``out`` or ``x``, not a new array) skips the
    binding: the pointers are those of last time (a CuPy array's memory, dtype and contiguity
    never change; its shape is part of the communicator's key).  Where ``issue`` can pin a
    call to its pointers (``issue.pinned(in_ptr, out_ptr)``: the IPC kernels, see
    :func:`ipc_issue`), the second call on the same arrays pins it, and the repeats replay
    that (one CUDA-graph launch instead of a kernel launch); a launcher pins at most
    ``_PIN_LIMIT`` times (then it launches kernels), so arrays that change every other
    call do not capture a graph each time.
    """
    err = err if err is not None else _NoError()
    active = _profile._ACTIVE
    check_level_, env, env_key, levels = check_level, _ENV, _KEY, _LEVELS
    if env is None:
        env, env_key, levels = {}, None, {}  # (every call asks check_level)
    log = comm._deferred
    every = comm._check_every
    ref = weakref.ref(comm)
    base = plan.base  # (what the log holds: the round hashes the bases, a mismatch names them by their spec)
    know = getattr(comm, "_know_spec", None)
    if know is not None:
        know(plan)
    pinned = getattr(issue, "pinned", None)
    # the arrays of the two latest calls that bound without a new result, and what they bound to: [x ref,
    # out ref, result code (0: out, 1: x, 2: NOTHING), in, out, pinned launch or None]; two, so that
    # calls alternating between two buffers hit as well
    memo = [[_dead, _dead, 0, 0, 0, None], [_dead, _dead, 0, 0, 0, None]]
    pins = [0]  # pinned launches made (at most _PIN_LIMIT)

    def call(x, out):
        if transport._broken is not None or err.value or active:  # (a closed transport is broken first)
            return None
        level = levels.get(env.get(env_key), _UNKNOWN)
        if level is _UNKNOWN:
            level = check_level_()
        if level == 1:
            return None
        m = memo[0]
        if x is not m[0]() or out is not m[1]():
            m = memo[1]
            if x is not m[0]() or out is not m[1]():
                m = None
        if m is not None:  # arrays of a call before: bound as then
            go = m[5]
            if go is not None:
                go()
            else:
                if pinned is not None and pins[0] < _PIN_LIMIT:
                    go = pinned(m[3], m[4])  # None: not now (a capture is on); False: none to be had
                    if go is not None:
                        pins[0] += 1
                        if go is False:
                            go = None
                        else:
                            m[5] = go
                if go is not None:
                    go()
                else:
                    issue(m[3], m[4])
            code = m[2]
            res = out if code == 0 else x if code == 1 else NOTHING
        else:
            if not x._c_contiguous:
                return None
            bound = bind(x, out)
            if bound is None:
                return None
            res, ip, outp = bound
            issue(ip, outp)
            code = 0 if res is out else 1 if res is x else 2 if res is NOTHING else -1
            if code >= 0:  # (not a new result array: its pointer would change every call)
                try:
                    entry = [weakref.ref(x), _dead if out is None else weakref.ref(out), code, ip, outp, None]
                except TypeError:  # (an array type without weak references: bound every call)
                    pass
                else:
                    memo[1] = memo[0]
                    memo[0] = entry
        if level is None:  # deferred: logged, agreed at the next round (Agreement._note_deferred, inlined)
            if not log:
                c = ref()
                c._deferred_from = c._seq
            log.append(base)
            if len(log) >= every:
                ref()._verify_sequence(op)
        return res

    call.memo = memo  # (tests look at it)
    return call


def ipc_issue(transport, op, x, fn_aligned, fn_unaligned, grid, block, mask, extra=0):
    """``issue(in_ptr, out_ptr)`` launching one IPC kernel on CuPy's current stream.

    ``issue.pinned(in_ptr, out_ptr)`` returns ``go()``, the same launch on those pointers as the
    replay of a one-node CUDA graph (``transport.one_node_graph``; a graph launch costs the host
    about half a kernel launch); None while the current stream is capturing (no graph is made
    then: ask again later); False where no graph is to be had.  ``issue.pinned`` is None where
    the transport makes no graphs (``MPIML_IPC_REPLAY=0``).  Into a capturing stream ``go``
    launches the kernel itself (a graph launch there would not be captured as one); on a stream
    other than the previous launch's both order it after that one (:class:`StreamOrder`).
    """
    import cupy

    args = ArgBlock(transport._ctx.data.ptr, x.size, extra)
    words, argv = args.words, args.argv_ptr
    launch = transport._launch_kernel
    stream = cupy.cuda.get_current_stream
    order = transport._order  # one call at a time across streams (ipc.StreamOrder)
    ctx, n = int(words[0]), int(words[3])

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

    make_graph = getattr(transport, "one_node_graph", None)

    capturing = cupy.cuda.runtime.streamIsCapturing

    def pinned(ip, outp):
        if capturing(stream().ptr):  # (no graph is made while the caller captures one: later)
            return None
        fn = fn_unaligned if (ip | outp) & mask else fn_aligned
        graph = make_graph(fn, grid, block, (ctx, ip, outp, n, extra))
        if graph is None:
            return False
        replay = graph.launch

        def go():
            st = stream()
            if st is not order.last:
                order.before(st)
            if capturing(st.ptr):  # (the kernel itself joins the capture)
                words[1] = ip
                words[2] = outp
                launch(fn, grid, 1, 1, block, 1, 1, 0, st.ptr, argv, 0)
            else:
                replay(st)
            if order.eager:
                order.after(st)
            transport._last_op = op

        go.graph = graph  # (held by the launch that replays it)
        return go

    issue.args = args  # keeps the argument block alive with the launcher
    issue.pinned = pinned if make_graph is not None and getattr(transport, "_replay", False) else None
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
