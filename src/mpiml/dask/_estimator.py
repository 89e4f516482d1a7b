"""Dask-driven SPMD estimators: the client side, written once for every mpiml estimator.

A wrapper class is a declaration::

    class KMeans(ClusterMixin, TransformerMixin, DaskSPMDEstimator, spmd=mpiml.cluster.KMeans):
        _local_attributes = ("labels_",)
        _block_methods = ("predict", "transform")

It gets the wrapped class's parameters (less ``comm``) as its own, so
``get_params``/``set_params``/``clone`` work, and:

* ``fit(X, y=None, sample_weight=None)`` where ``X`` is a dask array (NumPy or
  CuPy chunks) or a dask dataframe: the partitions are persisted on the
  workers, the workers that hold them form an mpiml communicator (see
  :mod:`._spmd`), the SPMD estimator is fitted there, and the fitted
  estimator comes back: its public fitted attributes are copied onto the
  wrapper (NumPy or CuPy, like the chunks) and it is kept as
  ``spmd_estimator_``;
* ``partial_fit`` and ``score`` the same way, when the wrapped class has them;
* every name in ``_block_methods`` (``predict``, ``transform``, ...) returns a
  dask array, lazily: one task per block of ``X`` calls the fitted estimator's
  method on that block (no communication).
"""

from __future__ import annotations

import inspect
import itertools
import threading
import uuid

from sklearn.base import BaseEstimator

from ._spmd import DaskSPMDError

__all__ = ["DaskSPMDEstimator", "DaskSPMDError"]

#: How long the client waits for the other ranks of a job once one of them failed.
_GRACE_SECONDS = 5.0
_POLL_SECONDS = 0.25

_job_ids = itertools.count(1)
_job_lock = threading.Lock()
#: scheduler address -> why the workers communicator can no longer be used
_broken = {}


# ---------------------------------------------------------------------- client and inputs
def _get_client():
    try:
        from distributed import default_client

        return default_client()
    except ValueError:
        raise DaskSPMDError(
            "mpiml.dask estimators need a Dask client whose workers are ranks of an MPI job; run your "
            "script with: mpiexec -n N mpiml dask script.py (or python -m mpiml.dask script.py)") from None


def _as_dask_array(x, name, *, rows_only=False):
    """A dask array from a dask array, dataframe or series (2-D X gets one column block)."""
    import dask.array as da

    if x is None:
        return None
    if hasattr(x, "to_dask_array") and not isinstance(x, da.Array):  # dask DataFrame / Series
        x = x.to_dask_array()
    if not isinstance(x, da.Array):
        raise TypeError(f"{name} must be a dask array or a dask dataframe; got {type(x).__name__} "
                        "(for data in memory, use da.from_array, or the SPMD estimator under mpiexec)")
    if x.ndim == 2 and x.numblocks[1] > 1 and not rows_only:
        x = x.rechunk({1: -1})
    return x


def _align_rows(x, X, name):
    """``x`` (y or sample_weight) split into the same row blocks as ``X``."""
    import math

    if x is None:
        return None
    if x.numblocks[0] == X.numblocks[0] and (x.chunks[0] == X.chunks[0]
                                            or any(math.isnan(c) for c in x.chunks[0] + X.chunks[0])):
        # same partitions (unknown sizes: the SPMD method checks the row counts per rank)
        return x
    if any(math.isnan(c) for c in X.chunks[0] + x.chunks[0]):
        raise ValueError(f"{name} has {x.numblocks[0]} row blocks of unknown size and X has "
                         f"{X.numblocks[0]}: give both with known chunk sizes (e.g. to_dask_array(lengths=True))")
    return x.rechunk({0: X.chunks[0]})


def _row_block_keys(arr):
    keys = arr.__dask_keys__()
    return [k[0] if isinstance(k, list) else k for k in keys]


