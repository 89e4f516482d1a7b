"""How the ranks of a communicator agree: signature rounds, inline calls, and the failure state.

A mixin of :class:`~mpiml.comm.Communicator` (it needs ``rank``, ``size``,
``_ctl``, ``_round``, ``_notices``, ``_seq``, ``_hot``, ``_failure``,
``_children``, ``_device_transports``); see :mod:`mpiml.comm._signature` for
the round itself and :mod:`mpiml.comm._communicator` for how calls use it.
"""

import pickle
import threading

import numpy as np

from .. import _config
from .._errors import CollectiveMismatchError, CommAbortedError, CommError, CommTimeoutError
from ._hotpath import DEFERRED, check_level
from ._request import poll_until, set_guard
from ._signature import describe, first_difference, mismatch_text, signature_base

_SEQUENCE_SPEC = ("sequence", None, 0, 0, None, (), "device", None)
_SEQUENCE_BASE = signature_base(*_SEQUENCE_SPEC)

__all__ = ["Agreement"]

_NP_UFUNC = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def _release(rnd, notices):
    """Give back a communicator's persistent round and pending notice receive.

    Run by ``close()``, when the communicator is collected, or at exit (a
    ``weakref.finalize``, first made after MPI's import, so before MPI_Finalize,
    which must not meet a pending receive).
    """
    if rnd is not None:
        rnd.close()
    if notices is not None:
        notices.close()


def _error_like(kind, message):
    """An exception of the class named ``kind`` (a communication error) with exactly ``message``."""
    if kind == "CommTimeoutError":
        return CommTimeoutError(None, "all", None, message=message)
    cls = {c.__name__: c for c in (CommAbortedError, CollectiveMismatchError)}.get(kind, CommError)
    return cls(message)


def _mpi_any_thread(transport):
    mpi = getattr(transport, "MPI", None)
    return mpi is not None and mpi.Query_thread() == mpi.THREAD_MULTIPLE


