"""K-means clustering over the rows of every rank (SPMD), on NumPy or CuPy shards."""

import contextlib
import time
import warnings
from numbers import Integral, Real

import numpy as np
from sklearn.base import ClassNamePrefixFeaturesOutMixin, ClusterMixin, TransformerMixin
from sklearn.exceptions import ConvergenceWarning

from ..base import SPMDEstimator
from ..utils._param_validation import HasMethods, Interval, StrOptions
from ..utils._threads import one_blas_thread
from ..utils._validation import check_random_state, row_counts, validate_data, validate_sample_weight
from . import _kmeans_node
from . import _kmeans_ops as ops
from ._kmeans_init import Shard, _to_host, init_centers

__all__ = ["KMeans"]


# ---------------------------------------------------------------------- private compute helpers
# dense GPU shards run their Lloyd iterations on the device (_lloyd_device); False: the host's loop (tests
# compare the two)
_DEVICE_LOOP = True


def _allreduce(comm, x):
    return comm.allreduce(x) if comm.size > 1 else x


def _centre_update(sums, counts, old):
    """The float64 centres ``sums / counts`` (a cluster of no weight keeps its ``old`` centre) and their squared
    shift from ``old`` (a 0-d array), on the host; ``mpiml_lloyd_update`` is its device twin (the same bits)."""
    new = np.where(counts[:, None] > 0, sums / np.where(counts > 0, counts, 1)[:, None], old)
    return new, ((new - old) ** 2).sum()


def _shift(X, mean):
    """The origin of the working coordinates: the global mean for dense rows, zero for sparse
    rows (centring would densify them; scikit-learn does not centre sparse data either)."""
    return mean * 0 if ops.is_sparse(X) else mean


def _global_stats(X, *, comm, xp):
    """Global mean of the rows and mean feature variance (two small allreduces)."""
    n, d = X.shape
    pack = xp.zeros(d + 1, dtype=xp.float64)
    device = ops._is_device(X) and not ops.is_sparse(X)
    dense_step = ops.chunk_rows(d, 1, 8, device=device)

    def colsum(a):
        # column sums of a float64 block; on a GPU as a matrix-vector product (CuPy's axis-0 reduction of a
        # tall block is many times slower: 1.9 s for the two passes over 4*10^7 x 64 on one H200)
        return xp.ones(a.shape[0], dtype=xp.float64) @ a if device else a.sum(axis=0)

    cpu = ops._cpu_kernels(X)  # dense host rows: both passes on this rank's threads
    if n and device:
        for s in range(0, n, dense_step):
            pack[:d] += colsum(X[s:s + dense_step].astype(xp.float64))
    elif n and cpu is not None:
        pack[:d] = cpu.column_sums(X)
    elif n:
        pack[:d] = xp.asarray(X.sum(axis=0, dtype=xp.float64)).ravel()
    pack[d] = n
    pack = _allreduce(comm, pack)
    mean = pack[:d] / pack[d]
    if ops.is_sparse(X):  # sum of squares minus n * mean^2, never densifying X
        sq = xp.asarray(X.multiply(X).sum(axis=0), dtype=xp.float64).ravel()
        sq = _allreduce(comm, sq)
        var = xp.maximum(sq - pack[d] * mean * mean, 0)
        return mean, float(var.sum()) / (d * float(pack[d]))
    var = xp.zeros(d, dtype=xp.float64)
    if cpu is not None:
        var = cpu.column_sums(X, mean, square=True)
    else:
        for s in range(0, n, dense_step):
            diff = X[s:s + dense_step].astype(xp.float64) - mean
            var += colsum(diff * diff)
    var = _allreduce(comm, var)
    return mean, float(var.sum()) / (d * float(pack[d]))


