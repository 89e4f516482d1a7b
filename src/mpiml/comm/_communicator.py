"""The public communicator: arrays in, arrays out, on the namespace of the input.

Point-to-point lives in :mod:`mpiml.comm._p2p`.  A :class:`Communicator` owns three contexts over the same group of ranks, so
that traffic of one kind can never match traffic of another:

* ``_coll`` — collectives (native ones and our algorithms' point-to-point);
* ``_p2p`` — the user's ``send``/``recv``;
* ``_ctl`` — small agreements (signatures, counts, metadata, objects).

Every call goes through :meth:`Communicator._run` (or, repeated, through the
plan it left, see ``_fast_plan``), which picks the backend and algorithm from
the tuning table (the same choice on every rank), agrees on the call's
signature (see :mod:`mpiml.comm._signature` and ``MPIML_CHECK``), runs it with
timeouts and records it for :func:`mpiml.profile`.

Longer than 800 lines because the one class users call carries every collective's public signature
(arguments checked the same way on every rank, the docstrings of the API) around one shared
:meth:`Communicator._run`; what stands alone already lives beside it (point-to-point, the hot path,
the routing table, the signature rounds, the backends).

How a checked call agrees (``MPIML_CHECK`` unset, the default):

* *inline* — small host calls (at most ``slot_bytes(size)`` per rank, no forced
  algorithm) send their data inside the signature round itself and compute
  the result locally, in rank order: one message round, as unchecked;
* *concurrent* — other host calls post the round, then the data collective,
  and verify the round before returning; a wait in between watches the round
  (a *guard*), so a mismatched data collective that would hang, truncate or
  return partial data ends as soon as the round shows the mismatch.  Data may
  then be in flight, so such a mismatch also aborts the communicator;
* *blocking* — device calls, calls with a local error to share and calls
  that need agreed metadata first (v-variants, scatter, alltoall, objects,
  split) wait for the round before any data moves.

``MPIML_CHECK=1`` makes every call blocking (nothing moves before the round
agrees, and a mismatch leaves the communicator usable); ``MPIML_CHECK=0``
posts no round for array collectives.
"""

from functools import partial
import os
import time
import weakref

import numpy as np

from .. import _config
from .._array import as_supported_array, get_namespace, is_device_array
from .._errors import CollectiveMismatchError, CommError, CommTimeoutError
from . import _profile
from ._agreement import Agreement, _release
from ._hotpath import DEFERRED, NOTHING
from ._liveness import Liveness, local_identity
from ._ops import check_dtype, check_op, identity
from ._objects import ObjectCollectives
from ._metadata import MetadataCollectives
from ._p2p import MAX_TAG, PointToPoint, _flat
from ._signature import AbortNotices, SignatureRound, signature_base
from ._tuning import TuningTable, stream_mode
from .algorithms import ALGORITHMS, Channel, get_algorithm
from .backends import get_backend_factory

__all__ = ["Communicator", "MAX_TAG"]



class _Plan:
    """How a call shape seen before is served again (see ``Communicator._fast_plan``).

    ``replay(*algo_args)`` repeats the route chosen then (None until one ran);
    ``base`` and ``spec`` are the call's signature (hash base, readable fields);
    ``inline(x, out)`` runs it inside the signature round (small host calls), or None;
    ``deferrable``: once agreed, its repeats are checked later (``DEFERRED``, see ``_call_level``);
    ``mode``: None, or the mode (``"eager"`` / ``"graph"``) whose route ``replay`` repeats when the
    tuning table routes this call differently in a CUDA graph (then only a hot launcher of the
    current mode repeats it, see :class:`_ModeLaunchers`; the full path routes every other call).
    """

    __slots__ = ("replay", "xp", "base", "spec", "inline", "blocking", "route", "deferrable", "mode")

    def __init__(self, replay, xp, base, spec, inline, blocking, deferrable=False):
        self.replay, self.xp, self.base, self.spec, self.inline, self.blocking = \
            replay, xp, base, spec, inline, blocking
        self.deferrable = deferrable
        self.route = None
        self.mode = None


class _ModeLaunchers:
    """The hot launchers of one call shape whose route differs in a CUDA graph (a tuning rule per mode).

    Called as a launcher: one capture-status query of the current stream (only such shapes pay it)
    picks the launcher of the current mode, or None (the full path) until a call of that mode made one.
    """

    __slots__ = ("eager", "graph", "_capturing")

    def __init__(self, capturing=None):
        self.eager = self.graph = None
        if capturing is None:
            import cupy

            runtime, current = cupy.cuda.runtime, cupy.cuda.get_current_stream

            def capturing():
                return runtime.streamIsCapturing(current().ptr)
        self._capturing = capturing

    def __call__(self, x, out):
        fn = self.graph if self._capturing() else self.eager
        return None if fn is None else fn(x, out)


