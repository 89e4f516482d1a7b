"""The signature agreement that every checked collective makes (``MPIML_CHECK``).

Every checked call starts with the same step on the control context: a
*round*, one allgather of a fixed-size row per rank.  A row is

====  =====================================================================
word  content
====  =====================================================================
0     hash of the call's signature: collective, call number, dtype, count,
      root, reduction, shape, memory kind, forced algorithm, local error flag
1     a per-rank integer of the call (rows of a v-collective, an object's
      pickled size)
2..   an inline slot (:func:`slot_bytes`: 4 KiB up to 4 ranks, less beyond):
      small payloads (the data of a small host collective, an object,
      scatter's metadata)
====  =====================================================================

Because the first control-plane step of *every* checked call is this same
allgather, ranks that called different collectives, or the same collective
with different arguments (even arguments that would pick different
algorithms), still meet in it, and every rank sees every rank's hash: a
mismatch is found by all ranks from the same data, and a second allgather
of the readable signatures builds one error text, identical everywhere.

The round is an MPI persistent collective where MPI offers one (MPI 4), so a
call pays one ``Start`` instead of building a request.  Small host
collectives travel *inside* the round (their data in the slot, the result
computed locally in rank order), so checking them costs no extra message.
"""

import zlib

import numpy as np

from .._errors import CollectiveMismatchError, CommError
from ._ops import OPS, dtype_code
from .algorithms import COLLECTIVES

__all__ = ["SLOT_BYTES", "slot_bytes", "HEADER_WORDS", "KINDS", "SignatureRound", "RoundMismatch", "AbortNotices",
           "signature_base", "describe", "mismatch_text", "first_difference"]

#: the most bytes of inline payload per rank in a round (see :func:`slot_bytes`)
SLOT_BYTES = 4096
#: the most bytes a whole round moves to each rank (slots and headers of every rank), roughly
ROUND_BYTES = 16384
HEADER_WORDS = 2