# ---------------------------------------------------------------------- the cluster
def _spmd_workers(client, what):
    """``{address: info}`` of the workers, checked to be ranks of one ``mpiml dask`` job."""
    from ._spmd import worker_info

    address = client.scheduler.address
    if address in _broken:
        raise DaskSPMDError(f"{what}: {_broken[address]}")
    infos = client.run(worker_info)
    if not infos:
        raise DaskSPMDError(f"{what}: the Dask cluster at {address} has no workers")
    missing = sorted(a for a, info in infos.items() if not info["spmd"])
    if missing:
        raise DaskSPMDError(
            f"{what}: mpiml's MPI communicator is unavailable on the Dask workers {missing[:4]}"
            f"{' ...' if len(missing) > 4 else ''}: they are not worker ranks of an MPI job started by "
            "`mpiml dask`, so the SPMD estimator cannot run across them. Launch the cluster and the "
            "script together with: mpiexec -n N mpiml dask script.py (or python -m mpiml.dask script.py); "
            "rank 0 is the scheduler, rank 1 runs the script, ranks >= 2 are the workers")
    return infos


def _current_workers(client):
    from ._launcher import worker_addresses

    return set(worker_addresses(client))


def _persisted_blocks(client, arrays):
    """Persist ``arrays``; return, per array, its row blocks' futures in order, and who holds them."""
    from distributed import futures_of, wait

    arrays = client.persist(list(arrays))
    wait(arrays)
    blocks = []
    for arr in arrays:
        by_key = {f.key: f for f in futures_of(arr)}
        blocks.append([by_key[k] for k in _row_block_keys(arr)])
    who = client.who_has([f for b in blocks for f in b])
    return blocks, who


def _run_job(method, estimator, X, y=None, sample_weight=None, *, drop=(), kwargs=None, keep=False,
             shards=None):
    """Run ``estimator.method(X, y, ...)`` SPMD on the workers that hold ``X``'s blocks.

    Returns the first member's result (the estimator for ``fit`` and ``partial_fit``).
    With ``keep`` (fit of a sharded model) or ``shards`` (a query of one: the
    members are the shards' workers, in order, and blocks held elsewhere are
    sent to them), returns ``(members, futures by member, blocks by member)``
    and leaves the results on the workers.
    """
    from ._spmd import Job, _env_timeout, run_job

    what = f"{type(estimator).__name__}.{method}"
    client = _get_client()
    X = _as_dask_array(X, "X")
    y = _align_rows(_as_dask_array(y, "y", rows_only=True), X, "y")
    w = _align_rows(_as_dask_array(sample_weight, "sample_weight", rows_only=True), X, "sample_weight")
    with _job_lock:
        infos = _spmd_workers(client, what)
        inputs = [a for a in (X, y, w) if a is not None]
        blocks, who = _persisted_blocks(client, inputs)
        rank_of = {a: info["workers_rank"] for a, info in infos.items()}
        world_rank = {a: info["world_rank"] for a, info in infos.items()}
        # each row block runs where X's block is (the lowest-ranked holder if replicated)
        owner = []
        shard_of = dict(shards or ())
        for i, fut in enumerate(blocks[0]):
            holders = [a for a in who.get(fut.key, ()) if a in rank_of and (not shards or a in shard_of)]
            if shards and not holders:  # a query block away from the index: send it to a shard
                holders = [shards[i % len(shards)][0]]
            if not holders:
                raise DaskSPMDError(f"{what}: block {fut.key} of X is on no worker of this cluster")
            owner.append(min(holders, key=rank_of.get))
        if shards:
            missing = [a for a, _ in shards if a not in rank_of]
            if missing:
                raise DaskSPMDError(f"{what}: the fitted model's shards on {missing} are gone; fit again")
            members = [a for a, _ in shards]  # the index's rank order is fixed by its fit
        else:
            members = list(dict.fromkeys(owner))  # ordered by their first block
        job = Job(job_id=next(_job_ids), method=method, estimator=None if shards else estimator,
                  members=tuple(rank_of[a] for a in members), drop=tuple(drop), kwargs=dict(kwargs or {}),
                  timeout=_env_timeout(), keep=keep, sharded=bool(shards))
        futures, token = {}, uuid.uuid4().hex[:8]
        for address in sorted(infos, key=rank_of.get):
            mine = [i for i, a in enumerate(owner) if a == address]
            args = [blocks[j][i] for j in range(len(blocks)) for i in mine]
            if address in shard_of:
                args.insert(0, shard_of[address])
            counts = {name: len(mine) if present else 0
                      for name, present in (("n_x", True), ("n_y", y is not None), ("n_w", w is not None))}
            futures[address] = client.submit(
                run_job, job.__class__(**{**job.__dict__, **counts}), *args,
                key=f"mpiml-{what}-job{job.job_id}-{token}-rank{world_rank[address]}",
                workers=[address], allow_other_workers=False, pure=False, retries=0)
        _wait_job(client, futures, world_rank, what)
    if keep or shards:
        return members, futures, {a: [i for i, o in enumerate(owner) if o == a] for a in members}
    return futures[members[0]].result()


