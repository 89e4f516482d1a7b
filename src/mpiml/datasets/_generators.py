"""Distributed dataset generators: each rank draws only its own rows.

For a given ``random_state`` the global dataset (the shards concatenated in
rank order) is the same whatever the number of ranks: rows are drawn in blocks
seeded by ``(random_state, block index)`` (see :mod:`._partition`), and the
small global arrays (centres, coefficients, low-rank factors) are drawn from
the base seed identically on every rank.  ``device="gpu"`` draws the rows on
the GPU with CuPy: reproducible and rank-count independent too, but not the
same numbers as on the CPU.

These follow scikit-learn's generators in parameters and in the shape of the
data; the numbers differ from scikit-learn's.
"""

from numbers import Integral

import numpy as np

from ._partition import (
    RowPermutation,
    as_device,
    generate_rows,
    groups_of,
    params_stream,
    resolve_comm,
    resolve_namespace,
    resolve_seed,
    shard_bounds,
)

__all__ = ["make_blobs", "make_classification", "make_regression", "make_low_rank_matrix"]


def _setup(n_samples, comm, device, xp, random_state):
    comm = resolve_comm(comm)
    xp = resolve_namespace(device, xp)
    seed = resolve_seed(random_state, comm)
    start, stop = shard_bounds(n_samples, comm.size, comm.rank)
    return comm, xp, seed, start, stop