def _relocate_empty_clusters(shard, sums, counts, mind, labels):
    """Move empty clusters onto the rows farthest from their centres (as scikit-learn does).

    Each rank offers its ``n_empty`` farthest rows; one ``allgatherv`` of those
    candidates picks the global farthest, ties broken by global row index.
    ``sums`` and ``counts`` (host float64, sums shifted) are updated in place.
    """
    xp, comm = shard.xp, shard.comm
    empty = np.nonzero(counts == 0)[0]
    m = len(empty)
    take = min(m, shard.n_local)
    d = shard.X.shape[1]
    offer = xp.zeros((take, 4 + d), dtype=xp.float64)
    if take:
        # stable descending order: larger distance first, then smaller index
        idx = xp.argsort(-mind.astype(xp.float64), kind="stable")[:take] if xp is np else \
            xp.argsort(-mind.astype(xp.float64))[:take]
        offer[:, 0] = mind[idx]
        offer[:, 1] = idx + shard.offset
        offer[:, 2] = shard.weight[idx]
        offer[:, 3] = labels[idx]
        offer[:, 4:] = ops.dense_rows(shard.X, idx, shard.shift)
    allc = comm.allgatherv(offer) if comm.size > 1 else offer
    allc = _to_host(allc)
    # rows that already sit on a centre gain nothing: with more clusters than distinct rows
    # the extra clusters stay empty (and fit warns), as in scikit-learn
    allc = allc[allc[:, 0] > 0]
    order = np.lexsort((allc[:, 1], -allc[:, 0]))[:m]
    for new_id, row in zip(empty, allc[order]):
        w, old = row[2], int(row[3])
        x = row[4:]
        sums[old] -= x * w
        sums[new_id] = x * w
        counts[new_id] = w
        counts[old] -= w


def _lloyd(shard, centers, *, max_iter, tol, verbose, iter_seconds=None):
    """Lloyd iterations from shifted ``centers``; the same result on every rank.

    Returns ``(labels, inertia, centers, n_iter)``; one packed allreduce per iteration.  Dense GPU rows go to
    :func:`_lloyd_device`; here the centres are updated on the host.
    """
    xp = shard.xp
    n = shard.n_local
    sparse = ops.is_sparse(shard.X)
    # dense GPU rows: a step of unit weights reads none, and writes no distances (only the relocation of empty
    # clusters needs them, and recomputes them)
    lean = xp is not np and not sparse
    if lean and _DEVICE_LOOP:
        return _lloyd_device(shard, centers, max_iter=max_iter, tol=tol, verbose=verbose, iter_seconds=iter_seconds)
    labels = xp.full(n, -1, dtype=xp.int32)
    step_weight = None if shard.unit_weight and (lean or xp is np) else shard.weight  # (host: no weight reads)
    mind = None if lean else xp.empty(n, dtype=shard.X.dtype)
    # the update of the k x d centres on the host: one copy of the packed vector back (the iteration waits for
    # it anyway) and one of the centres out; dense rows take the host copy of the centres, sparse GPU rows need
    # them on the device, a copy each iteration
    c_host = _to_host(centers)
    # the compiled steps run BLAS on one thread of each part: held once for the iterations, not per step
    with (one_blas_thread() if ops._cpu_kernels(shard.X) is not None else contextlib.nullcontext()):
        return _lloyd_host(shard, centers, c_host, labels, step_weight, mind, sparse, max_iter=max_iter, tol=tol,
                           verbose=verbose, iter_seconds=iter_seconds)