def _wait_job(client, futures, rank_of, what):
    """Wait for every task of a job; a failure or a lost member raises, never hangs."""
    from distributed import wait

    address = client.scheduler.address
    while True:
        pending = [f for f in futures.values() if f.status not in ("finished", "error")]
        if pending:
            try:
                wait(pending, timeout=_POLL_SECONDS, return_when="FIRST_COMPLETED")
            except TimeoutError:
                pass
        if all(f.status == "finished" for f in futures.values()):
            return
        if any(f.status == "error" for f in futures.values()):
            return _raise_failure(client, futures, rank_of, what)
        # every worker takes part in the job's split, members or not
        current = _current_workers(client)
        gone = [a for a in futures if a not in current]
        if gone:
            names = ", ".join(f"{a} (MPI rank {rank_of[a]})" for a in gone)
            _broken[address] = (f"worker {names} left the cluster during {what}; the MPI communicator of the "
                                "workers cannot be used without it: restart the mpiml dask job")
            client.cancel(list(futures.values()))
            raise DaskSPMDError(
                f"{what} cannot finish: worker {names} left the Dask cluster during the SPMD job (it died "
                "or was retired). The other ranks of the job stop at MPIML_TIMEOUT; restart the job to "
                "fit again")


def _raise_failure(client, futures, rank_of, what):
    from distributed import wait

    try:  # ranks of an SPMD call raise the same error together: give the others a moment
        wait(list(futures.values()), timeout=_GRACE_SECONDS)
    except TimeoutError:
        pass
    errors = {a: f.exception() for a, f in futures.items() if f.status == "error"}
    pending = [a for a, f in futures.items() if f.status not in ("finished", "error")]

    def timed_out(e):  # a CommTimeoutError, or its text (see _spmd._picklable)
        return "CommTimeoutError" in f"{type(e).__name__}: {e}" or "timed out after" in str(e)

    # the root cause, not a peer's timeout waiting for it
    first = min(errors, key=lambda a: (timed_out(errors[a]), rank_of[a]))
    exc = errors[first]
    if any(timed_out(e) and "Dask SPMD job start" in str(e) for e in errors.values()):
        # the agreement was left pending on the workers communicator: it is out of step for good
        _broken[client.scheduler.address] = (f"{what} timed out before it started (a worker was busy, stuck or "
                                             "gone): restart the mpiml dask job")
    if not pending and len({(type(e), str(e)) for e in errors.values()}) == 1:
        raise exc  # the same error on every rank that failed (bad parameters or data): as is
    client.cancel([futures[a] for a in pending])
    others = f"; workers {pending} were still inside the job" if pending else ""
    raise DaskSPMDError(
        f"{what} failed on worker {first} (MPI rank {rank_of[first]}) with {type(exc).__name__}: {exc}"
        f"{others}") from exc


# ---------------------------------------------------------------------- the wrapper base class
def _block_method(name):
    def method(self, X):
        self._check_is_fitted()
        return _map_blocks(self.spmd_estimator_, name, X)

    method.__name__ = name
    method.__qualname__ = name
    method.__doc__ = (f"``{name}`` of the fitted estimator on every block of ``X``, lazily.\n\n"
                      "Returns\n-------\ndask.array.Array\n    One block per row block of ``X``, "
                      "computed on the worker that holds it.")
    return method


def _query_method(name):
    def method(self, X, **kwargs):
        self._check_is_fitted()
        members, futures, mine = _run_job(name, None, X, kwargs=kwargs, shards=self._shards_)
        return _assemble(members, futures, mine, _as_dask_array(X, "X").numblocks[0])

    method.__name__ = name
    method.__qualname__ = name
    method.__doc__ = (f"``{name}`` of the sharded model, run SPMD over its workers now.\n\n"
                      "Returns\n-------\ndask.array.Array or tuple of them\n    One block per row block of ``X``.")
    return method


