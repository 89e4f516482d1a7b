"""The public communicator: arrays in, arrays out, on the namespace of the input.

Point-to-point lives in :mod:`mpiml.comm._p2p`.  A :class:`Communicator` owns three contexts over the same group of ranks, so
that traffic of one kind can never match traffic of another:

* ``_coll`` — collectives (native ones and our algorithms' point-to-point);
* ``_p2p`` — the user's ``send``/``recv``;
* ``_ctl`` — small agreements (argument checks, counts, metadata, objects).

Every call goes through :meth:`Communicator._run`, which picks the backend and
algorithm from the tuning table (the same choice on every rank), optionally
agrees on the call's signature first, runs it with timeouts and records it for
:func:`mpiml.profile`.
"""

import pickle
from functools import partial
import time
import weakref

import numpy as np

from .. import _config
from .._array import as_supported_array, get_namespace, is_device_array
from .._errors import CollectiveMismatchError, CommAbortedError, CommError, CommTimeoutError
from . import _profile
from ._ops import check_dtype, check_op, dtype_code, identity, OPS
from ._p2p import MAX_TAG, PointToPoint, _cupy, _flat
from ._tuning import TuningTable, stream_mode
from .algorithms import ALGORITHMS, COLLECTIVES, Channel, get_algorithm
from .backends import get_backend_factory

__all__ = ["Communicator", "MAX_TAG"]

_MAX_NDIM = 10  # dimensions carried in scatter's metadata
_OP_CODE = {name: i + 1 for i, name in enumerate(COLLECTIVES)}