def _lloyd_host(shard, centers, c_host, labels, step_weight, mind, sparse, *, max_iter, tol, verbose, iter_seconds):
    """The iterations of :func:`_lloyd` with the centres updated on the host."""
    xp, comm = shard.xp, shard.comm
    k, d = centers.shape
    it = 0
    # CPU ranks of one node: every step over the node's rows, its parts shared by all the ranks' threads
    node = None if sparse or ops._cpu_kernels(shard.X) is None else _kmeans_node.start(shard, step_weight, labels,
                                                                                      mind, k)
    if node is not None:
        labels, mind = node.labels, node.mind
    # a rank beyond the node's cores sleeps through the iterations; the workers' labels land in its rows
    loop = range(0) if node is not None and node.idle else range(max_iter)
    timed = len(iter_seconds) if iter_seconds is not None else 0
    for it in loop:
        t0 = time.perf_counter()
        if node is not None:
            packed = node.step(c_host, shard.shift)
        else:
            packed = ops.lloyd_step(shard.X, step_weight, shard.shift, centers if sparse else c_host, labels, mind,
                                    batch_size=shard.batch_size)
            packed = _to_host(_allreduce(comm, packed))
        sums = packed[:k * d].reshape(k, d)
        counts = packed[k * d:k * d + k].copy()
        inertia, changed = float(packed[k * d + k]), int(packed[k * d + k + 1])
        if (counts == 0).any():
            sums = sums.copy()
            # the distances of this step's centres, by the step's kernel again, where it wrote none
            if node is not None:
                node.relocate(sums, counts, shard.shift)
            else:
                dist = mind if mind is not None else _step_distances(shard, step_weight, c_host)[1]
                _relocate_empty_clusters(shard, sums, counts, dist, labels)
        new, sq_shift = _centre_update(sums, counts, c_host.astype(np.float64))
        center_shift = float(sq_shift)
        c_host = np.ascontiguousarray(new.astype(shard.X.dtype))
        if sparse:
            centers = xp.asarray(c_host)
        if iter_seconds is not None:
            iter_seconds.append(time.perf_counter() - t0)
        if _converged(it, inertia, changed, center_shift, tol, verbose and comm.rank == 0,
                      (iter_seconds, max_iter)):
            break
    if node is not None:
        # a worker's centres to the idle ranks (the workers' are the same)
        seconds = sum(iter_seconds[timed:]) if iter_seconds is not None else 0.0
        c_host, last, seconds = node.finish(c_host, it, seconds)
        if node.idle:
            it = last
            if iter_seconds is not None:
                iter_seconds.extend([seconds / (it + 1)] * (it + 1))
        node.release()  # kept for the next fit, or freed (not on an error: freeing is collective)
    centers = xp.asarray(c_host)
    labels, _, inertia = ops.assign(shard.X, shard.shift, centers if sparse else c_host,
                                    batch_size=shard.batch_size, sample_weight=shard.weight)
    inertia = float(_to_host(_allreduce(comm, np.array([inertia])))[0])
    return labels, inertia, centers, it + 1


def _step_distances(shard, weight, centers):
    """The labels and squared distances of a Lloyd step from ``centers`` (its kernel and arithmetic: the rows
    that the step counted in each cluster), for the relocation of empty clusters where the step kept none."""
    xp = shard.xp
    labels, mind = xp.full(shard.n_local, -1, dtype=xp.int32), xp.empty(shard.n_local, dtype=shard.X.dtype)
    ops.lloyd_step(shard.X, weight, shard.shift, centers, labels, mind, batch_size=shard.batch_size)
    return labels, mind


def _converged(it, inertia, changed, center_shift, tol, say, timing=None):
    """Whether Lloyd iteration ``it`` ends the run (scikit-learn's rules: no label changed, or the squared shift
    of the centres within ``tol``); ``say``: one line an iteration, and the reason; ``timing``:
    ``(seconds of the iterations so far, max_iter)``, to add the time of this one and a bound on what remains."""
    if say:
        tail = ""
        if timing is not None and timing[0]:
            seconds, max_iter = timing
            left = max_iter - it - 1
            tail = f" ({seconds[-1]:.3f} s; at most {left} more, {left * float(np.median(seconds)):.1f} s)"
        print(f"Iteration {it}, inertia {inertia:.6g}, center shift {center_shift:.3g}{tail}", flush=True)
    if changed == 0 and it > 0:
        if say:
            print(f"Converged at iteration {it}: strict convergence.", flush=True)
        return True
    if center_shift <= tol:
        if say:
            print(f"Converged at iteration {it}: center shift {center_shift:.3g} within tolerance {tol:.3g}.",
                  flush=True)
        return True
    return False


