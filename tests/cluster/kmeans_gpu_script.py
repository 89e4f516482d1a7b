"""Multi-rank KMeans on CuPy shards (one GPU per rank), run by test_gpu_kmeans.py.

Compares with scikit-learn on the gathered data and with the NumPy path.
"""

import warnings

import cupy as cp
import numpy as np
from sklearn.cluster import KMeans as SkKMeans
from sklearn.datasets import make_blobs

from mpiml.cluster import KMeans
from mpiml.comm import get_comm

from _spmd import assert_close, check, gpu_shards, guarded

comm = get_comm()
SELF = get_comm("self")
rank, size = comm.rank, comm.size
shard = gpu_shards(comm)


def gathered(a):
    a = a.get() if isinstance(a, cp.ndarray) else a
    return comm.allgatherv(np.ascontiguousarray(a)) if size > 1 else a


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-300)


def main():
    X, _ = make_blobs(n_samples=20000, n_features=24, centers=40, cluster_std=1.5, random_state=3)
    init = X[np.random.RandomState(1).choice(len(X), 40, replace=False)]
    sk = SkKMeans(40, init=init, n_init=1).fit(X)
    km = KMeans(40, init=init).fit(cp.asarray(shard(X)))
    check(isinstance(km.cluster_centers_, cp.ndarray) and isinstance(km.labels_, cp.ndarray), "outputs follow X")
    check(np.array_equal(gathered(km.labels_), sk.labels_), "GPU float64 labels vs scikit-learn")
    check(rel(km.inertia_, sk.inertia_) < 1e-6, f"GPU float64 inertia {km.inertia_} vs {sk.inertia_}")
    check(km.n_iter_ == sk.n_iter_, f"n_iter {km.n_iter_} vs {sk.n_iter_}")
    assert_close(km.cluster_centers_, sk.cluster_centers_, "GPU float64 centres", rtol=1e-6, atol=1e-8)

    X32 = X.astype(np.float32)
    sk32 = SkKMeans(40, init=init.astype(np.float32), n_init=1).fit(X32)
    km32 = KMeans(40, init=init).fit(cp.asarray(shard(X32)))
    check(km32.cluster_centers_.dtype == cp.float32, "float32 preserved")
    agree = float((gathered(km32.labels_) == sk32.labels_).mean())
    check(agree > 0.999, f"GPU float32 labels agree with scikit-learn on {agree:.5f} of rows")
    check(rel(km32.inertia_, sk32.inertia_) < 1e-4, f"GPU float32 inertia {km32.inertia_} vs {sk32.inertia_}")

    best = SkKMeans(40, n_init=3, random_state=0).fit(X32).inertia_
    for init_name in ("k-means||", "k-means++"):
        kp = KMeans(40, init=init_name, n_init=1 if init_name == "k-means||" else 3,
                    random_state=0).fit(cp.asarray(shard(X32)))
        check(kp.inertia_ <= best * 1.01, f"GPU {init_name} inertia {kp.inertia_} vs scikit-learn {best}")
        ref = KMeans(40, init=init_name, n_init=1 if init_name == "k-means||" else 3, random_state=0, comm=SELF).fit(cp.asarray(X32))
        assert_close(kp.cluster_centers_, ref.cluster_centers_.get(), f"GPU {init_name} vs one GPU", rtol=1e-4, atol=1e-4)

    # predict / transform / score on the device; same as the host model
    Xl = cp.asarray(shard(X))
    check(bool((km.predict(Xl) == km.labels_).all()), "predict == labels_")
    host = KMeans(40, init=init).fit(shard(X)) if size == 1 else None
    if host is not None:
        assert_close(km.transform(Xl).get(), host.transform(shard(X)), "GPU transform vs host", rtol=1e-6, atol=1e-8)
    check(rel(-km.score(Xl), sk.inertia_) < 1e-6, "GPU score")

    # an empty cluster relocated on the device like scikit-learn does
    init_e = init.copy()
    init_e[0] = 1e3
    ke = KMeans(40, init=init_e, max_iter=30).fit(cp.asarray(shard(X)))
    se = SkKMeans(40, init=init_e, n_init=1, max_iter=30).fit(X)
    check(rel(ke.inertia_, se.inertia_) < 1e-6, f"GPU empty-cluster inertia {ke.inertia_} vs {se.inertia_}")

    # the host's Lloyd loop (centres updated on the host, no step queued ahead) against the device's loop, the
    # default for dense GPU rows: the same fits, bit for bit; also 16 x 16 float32 (the small kernel's
    # tensor-core form, its centres packed on the device)
    from mpiml.cluster import _kmeans

    def host_loop(*args, data=X, **kwargs):
        _kmeans._DEVICE_LOOP = False
        try:
            return KMeans(*args, **kwargs).fit(cp.asarray(shard(data)))
        finally:
            _kmeans._DEVICE_LOOP = True

    def same(a, b):
        return (bool((a.cluster_centers_ == b.cluster_centers_).all()) and bool((a.labels_ == b.labels_).all())
                and a.inertia_ == b.inertia_ and a.n_iter_ == b.n_iter_)

    check(same(host_loop(40, init=init), km), "host loop vs device loop: the same fit")
    check(same(host_loop(40, init=init_e, max_iter=30), ke), "host loop vs device loop with an empty cluster")
    Xs = np.ascontiguousarray(X32[:, :16])
    ks = KMeans(16, init=Xs[:16], max_iter=50).fit(cp.asarray(shard(Xs)))
    check(same(host_loop(16, init=Xs[:16], max_iter=50, data=Xs), ks) and ks.n_iter_ > 1,
          "host loop vs device loop, 16 x 16 float32: the same fit")

    # partial_fit on the device
    pf = KMeans(40, random_state=0)
    for b in range(4):
        pf.partial_fit(cp.asarray(shard(X32[b * 5000:(b + 1) * 5000])))
    check(isinstance(pf.cluster_centers_, cp.ndarray) and pf.n_steps_ == 4, "GPU partial_fit")


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    guarded(main, comm)