class Communicator(Agreement, ObjectCollectives, MetadataCollectives, PointToPoint):
    """An MPI-style communicator over NumPy and CuPy arrays.

    Use :func:`mpiml.comm.get_comm` to get the world communicator.

    Parameters
    ----------
    world : Transport
        The host-side transport (``mpi`` or ``self``) of this group.
    prefer : str, default="auto"
        ``"auto"`` follows the tuning table; a backend name makes that backend
        the first choice for the calls it can serve.
    tuning : TuningTable, default=None
        Agreed table; read by rank 0 and broadcast when None.
    """

    def __init__(self, world, *, prefer="auto", tuning=None):
        self._world = world
        self._coll = world.dup()
        self._p2p = world.dup()
        self._ctl = world.dup()
        self.rank = world.rank
        self.size = world.size
        self.prefer = prefer
        self._device_transports = {}
        self._unavailable = {}
        # (op, array type, dtype, shape, op/root, algorithm) -> _Plan: calls that were
        # validated and routed once; see _fast_plan
        self._plans = {}
        # (op, array type, dtype, shape, op/root, algorithm) -> hot launcher of the device
        # transport (see mpiml.comm._hotpath): the few microseconds of a repeated small call
        self._hot = {}
        # per collective, the arrays of its latest hot call: (weak ref to x, reduction / root, algorithm,
        # shape, launcher); a call on the same x (and the same arguments, and x's shape unchanged) reaches
        # the launcher without the key (a CuPy array's type and dtype never change); forgotten whenever
        # self._hot changes
        self._memo_bcast = self._memo_reduce = self._memo_allreduce = None
        self._memo_allgather = self._memo_reduce_scatter = None
        self._failure = None  # the first failure (then every call raises CommAbortedError)
        self._children = weakref.WeakSet()
        self._seq = 0  # collectives called on this communicator (part of every signature)
        # signature bases of the calls that ran before their signature was agreed, the first being
        # call number _deferred_from (see Agreement._note_deferred); the next round agrees on them,
        # at the latest after _check_every of them; which memory kinds defer is the same on
        # every rank. _deferred_specs: base -> readable signature, for a mismatch's text
        self._deferred = []
        self._deferred_from = 0
        self._deferred_specs = {}
        self._check_every = _config.env_number("MPIML_CHECK_EVERY", 1024, minimum=1, unit="calls")
        self._defer_memory = ("device",)
        self._round = self._notices = self._liveness = None
        self._untold = None  # a failure not yet told to the other ranks
        if tuning is None:
            data = None
            if self.rank == 0:
                try:
                    data = TuningTable.from_config(_config.tuning_file(), _config.comm_algo_override(),
                                                   explicit="MPIML_TUNING_FILE" in os.environ).to_data()
                except ValueError as exc:  # a bad table or MPIML_COMM_ALGO: the same error everywhere
                    data = exc
            data = self._bcast_obj_ctl(data)
            if isinstance(data, ValueError):
                self.close()
                raise ValueError(str(data))
            tuning = TuningTable.from_data(data)
        self._tuning = tuning
        # the peers whose processes this rank can watch (see mpiml.comm._liveness)
        self._liveness = Liveness(self.rank, self._allgather_obj(local_identity())) if self.size > 1 else None
        # created here, in the same order on every rank (a persistent collective's set-up is collective)
        self._round = SignatureRound(self._ctl, self.size) if self.size > 1 else None
        if self.size > 1 and getattr(self._ctl, "MPI", None) is not None:
            self._notices = AbortNotices(self._ctl, self.rank, self.size)
        self._finalizer = weakref.finalize(self, _release, self._round, self._notices)
        self._guard = None if self._round is None else self._round.guard

    # ------------------------------------------------------------------ basics
    @property
    def backend(self):
        """Name of the host transport (``"mpi"`` or ``"self"``)."""
        return self._world.name

    def __repr__(self):
        return f"<mpiml.Communicator rank={self.rank} size={self.size} backend={self.backend!r}>"

    def synchronize(self):
        """Wait until this rank's device collectives enqueued so far have completed.

        Device collectives are stream-ordered and return once enqueued; this waits
        on CuPy's current stream, at most ``MPIML_TIMEOUT`` seconds, and raises
        :class:`~mpiml.CommAbortedError` if a collective failed (on any rank that
        this rank waited for) or :class:`~mpiml.CommTimeoutError` if the stream
        did not finish in time.  A no-op for host-only communicators.
        """
        if self._failure is not None:
            raise self._aborted("synchronize")
        if not self._device_transports:
            return
        from .backends import _watchdog

        try:
            _watchdog.wait_stream(lambda: self._failure is not None)
        except CommTimeoutError as exc:
            self._poison(exc)
            raise
        _watchdog.check(self)  # what the watchdog would find at its next look
        if self._failure is not None:
            raise self._aborted("synchronize")

    def close(self):
        # (no launcher may run on a closed transport's workspace)
        self._hot.clear()
        self._memo_bcast = self._memo_reduce = self._memo_allreduce = None
        self._memo_allgather = self._memo_reduce_scatter = None
        for t in list(self._device_transports.values()):
            t.close()
        self._device_transports.clear()
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        for t in (self._coll, self._p2p, self._ctl):
            t.close()

    # ------------------------------------------------------------------ transports
    def _transport(self, backend):
        if backend == self._world.name or backend in ("mpi", "self"):
            return self._coll
        t = self._device_transports.get(backend)
        if t is None:
            t = get_backend_factory(backend)(self._coll)
            self._device_transports[backend] = t
            from .backends._watchdog import watch

            watch(self)
        return t

    def available_backends(self, memory):
        """Backends that can serve a call on ``memory`` ("host" or "device") here."""
        names = [self._world.name]
        if memory == "device" and self.size > 1:
            for name in ("nccl", "ipc"):
                if name in self._unavailable:
                    continue
                names.append(name)
        return tuple(names)

    def _device_backend_usable(self, name):
        """Create the device transport once; remember (on every rank alike) if it cannot run."""
        if name in self._device_transports:
            return True
        if name in self._unavailable:
            return False
        err = None
        try:
            self._transport(name)
        except Exception as exc:  # missing package, no peer access, ...
            err = f"{type(exc).__name__}: {exc}"
        errs = self._allgather_obj(err)
        bad = [(r, e) for r, e in enumerate(errs) if e]
        if bad:
            t = self._device_transports.pop(name, None)
            if t is not None:
                t.close()
            self._unavailable[name] = "; ".join(f"rank {r}: {e}" for r, e in bad)
            return False
        return True

    def _choose(self, op, nbytes, memory, algorithm, backend=None):
        # Memoized: the inputs are equal on every rank and the table, the preference and
        # which backends can run are fixed once decided, so a cached choice stays agreed.
        # This keeps the tuning lookup off the path of small device calls (a few us).
        cache = self.__dict__.setdefault("_choice_cache", {})
        mode = stream_mode(memory) if algorithm is None else "eager"  # "graph" while capturing
        self._last_mode = mode
        key = (op, nbytes, memory, algorithm, backend, mode)
        hit = cache.get(key)
        if hit is None:
            hit = self._choose_uncached(op, nbytes, memory, algorithm, backend, mode)
            if len(cache) >= 4096:
                cache.clear()
            cache[key] = hit
        return hit

    def _choose_uncached(self, op, nbytes, memory, algorithm, backend, mode="eager"):
        if algorithm is not None:
            if "/" in algorithm:
                backend, algorithm = algorithm.split("/", 1)
            backend = backend or (self.prefer if self.prefer not in ("auto", None) else self._world.name)
            if backend not in (self._world.name, "mpi", "self") and not self._device_backend_usable(backend):
                raise CommError(f"backend {backend!r} cannot run here: {self._unavailable[backend]}")
            if backend in ("mpi", "self"):
                backend = self._world.name
            return backend, algorithm
        if memory == "device" and self._tuning.machine is None and self.size > 1:
            self._tuning = self._machine_tuning()
        avail = self.available_backends(memory)
        if self.prefer not in ("auto", None, self._world.name) and memory == "device":
            if self.prefer in avail and self._device_backend_usable(self.prefer):
                return self.prefer, "native"
            if self.prefer in self._unavailable:  # asked for by name: the agreed reason, on every rank
                raise CommError(f"backend {self.prefer!r} cannot run here: {self._unavailable[self.prefer]}")
        backend, algo = self._tuning.choose(op, nbytes, self.size, memory, avail, mode)
        if backend not in (self._world.name, "mpi", "self") and not self._device_backend_usable(backend):
            backend, algo = self._tuning.choose(op, nbytes, self.size, memory, (self._world.name,), mode)
        if backend in ("mpi", "self"):
            backend = self._world.name
        return backend, algo

    def _machine_tuning(self):
        """The table with this machine's keyed rules (rank 0's key and files, agreed; see ``_tuning``).

        Made at the first device call that consults the table: a collective call, so the
        broadcast on the control context meets on every rank.
        """
        data = None
        if self.rank == 0:
            try:
                from ._tuning import load_keyed_rules, machine_key

                key = machine_key()
                data = (key, [dict(r) for r in load_keyed_rules(key, _config.tuning_file())])
            except Exception as exc:  # no NVML, a malformed file: the generic rules, and why
                data = ("", [], f"{type(exc).__name__}: {exc}")
        data = self._bcast_obj_ctl(data)
        return self._tuning.with_machine(data[0], data[1])

    # ------------------------------------------------------------------ the engine
    def _run(self, op, nbytes, xp, *, algorithm, native, algo_args, spec, level, error=None, blocking=False,
             inline_bytes=None):
        """Choose, check, run and record one collective; returns the :class:`_Plan` that repeats it.

        ``spec`` is this rank's ``(dtype, count, root, reduction, shape)``; ``level`` the
        checking of :meth:`_call_level` (0 also for a call whose round was already agreed);
        ``error`` a local validation message that every rank will raise; ``blocking`` makes
        the round complete before data moves; ``inline_bytes`` is the per-rank payload of an
        op that can travel inside the round (None: it cannot).
        """
        if self._failure is not None:
            raise self._aborted(op)
        memory = "device" if xp is not np else "host"
        spec = (op, *spec, memory, algorithm)
        base = signature_base(*spec, error=bool(error))
        plan = _Plan(None, xp, base, spec, None, memory == "device", memory in self._defer_memory)
        start = time.perf_counter()
        if (inline_bytes is not None and memory == "host" and algorithm is None and self.size > 1
                and inline_bytes <= self._round.slot_bytes and op not in self._tuning.override):
            plan.inline = self._make_inline(op, base, spec, spec[1], spec[2])
            if level not in (0, DEFERRED) and not error:
                plan.inline(*algo_args)
                if _profile.active():
                    _profile.record(op, nbytes, self._world.name, "inline", time.perf_counter() - start)
                return plan
        if level in (0, DEFERRED):
            if error:
                raise ValueError(error)
            self._run_data(op, nbytes, xp, memory, algorithm, native, algo_args, plan)
            if level == DEFERRED:
                self._note_deferred(plan)
        else:
            self._start_round(base)
            if level == 1 or blocking or error or memory == "device" or (algorithm and "/" in algorithm):
                # device calls too: they return once enqueued, so nothing is gained by overlapping
                # the round, and a mismatch found first leaves no kernel waiting for its peers
                self._wait_round(op)
                if error or not self._round_agreed():
                    self._mismatch(op, spec, posted=False, error=error)
                self._run_data(op, nbytes, xp, memory, algorithm, native, algo_args, plan)
            else:
                self._concurrent(op, spec, lambda: self._run_data(op, nbytes, xp, memory, algorithm, native,
                                                                  algo_args, plan, poison=False))
        if _profile.active():
            if xp is not np:
                xp.cuda.get_current_stream().synchronize()
            _profile.record(op, nbytes, plan.route[0], plan.route[1], time.perf_counter() - start)
        return plan

    def _run_data(self, op, nbytes, xp, memory, algorithm, native, algo_args, plan, poison=True):
        """The data part of :meth:`_run`: route and run; a transport failure aborts the communicator
        (``poison=False``: the caller decides, after the round said whether it was a mismatch)."""
        backend, name = self._choose(op, nbytes, memory, algorithm)
        transport = self._transport(backend)
        if xp is np and not transport.accepts_host:
            backend, transport = self._world.name, self._coll
        self._last_route = (transport, name)
        plan.route = (backend, name)
        if memory == "device" and algorithm is None and self._mode_split(op, nbytes):
            plan.mode = self._last_mode
            if plan.mode == "eager":
                # the graph route's transport is made now, outside any capture (a transport's set-up
                # synchronizes the device); every rank is at this call, so the set-up meets
                other = self._tuning.choose(op, nbytes, self.size, "device", self.available_backends("device"),
                                            "graph")[0]
                if other not in (self._world.name, "mpi", "self"):
                    self._device_backend_usable(other)
        if memory == "device" and backend in ("mpi", "self"):
            # staged through the host, the call blocks there anyway: it keeps its round, so a
            # mismatch is found before MPI can hang or truncate on it
            plan.deferrable = False
        try:
            if name == "native" or (backend not in ("mpi", "self") and name not in ALGORITHMS[op]):
                if backend in ("mpi", "self") or name == "native":
                    if not transport.has_native(op):
                        raise ValueError(f"backend {backend!r} has no native {op}")
                    _complete(native(transport))
                else:
                    _complete(transport.run_algorithm(op, name, *algo_args))
            else:
                algo = get_algorithm(op, name)
                algo.run(Channel(transport, xp, f"{op}[{name}]"), *algo_args)
        except CollectiveMismatchError:
            raise  # a guard's trip: _concurrent decides
        except CommError as exc:
            # data may be in flight (a timed-out request, a dead peer, an aborted transport): no later
            # call on this communicator may return data, so it is dead from here on, on every backend
            if poison:
                self._poison(exc)
            raise
        except Exception as exc:
            mpi = getattr(self._world, "MPI", None)
            if mpi is not None and isinstance(exc, mpi.Exception):
                err = CommError(f"{op} via {backend}/{name} failed on rank {self.rank}: {exc}")
                if poison:
                    self._poison(err)
                raise err from exc
            raise
        plan.replay = self._replay(op, backend, name, transport, xp)

    def _replay(self, op, backend, name, transport, xp):
        """A callable ``fn(*algo_args)`` that repeats this choice (for the fast path), or None.

        The native collectives take the same arguments as the algorithms
        (``native_allreduce(send, recv, op)`` and ``allreduce(ch, send, recv, op)``),
        so one argument tuple serves all three kinds of path.
        """
        if name == "native":
            return getattr(transport, "native_" + op) if transport.has_native(op) else None
        if backend not in ("mpi", "self") and name not in ALGORITHMS[op]:
            return partial(transport.run_algorithm, op, name)
        algo, label = get_algorithm(op, name), f"{op}[{name}]"
        return lambda *args: algo.run(Channel(transport, xp, label), *args)

    # ------------------------------------------------------------------ the fast path
    # A call shape seen before (same op, array type, dtype, shape, op or root, algorithm)
    # replays the path chosen then and skips validation, the table and the bookkeeping of
    # _run: small collectives are dominated by that Python time.  It is checked as _run
    # would check it.  Profiling takes the full path again.
    def _fast_plan(self, key):
        return None if _profile._ACTIVE else self._plans.get(key)

    def _mode_split(self, op, nbytes):
        """Whether the table routes a device ``op`` of ``nbytes`` differently in a CUDA graph than eagerly."""
        if op in self._tuning.override or self.prefer not in ("auto", None, self._world.name):
            return False
        avail = self.available_backends("device")
        cache = self.__dict__.get("_split_cache")
        if cache is None or cache[0] is not self._tuning or cache[1] != avail:  # (memoized per table)
            cache = self.__dict__["_split_cache"] = (self._tuning, avail, {})
        hit = cache[2].get((op, nbytes))
        if hit is None:
            hit = cache[2][(op, nbytes)] = (self._tuning.choose(op, nbytes, self.size, "device", avail, "eager")
                                            != self._tuning.choose(op, nbytes, self.size, "device", avail, "graph"))
        return hit

    def _replay_plan(self, plan, level, *args):
        """Run a remembered plan, checked as :meth:`_run` would; an error poisons the communicator."""
        if plan.mode is not None:  # routed per mode: the full path finds this call's route
            return False
        if level not in (0, DEFERRED) and plan.inline is not None:
            plan.inline(*args)
            return
        if plan.replay is None:  # (an inline plan, checks now off: _run finds the route)
            return False
        if level in (0, DEFERRED):
            try:
                _complete(plan.replay(*args))
            except CommError as exc:
                self._poison(exc)
                raise
            if level == DEFERRED:
                self._note_deferred(plan)
            return
        op = plan.spec[0]
        self._start_round(plan.base)
        if level == 1 or plan.blocking:
            self._wait_round(op)
            if not self._round_agreed():
                self._mismatch(op, plan.spec, posted=False)
            try:
                _complete(plan.replay(*args))
            except CommError as exc:
                self._poison(exc)
                raise
            return
        self._concurrent(op, plan.spec, lambda: _complete(plan.replay(*args)))

    def _remember_hot(self, key, op, x, arg):
        """Ask the device transport that served this call for a hot launcher of it (or None)."""
        route = self.__dict__.pop("_last_route", None)
        if route is None or not hasattr(route[0], "hot_launcher"):
            return
        if key[1] is np.ndarray or not key[1].__module__.startswith("cupy"):
            return
        plan = self._plans.get(key)
        if plan is None:
            return
        have = self._hot.get(key)
        mode = plan.mode
        if have is not None and (mode is None or not isinstance(have, _ModeLaunchers)
                                 or getattr(have, mode) is not None):
            return
        fn = route[0].hot_launcher(self, plan, op, route[1], x, arg)
        if fn is not None:
            self._memo_bcast = self._memo_reduce = self._memo_allreduce = None
            self._memo_allgather = self._memo_reduce_scatter = None
            if len(self._hot) >= 1024:
                self._hot.clear()
                have = None
            if mode is not None:  # one launcher per mode, picked per call (_ModeLaunchers)
                if not isinstance(have, _ModeLaunchers):
                    have = self._hot[key] = _ModeLaunchers()
                setattr(have, mode, fn)
            else:
                self._hot[key] = fn

    def _remember(self, key, plan):
        # only NumPy/CuPy inputs: other array types are converted by _prep, every time
        if plan is not None and (plan.replay is not None or plan.inline is not None) and (
                key[1] is np.ndarray or key[1].__module__.startswith("cupy")):
            old = self._plans.get(key)
            if old is not None and plan.inline is None:  # keep what the other path learnt
                plan.inline = old.inline
            if old is not None and plan.replay is None:
                plan.replay = old.replay
            if len(self._plans) >= 1024:
                self._plans.clear()
            self._plans[key] = plan

    # ------------------------------------------------------------------ helpers
    def _prep(self, x, name="x"):
        if x is None:
            raise TypeError(f"{name} must be an array, got None")
        x = as_supported_array(x)
        xp = get_namespace(x)
        check_dtype(x.dtype)
        if not x.flags.c_contiguous:  # (ascontiguousarray would also turn 0-d into 1-d)
            x = xp.ascontiguousarray(x)
        return x, xp

    def _check_root(self, root):
        if not isinstance(root, (int, np.integer)) or not 0 <= root < self.size:
            raise ValueError(f"root must be a rank in [0, {self.size}); got {root!r}")
        return int(root)

    def _out(self, out, shape, dtype, xp, name="out"):
        if out is None:
            return xp.empty(shape, dtype=dtype)
        if get_namespace(out) is not xp:
            raise TypeError(f"{name} must be a {xp.__name__} array like the input")
        if tuple(out.shape) != tuple(shape) or out.dtype != dtype:
            raise ValueError(f"{name} must have shape {tuple(shape)} and dtype {dtype}; "
                             f"got {tuple(out.shape)} and {out.dtype}")
        if not out.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
        return out

    def _begin(self, op):
        """Every collective starts here: refused on a dead communicator; counted."""
        if self._failure is not None:
            raise self._aborted(op)
        self._seq += 1

    # ------------------------------------------------------------------ collectives
    def barrier(self, *, algorithm=None):
        """Wait until every rank has entered the barrier."""
        self._begin("barrier")
        self._run("barrier", 0, np, algorithm=algorithm, native=lambda t: t.native_barrier(), algo_args=(),
                  spec=(None, 0, 0, None, ()), level=self._call_level(None, 0), inline_bytes=0)

    def bcast(self, x, root=0, out=None, *, algorithm=None):
        """The root's array on every rank.

        Every rank passes an array of the root's shape and dtype (non-roots'
        contents are ignored; their array is not modified).  Returns ``x`` on the
        root; elsewhere ``out`` (an array like ``x`` that receives the root's
        data) or, if None, a new array.  The root ignores ``out``.
        """
        if self._failure is not None:  # (self._begin, inlined: a hot call's every step counts)
            raise self._aborted("bcast")
        self._seq += 1
        m = self._memo_bcast
        if m is not None and x is m[0]() and m[1] == root and algorithm is m[2] and x.shape == m[3]:
            res = m[4](x, out)
            if res is not None:
                return res
        try:  # (attributes read directly: getattr with a default costs ~0.2 us more a call)
            key = ("bcast", type(x), x.dtype, x.shape, root, algorithm)
        except AttributeError:  # not an array: the full path makes it one (or refuses it)
            key = ("bcast", type(x), None, None, root, algorithm)
        hot = self._hot.get(key) if self._hot else None
        if hot is not None:
            res = hot(x, out)
            if res is not None:
                self._memo_bcast = (weakref.ref(x), root, algorithm, key[3], hot)
                return res
        plan = self._fast_plan(key)
        if plan is not None and x.flags.c_contiguous and (self.rank == root or _fits(out, x, x.shape)):
            buf = x if self.rank == root else plan.xp.empty_like(x) if out is None else out
            if self._replay_plan(plan, self._call_level(key, x.nbytes), _flat(buf), root) is not False:
                return buf
        root = self._check_root(root)
        x, xp = self._prep(x)
        buf = x if self.rank == root else self._out(out, x.shape, x.dtype, xp)
        flat = _flat(buf)
        plan = self._run("bcast", x.nbytes, xp, algorithm=algorithm,
                         native=lambda t: t.native_bcast(flat, root), algo_args=(flat, root),
                         spec=(x.dtype, x.size, root, None, x.shape), level=self._call_level(key, x.nbytes),
                         inline_bytes=x.nbytes)
        self._remember(key, plan)
        self._remember_hot(key, "bcast", x, root)
        return buf

    def reduce(self, x, op="sum", root=0, out=None, *, algorithm=None):
        """Reduce ``x`` over all ranks with ``op``; the result on ``root`` (in ``out`` if given), None elsewhere."""
        if self._failure is not None:  # (self._begin, inlined: a hot call's every step counts)
            raise self._aborted("reduce")
        self._seq += 1
        m = self._memo_reduce
        if (m is not None and x is m[0]() and op is m[1][0] and root == m[1][1] and algorithm is m[2]
                and x.shape == m[3]):
            res = m[4](x, out)
            if res is not None:
                return None if res is NOTHING else res
        try:  # (attributes read directly: getattr with a default costs ~0.2 us more a call)
            key = ("reduce", type(x), x.dtype, x.shape, (op, root), algorithm)
        except AttributeError:  # not an array: the full path makes it one (or refuses it)
            key = ("reduce", type(x), None, None, (op, root), algorithm)
        hot = self._hot.get(key) if self._hot else None
        if hot is not None:
            res = hot(x, out)
            if res is not None:
                self._memo_reduce = (weakref.ref(x), (op, root), algorithm, key[3], hot)
                return None if res is NOTHING else res
        plan = self._fast_plan(key)
        if plan is not None and x.flags.c_contiguous and (self.rank != root or _fits(out, x, x.shape)):
            res = (plan.xp.empty_like(x) if out is None else out) if self.rank == root else None
            send = _flat(x)
            if res is not None and res.size and _may_overlap(res, x):
                send = send.copy()
            if self._replay_plan(plan, self._call_level(key, x.nbytes), send,
                                 _flat(res) if res is not None else None, op, root) is not False:
                return res
        check_op(op)
        root = self._check_root(root)
        x, xp = self._prep(x)
        out = self._out(out, x.shape, x.dtype, xp) if self.rank == root else None
        send = _flat(x)
        if out is not None and out.size and _may_overlap(out, x):
            send = send.copy()
        recv = _flat(out) if out is not None else None
        plan = self._run("reduce", x.nbytes, xp, algorithm=algorithm,
                         native=lambda t: t.native_reduce(send, recv, op, root),
                         algo_args=(send, recv, op, root), spec=(x.dtype, x.size, root, op, x.shape),
                         level=self._call_level(key, x.nbytes), inline_bytes=x.nbytes)
        self._remember(key, plan)
        self._remember_hot(key, "reduce", x, (op, root))
        return out

    def allreduce(self, x, op="sum", out=None, *, algorithm=None):
        """Reduce ``x`` over all ranks with ``op`` (sum, prod, min, max); the result everywhere."""
        if self._failure is not None:  # (self._begin, inlined: a hot call's every step counts)
            raise self._aborted("allreduce")
        self._seq += 1
        m = self._memo_allreduce
        if m is not None and x is m[0]() and op is m[1] and algorithm is m[2] and x.shape == m[3]:
            res = m[4](x, out)
            if res is not None:
                return res
        try:  # (attributes read directly: getattr with a default costs ~0.2 us more a call)
            key = ("allreduce", type(x), x.dtype, x.shape, op, algorithm)
        except AttributeError:  # not an array: the full path makes it one (or refuses it)
            key = ("allreduce", type(x), None, None, op, algorithm)
        hot = self._hot.get(key) if self._hot else None
        if hot is not None:
            res = hot(x, out)
            if res is not None:
                self._memo_allreduce = (weakref.ref(x), op, algorithm, key[3], hot)
                return res
        plan = self._fast_plan(key)
        if plan is not None and x.flags.c_contiguous and (
                out is None or (type(out) is type(x) and out.shape == x.shape and out.dtype == x.dtype
                                and out.flags.c_contiguous)):
            res = plan.xp.empty_like(x) if out is None else out
            level = self._call_level(key, x.nbytes)
            if level not in (0, DEFERRED) and plan.inline is not None:  # x goes into the round before res is written
                plan.inline(_flat(x), _flat(res), op)
                return res
            send = _flat(x)
            if res.size and _may_overlap(res, x):
                send = send.copy()
            if self._replay_plan(plan, level, send, _flat(res), op) is not False:
                return res
        check_op(op)
        x, xp = self._prep(x)
        out = self._out(out, x.shape, x.dtype, xp)
        send = _flat(x)
        if out.size and _may_overlap(out, x):
            send = send.copy()
        recv = _flat(out)
        plan = self._run("allreduce", x.nbytes, xp, algorithm=algorithm,
                         native=lambda t: t.native_allreduce(send, recv, op), algo_args=(send, recv, op),
                         spec=(x.dtype, x.size, 0, op, x.shape), level=self._call_level(key, x.nbytes),
                         inline_bytes=x.nbytes)
        self._remember(key, plan)
        self._remember_hot(key, "allreduce", x, op)
        return out

    def _lead(self, x):
        """``x`` with at least one dimension (scalars become 1-element vectors)."""
        return x.reshape(1) if x.ndim == 0 else x

    def allgather(self, x, out=None, *, algorithm=None):
        """Every rank's ``x`` concatenated along axis 0 (equal shapes on every rank), in ``out`` if given."""
        if self._failure is not None:  # (self._begin, inlined: a hot call's every step counts)
            raise self._aborted("allgather")
        self._seq += 1
        m = self._memo_allgather
        if m is not None and x is m[0]() and algorithm is m[2] and x.shape == m[3]:
            res = m[4](x, out)
            if res is not None:
                return res
        try:  # (attributes read directly: getattr with a default costs ~0.2 us more a call)
            key = ("allgather", type(x), x.dtype, x.shape, None, algorithm)
        except AttributeError:  # not an array: the full path makes it one (or refuses it)
            key = ("allgather", type(x), None, None, None, algorithm)
        hot = self._hot.get(key) if self._hot else None
        if hot is not None:
            res = hot(x, out)
            if res is not None:
                self._memo_allgather = (weakref.ref(x), None, algorithm, key[3], hot)
                return res
        plan = self._fast_plan(key)
        if plan is not None and x.ndim and x.flags.c_contiguous:
            shape = (x.shape[0] * self.size,) + x.shape[1:]
            if _fits(out, x, shape) and (out is None or not _may_overlap(out, x)):
                res = plan.xp.empty(shape, dtype=x.dtype) if out is None else out
                if self._replay_plan(plan, self._call_level(key, x.nbytes), _flat(x), _flat(res)) is not False:
                    return res
        x, xp = self._prep(x)
        x = self._lead(x)
        out = self._out(out, (x.shape[0] * self.size,) + x.shape[1:], x.dtype, xp)
        send, recv = _flat(x), _flat(out)
        if out.size and _may_overlap(out, x):
            send = send.copy()
        plan = self._run("allgather", x.nbytes * self.size, xp, algorithm=algorithm,
                         native=lambda t: t.native_allgather(send, recv), algo_args=(send, recv),
                         spec=(x.dtype, x.size, 0, None, x.shape), level=self._call_level(key, x.nbytes),
                         inline_bytes=x.nbytes)
        self._remember(key, plan)
        if key[3]:  # (a 0-d x takes the full path each time)
            self._remember_hot(key, "allgather", x, None)
        return out

    def gather(self, x, root=0, *, algorithm=None):
        """Every rank's ``x`` concatenated along axis 0 on ``root`` (None elsewhere)."""
        self._begin("gather")
        root = self._check_root(root)
        x, xp = self._prep(x)
        x = self._lead(x)
        out = xp.empty((x.shape[0] * self.size,) + x.shape[1:], dtype=x.dtype) if self.rank == root else None
        send, recv = _flat(x), (_flat(out) if out is not None else None)
        self._run("gather", x.nbytes * self.size, xp, algorithm=algorithm,
                  native=lambda t: t.native_gather(send, recv, root), algo_args=(send, recv, root),
                  spec=(x.dtype, x.size, root, None, x.shape), level=self._call_level(None, x.nbytes),
                  inline_bytes=x.nbytes)
        return out

    def reduce_scatter(self, x, op="sum", out=None, *, algorithm=None):
        """Reduce ``x`` over all ranks and return this rank's block along axis 0 (in ``out`` if given).

        Blocks follow ``numpy.array_split``: the first ``n % size`` ranks get one
        more row.  ``out`` must have this rank's block's shape and ``x``'s dtype.
        """
        if self._failure is not None:  # (self._begin, inlined: a hot call's every step counts)
            raise self._aborted("reduce_scatter")
        self._seq += 1
        m = self._memo_reduce_scatter
        if m is not None and x is m[0]() and op is m[1] and algorithm is m[2] and x.shape == m[3]:
            res = m[4](x, out)
            if res is not None:
                return res
        try:  # (attributes read directly: getattr with a default costs ~0.2 us more a call)
            key = ("reduce_scatter", type(x), x.dtype, x.shape, op, algorithm)
        except AttributeError:  # not an array: the full path makes it one (or refuses it)
            key = ("reduce_scatter", type(x), None, None, op, algorithm)
        hot = self._hot.get(key) if self._hot else None
        if hot is not None:
            res = hot(x, out)
            if res is not None:
                self._memo_reduce_scatter = (weakref.ref(x), op, algorithm, key[3], hot)
                return res
        plan = self._fast_plan(key)
        if plan is not None and x.ndim and x.flags.c_contiguous:
            rows, counts = self._blocks(x.shape)
            shape = (rows[self.rank],) + x.shape[1:]
            if _fits(out, x, shape):
                res = plan.xp.empty(shape, dtype=x.dtype) if out is None else out
                send = _flat(x)
                if res.size and _may_overlap(res, x):
                    send = send.copy()
                if self._replay_plan(plan, self._call_level(key, x.nbytes), send, _flat(res), counts,
                                     op) is not False:
                    return res
        check_op(op)
        x, xp = self._prep(x)
        x = self._lead(x)
        rows, counts = self._blocks(x.shape)
        out = self._out(out, (rows[self.rank],) + x.shape[1:], x.dtype, xp)
        send, recv = _flat(x), _flat(out)
        if out.size and _may_overlap(out, x):
            send = send.copy()
        plan = self._run("reduce_scatter", x.nbytes, xp, algorithm=algorithm,
                         native=lambda t: t.native_reduce_scatter(send, recv, counts, op),
                         algo_args=(send, recv, counts, op), spec=(x.dtype, x.size, 0, op, x.shape),
                         level=self._call_level(key, x.nbytes))
        self._remember(key, plan)
        if key[3]:
            self._remember_hot(key, "reduce_scatter", x, (counts, op))
        return out

    def _blocks(self, shape):
        """Rows and element counts of every rank's reduce_scatter block of an array of ``shape``."""
        n0 = shape[0]
        rows = [n0 // self.size + (1 if r < n0 % self.size else 0) for r in range(self.size)]
        row = int(np.prod(shape[1:], dtype=np.int64))
        return rows, [r * row for r in rows]

    def _scan(self, kind, x, op, algorithm):
        self._begin(kind)
        check_op(op)
        x, xp = self._prep(x)
        out = xp.empty_like(x)
        if kind == "exscan" and self.rank == 0:
            out.fill(identity(op, x.dtype))
        send, recv = _flat(x), _flat(out)
        native = (lambda t: t.native_scan(send, recv, op)) if kind == "scan" else \
                 (lambda t: t.native_exscan(send, recv, op))
        self._run(kind, x.nbytes, xp, algorithm=algorithm, native=native, algo_args=(send, recv, op),
                  spec=(x.dtype, x.size, 0, op, x.shape), level=self._call_level(None, x.nbytes),
                  inline_bytes=x.nbytes)
        return out

    def scan(self, x, op="sum", *, algorithm=None):
        """Inclusive prefix reduction: rank r gets op(x_0, ..., x_r)."""
        return self._scan("scan", x, op, algorithm)

    def exscan(self, x, op="sum", *, algorithm=None):
        """Exclusive prefix reduction: rank r gets op(x_0, ..., x_{r-1}); rank 0 the identity."""
        return self._scan("exscan", x, op, algorithm)

    def alltoall(self, x, *, algorithm=None):
        """``x`` split along axis 0 into ``size`` blocks; block j goes to rank j.

        Returns the blocks received, concatenated in rank order.
        """
        self._begin("alltoall")
        x, xp = self._prep(x)
        x = self._lead(x)
        error = None
        if x.shape[0] % self.size:
            error = (f"alltoall: first dimension {x.shape[0]} on rank {self.rank} does not divide "
                     f"by the communicator size {self.size}")
        out = xp.empty_like(x)
        send, recv = _flat(x), _flat(out)
        level = self._call_level(None, x.nbytes)
        # a bad first dimension is seen by one rank only: agree on it unless checks are off
        self._run("alltoall", x.nbytes, xp, algorithm=algorithm,
                  native=lambda t: t.native_alltoall(send, recv), algo_args=(send, recv),
                  spec=(x.dtype, x.size, 0, None, x.shape), level=level, error=error, blocking=True)
        return out

    # ------------------------------------------------------------------ groups
    def split(self, color, key=0):
        """New communicator of the ranks with the same ``color``, ordered by ``key`` then rank.

        ``color=None`` takes no part and returns None (MPI_UNDEFINED).
        """
        self._begin("split")  # a dead communicator makes no new ones (the split is collective)
        if color is not None and (not isinstance(color, (int, np.integer)) or color < 0):
            raise ValueError(f"color must be a non-negative int or None; got {color!r}")
        if self.size > 1:  # a rank in another collective must not be left in MPI's blocking split
            spec = ("split", None, 0, 0, None, (), "host", None)
            self._agree("split", signature_base(*spec), spec)
        new = self._world.split(None if color is None else int(color), int(key))
        if new is None:
            return None
        child = Communicator(new, prefer=self.prefer, tuning=self._tuning)
        self._children.add(child)
        return child


def _fits(out, x, shape):
    """Whether ``out`` can take a result of ``shape`` like ``x`` as it is (None: one is allocated)."""
    return out is None or (type(out) is type(x) and out.shape == shape and out.dtype == x.dtype
                           and out.flags.c_contiguous)


def _complete(req):
    """Wait for a transport's request (``None`` means the call already completed)."""
    if req is not None:
        req.wait()


def _may_overlap(a, b):
    """Whether two arrays' memory ranges overlap (bounds only: never a device round trip).

    ``cupy.shares_memory`` answers exactly by comparing the arrays on the device,
    which costs a kernel, a device-to-host copy and O(n) work per call, and is
    illegal while a CUDA graph is being captured.
    """
    if is_device_array(a):
        pa, pb = a.data.ptr, b.data.ptr
        return pa < pb + b.nbytes and pb < pa + a.nbytes
    return np.may_share_memory(a, b)