def slot_bytes(size):
    """Inline bytes per rank for a group of ``size`` ranks (the same on every rank).

    Every round moves ``size`` rows to every rank, inline payload or not, so the
    slot shrinks as the group grows: 4 KiB up to 4 ranks (the small host calls of
    a k-means step travel inline), 128 bytes at 128 ranks and beyond (scatter's
    metadata still fits).  Measured in ``benchmarks/results/check_cost_vm.json``.
    """
    return max(128, min(SLOT_BYTES, ROUND_BYTES // max(size, 1)) // 8 * 8)

#: collectives named in signatures, with a code each (ints only: str hashes are salted per process)
KINDS = COLLECTIVES + ("allgather_obj", "bcast_obj", "allreduce_obj", "split", "sequence")
_KIND_CODE = {k: i + 1 for i, k in enumerate(KINDS)}
_RED_CODE = {op: i + 1 for i, op in enumerate(OPS)}


def _algo_code(algorithm):
    return 0 if algorithm is None else zlib.crc32(str(algorithm).encode()) + 1


def signature_base(kind, dtype=None, count=0, root=0, redop=None, shape=(), memory="host", algorithm=None,
                   error=False):
    """The integer that ranks compare for one call, before the call number is mixed in.

    Built from ints only (tuples of ints hash alike in every process), so equal
    arguments give an equal base on every rank.
    """
    return hash((_KIND_CODE[kind], 0 if dtype is None else dtype_code(dtype), int(count), int(root),
                 _RED_CODE.get(redop, 0), tuple(int(d) for d in shape), 1 if memory == "device" else 0,
                 _algo_code(algorithm), 1 if error else 0))


def describe(spec, seq):
    """The readable signature of ``spec`` (the arguments of :func:`signature_base`) at call ``seq``."""
    kind, dtype, count, root, redop, shape, memory, algorithm = spec
    return {"collective": kind, "call": seq, "dtype": None if dtype is None else str(np.dtype(dtype)),
            "count": int(count), "root": int(root), "op": redop, "shape": tuple(int(d) for d in shape),
            "memory": memory, "algorithm": algorithm}


def _groups(values):
    groups = {}
    for r, v in enumerate(values):
        groups.setdefault(v, []).append(r)
    return "; ".join(f"{v} on ranks {rs}" for v, rs in groups.items())


def mismatch_text(op, details):
    """The error text for gathered ``(describe(...), error)`` pairs, one per rank (the same on every rank)."""
    descs = [d for d, _ in details]
    kinds = [d["collective"] for d in descs]
    if len(set(kinds)) > 1:
        return f"ranks called different collectives (mismatched collective): {_groups(kinds)}"
    op = kinds[0]
    calls = [d["call"] for d in descs]
    if len(set(calls)) > 1:
        return (f"{op}: ranks are at different calls of this communicator (mismatched call number: "
                f"a rank skipped or repeated a collective): {_groups(calls)}")
    roots = [d["root"] for d in descs]
    if len(set(roots)) > 1:  # before local errors: a rank that thinks it is the root may lack data
        return f"{op} called with mismatched root across ranks: {_groups(roots)}"
    bad = [(r, e) for r, (_, e) in enumerate(details) if e]
    if bad:
        return f"{op} is invalid on rank(s) {[r for r, _ in bad]}: " + "; ".join(f"rank {r}: {e}" for r, e in bad)
    for field in ("dtype", "count", "op", "shape", "memory", "algorithm"):
        values = [d[field] for d in descs]
        if len(set(values)) > 1:
            label = "trailing shape" if field == "shape" and op in ("allgatherv", "gatherv") else field
            return f"{op} called with mismatched {label} across ranks: {_groups(values)}"
    return f"{op} called with mismatched arguments across ranks"


def first_difference(sequences, logged):
    """``(index, in_log)``: where the ranks' call ``sequences`` first differ (a shorter one repeats its
    last entry), and whether that is among the first ``logged[r]`` (deferred) entries of some rank."""
    longest = max(len(s) for s in sequences)
    for i in range(longest):
        items = [s[min(i, len(s) - 1)] for s in sequences]
        if any(item != items[0] for item in items[1:]):
            return i, any(i < n for n in logged)
    return longest - 1, False


class RoundMismatch(CollectiveMismatchError):
    """Raised by :meth:`SignatureRound.guard` inside a wait: the round shows a mismatch."""


class SignatureRound:
    """The fixed-size allgather on the control transport that starts every checked call.

    Parameters
    ----------
    ctl : Transport
        The communicator's control context (``mpi``).
    size : int
        Ranks in the group.
    """

    def __init__(self, ctl, size):
        self.size = size
        self.slot_bytes = slot_bytes(size)
        width = HEADER_WORDS + self.slot_bytes // 8
        self.send = np.zeros(width, dtype=np.int64)
        self.recv = np.zeros((size, width), dtype=np.int64)
        self.hashes = self.recv[:, 0]
        self.aux = self.recv[:, 1]
        self.slot = self.send[HEADER_WORDS:].view(np.uint8)
        self.slots = self.recv[:, HEADER_WORDS:].view(np.uint8)  # (size, slot_bytes)
        self.pending = False
        self.h = 0
        self._ctl = ctl
        mpi = getattr(ctl, "MPI", None)
        self._mpi_error = mpi.Exception if mpi is not None else ()
        self._persistent = None
        comm = getattr(ctl, "comm", None)
        if comm is not None and hasattr(comm, "Allgather_init"):
            try:  # MPI 4 persistent collective (MPICH 4+, Open MPI 5+); else one Iallgather per round
                self._persistent = comm.Allgather_init(self.send, self.recv)
            except Exception:
                self._persistent = None
        self._test = self._persistent.Test if self._persistent is not None else None

    def start(self, h, aux=0):
        """Post this rank's row ``(h, aux, slot)``; the slot must already be written."""
        send = self.send
        send[0] = h
        send[1] = aux
        self.h = h
        try:
            if self._persistent is not None:
                self._persistent.Start()
            else:
                self._test = self._ctl.native_allgather(send, self.recv.reshape(-1)).test
        except self._mpi_error as exc:
            raise CommError(f"the signature agreement failed in MPI: {exc}") from exc
        self.pending = True

    def done(self):
        """Make progress; True once every rank's row has arrived."""
        if not self.pending:
            return True
        try:
            if self._test():
                self.pending = False
                return True
        except self._mpi_error as exc:
            raise CommError(f"the signature agreement failed in MPI: {exc}") from exc
        return False

    def agreed(self):
        """Whether every rank posted the hash this rank posted (after :meth:`done`)."""
        return self.hashes.tolist().count(self.h) == self.size

    def guard(self):
        """For :func:`~mpiml.comm._request.set_guard`: end a wait once the round shows a mismatch."""
        if self.pending and self.done() and not self.agreed():
            raise RoundMismatch("the ranks' signatures differ")

    def rows(self, dtype, n):
        """The first ``n`` items of every rank's slot as a ``(size, n)`` view of ``dtype``."""
        nb = n * np.dtype(dtype).itemsize
        return self.slots[:, :nb].view(dtype)

    def slot_view(self, dtype, n):
        """The first ``n`` items of this rank's outgoing slot, as ``dtype``."""
        nb = n * np.dtype(dtype).itemsize
        return self.slot[:nb].view(dtype)

    def close(self):
        if self._persistent is not None and not self.pending:  # an active one cannot be freed
            try:
                self._persistent.Free()
            except Exception:
                pass
        self._persistent = None


class AbortNotices:
    """Tells the other ranks that this communicator died here, and hears them say so.

    A rank whose call failed (a timeout, a lost peer, a transport error) leaves
    its part of that call posted; a rank that arrives late can still complete
    the call from those parts (the result is right: they were posted), but it
    must not wait for the *next* one, which the others will never make.  So a
    rank that aborts a communicator sends its reason to every other rank (a
    small message on the control context, never waited for), and a wait that
    outlasts its spin listens for one (:meth:`heard`): the late rank raises
    :class:`~mpiml.CommAbortedError` naming the first failure at once, not
    after its own timeout.  Nothing is checked on a call that does not wait.
    """

    TAG = 32001
    MAX_BYTES = 1024

    def __init__(self, ctl, rank, size):
        mpi = ctl.MPI
        self._mpi, self._comm, self.rank, self.size = mpi, ctl.comm, rank, size
        self._buf = bytearray(self.MAX_BYTES)
        self._status = mpi.Status()
        self._recv = self._comm.Irecv([self._buf, mpi.BYTE], mpi.ANY_SOURCE, self.TAG)
        self._sent = []
        self.told = False

    def tell(self, text):
        """Send ``text`` to every other rank (once; nothing waits for it)."""
        if self.told or self._comm is None:
            return
        self.told = True
        data = text.encode("utf-8", "replace")[:self.MAX_BYTES]
        for k in range(self.size):
            if k != self.rank:
                try:
                    self._sent.append(self._comm.Isend([data, self._mpi.BYTE], k, self.TAG))
                except self._mpi.Exception:
                    pass

    def heard(self):
        """``(rank, text)`` of the first other rank that aborted, or None."""
        if self._recv is None:
            return None
        try:
            if not self._recv.Test(self._status):
                return None
        except self._mpi.Exception:
            return None
        self._recv = None
        n = self._status.Get_count(self._mpi.BYTE)
        return self._status.Get_source(), bytes(self._buf[:n]).decode("utf-8", "replace")

    def close(self):
        """Withdraw the pending receive (MPI must not finalize with it posted)."""
        if self._recv is not None:
            try:
                self._recv.Cancel()
                self._recv.Wait()
            except self._mpi.Exception:
                pass
            self._recv = None
        for req in self._sent:
            try:
                if not req.Test():
                    req.Cancel()
            except self._mpi.Exception:
                pass
        self._sent = []
        self._comm = None