class Agreement:
    """Failure state, the control plane and the signature round of a communicator."""

    # ------------------------------------------------------------------ failure state
    def _poison(self, exc, *, tell=True):
        """Record the first failure here and on every communicator split from this one.

        Aborts the device transports (an IPC kernel still spinning gives up, the
        NCCL communicator is aborted), so that nothing waits for a peer that is
        gone, and tells the other ranks (see :class:`~mpiml.comm._signature.AbortNotices`)
        unless the news came from one of them.  Safe to call from the watchdog thread.
        """
        if self._failure is None:
            self._failure = exc
            for t in list(self._device_transports.values()):
                abort = getattr(t, "abort", None)
                if abort is not None:
                    try:
                        abort(f"{type(exc).__name__}: {exc}")
                    except Exception:
                        pass
            if tell and self._notices is not None:
                self._untold = f"{self._seq}|{type(exc).__name__}|{exc}"
                self._tell()
        for child in list(self._children):
            child._poison(exc)

    def _tell(self):
        """Send the failure to the other ranks, from a thread that may call MPI."""
        if self._untold and (_mpi_any_thread(self._ctl) or threading.current_thread() is threading.main_thread()):
            text, self._untold = self._untold, None
            self._notices.tell(text)

    def _listen(self):
        """The watch of this communicator's long waits: a rank that aborted it ends them.

        A rank in the same call raises the error that rank raised (the same class and
        text: the call failed for the whole group); a rank at a later call raises
        :class:`~mpiml.CommAbortedError` naming it.  A peer on this host whose process
        has ended (see :mod:`mpiml.comm._liveness`) aborts it too, naming that rank.
        """
        live = self._liveness
        if live is not None and live.look() is not None:
            self._poison(CommAbortedError(live.describe(live.dead)))
            raise self._aborted("wait")
        heard = self._notices.heard() if self._notices is not None else None
        if heard is None:
            return
        source, text = heard
        seq, kind, message = (text.split("|", 2) + ["", ""])[:3]
        if seq == str(self._seq):
            exc = _error_like(kind, message)
            self._poison(exc, tell=False)
            raise exc
        self._poison(CommError(f"rank {source} aborted it: {kind}: {message}"), tell=False)
        raise self._aborted("wait")

    def _aborted(self, op):
        if self._untold:  # (a failure found by another thread: tell the peers now)
            self._tell()
        f = self._failure
        err = CommAbortedError(f"{op} on rank {self.rank}: the communicator was aborted by an earlier failure "
                               f"({type(f).__name__}: {f})")
        err.__cause__ = f
        return err

    # ------------------------------------------------------------------ control plane
    # Agreements between ranks that already know they are at the same point: inside a call
    # whose signature round agreed, or while a communicator is being created.  A user's call
    # never starts with one of these; it starts with its signature round.
    def _ctl_wait(self, op, start):
        """Run one control-plane collective: refused on a dead communicator, and a failure
        (a timeout, a lost peer) kills the communicator, as on the data plane."""
        if self._failure is not None:
            raise self._aborted(op)
        try:
            start().wait()
        except CommError as exc:
            self._poison(exc)
            raise

    def _allgather_ints(self, values):
        send = np.asarray(values, dtype=np.int64).reshape(-1)
        recv = np.empty(send.size * self.size, dtype=np.int64)
        self._ctl_wait("allgather", lambda: self._ctl.native_allgather(send, recv))
        return recv.reshape(self.size, send.size)

    def _allgather_obj(self, obj):
        """Allgather picklable objects on the control plane (honours the timeout)."""
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        return self._allgatherv_pickles(data, self._allgather_ints([data.size])[:, 0])

    def _allgatherv_pickles(self, data, counts):
        """Every rank's pickle ``data`` (uint8; ``counts[r]`` bytes on rank r), unpickled in rank order."""
        counts = np.asarray(counts, dtype=np.int64)
        out = np.empty(int(counts.sum()), dtype=np.uint8)
        self._ctl_wait("allgatherv", lambda: self._ctl.native_allgatherv(data, out, counts))
        result, start = [], 0
        for c in counts:
            result.append(pickle.loads(out[start:start + c].tobytes()))
            start += c
        return result

    def _bcast_obj_ctl(self, obj, root=0):
        if self.size == 1:
            return obj
        payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if self.rank == root else None
        n = np.array([payload.size if payload is not None else 0], dtype=np.int64)
        self._ctl_wait("bcast", lambda: self._ctl.native_bcast(n, root))
        buf = payload.copy() if payload is not None else np.empty(int(n[0]), dtype=np.uint8)
        self._ctl_wait("bcast", lambda: self._ctl.native_bcast(buf, root))
        return pickle.loads(buf.tobytes()) if self.rank != root else obj

    # ------------------------------------------------------------------ the signature round
    def _call_level(self, key, nbytes):
        """How this call is checked: 0 not at all, 1 strictly, None the default, DEFERRED later.

        Under the default, a repeated call (its shape's first call was agreed) on
        memory that defers (device) is DEFERRED: it runs at once and joins the log
        that the next round agrees on (see :meth:`_note_deferred`).  Whether a call
        defers depends only on the sequence of call shapes, so ranks that made the
        same calls post the same rounds.
        """
        if self.size == 1:
            return 0
        level = check_level()
        if level is None and key is not None:
            plan = self._plans.get(key)
            if plan is not None and plan.deferrable:
                return DEFERRED
        return level

    # ------------------------------------------------------------------ deferred checking
    # A repeated device call runs without a host round: its signature's base joins
    # self._deferred, and every round folds a hash of that log (with the call number of
    # its first entry, _deferred_from) into the hash it posts, so the ranks agree on the
    # whole sequence at the next round: the next checked call, split or object collective,
    # or the round that _note_deferred posts after _check_every deferred calls.  Between
    # two rounds every call is deferred (any other call posts a round), so entry i is call
    # _deferred_from + i.  A mismatch then names the first call where the ranks' sequences
    # part, and aborts the communicator (those calls moved data).
    def _note_deferred(self, plan):
        log = self._deferred
        if not log:
            self._deferred_from = self._seq
        log.append(plan.base)
        self._know_spec(plan)
        if len(log) >= self._check_every:
            self._verify_sequence(plan.spec[0])

    def _know_spec(self, plan):
        """Remember the readable signature of ``plan``'s base (the log holds bases; a mismatch names specs)."""
        specs = self._deferred_specs
        if plan.base not in specs:
            if len(specs) >= 4096:
                specs.clear()
            specs[plan.base] = plan.spec

    def _spec_of(self, base):
        """The readable signature of a logged base (by its plan, if this rank forgot it)."""
        spec = self._deferred_specs.get(base)
        if spec is None:
            spec = next((p.spec for p in self._plans.values() if p.base == base), None)
        return spec if spec is not None else ("unknown", None, 0, 0, None, (), "device", None)

    def _verify_sequence(self, op):
        """Agree now on the calls deferred so far (one blocking round)."""
        if self.size > 1 and self._failure is None:
            self._agree(op, _SEQUENCE_BASE, _SEQUENCE_SPEC)

    def _round_hash(self, base):
        log = self._deferred
        if not log:
            return hash((base, self._seq))
        return hash((base, self._seq, self._deferred_from, tuple(log)))

    def _round_agreed(self):
        """Whether the round just completed agreed (and with it every deferred call: the log empties)."""
        if self._round.agreed():
            if self._deferred:
                self._deferred.clear()
            return True
        return False

    def _start_round(self, base, aux=0):
        try:
            self._round.start(self._round_hash(base), aux)
        except CommError as exc:
            self._poison(exc)
            raise

    def _wait_round(self, op):
        rnd = self._round
        try:
            if not rnd.done():
                poll_until(rnd.done, op=op, peer="all", detail="the ranks' signature agreement", watch=self._listen)
        except CommError as exc:
            self._poison(exc)
            raise

    def _agree(self, op, base, spec, aux=0, error=None):
        """One blocking round (this rank's slot already written): the call's signature, agreed."""
        rnd = self._round
        try:
            rnd.start(self._round_hash(base), aux)
            if not rnd.done():
                poll_until(rnd.done, op=op, peer="all", detail="the ranks' signature agreement", watch=self._listen)
        except CommError as exc:
            self._poison(exc)
            raise
        if error or not self._round_agreed():
            self._mismatch(op, spec, posted=False, error=error)
        return rnd

    def _mismatch(self, op, spec, posted, error=None):
        """Exchange readable signatures; raise the same CollectiveMismatchError on every rank.

        Every rank gets here from the same round, so the exchange meets.  If any rank
        had already posted its data collective, the communicator is aborted: that data
        may still be in flight and must never be taken for a later call's.  So it is
        when a rank skipped a call (the call numbers differ), and when the sequences
        part among deferred calls (they ran).  The text names the first call at which
        the ranks' sequences (deferred calls, then this one) differ.
        """
        log = [describe(self._spec_of(b), self._deferred_from + i) for i, b in enumerate(self._deferred)]
        gathered = self._allgather_obj((describe(spec, self._seq), error, bool(posted), log))
        where, in_log = first_difference([lg + [d] for d, _, _, lg in gathered], [len(lg) for *_, lg in gathered])
        if in_log:
            items = [seq[min(where, len(seq) - 1)] for seq in ([*lg, d] for d, _, _, lg in gathered)]
            text = mismatch_text(op, [(item, None) for item in items])
            text += (f" (at call {items[0]['call']} of this communicator on rank 0; found when the ranks agreed "
                     "on their repeated device calls, which run before their signatures are agreed: see MPIML_CHECK)")
        else:
            text = mismatch_text(op, [(d, e) for d, e, _, _ in gathered])
        exc = CollectiveMismatchError(text)
        self._deferred.clear()
        # aborted too when the ranks' call numbers differ: their sequences of calls have parted,
        # and every later call would pair one rank's n-th call with another's (n+1)-th
        if in_log or any(p for _, _, p, _ in gathered) or len({d["call"] for d, _, _, _ in gathered}) > 1:
            self._poison(exc)
        raise exc

    def _concurrent(self, op, spec, run):
        """``run()`` (the data part) while this call's posted round is in flight; verify it after.

        The waits inside ``run`` watch the round, so a mismatched data collective that
        hangs ends as soon as the round shows the mismatch.  Every exit completes the
        round (the next call posts it again) or aborts the communicator.
        """
        rnd = self._round
        prev = set_guard(self._guard, self._listen)
        try:
            result = run()
        except (CommTimeoutError, CommAbortedError) as exc:  # no time left to wait for the round; or dead
            set_guard(*prev)
            self._poison(exc)
            raise
        except Exception as exc:
            set_guard(*prev)
            if not isinstance(exc, CollectiveMismatchError):  # (a guard's trip is one)
                try:
                    self._wait_round(op)
                except CommError:
                    raise exc from None
                if self._round_agreed():  # an error of its own (a truncation is a mismatch: not here)
                    if isinstance(exc, CommError):
                        self._poison(exc)
                    raise
            self._mismatch(op, spec, posted=True)
        set_guard(*prev)
        self._wait_round(op)
        if not self._round_agreed():
            self._mismatch(op, spec, posted=True)
        return result

    # ------------------------------------------------------------------ inline calls
    def _make_inline(self, op, base, spec, dtype, n):
        """``fn(*algo_args)`` running a small host call inside its signature round.

        Every rank's payload arrives with every rank's signature; after the round
        agrees, the result is computed locally from the same rows in rank order, so
        it is identical on every rank and nothing is left in flight.
        """
        rnd, rank, size, agree = self._round, self.rank, self.size, self._agree
        if op == "barrier":
            return lambda: agree(op, base, spec)
        sv = rnd.slot_view(dtype, n)
        rows = rnd.rows(dtype, n)
        row = [rows[i] for i in range(size)]
        if op in ("allreduce", "reduce", "scan", "exscan"):
            upto = {"allreduce": size, "reduce": size, "scan": rank + 1, "exscan": rank}[op]

            def fn(send, recv, red, root=None):
                sv[...] = send
                agree(op, base, spec)
                if upto and recv is not None:
                    _reduce_rows(row, upto, red, recv)
        elif op == "bcast":
            def fn(buf, root):
                if rank == root:
                    sv[...] = buf
                agree(op, base, spec)
                if rank != root:
                    buf[...] = row[root]
        elif op in ("allgather", "gather"):
            def fn(send, recv, root=None):
                sv[...] = send
                agree(op, base, spec)
                if recv is not None:
                    recv.reshape(size, n)[...] = rows
        else:
            raise AssertionError(op)
        return fn


def _reduce_rows(rows, upto, op, out):
    """``out = rows[0] op rows[1] op ... op rows[upto - 1]``, in rank order (the same bits everywhere)."""
    if upto == 1:
        out[...] = rows[0]
        return
    uf = _NP_UFUNC[op]
    uf(rows[0], rows[1], out=out)
    for i in range(2, upto):
        uf(out, rows[i], out=out)