def _check_positive_int(value, name, minimum=1):
    if not isinstance(value, Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
    return int(value)


def _shuffle_in_block(stream, arrays, shuffle):
    if not shuffle or arrays[0].shape[0] <= 1:
        return arrays
    order = stream.permutation(arrays[0].shape[0])
    return tuple(a[order] for a in arrays)


# ---------------------------------------------------------------------- make_blobs
def make_blobs(n_samples=100, n_features=2, *, centers=None, cluster_std=1.0, center_box=(-10.0, 10.0),
               shuffle=True, random_state=None, return_centers=False, comm=None, device="cpu", xp=None,
               dtype=np.float64):
    """Isotropic Gaussian blobs; this rank's shard of the global dataset.

    Parameters
    ----------
    n_samples : int or array-like of int, default=100
        Global number of rows, split over ranks like ``np.array_split``; or
        the number of rows of each blob.
    n_features : int, default=2
        Columns (ignored when ``centers`` is an array).
    centers : int or array-like of shape (n_centers, n_features), default=None
        Number of blobs (3 when None and ``n_samples`` is an int) or their centres.
    cluster_std : float or array-like of shape (n_centers,), default=1.0
        Standard deviation of each blob.
    center_box : tuple of float, default=(-10.0, 10.0)
        Bounds of random centres.
    shuffle : bool, default=True
        Mix the blobs over the rows; otherwise rows are ordered by blob.
    random_state : int, RandomState, Generator or None, default=None
        Seed of the global dataset (None: drawn on rank 0 and broadcast).
    return_centers : bool, default=False
        Also return the (replicated) centres.
    comm : Communicator, default=None
        World communicator when None.
    device : {"cpu", "gpu"}, default="cpu"
        Where the shard is generated and returned.
    xp : module, default=None
        ``numpy`` or ``cupy``; overrides ``device``.
    dtype : dtype, default=np.float64
        Dtype of ``X`` (rows are drawn in float64, then cast).

    Returns
    -------
    X : ndarray of shape (n_local_samples, n_features)
        This rank's rows.
    y : ndarray of shape (n_local_samples,), int64
        Blob of each row.
    centers : ndarray of shape (n_centers, n_features), replicated
        Only with ``return_centers=True``.
    """
    if isinstance(n_samples, Integral):
        total = _check_positive_int(n_samples, "n_samples", 0)
        counts = None
    else:
        counts = np.asarray(n_samples, dtype=np.int64)
        if counts.ndim != 1 or (counts < 0).any():
            raise ValueError("n_samples must be an int or a 1-D array-like of non-negative ints")
        total = int(counts.sum())
    comm, xp, seed, start, stop = _setup(total, comm, device, xp, random_state)
    params = params_stream(seed)

    if centers is None:
        n_centers = 3 if counts is None else counts.size
        centers = None
    elif isinstance(centers, Integral):
        n_centers = _check_positive_int(centers, "centers")
        centers = None
    else:
        centers = np.asarray(centers, dtype=np.float64)
        if centers.ndim != 2:
            raise ValueError(f"centers must be an int or a 2-D array; got shape {centers.shape}")
        n_centers, n_features = centers.shape
    n_features = _check_positive_int(n_features, "n_features")
    if counts is not None and counts.size != n_centers:
        raise ValueError(f"Length of `n_samples` not consistent with number of centers. "
                         f"Got n_samples = {counts.size} and centers = {n_centers}")
    if centers is None:
        centers = params.uniform((n_centers, n_features), center_box[0], center_box[1])
    std = np.broadcast_to(np.asarray(cluster_std, dtype=np.float64), (n_centers,)) \
        if np.ndim(cluster_std) == 0 or len(cluster_std) == n_centers else None
    if std is None:
        raise ValueError(f"Length of `clusters_std` not consistent with number of centers. "
                         f"Got centers = {n_centers} and cluster_std = {len(cluster_std)}")
    if counts is None:
        counts = np.full(n_centers, total // n_centers, dtype=np.int64)
        counts[: total % n_centers] += 1
    perm = RowPermutation(total, params, shuffle)
    cum = np.cumsum(counts)
    d_centers, d_std = as_device(centers, xp), as_device(np.ascontiguousarray(std), xp)

    def block(stream, b0, b1):
        y = groups_of((b0, b1), cum, perm, xp)
        (y,) = _shuffle_in_block(stream, (y,), shuffle)
        X = stream.normal((b1 - b0, n_features))
        X *= d_std[y][:, None]
        X += d_centers[y]
        return X.astype(dtype, copy=False), y.astype(xp.int64, copy=False)

    X, y = generate_rows(total, start, stop, n_features, seed, xp, block)
    if return_centers:
        return X, y, centers
    return X, y


# ---------------------------------------------------------------------- make_classification
def _hypercube_vertices(n_vertices, dim, params):
    """``n_vertices`` distinct vertices of the unit hypercube in ``dim`` dimensions."""
    if dim > 30:
        out = params.integers(2, (n_vertices, dim)).astype(np.float64)
        while len({row.tobytes() for row in out}) < n_vertices:  # pragma: no cover - vanishingly rare
            out = params.integers(2, (n_vertices, dim)).astype(np.float64)
        return out
    picks = params.permutation(2**dim)[:n_vertices] if 2**dim <= 1 << 20 else None
    if picks is None:
        seen, picks = set(), []
        while len(picks) < n_vertices:
            v = int(params.integers(2**dim, 1)[0])
            if v not in seen:
                seen.add(v)
                picks.append(v)
        picks = np.asarray(picks)
    bits = (np.asarray(picks)[:, None] >> np.arange(dim)) & 1
    return bits.astype(np.float64)


def make_classification(n_samples=100, n_features=20, *, n_informative=2, n_redundant=2, n_repeated=0,
                        n_classes=2, n_clusters_per_class=2, weights=None, flip_y=0.01, class_sep=1.0,
                        hypercube=True, shift=0.0, scale=1.0, shuffle=True, random_state=None, comm=None,
                        device="cpu", xp=None, dtype=np.float64):
    """A random n-class problem (Gaussian clusters on hypercube vertices); this rank's shard.

    Parameters are those of :func:`sklearn.datasets.make_classification`
    (``n_samples`` is the global number of rows) plus ``comm``, ``device``,
    ``xp`` and ``dtype`` as in :func:`make_blobs`.  With ``shuffle=True`` rows
    are mixed over the dataset and features permuted (one permutation, the
    same on every rank).

    Returns
    -------
    X : ndarray of shape (n_local_samples, n_features)
    y : ndarray of shape (n_local_samples,), int64
    """
    total = _check_positive_int(n_samples, "n_samples", 0)
    n_features = _check_positive_int(n_features, "n_features")
    n_classes = _check_positive_int(n_classes, "n_classes")
    n_clusters_per_class = _check_positive_int(n_clusters_per_class, "n_clusters_per_class")
    if n_informative + n_redundant + n_repeated > n_features:
        raise ValueError("Number of informative, redundant and repeated features must sum to less than "
                         "the number of total features")
    if n_informative < np.log2(n_classes * n_clusters_per_class):
        raise ValueError(f"n_classes({n_classes}) * n_clusters_per_class({n_clusters_per_class}) must be "
                         f"smaller or equal 2**n_informative({n_informative})={2**n_informative}")
    if weights is not None:
        weights = list(weights)
        if len(weights) not in (n_classes, n_classes - 1):
            raise ValueError("Weights specified but incompatible with number of classes.")
        if len(weights) == n_classes - 1:
            weights.append(1.0 - sum(weights))
    else:
        weights = [1.0 / n_classes] * n_classes
    comm, xp, seed, start, stop = _setup(total, comm, device, xp, random_state)
    params = params_stream(seed)

    n_clusters = n_classes * n_clusters_per_class
    counts = np.array([int(total * weights[k % n_classes] / n_clusters_per_class) for k in range(n_clusters)],
                      dtype=np.int64)
    for i in range(total - int(counts.sum())):
        counts[i % n_clusters] += 1
    centroids = _hypercube_vertices(n_clusters, n_informative, params) * (2 * class_sep) - class_sep
    if not hypercube:
        centroids *= params.uniform((n_clusters, 1))
        centroids *= params.uniform((1, n_informative))
    mixing = 2 * params.uniform((n_clusters, n_informative, n_informative)) - 1
    redundant = 2 * params.uniform((n_informative, n_redundant)) - 1
    n_used = n_informative + n_redundant
    repeat_idx = ((n_used - 1) * params.uniform(n_repeated) + 0.5).astype(np.int64)
    shift_v = (2 * params.uniform(n_features) - 1) * class_sep if shift is None \
        else np.broadcast_to(np.asarray(shift, dtype=np.float64), (n_features,))
    scale_v = 1 + 100 * params.uniform(n_features) if scale is None \
        else np.broadcast_to(np.asarray(scale, dtype=np.float64), (n_features,))
    feature_order = params.permutation(n_features) if shuffle else np.arange(n_features)
    perm = RowPermutation(total, params, shuffle)
    cum = np.cumsum(counts)
    d = {k: as_device(np.ascontiguousarray(v), xp) for k, v in dict(
        centroids=centroids, mixing=mixing, redundant=redundant, repeat=repeat_idx, shift=shift_v,
        scale=scale_v, order=feature_order).items()}

    def block(stream, b0, b1):
        m = b1 - b0
        cluster = groups_of((b0, b1), cum, perm, xp)
        (cluster,) = _shuffle_in_block(stream, (cluster,), shuffle)
        z = stream.normal((m, n_informative))
        informative = xp.einsum("ij,ijk->ik", z, d["mixing"][cluster]) + d["centroids"][cluster]
        X = xp.empty((m, n_features), dtype=xp.float64)
        X[:, :n_informative] = informative
        X[:, n_informative:n_used] = informative @ d["redundant"]
        X[:, n_used:n_used + n_repeated] = X[:, d["repeat"]]
        n_useless = n_features - n_used - n_repeated
        if n_useless:
            X[:, n_features - n_useless:] = stream.normal((m, n_useless))
        y = cluster % n_classes
        if flip_y > 0:
            flip = stream.uniform(m) < flip_y
            y = xp.where(flip, stream.integers(n_classes, m), y)
        X += d["shift"]
        X *= d["scale"]
        X = X[:, d["order"]]
        return X.astype(dtype, copy=False), y.astype(xp.int64, copy=False)

    return generate_rows(total, start, stop, n_features, seed, xp, block)


# ---------------------------------------------------------------------- low rank and regression
def _singular_profile(n, effective_rank, tail_strength):
    i = np.arange(n, dtype=np.float64)
    low_rank = (1 - tail_strength) * np.exp(-1.0 * (i / effective_rank) ** 2)
    tail = tail_strength * np.exp(-0.1 * i / effective_rank)
    return low_rank + tail


def _low_rank_factors(total, n_features, effective_rank, tail_strength, params):
    """Replicated right factor ``S V^T`` (k x n_features) of a low-rank matrix."""
    k = min(total, n_features)
    v, _ = np.linalg.qr(params.normal((n_features, k)))
    s = _singular_profile(k, effective_rank, tail_strength)
    return (s[:, None] * v.T) / np.sqrt(max(total, 1)), k


def make_low_rank_matrix(n_samples=100, n_features=100, *, effective_rank=10, tail_strength=0.5,
                         random_state=None, comm=None, device="cpu", xp=None, dtype=np.float64):
    """A mostly low-rank matrix with bell-shaped singular values; this rank's rows.

    ``X = U diag(s) V^T`` where ``V`` (replicated) has orthonormal columns, the
    singular profile ``s`` follows scikit-learn's, and the rows of ``U`` are
    independent Gaussian vectors scaled by ``1/sqrt(n_samples)``, so the
    columns of ``U`` are orthonormal in expectation (exactly so only as
    ``n_samples`` grows: drawing an exactly orthonormal ``U`` would need the
    whole matrix on one rank).

    Returns
    -------
    X : ndarray of shape (n_local_samples, n_features)
    """
    total = _check_positive_int(n_samples, "n_samples", 0)
    n_features = _check_positive_int(n_features, "n_features")
    comm, xp, seed, start, stop = _setup(total, comm, device, xp, random_state)
    right, k = _low_rank_factors(total, n_features, effective_rank, tail_strength, params_stream(seed))
    d_right = as_device(np.ascontiguousarray(right), xp)

    def block(stream, b0, b1):
        return ((stream.normal((b1 - b0, k)) @ d_right).astype(dtype, copy=False),)

    (X,) = generate_rows(total, start, stop, max(n_features, k), seed, xp, block)
    return X


def make_regression(n_samples=100, n_features=100, *, n_informative=10, n_targets=1, bias=0.0,
                    effective_rank=None, tail_strength=0.5, noise=0.0, shuffle=True, coef=False,
                    random_state=None, comm=None, device="cpu", xp=None, dtype=np.float64):
    """A random linear regression problem; this rank's shard.

    Parameters are those of :func:`sklearn.datasets.make_regression`
    (``n_samples`` global) plus ``comm``, ``device``, ``xp`` and ``dtype``.
    ``shuffle`` permutes the features (rows are independent already).

    Returns
    -------
    X : ndarray of shape (n_local_samples, n_features)
    y : ndarray of shape (n_local_samples,) or (n_local_samples, n_targets)
    coef : ndarray of shape (n_features,) or (n_features, n_targets), replicated
        Only with ``coef=True``.
    """
    total = _check_positive_int(n_samples, "n_samples", 0)
    n_features = _check_positive_int(n_features, "n_features")
    n_targets = _check_positive_int(n_targets, "n_targets")
    n_informative = min(n_features, _check_positive_int(n_informative, "n_informative", 0))
    comm, xp, seed, start, stop = _setup(total, comm, device, xp, random_state)
    params = params_stream(seed)
    ground_truth = np.zeros((n_features, n_targets))
    ground_truth[:n_informative] = 100 * params.uniform((n_informative, n_targets))
    right = k = None
    if effective_rank is not None:
        right, k = _low_rank_factors(total, n_features, effective_rank, tail_strength, params)
    # rows are drawn with the informative features first, then the columns permuted:
    # X[:, j] = X_drawn[:, order[j]], so the returned coefficients are ground_truth[order]
    order = params.permutation(n_features) if shuffle else np.arange(n_features)
    d_truth = as_device(ground_truth, xp)
    d_right = as_device(np.ascontiguousarray(right), xp) if right is not None else None
    d_order = as_device(order, xp)

    def block(stream, b0, b1):
        m = b1 - b0
        if d_right is None:
            X = stream.normal((m, n_features))
        else:
            X = stream.normal((m, k)) @ d_right
        y = X @ d_truth + bias
        if noise > 0.0:
            y += noise * stream.normal(y.shape)
        X = X[:, d_order]
        if n_targets == 1:
            y = y[:, 0]
        return X.astype(dtype, copy=False), y.astype(dtype, copy=False)

    X, y = generate_rows(total, start, stop, max(n_features, k or 0), seed, xp, block)
    if coef:
        c = ground_truth[order]
        c = c[:, 0] if n_targets == 1 else c
        return X, y, c
    return X, y