def _lloyd_device(shard, centers, *, max_iter, tol, verbose, iter_seconds=None):
    """Lloyd iterations of dense rows on the GPU, the centres kept on the device (:func:`_lloyd`'s contract).

    Step, allreduce and the centres' update (``mpiml_lloyd_update``) are queued on the stream, and so is the
    next step, before the host waits for this iteration's four scalars ``[inertia, changed, shift, empty
    clusters]`` (which the update writes to pinned host memory): the GPU does not idle while the host decides,
    and the host's launches of the next step overlap this one.  A run that converges has computed one step
    more than it uses (none at ``max_iter``).  An empty cluster (rare) is relocated on the host as in
    :func:`_lloyd`, from this step's labels and distances computed again (the queued step has overwritten the
    labels), and the step after it queued again.  The same centres as the host's loop, bit for bit: the update
    rounds the same float64 quotients, and the centres' norms are summed in the same order.
    """
    import cupy
    import cupyx

    from . import _gpu

    comm, X = shard.comm, shard.X
    n = shard.n_local
    k, d = centers.shape
    labels = cupy.full(n, -1, dtype=cupy.int32)
    weight = None if shard.unit_weight else shard.weight
    c = cupy.array(centers, dtype=X.dtype, order="C")
    stream = cupy.cuda.get_current_stream()
    scalars = cupyx.empty_pinned(4, dtype=np.float64)
    ready = cupy.cuda.Event(disable_timing=True)

    def step(cen, lab, mind=None):
        return ops.lloyd_step(X, weight, shard.shift, cen, lab, mind, batch_size=shard.batch_size)

    packed = step(c, labels)
    it = 0
    while True:
        t0 = time.perf_counter()
        packed = _allreduce(comm, packed)
        new, _ = _gpu.lloyd_update(packed, c, scalars)
        ready.record(stream)
        last = it + 1 >= max_iter
        ahead = None if last else step(new, labels)
        ready.synchronize()
        inertia, changed, center_shift, empty = (float(v) for v in scalars)
        changed = int(changed)
        if empty:
            fresh, mind = _step_distances(shard, weight, c)   # this step's labels again (its sums are in packed)
            labels[...] = fresh
            host = _to_host(packed)
            sums, counts = host[:k * d].reshape(k, d).copy(), host[k * d:k * d + k].copy()
            _relocate_empty_clusters(shard, sums, counts, mind, labels)
            new, sq_shift = _centre_update(sums, counts, _to_host(c).astype(np.float64))
            center_shift = float(sq_shift)
            new = cupy.asarray(new.astype(X.dtype))
            ahead = None if last else step(new, labels)
        c = new
        if iter_seconds is not None:
            iter_seconds.append(time.perf_counter() - t0)
        if _converged(it, inertia, changed, center_shift, tol, verbose and comm.rank == 0) or last:
            break
        packed = ahead
        it += 1
    labels, _, inertia = ops.assign(X, shard.shift, c, batch_size=shard.batch_size, sample_weight=shard.weight)
    inertia = float(_to_host(_allreduce(comm, np.array([inertia])))[0])
    return labels, inertia, c, it + 1