class Communicator(PointToPoint):
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
        # (op, array type, dtype, shape, op/root, algorithm) -> (replay, xp, check_by_default):
        # calls that were validated and routed once; see _fast_plan
        self._plans = {}
        # (op, array type, dtype, shape, op/root, algorithm) -> hot launcher of the device
        # transport (see mpiml.comm._hotpath): the few microseconds of a repeated small call
        self._hot = {}
        self._failure = None  # the first failure (then every call raises CommAbortedError)
        self._children = weakref.WeakSet()
        if tuning is None:
            data = None
            if self.rank == 0:
                try:
                    data = TuningTable.from_config(_config.tuning_file(), _config.comm_algo_override()).to_data()
                except ValueError as exc:  # a bad table or MPIML_COMM_ALGO: the same error everywhere
                    data = exc
            data = self._bcast_obj_ctl(data)
            if isinstance(data, ValueError):
                self.close()
                raise ValueError(str(data))
            tuning = TuningTable.from_data(data)
        self._tuning = tuning

    # ------------------------------------------------------------------ basics
    @property
    def backend(self):
        """Name of the host transport (``"mpi"`` or ``"self"``)."""
        return self._world.name

    def __repr__(self):
        return f"<mpiml.Communicator rank={self.rank} size={self.size} backend={self.backend!r}>"

    # ------------------------------------------------------------------ failure state
    def _poison(self, exc):
        """Record the first failure here and on every communicator split from this one.

        Aborts the device transports (an IPC kernel still spinning gives up, the
        NCCL communicator is aborted), so that nothing waits for a peer that is
        gone.  Safe to call from the watchdog thread.
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
        for child in list(self._children):
            child._poison(exc)

    def _aborted(self, op):
        f = self._failure
        err = CommAbortedError(f"{op} on rank {self.rank}: the communicator was aborted by an earlier failure "
                               f"({type(f).__name__}: {f})")
        err.__cause__ = f
        return err

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
        for t in list(self._device_transports.values()):
            t.close()
        self._device_transports.clear()
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

    # ------------------------------------------------------------------ agreement
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

    def _agree_ints(self, values, op="max"):
        """Elementwise max (or min) of a small int64 vector over all ranks (control plane)."""
        send = np.asarray(values, dtype=np.int64)
        recv = np.empty_like(send)
        self._ctl_wait("allreduce", lambda: self._ctl.native_allreduce(send, recv, op))
        return recv

    def _allgather_ints(self, values):
        send = np.asarray(values, dtype=np.int64).reshape(-1)
        recv = np.empty(send.size * self.size, dtype=np.int64)
        self._ctl_wait("allgather", lambda: self._ctl.native_allgather(send, recv))
        return recv.reshape(self.size, send.size)

    def _allgather_obj(self, obj):
        """Allgather picklable objects on the control plane (honours the timeout)."""
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        counts = self._allgather_ints([data.size])[:, 0]
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

    def allgather_obj(self, obj):
        """Small Python objects from every rank, as a list in rank order."""
        return self._allgather_obj(obj)

    def bcast_obj(self, obj, root=0):
        """The root's small Python object on every rank."""
        self._check_root(root)
        return self._bcast_obj_ctl(obj, root)

    def allreduce_obj(self, obj, op="sum"):
        """Reduce small Python objects (numbers, NumPy scalars) with ``op``."""
        check_op(op)  # before any communication, so a bad op is raised on every rank alike
        values = self._allgather_obj(obj)
        if op == "prod":
            result = values[0]
            for v in values[1:]:
                result = result * v
            return result
        return {"sum": sum, "min": min, "max": max}[op](values)

    def _check_signature(self, op, sig, error, shape=None):
        """Agree on a call's signature; raise the same error on every rank if they differ.

        ``sig`` is a short tuple of ints describing the call, laid out as
        (dtype, count, root, op, shape hash, memory); ``error`` is a local
        validation message (or None) that every rank will see; ``shape`` (this
        rank's array shape) makes a shape mismatch name the shapes.
        """
        width = 8
        vec = ([_OP_CODE[op], *sig] + [0] * width)[:width - 1] + [1 if error else 0]
        agreed = self._agree_ints(vec + [-v for v in vec])
        if all(agreed[i] == -agreed[width + i] for i in range(width)) and not agreed[width - 1]:
            return
        rows = self._allgather_ints(vec)
        if (rows[:, 0] != rows[0, 0]).any():  # different collectives: a text that names no local op
            inv = {v: k for k, v in _OP_CODE.items()}
            groups = {}
            for r, v in enumerate(rows[:, 0]):
                groups.setdefault(int(v), []).append(r)
            desc = "; ".join(f"{inv.get(v, v)} on ranks {rs}" for v, rs in groups.items())
            raise CollectiveMismatchError(f"ranks called different collectives (mismatched collective): {desc}")
        errors = self._allgather_obj(error) if agreed[width - 1] else [None] * self.size
        bad = [(r, e) for r, e in enumerate(errors) if e]
        if bad:
            raise CollectiveMismatchError(
                f"{op} is invalid on rank(s) {[r for r, _ in bad]}: " + "; ".join(f"rank {r}: {e}" for r, e in bad)
            )
        names = ["collective", "dtype", "count", "root", "op", "shape", "memory"]
        for i, name in enumerate(names[1:], 1):
            col = rows[:, i]
            if (col != col[0]).any():
                groups = {}
                for r, v in enumerate(col):
                    groups.setdefault(int(v), []).append(r)
                if name == "dtype":
                    from ._ops import SUPPORTED_DTYPES as D
                    desc = "; ".join(f"{D[v - 1] if 0 < v <= len(D) else v} on ranks {rs}" for v, rs in groups.items())
                elif name == "op":
                    desc = "; ".join(f"{OPS[v - 1] if 0 < v <= len(OPS) else v} on ranks {rs}" for v, rs in groups.items())
                elif name == "memory":
                    desc = "; ".join(f"{'device' if v else 'host'} on ranks {rs}" for v, rs in groups.items())
                elif name == "shape" and shape is not None:
                    shapes = self._allgather_obj(tuple(int(d) for d in shape))
                    groups = {}
                    for r, v in enumerate(shapes):
                        groups.setdefault(v, []).append(r)
                    desc = "; ".join(f"{v} on ranks {rs}" for v, rs in groups.items())
                else:
                    desc = "; ".join(f"{v} on ranks {rs}" for v, rs in groups.items())
                raise CollectiveMismatchError(f"{op} called with mismatched {name} across ranks: {desc}")
        raise CollectiveMismatchError(f"{op} called with mismatched arguments across ranks")

    def _should_check(self, nbytes):
        if self.size == 1:
            return False
        level = _config.check_level()
        if level is None:
            return nbytes >= _config.CHEAP_CHECK_BYTES
        return level >= 1

    # ------------------------------------------------------------------ the engine
    def _run(self, op, nbytes, xp, *, algorithm, native, algo_args, sig=(), error=None, force_check=False,
             shape=None):
        """Choose, check, run and record one collective."""
        if self._failure is not None:
            raise self._aborted(op)
        memory = "device" if xp is not np else "host"
        if force_check or self._should_check(nbytes):
            sig = (tuple(sig) + (0,) * 5)[:5]
            self._check_signature(op, (*sig, 1 if memory == "device" else 0), error, shape)
        if error:
            raise ValueError(error)
        backend, name = self._choose(op, nbytes, memory, algorithm)
        transport = self._transport(backend)
        if xp is np and not transport.accepts_host:
            backend, transport = self._world.name, self._coll
        start = time.perf_counter()
        self._last_route = (transport, name)
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
        except CommError as exc:
            # data may be in flight (a timed-out request, a dead peer, an aborted transport): no later
            # call on this communicator may return data, so it is dead from here on, on every backend
            self._poison(exc)
            raise
        except Exception as exc:
            mpi = getattr(self._world, "MPI", None)
            if mpi is not None and isinstance(exc, mpi.Exception):
                err = CommError(f"{op} via {backend}/{name} failed on rank {self.rank}: {exc}")
                self._poison(err)
                raise err from exc
            raise
        if _profile.active():
            if xp is not np:
                xp.cuda.get_current_stream().synchronize()
            _profile.record(op, nbytes, backend, name, time.perf_counter() - start)
        return self._replay(op, backend, name, transport, xp)

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
    # replays the path chosen then and skips validation, the signature, the table and
    # the bookkeeping of _run: small device collectives are dominated by that Python time.
    # Anything that changes the outcome of those steps (profiling, checking) takes the
    # full path again.
    def _fast_plan(self, key):
        plan = self._plans.get(key)
        if plan is None or _profile._ACTIVE:
            return None
        level = _config.check_level()
        if level == 1 or (level is None and plan[2]):
            return None
        return plan

    def _replay_plan(self, plan, *args):
        """Run a remembered plan; an error poisons the communicator, as in _run."""
        try:
            _complete(plan[0](*args))
        except CommError as exc:
            self._poison(exc)
            raise

    def _remember_hot(self, key, op, x, arg):
        """Ask the device transport that served this call for a hot launcher of it (or None)."""
        route = self.__dict__.pop("_last_route", None)
        if route is None or key in self._hot or not hasattr(route[0], "hot_launcher"):
            return
        if key[1] is np.ndarray or not key[1].__module__.startswith("cupy"):
            return
        fn = route[0].hot_launcher(self, op, route[1], x, arg)
        if fn is not None:
            if len(self._hot) >= 1024:
                self._hot.clear()
            self._hot[key] = fn

    def _remember(self, key, replay, xp, nbytes):
        # only NumPy/CuPy inputs: other array types are converted by _prep, every time
        if replay is not None and (key[1] is np.ndarray or key[1].__module__.startswith("cupy")):
            if len(self._plans) >= 1024:
                self._plans.clear()
            self._plans[key] = (replay, xp, nbytes >= _config.CHEAP_CHECK_BYTES)

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

    @staticmethod
    def _shape_hash(shape):
        # tuples of ints hash the same in every process (only str/bytes hashing is salted)
        return hash(tuple(shape)) & 0x7FFFFFFF

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

    # ------------------------------------------------------------------ collectives
    def barrier(self, *, algorithm=None):
        """Wait until every rank has entered the barrier."""
        self._run("barrier", 0, np, algorithm=algorithm,
                  native=lambda t: t.native_barrier(), algo_args=())

    def bcast(self, x, root=0, *, algorithm=None):
        """The root's array on every rank.

        Every rank passes an array of the root's shape and dtype (non-roots'
        contents are ignored; their array is not modified).  Returns ``x`` on the
        root and a new array elsewhere.
        """
        if self._failure is not None:
            raise self._aborted("bcast")
        key = ("bcast", type(x), getattr(x, "dtype", None), getattr(x, "shape", None), root, algorithm)
        hot = self._hot.get(key)
        if hot is not None:
            res = hot(x, None)
            if res is not None:
                return res
        plan = self._fast_plan(key)
        if plan is not None and x.flags.c_contiguous:
            buf = x if self.rank == root else plan[1].empty_like(x)
            self._replay_plan(plan, _flat(buf), root)
            return buf
        root = self._check_root(root)
        x, xp = self._prep(x)
        buf = x if self.rank == root else xp.empty_like(x)
        flat = _flat(buf)
        t = self._run("bcast", x.nbytes, xp, algorithm=algorithm,
                      native=lambda t: t.native_bcast(flat, root), algo_args=(flat, root),
                      sig=(dtype_code(x.dtype), x.size, root, 0, self._shape_hash(x.shape)), shape=x.shape)
        self._remember(key, t, xp, x.nbytes)
        self._remember_hot(key, "bcast", x, root)
        return buf

    def reduce(self, x, op="sum", root=0, *, algorithm=None):
        """Reduce ``x`` over all ranks with ``op``; the result on ``root``, None elsewhere."""
        if self._failure is not None:
            raise self._aborted("reduce")
        key = ("reduce", type(x), getattr(x, "dtype", None), getattr(x, "shape", None), (op, root), algorithm)
        plan = self._fast_plan(key)
        if plan is not None and x.flags.c_contiguous:
            out = plan[1].empty_like(x) if self.rank == root else None
            self._replay_plan(plan, _flat(x), _flat(out) if out is not None else None, op, root)
            return out
        check_op(op)
        root = self._check_root(root)
        x, xp = self._prep(x)
        send = _flat(x)
        out = xp.empty_like(x) if self.rank == root else None
        recv = _flat(out) if out is not None else None
        t = self._run("reduce", x.nbytes, xp, algorithm=algorithm,
                      native=lambda t: t.native_reduce(send, recv, op, root),
                      algo_args=(send, recv, op, root),
                      sig=(dtype_code(x.dtype), x.size, root, OPS.index(op) + 1, self._shape_hash(x.shape)),
                      shape=x.shape)
        self._remember(key, t, xp, x.nbytes)
        return out

    def allreduce(self, x, op="sum", out=None, *, algorithm=None):
        """Reduce ``x`` over all ranks with ``op`` (sum, prod, min, max); the result everywhere."""
        if self._failure is not None:
            raise self._aborted("allreduce")
        key = ("allreduce", type(x), getattr(x, "dtype", None), getattr(x, "shape", None), op, algorithm)
        hot = self._hot.get(key)
        if hot is not None:
            res = hot(x, out)
            if res is not None:
                return res
        plan = self._fast_plan(key)
        if plan is not None and x.flags.c_contiguous and (
                out is None or (type(out) is type(x) and out.shape == x.shape and out.dtype == x.dtype
                                and out.flags.c_contiguous)):
            if out is None:
                out = plan[1].empty_like(x)
            send = _flat(x)
            if out.size and _may_overlap(out, x):
                send = send.copy()
            self._replay_plan(plan, send, _flat(out), op)
            return out
        check_op(op)
        x, xp = self._prep(x)
        out = self._out(out, x.shape, x.dtype, xp)
        send = _flat(x)
        if out.size and _may_overlap(out, x):
            send = send.copy()
        recv = _flat(out)
        t = self._run("allreduce", x.nbytes, xp, algorithm=algorithm,
                      native=lambda t: t.native_allreduce(send, recv, op),
                      algo_args=(send, recv, op),
                      sig=(dtype_code(x.dtype), x.size, 0, OPS.index(op) + 1, self._shape_hash(x.shape)),
                      shape=x.shape)
        self._remember(key, t, xp, x.nbytes)
        self._remember_hot(key, "allreduce", x, op)
        return out

    def _lead(self, x):
        """``x`` with at least one dimension (scalars become 1-element vectors)."""
        return x.reshape(1) if x.ndim == 0 else x

    def allgather(self, x, *, algorithm=None):
        """Every rank's ``x`` concatenated along axis 0 (equal shapes on every rank)."""
        if self._failure is not None:
            raise self._aborted("allgather")
        key = ("allgather", type(x), getattr(x, "dtype", None), getattr(x, "shape", None), None, algorithm)
        plan = self._fast_plan(key)
        if plan is not None and x.ndim and x.flags.c_contiguous:
            out = plan[1].empty((x.shape[0] * self.size,) + x.shape[1:], dtype=x.dtype)
            self._replay_plan(plan, _flat(x), _flat(out))
            return out
        x, xp = self._prep(x)
        x = self._lead(x)
        out = xp.empty((x.shape[0] * self.size,) + x.shape[1:], dtype=x.dtype)
        send, recv = _flat(x), _flat(out)
        t = self._run("allgather", x.nbytes * self.size, xp, algorithm=algorithm,
                      native=lambda t: t.native_allgather(send, recv), algo_args=(send, recv),
                      sig=(dtype_code(x.dtype), x.size, 0, 0, self._shape_hash(x.shape)), shape=x.shape)
        self._remember(key, t, xp, x.nbytes * self.size)
        return out

    def _v_counts(self, op, x, root=None):
        """Agree on rows per rank; the same error everywhere if trailing shapes or dtypes differ."""
        rows = self._allgather_ints([x.shape[0], self._shape_hash(x.shape[1:]), dtype_code(x.dtype),
                                     1 if is_device_array(x) else 0, -1 if root is None else root])
        for col, what in ((1, "trailing shape"), (2, "dtype"), (3, "memory kind"), (4, "root")):
            if (rows[:, col] != rows[0, col]).any():
                detail = "; ".join(f"rank {r}: {what} code {int(v)}" for r, v in enumerate(rows[:, col]))
                if col == 1:
                    shapes = self._allgather_obj(tuple(x.shape))
                    detail = "; ".join(f"rank {r}: shape {s}" for r, s in enumerate(shapes))
                elif col == 2:
                    dts = self._allgather_obj(str(x.dtype))
                    detail = "; ".join(f"rank {r}: {d}" for r, d in enumerate(dts))
                raise CollectiveMismatchError(f"{op} called with mismatched {what} across ranks ({detail})")
        return rows[:, 0]

    def allgatherv(self, x, *, algorithm=None):
        """Every rank's ``x`` concatenated along axis 0; first dimensions may differ."""
        x, xp = self._prep(x)
        x = self._lead(x)
        rows = self._v_counts("allgatherv", x)
        row = int(np.prod(x.shape[1:], dtype=np.int64))
        counts = [int(r) * row for r in rows]
        out = xp.empty((int(rows.sum()),) + x.shape[1:], dtype=x.dtype)
        send, recv = _flat(x), _flat(out)
        self._run("allgatherv", out.nbytes, xp, algorithm=algorithm,
                  native=lambda t: t.native_allgatherv(send, recv, counts), algo_args=(send, recv, counts))
        return out

    def gather(self, x, root=0, *, algorithm=None):
        """Every rank's ``x`` concatenated along axis 0 on ``root`` (None elsewhere)."""
        root = self._check_root(root)
        x, xp = self._prep(x)
        x = self._lead(x)
        out = xp.empty((x.shape[0] * self.size,) + x.shape[1:], dtype=x.dtype) if self.rank == root else None
        send, recv = _flat(x), (_flat(out) if out is not None else None)
        self._run("gather", x.nbytes * self.size, xp, algorithm=algorithm,
                  native=lambda t: t.native_gather(send, recv, root), algo_args=(send, recv, root),
                  sig=(dtype_code(x.dtype), x.size, root, 0, self._shape_hash(x.shape)), shape=x.shape)
        return out

    def gatherv(self, x, root=0, *, algorithm=None):
        """Like :meth:`gather`, but first dimensions may differ across ranks."""
        root = self._check_root(root)
        x, xp = self._prep(x)
        x = self._lead(x)
        rows = self._v_counts("gatherv", x, root)
        row = int(np.prod(x.shape[1:], dtype=np.int64))
        counts = [int(r) * row for r in rows]
        out = xp.empty((int(rows.sum()),) + x.shape[1:], dtype=x.dtype) if self.rank == root else None
        send, recv = _flat(x), (_flat(out) if out is not None else None)
        self._run("gatherv", int(rows.sum()) * row * x.itemsize, xp, algorithm=algorithm,
                  native=lambda t: t.native_gatherv(send, recv, counts, root),
                  algo_args=(send, recv, counts, root))
        return out

    def scatter(self, x, root=0, *, algorithm=None):
        """The root's ``x`` split along axis 0 into ``size`` equal blocks; this rank's block.

        Only the root's ``x`` is read (others may pass None).  The root's shape
        and dtype are broadcast first, and a first dimension that does not divide
        by ``size`` is the same ``ValueError`` on every rank.
        """
        root = self._check_root(root)
        if self.size > 1 and _config.check_level() == 1:  # ranks must agree on the root first
            self._check_signature("scatter", (0, 0, root, 0, 0, 0), None)
        meta = np.zeros(4 + _MAX_NDIM, dtype=np.int64)
        if self.rank == root:
            x, xp = self._prep(x)
            x = self._lead(x)
            ok = x.ndim <= _MAX_NDIM and x.shape[0] % self.size == 0
            meta[:4] = [1 if ok else 0, x.ndim, dtype_code(x.dtype), 1 if xp is not np else 0]
            meta[4:4 + min(x.ndim, _MAX_NDIM)] = x.shape[:_MAX_NDIM]
        if self.size > 1:
            self._ctl_wait("bcast", lambda: self._ctl.native_bcast(meta, root))
        ok, ndim, dcode, dev = (int(v) for v in meta[:4])
        shape = tuple(int(s) for s in meta[4:4 + ndim])
        if not ok:
            raise ValueError(f"scatter: the root's array has shape {shape}; its first dimension must "
                             f"divide by the communicator size {self.size}")
        from ._ops import SUPPORTED_DTYPES

        dtype = SUPPORTED_DTYPES[dcode - 1]
        xp = get_namespace(x) if self.rank == root else (np if not dev else _cupy())
        block = (shape[0] // self.size,) + shape[1:]
        out = xp.empty(block, dtype=dtype)
        send = _flat(x) if self.rank == root else None
        recv = _flat(out)
        self._run("scatter", out.nbytes * self.size, xp, algorithm=algorithm,
                  native=lambda t: t.native_scatter(send, recv, root), algo_args=(send, recv, root))
        return out

    def reduce_scatter(self, x, op="sum", *, algorithm=None):
        """Reduce ``x`` over all ranks and return this rank's block along axis 0.

        Blocks follow ``numpy.array_split``: the first ``n % size`` ranks get one
        more row.
        """
        check_op(op)
        x, xp = self._prep(x)
        x = self._lead(x)
        n0 = x.shape[0]
        rows = [n0 // self.size + (1 if r < n0 % self.size else 0) for r in range(self.size)]
        row = int(np.prod(x.shape[1:], dtype=np.int64))
        counts = [r * row for r in rows]
        out = xp.empty((rows[self.rank],) + x.shape[1:], dtype=x.dtype)
        send, recv = _flat(x), _flat(out)
        self._run("reduce_scatter", x.nbytes, xp, algorithm=algorithm,
                  native=lambda t: t.native_reduce_scatter(send, recv, counts, op),
                  algo_args=(send, recv, counts, op),
                  sig=(dtype_code(x.dtype), x.size, 0, OPS.index(op) + 1, self._shape_hash(x.shape)), shape=x.shape)
        return out

    def _scan(self, kind, x, op, algorithm):
        check_op(op)
        x, xp = self._prep(x)
        out = xp.empty_like(x)
        if kind == "exscan" and self.rank == 0:
            out.fill(identity(op, x.dtype))
        send, recv = _flat(x), _flat(out)
        native = (lambda t: t.native_scan(send, recv, op)) if kind == "scan" else \
                 (lambda t: t.native_exscan(send, recv, op))
        self._run(kind, x.nbytes, xp, algorithm=algorithm, native=native, algo_args=(send, recv, op),
                  sig=(dtype_code(x.dtype), x.size, 0, OPS.index(op) + 1, self._shape_hash(x.shape)), shape=x.shape)
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
        x, xp = self._prep(x)
        x = self._lead(x)
        error = None
        if x.shape[0] % self.size:
            error = (f"alltoall: first dimension {x.shape[0]} on rank {self.rank} does not divide "
                     f"by the communicator size {self.size}")
        out = xp.empty_like(x)
        send, recv = _flat(x), _flat(out)
        self._run("alltoall", x.nbytes, xp, algorithm=algorithm,
                  native=lambda t: t.native_alltoall(send, recv), algo_args=(send, recv),
                  sig=(dtype_code(x.dtype), x.size, 0, 0, self._shape_hash(x.shape)), shape=x.shape, error=error,
                  # a bad first dimension is seen by one rank only: agree unless checks are off
                  force_check=self.size > 1 and _config.check_level() != 0)
        return out

    # ------------------------------------------------------------------ groups
    def split(self, color, key=0):
        """New communicator of the ranks with the same ``color``, ordered by ``key`` then rank.

        ``color=None`` takes no part and returns None (MPI_UNDEFINED).
        """
        if self._failure is not None:  # a dead communicator makes no new ones (the split is collective)
            raise self._aborted("split")
        if color is not None and (not isinstance(color, (int, np.integer)) or color < 0):
            raise ValueError(f"color must be a non-negative int or None; got {color!r}")
        new = self._world.split(None if color is None else int(color), int(key))
        if new is None:
            return None
        child = Communicator(new, prefer=self.prefer, tuning=self._tuning)
        self._children.add(child)
        return child


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
