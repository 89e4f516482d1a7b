"""The order of one IPC workspace's kernels across the CUDA streams they are launched on.

:class:`StreamOrder` is what :class:`mpiml.comm.backends.ipc.IPCTransport` (and its hot launchers)
consult on every launch; it knows nothing of the kernels, and its CUDA operations are injected, so
``tests/comm/test_ipc_protocol_model.py`` runs it as is against a CPU model of the workspaces.
"""

from ..._errors import CommError

__all__ = ["StreamOrder"]


class StreamOrder:
    """Keeps the kernels of one workspace in issue order across the CUDA streams they are launched on.

    Launches that stay on one stream are ordered by it, and pay nothing here:
    the caller compares the launch stream with ``last`` (``is``) and calls
    :meth:`before` only on a switch.  Only then is the event recorded on the
    previous stream (held here, so alive) and waited on by the new one: the
    kernel about to start then cannot run beside an earlier one (both would
    take the same call number from the epoch word, and the peers would give the
    second call the next one).  Capture status is queried only on a switch too.

    ``last`` is the stream *object* of the latest launch outside a capture,
    compared by identity and held, not its handle: a destroyed stream's handle
    may come back as a new stream's, while a stream object held here is not
    destroyed (a CuPy ``Stream`` destroys its handle when the object goes), and
    a new object is another stream (at worst one wait too many).  A stream this
    object cannot keep alive (``owned(s)`` false: a CuPy ``ExternalStream``, whose
    owner may destroy it at any time) is never touched after its launch: while
    ``last`` is such a stream, ``eager`` is set and the caller calls
    :meth:`after` after every launch, which records the event on the launch
    stream itself, as long as it is not capturing.

    A launch into a capturing stream records and waits for nothing and leaves
    ``last`` alone (its kernel runs when the graph is launched, on a stream the
    caller orders).  If ``last`` itself has begun a capture since its latest
    eager launch, no event can mark that launch any more (a record would go into
    the graph): :meth:`before` then waits on the host until the device is idle
    (``drain``: ``cudaDeviceSynchronize``; where the capture refuses it, a
    ``CommError`` that says to synchronize the stream before beginning the
    capture: the old per-launch record is what this rare case would need, and
    every call would pay for it).

    ``capturing(s)``, ``record(s)``, ``wait(s)``, ``owned(s)`` and ``drain(s)``
    are the CUDA operations (stream capture status; record this object's event
    on ``s``; make ``s`` wait on it; whether a held ``s`` stays alive; wait for
    the device), injected so that a model of the protocol can use this class as
    is.
    """

    __slots__ = ("last", "eager", "event", "_capturing", "_record", "_wait", "_owned", "_drain")

    def __init__(self, capturing, record, wait, owned=lambda s: True, drain=None, event=None):
        self.last = None
        self.eager = False
        self.event = event  # (the CUDA event of cuda(), destroyed by close())
        self._capturing, self._record, self._wait, self._owned = capturing, record, wait, owned
        self._drain = drain

    def before(self, s):
        """Before a launch on stream ``s`` when ``s is not self.last``: order it after the previous launch."""
        if self._capturing(s):
            return
        last = self.last
        if last is not None:
            if self.eager:  # the event already marks last's latest launch (after())
                self._wait(s)
            elif self._capturing(last):
                self._drain(last)
            else:
                self._record(last)
                self._wait(s)
        self.last = s
        self.eager = not self._owned(s)

    def after(self, s):
        """After a launch on ``s`` while ``eager``: the event marks it, unless ``s`` is capturing."""
        if s is self.last and not self._capturing(s):
            self._record(s)

    @classmethod
    def cuda(cls):
        """The order over CuPy's runtime (one event, no timing)."""
        from cupy.cuda import ExternalStream, runtime

        event = runtime.eventCreateWithFlags(2)  # cudaEventDisableTiming

        def drain(s):
            try:
                runtime.deviceSynchronize()
            except Exception as exc:
                raise CommError(
                    "an ipc collective on another stream while the stream of the previous one is being captured "
                    "into a CUDA graph: the previous call can only be waited for by synchronizing the device, which "
                    f"the capture refuses ({type(exc).__name__}: {exc}); synchronize that stream before beginning "
                    "the capture") from exc

        # (streams are CuPy stream objects; the capture status is an int, 0 when not capturing)
        return cls(lambda s: runtime.streamIsCapturing(s.ptr), lambda s: runtime.eventRecord(event, s.ptr),
                   lambda s: runtime.streamWaitEvent(s.ptr, event, 0),
                   lambda s: not isinstance(s, ExternalStream), drain, event)

    def close(self):
        self.last = None  # (the held stream may go)
        if self.event is not None:
            from cupy.cuda import runtime

            event, self.event = self.event, None
            runtime.eventDestroy(event)