class KMeans(ClassNamePrefixFeaturesOutMixin, ClusterMixin, TransformerMixin, SPMDEstimator):
    """K-means clustering of rows spread over ranks (SPMD), on NumPy or CuPy shards.

    Every rank calls :meth:`fit` with its own rows; the fitted centres are the
    same on every rank and equal (for a fixed initialisation) to those of a
    single process on the concatenated rows.

    Parameters
    ----------
    n_clusters : int, default=8
        Number of clusters.
    init : {"k-means||", "k-means++", "random"}, callable or array of shape (n_clusters, n_features), \
default="k-means||"
        ``"k-means||"``: scalable k-means++ (a few rounds of oversampling with
        ``oversampling_factor * n_clusters`` expected draws each, the weighted
        candidates reduced to ``n_clusters`` on every rank alike).
        ``"k-means++"``: greedy k-means++ with one global D^2 draw per centre.
        ``"random"``: ``n_clusters`` rows drawn uniformly over all ranks.
        An array: the initial centres (the same on every rank).
        A callable ``init(X, n_clusters, random_state=...)`` returning the centres:
        called on rank 0 with rank 0's rows (on one process: all rows, as in
        scikit-learn), its result broadcast to every rank.
    n_init : "auto" or int, default="auto"
        Runs with different initial centres; the one with the lowest inertia
        is kept.  ``"auto"``: 10 for ``"random"`` and a callable, else 1
        (scikit-learn's rule).
    max_iter : int, default=300
        Maximum Lloyd iterations per run.
    tol : float, default=1e-4
        Convergence when the squared shift of the centres is at most ``tol``
        times the mean feature variance of the whole dataset (scikit-learn's rule).
    verbose : int, default=0
        Print one line per iteration on rank 0.
    random_state : int, RandomState instance or None, default=None
        Seed of the initialisation.  One seed is agreed by all ranks (rank 0's).
    copy_x : bool, default=True
        Accepted for scikit-learn compatibility. mpiml never modifies ``X``: the
        rows are centred on the fly (per chunk, or inside the GPU kernel), so
        ``copy_x=False`` saves no memory and ``X`` is left unchanged either way.
    algorithm : {"lloyd", "elkan"}, default="lloyd"
        ``"elkan"`` runs Lloyd's iterations, which give the same result: Elkan's
        triangle-inequality bounds save distance computations on one CPU, but
        the distances are not what costs time on GPUs (the fused kernel reads
        each row once) and the bounds would be state per row on every rank.
        With ``n_clusters=1``, ``"elkan"`` warns as scikit-learn does.
    oversampling_factor : float, default=2.0
        ``k-means||``: expected candidates per round, in multiples of ``n_clusters``.
    init_max_iter : int or None, default=None
        ``k-means||``: rounds of oversampling (None: about ``log(cost)``, at most 5).
    batch_size : int or None, default=None
        Rows per chunk of the host computation (bounds memory); None picks a
        chunk of a few MiB.  The GPU kernel needs no chunks.
    comm : Communicator or None, default=None
        Communicator of the ranks that share the data; None is the world.

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, n_features)
        Replicated on every rank; NumPy or CuPy like ``X``, dtype of ``X``.
    labels_ : ndarray of shape (n_local_samples,), int32
        Labels of *this rank's* rows.
    inertia_ : float
        Weighted sum of squared distances to the nearest centre, over all ranks.
    n_iter_ : int
        Lloyd iterations of the kept run.
    n_features_in_ : int
        Number of features.
    n_steps_ : int
        Calls of :meth:`partial_fit` since the last reset.

    Notes
    -----
    Communicated per Lloyd iteration: **one** allreduce of a float64 vector of
    ``n_clusters * (n_features + 1) + 2`` values, ``[sums | weights per cluster
    | inertia | changed labels]``; an ``allgatherv`` of ``n_empty`` candidate
    rows per rank only in iterations that leave a cluster empty.  Per fit:
    two allreduces of ``n_features + 1`` values (global mean and variance),
    the row counts (allgather), the seed (bcast), the initialisation (see
    ``init``) and one scalar allreduce for the final inertia.

    Sums are accumulated in float64 around the global mean, so results do not
    depend on the number of ranks for a fixed initialisation: centres agree to
    about 1e-12 relative (float64 data) and labels agree except for rows
    equidistant to two centres within rounding.  On the GPU the per-cluster sums
    use atomics, whose order varies from run to run at the same 1e-16 level.

    On dense CuPy shards the iterations stay on the device: the centres are
    updated there, and the next step is queued before the host has read the
    iteration's four scalars (inertia, changed labels, centre shift, empty
    clusters), so the GPU does not wait for Python between steps; a run that
    converges early computes one step it does not use.

    :meth:`predict` and :meth:`transform` act on local rows and communicate
    nothing; :meth:`score` is global (one scalar allreduce).

    Sparse rows (SciPy CSR, on CPU ranks) are never densified: distances are
    sparse-times-dense products, the per-cluster sums sparse products, and the
    rows are not centred (the shift is zero, as in scikit-learn). The centres are
    dense, so the packed allreduce still carries ``n_clusters * n_features``
    float64 sums per iteration. ``k-means||`` keeps its candidate centres dense
    (about ``oversampling_factor * n_clusters`` rows per round). ``cupyx.scipy.sparse``
    CSR rows (GPU ranks) take the same path through cuSPARSE
    (:mod:`mpiml.cluster._kmeans_sparse_gpu`).
    """

    _parameter_constraints = {
        **SPMDEstimator._parameter_constraints,
        "n_clusters": [Interval(Integral, 1, None, closed="left")],
        # (not "array-like": strings have a length and would pass as arrays)
        "init": [StrOptions({"k-means||", "k-means++", "random"}), callable, HasMethods(["__array__"]), list, tuple],
        "n_init": [StrOptions({"auto"}), Interval(Integral, 1, None, closed="left")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "verbose": ["verbose"],
        "random_state": ["random_state"],
        "oversampling_factor": [Interval(Real, 0, None, closed="neither")],
        "init_max_iter": [None, Interval(Integral, 1, None, closed="left")],
        "batch_size": [None, Interval(Integral, 1, None, closed="left")],
        "copy_x": ["boolean"],
        "algorithm": [StrOptions({"lloyd", "elkan"})],
    }
    _saved_attributes = ("cluster_centers_", "inertia_", "n_iter_", "_counts", "n_steps_")

    def __init__(self, n_clusters=8, *, init="k-means||", n_init="auto", max_iter=300, tol=1e-4, verbose=0,
                 random_state=None, copy_x=True, algorithm="lloyd", oversampling_factor=2.0, init_max_iter=None,
                 batch_size=None, comm=None):
        self.n_clusters = n_clusters
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.verbose = verbose
        self.random_state = random_state
        self.copy_x = copy_x
        self.algorithm = algorithm
        self.oversampling_factor = oversampling_factor
        self.init_max_iter = init_max_iter
        self.batch_size = batch_size
        self.comm = comm

    # ------------------------------------------------------------------ helpers
    @property
    def _n_features_out(self):
        return self.cluster_centers_.shape[0]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    def _resolve_n_init(self):
        # scikit-learn's resolution of "auto": 10 for "random" and for a callable, else 1
        if self.n_init == "auto":
            return 10 if (isinstance(self.init, str) and self.init == "random") or callable(self.init) else 1
        if not isinstance(self.init, str) and not callable(self.init) and self.n_init != 1:
            warnings.warn("Explicit initial center position passed: performing only one init in KMeans "
                          f"instead of n_init={self.n_init}.", RuntimeWarning, stacklevel=3)
            return 1
        return self.n_init

    def _check_algorithm(self):
        if self.algorithm == "elkan" and self.n_clusters == 1:
            warnings.warn("algorithm='elkan' doesn't make sense for a single cluster. Using 'lloyd' instead.",
                          RuntimeWarning, stacklevel=3)

    def _call_init(self, X, comm, random_state):
        """Centres from a callable ``init``: called on rank 0 with its rows, the result broadcast.

        Any error (an exception in the callable, a wrong shape) is raised on every rank.
        """
        from ..utils._validation import agree_on_error

        centers, error = None, None
        if comm.rank == 0:
            try:
                Xh = X.get() if ops._is_device(X) else X
                centers = np.asarray(self.init(Xh, self.n_clusters, random_state=random_state))
                self._check_init_shape(centers, X)
            except Exception as exc:  # raised on every rank below
                error = exc
        agree_on_error(comm, error, error_class=ValueError, prefix="init (a callable, called on rank 0) failed")
        return comm.bcast_obj(centers) if comm.size > 1 else centers

    def _check_init_shape(self, init, X):
        if init.ndim != 2 or init.shape[0] != self.n_clusters:
            raise ValueError(f"The shape of the initial centers {init.shape} does not match the number of "
                             f"clusters {self.n_clusters}.")
        if init.shape[1] != X.shape[1]:
            raise ValueError(f"The shape of the initial centers {init.shape} does not match the number of "
                             f"features of the data {X.shape[1]}.")
        if not np.isfinite(init).all():
            raise ValueError("The initial centers contain NaN or infinity.")

    def _check_init_array(self, X, xp):
        if isinstance(self.init, str) or callable(self.init):
            return self.init
        init = self.init
        init = init.get() if ops._is_device(init) else np.asarray(init)
        self._check_init_shape(init, X)
        return xp.asarray(init.astype(X.dtype))

    def _seed(self, comm):
        rs = check_random_state(self.random_state)
        seed = int(rs.randint(np.iinfo(np.int32).max))
        return comm.bcast_obj(seed) if comm.size > 1 else seed

    def _shard(self, X, xp, sample_weight, comm, shift=None):
        counts = row_counts(X.shape[0], comm)
        offset = int(counts[:comm.rank].sum())
        return Shard(X=X, weight=sample_weight, shift=shift, comm=comm, xp=xp, offset=offset,
                     n_total=int(counts.sum()), batch_size=self.batch_size)

    def _check_n_samples(self, shard):
        if shard.n_total < self.n_clusters:
            raise ValueError(f"n_samples={shard.n_total} should be >= n_clusters={self.n_clusters}.")

    def _local_input(self, X):
        """Validate rows for a local method (predict, transform): no communication."""
        from ..comm import get_comm

        self._check_is_fitted()
        X, xp = validate_data(self, X, comm=get_comm("self"), reset=False, order="C", accept_sparse="csr")
        centers = self.cluster_centers_
        if xp is not np and not ops._is_device(centers):
            centers = xp.asarray(centers)
        elif xp is np and ops._is_device(centers):
            centers = centers.get()
        centers = centers.astype(X.dtype, copy=False)
        shift = _shift(X, centers.mean(axis=0))
        return X, xp, xp.ascontiguousarray(centers - shift), shift

    # ------------------------------------------------------------------ fitting
    def fit(self, X, y=None, sample_weight=None):
        """Compute k-means clustering of the rows of every rank.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_local_samples, n_features)
            This rank's rows (NumPy or CuPy, or SciPy sparse, converted to CSR;
            float64 and float32 are kept).
        y : Ignored
        sample_weight : array-like of shape (n_local_samples,), default=None
            Weights of this rank's rows.

        Returns
        -------
        self : KMeans
            Fitted estimator.
        """
        self._validate_params()
        comm = self._get_comm()
        X, xp = validate_data(self, X, comm=comm, order="C", accept_sparse="csr")
        unit_weight = sample_weight is None
        sample_weight = validate_sample_weight(sample_weight, X, xp=xp, comm=comm)
        init = self._check_init_array(X, xp)
        n_init = self._n_init = self._resolve_n_init()  # the resolved value, as scikit-learn keeps it
        self._check_algorithm()
        shard = self._shard(X, xp, sample_weight, comm)
        shard.unit_weight = unit_weight
        self._check_n_samples(shard)
        mean, mean_var = _global_stats(X, comm=comm, xp=xp)
        shard.shift = _shift(X, mean.astype(X.dtype))
        tol = mean_var * self.tol
        rng = np.random.RandomState(self._seed(comm))
        self._iter_seconds = []
        best = None
        for _ in range(n_init):
            seed = int(rng.randint(np.iinfo(np.int32).max))
            run_init = self._call_init(X, comm, rng) if callable(init) else init
            centers = init_centers(shard, self.n_clusters, run_init, rng, seed,
                                   oversampling_factor=self.oversampling_factor,
                                   init_max_iter=self.init_max_iter)
            if self.verbose and comm.rank == 0:
                print("Initialization complete", flush=True)
            seconds = []
            run = _lloyd(shard, centers, max_iter=self.max_iter, tol=tol, verbose=self.verbose,
                         iter_seconds=seconds)
            if best is None or run[1] < best[1]:
                best = run
                self._iter_seconds = seconds
        labels, inertia, centers, n_iter = best
        counts = xp.bincount(labels, minlength=self.n_clusters)
        distinct = int(np.count_nonzero(_to_host(_allreduce(comm, counts.astype(xp.int64)))))
        if distinct < self.n_clusters:
            warnings.warn(f"Number of distinct clusters ({distinct}) found smaller than n_clusters "
                          f"({self.n_clusters}). Possibly due to duplicate points in X.",
                          ConvergenceWarning, stacklevel=2)
        self.cluster_centers_ = centers + shard.shift
        self.labels_ = labels
        self.inertia_ = inertia
        self.n_iter_ = n_iter
        for name in ("_counts", "n_steps_"):
            if hasattr(self, name):
                delattr(self, name)
        return self

    def partial_fit(self, X, y=None, sample_weight=None):
        """Update the centres with one batch of rows per rank (mini-batch k-means step).

        The first call initialises the centres from the batch with ``init``;
        each call moves every centre to the weighted mean of all the rows it
        has received so far (running counts per centre), with one packed
        allreduce, then labels the batch (one scalar allreduce for ``inertia_``).

        Parameters
        ----------
        X : array-like of shape (n_local_samples, n_features)
            This rank's batch.
        y : Ignored
        sample_weight : array-like of shape (n_local_samples,), default=None

        Returns
        -------
        self : KMeans
        """
        first = not hasattr(self, "_counts")
        if first:
            self._validate_params()
        comm = self._get_comm()
        X, xp = validate_data(self, X, comm=comm, reset=first, order="C", accept_sparse="csr")
        sample_weight = validate_sample_weight(sample_weight, X, xp=xp, comm=comm)
        shard = self._shard(X, xp, sample_weight, comm)
        k, d = self.n_clusters, X.shape[1]
        if first:
            init = self._check_init_array(X, xp)
            self._check_n_samples(shard)
            mean, _ = _global_stats(X, comm=comm, xp=xp)
            shard.shift = _shift(X, mean.astype(X.dtype))
            rng = np.random.RandomState(self._seed(comm))
            if callable(init):
                init = self._call_init(X, comm, rng)
            centers = init_centers(shard, k, init, rng, int(rng.randint(np.iinfo(np.int32).max)),
                                   oversampling_factor=self.oversampling_factor,
                                   init_max_iter=self.init_max_iter)
            self.cluster_centers_ = centers + shard.shift
            self._counts = np.zeros(k, dtype=np.float64)
            self.n_steps_ = 0
        centers = self.cluster_centers_
        if xp is not np and not ops._is_device(centers):
            centers = xp.asarray(centers)
        centers = centers.astype(X.dtype, copy=False)
        shift = _shift(X, centers.mean(axis=0))
        shard.shift = shift
        centers_s = xp.ascontiguousarray(centers - shift)
        labels = xp.full(shard.n_local, -1, dtype=xp.int32)
        # (no distance buffer: the step's distances are not needed, and dense GPU steps then write none)
        packed = _allreduce(comm, ops.lloyd_step(X, sample_weight, shift, centers_s, labels, None,
                                                 batch_size=self.batch_size))
        sums = packed[:k * d].reshape(k, d)
        batch = _to_host(packed[k * d:k * d + k])
        old = xp.asarray(self._counts)[:, None]
        total = old + xp.asarray(batch)[:, None]
        new = xp.where(total > 0, (centers_s.astype(xp.float64) * old + sums) / xp.where(total > 0, total, 1),
                       centers_s.astype(xp.float64))
        self._counts = self._counts + batch
        centers_s = xp.ascontiguousarray(new.astype(X.dtype))
        self.cluster_centers_ = centers_s + shift
        labels, _, inertia = ops.assign(X, shift, centers_s, batch_size=self.batch_size,
                                        sample_weight=sample_weight)
        self.labels_ = labels
        self.inertia_ = float(_to_host(_allreduce(comm, np.array([inertia])))[0])
        self.n_steps_ += 1
        self.n_iter_ = self.n_steps_
        return self

    # ------------------------------------------------------------------ using the model
    def predict(self, X):
        """Index of the nearest centre for each local row (no communication).

        Parameters
        ----------
        X : array-like of shape (n_local_samples, n_features)

        Returns
        -------
        labels : ndarray of shape (n_local_samples,), int32
        """
        X, xp, centers, shift = self._local_input(X)
        labels, _, _ = ops.assign(X, shift, centers, batch_size=self.batch_size)
        return labels

    def fit_predict(self, X, y=None, sample_weight=None):
        """Fit, then return the labels of this rank's rows (``labels_``)."""
        return self.fit(X, sample_weight=sample_weight).labels_

    def transform(self, X):
        """Euclidean distances of the local rows to every centre (no communication).

        Returns
        -------
        ndarray of shape (n_local_samples, n_clusters)
        """
        X, xp, centers, shift = self._local_input(X)
        return ops.euclidean_distances(X, shift, centers, batch_size=self.batch_size)

    def fit_transform(self, X, y=None, sample_weight=None):
        """Fit, then return the distances of this rank's rows to the centres."""
        return self.fit(X, sample_weight=sample_weight).transform(X)

    def score(self, X, y=None, sample_weight=None):
        """Opposite of the inertia of ``X`` over all ranks (one scalar allreduce).

        Returns
        -------
        float
            ``-sum(sample_weight * squared distance to the nearest centre)``, global.
        """
        comm = self._get_comm()
        self._check_is_fitted()
        X, xp = validate_data(self, X, comm=comm, reset=False, order="C", accept_sparse="csr")
        sample_weight = validate_sample_weight(sample_weight, X, xp=xp, comm=comm)
        _, _, centers, shift = self._local_input(X)
        _, _, inertia = ops.assign(X, shift, centers, batch_size=self.batch_size, sample_weight=sample_weight)
        return -float(_to_host(_allreduce(comm, np.array([inertia])))[0])
