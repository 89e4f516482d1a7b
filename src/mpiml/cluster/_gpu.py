"""k-means on CuPy shards through the fused distance kernels (:mod:`mpiml.kernels.kmeans`).

Thin adapters from the estimator's conventions (shifted centres, the packed
``[sums | weights | inertia | changed]`` vector) to the kernel family.  Nothing
compiles at import; the kernels compile on first use, memoized per device.
"""

__all__ = ["lloyd_step", "lloyd_update", "assign", "euclidean_distances", "kernel_plan"]


def kernel_plan(dtype, k, d, accumulate=True):
    """What one Lloyd (or assign) launch would use (see :func:`mpiml.kernels.kmeans.kernel_plan`)."""
    from ..kernels import kmeans

    return kmeans.kernel_plan(dtype, k, d, mode="lloyd" if accumulate else "assign")


def lloyd_step(X, sample_weight, shift, C, labels, mind):
    """GPU version of :func:`mpiml.cluster._kmeans_ops.lloyd_step` (one fused kernel + a small reduction)."""
    from ..kernels import kmeans

    return kmeans.lloyd_step_packed(X, C, sample_weight, shift=shift, labels=labels, mind=mind)


def assign(X, shift, C):
    """Labels (int32) and squared distances of every row to its nearest centre."""
    from ..kernels import kmeans

    return kmeans.argmin_sqeuclidean(X, C, shift=shift)


def euclidean_distances(X, shift, C):
    """(n, k) Euclidean distances of the rows of ``X`` (shifted) to the shifted centres ``C``."""
    from ..kernels import kmeans

    return kmeans.pairwise_distances(X, C, metric="euclidean", shift=shift, y_shifted=True)


def lloyd_update(packed, C, tail=None):
    """``(new centres, [inertia, changed, squared shift, empty clusters])`` from a step's summed totals, on the
    device (see :func:`mpiml.kernels.kmeans.lloyd_update`)."""
    from ..kernels import kmeans

    return kmeans.lloyd_update(packed, C, tail=tail)