def _assemble(members, futures, mine, n_blocks):
    """Dask arrays over the per-block results that a sharded query left on the members."""
    import operator

    import dask.array as da

    from ._spmd import block_of, describe

    client = _get_client()
    info = dict(zip(members, client.gather([client.submit(describe, futures[a], workers=[a], pure=False)
                                            for a in members])))
    parts, is_tuple = [None] * n_blocks, False
    for a in members:
        for j, i in enumerate(mine[a]):
            block = client.submit(block_of, futures[a], j, workers=[a], pure=False)
            desc = info[a][j]
            if isinstance(desc[0], tuple):  # a tuple of outputs
                is_tuple = True
                parts[i] = [(client.submit(operator.getitem, block, o, workers=[a], pure=False), d)
                            for o, d in enumerate(desc)]
            else:
                parts[i] = [(block, desc)]

    def array(fut, desc):
        rows, tail, dtype, module = desc
        meta = __import__(module).empty((0,) + tuple(tail), dtype=dtype)
        return da.from_delayed(fut, shape=(rows,) + tuple(tail), dtype=dtype, meta=meta)

    outputs = [da.concatenate([array(*p[o]) for p in parts]) for o in range(len(parts[0]))]
    return tuple(outputs) if is_tuple else outputs[0]


def _map_blocks(model, name, X):
    import dask

    X = _as_dask_array(X, "X")
    meta = X._meta
    xp = type(meta).__module__.split(".")[0]
    probe = getattr(model, name)(__import__(xp).zeros((1,) + X.shape[1:], dtype=X.dtype))
    model = dask.delayed(model, pure=True)
    from ._spmd import run_block_method

    if probe.ndim == 1:
        return X.map_blocks(run_block_method, model, name, drop_axis=list(range(1, X.ndim)),
                            dtype=probe.dtype, meta=probe[:0])
    return X.map_blocks(run_block_method, model, name, chunks=(X.chunks[0],) + probe.shape[1:],
                        dtype=probe.dtype, meta=probe[:0])


class DaskSPMDEstimator(BaseEstimator):
    """Base class of the Dask-driven wrappers of mpiml's SPMD estimators.

    Subclass it with ``spmd=TheSPMDClass`` (see the module docstring). Class
    attributes of a subclass:

    _local_attributes : tuple of str
        Fitted attributes that describe one rank's rows (``labels_``): not
        sent back to the client.
    _block_methods : tuple of str
        Methods that act on rows independently and return dask arrays.

    _sharded : bool
        The fitted state is sharded over the ranks (a neighbours index): the
        members keep their fitted estimators on their workers (``_shards_``,
        futures in rank order) and the client gets rank 0's without
        ``_local_attributes``.
    _query_methods : tuple of str
        Methods of a sharded model that need every rank (``kneighbors``): each
        call is an SPMD job over the shards' workers (query blocks held elsewhere
        are sent to them); it runs at call time and returns dask arrays (a tuple
        of them for tuple outputs) whose blocks stay on the workers.

    Attributes
    ----------
    spmd_estimator_ : SPMDEstimator
        The fitted estimator (``comm=None``); usable in this process on
        in-memory arrays.
    Every public fitted attribute of ``spmd_estimator_`` (``cluster_centers_``, ...)
        Replicated attributes, on the client, NumPy or CuPy like the chunks.
    """

    _spmd_class = None
    _local_attributes: tuple = ()
    _block_methods: tuple = ()
    _sharded: bool = False
    _query_methods: tuple = ()

    def __init_subclass__(cls, spmd=None, **kwargs):
        super().__init_subclass__(**kwargs)
        if spmd is None:
            return
        cls._spmd_class = spmd
        params = [p for name, p in inspect.signature(spmd.__init__).parameters.items()
                  if name not in ("self", "comm")]
        defaults = {p.name: p.default for p in params}

        def __init__(self, *args, **kw):
            if len(args) > 1:
                raise TypeError(f"{cls.__name__} takes at most one positional argument")
            if args:
                kw = {params[0].name: args[0], **kw}
            unknown = set(kw) - set(defaults)
            if unknown:
                raise TypeError(f"{cls.__name__} got unexpected parameters {sorted(unknown)}")
            for name, default in defaults.items():
                setattr(self, name, kw.get(name, default))

        self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        __init__.__signature__ = inspect.Signature([self_param, *params])
        __init__.__qualname__ = f"{cls.__name__}.__init__"
        cls.__init__ = __init__
        for name in cls._block_methods:
            if name not in cls.__dict__:
                setattr(cls, name, _block_method(name))
        for name in cls._query_methods:
            if name not in cls.__dict__:
                setattr(cls, name, _query_method(name))
        if "predict" in cls._block_methods and "fit_predict" not in cls.__dict__:
            cls.fit_predict = _fit_predict
        # the SPMD versions win over the mixins' (RegressorMixin.score would score dask arrays locally)
        for name in ("partial_fit", "score"):
            if name not in cls.__dict__:
                setattr(cls, name, getattr(DaskSPMDEstimator, name) if hasattr(spmd, name) else _missing(name))

    @classmethod
    def from_spmd_estimator(cls, estimator):
        """A wrapper around an already fitted SPMD estimator (e.g. a search's ``best_estimator_``)."""
        if not isinstance(estimator, cls._spmd_class):
            raise TypeError(f"{cls.__name__} wraps {cls._spmd_class.__name__}; got {type(estimator).__name__}")
        params = {k: v for k, v in estimator.get_params(deep=False).items() if k != "comm"}
        wrapper = cls(**params)
        wrapper._adopt(estimator)
        wrapper._check_is_fitted()
        return wrapper

    # ------------------------------------------------------------------ helpers
    def _spmd_estimator(self):
        """A new SPMD estimator with this wrapper's parameters."""
        return self._spmd_class(**self.get_params(deep=False))

    def _adopt(self, fitted):
        for name in list(vars(self)):
            if name.endswith("_") and not name.startswith("_"):
                delattr(self, name)
        for name, value in vars(fitted).items():
            if name.endswith("_") and not name.startswith("_") and name not in self._local_attributes:
                setattr(self, name, value)
        self.spmd_estimator_ = fitted
        return self

    def _check_is_fitted(self):
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self, "spmd_estimator_")

    # ------------------------------------------------------------------ the API
    def fit(self, X, y=None, sample_weight=None):
        """Fit the SPMD estimator on the workers that hold ``X`` (a dask array or dataframe).

        Parameters
        ----------
        X : dask.array.Array or dask.dataframe.DataFrame of shape (n_samples, n_features)
            NumPy or CuPy chunks; split into row blocks only (column blocks are joined).
        y : dask array or series of shape (n_samples,), default=None
        sample_weight : dask array of shape (n_samples,), default=None

        Returns
        -------
        self
        """
        if self._sharded:
            return self._fit_sharded(X, y, sample_weight)
        fitted = _run_job("fit", self._spmd_estimator(), X, y, sample_weight, drop=self._local_attributes)
        return self._adopt(fitted)

    def _fit_sharded(self, X, y, sample_weight):
        """Fit a model whose state stays sharded (a neighbours index): the shards stay on the workers."""
        from ._spmd import strip

        members, futures, _ = _run_job("fit", self._spmd_estimator(), X, y, sample_weight, keep=True)
        client = _get_client()
        first = client.submit(strip, futures[members[0]], self._local_attributes, workers=[members[0]],
                              pure=False).result()
        self._adopt(first)
        self._shards_ = [(a, futures[a]) for a in members]
        return self

    def partial_fit(self, X, y=None, sample_weight=None):
        """One ``partial_fit`` step of the SPMD estimator on the workers that hold ``X``."""
        start = getattr(self, "spmd_estimator_", None)
        if start is None:
            start = self._spmd_estimator()
        else:  # continue from the fitted state, with the current parameters
            start.set_params(**self.get_params(deep=False))
        fitted = _run_job("partial_fit", start, X, y, sample_weight, drop=self._local_attributes)
        return self._adopt(fitted)

    def score(self, X, y=None, sample_weight=None):
        """The SPMD estimator's (global) ``score`` over the rows of ``X``, run on the workers."""
        self._check_is_fitted()
        if self._sharded:
            members, futures, _ = _run_job("score", None, X, y, sample_weight, shards=self._shards_)
            return futures[members[0]].result()
        return _run_job("score", self.spmd_estimator_, X, y, sample_weight)


def _missing(name):
    """A property that hides an inherited method the wrapped class lacks (``hasattr`` is False)."""

    def absent(self):
        raise AttributeError(f"{type(self).__name__} has no {name}: "
                             f"{self._spmd_class.__name__} does not implement it")

    return property(absent)


def _fit_predict(self, X, y=None, sample_weight=None):
    """Fit, then ``predict(X)`` lazily (``labels_`` stays on the workers' ranks)."""
    return self.fit(X, y, sample_weight=sample_weight).predict(X)
