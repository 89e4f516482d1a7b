"""Multi-rank KMeans checks, run under ``mpiexec -n N`` by test_kmeans_mpi.py.

Every rank builds the same global dataset, keeps an uneven shard of it, and
compares the SPMD estimator with scikit-learn (and with mpiml on one process)
fitted on the whole data.  Verdicts are collective (tests/_spmd.py).

Usage: kmeans_spmd_script.py OUTDIR
"""

import os
import sys
import warnings

import numpy as np
from sklearn.cluster import KMeans as SkKMeans
from sklearn.datasets import make_blobs

import mpiml
from mpiml import DistributedInputError
from mpiml.cluster import KMeans
from mpiml.comm import get_comm

from _spmd import assert_close, check, guarded

comm = get_comm()
SELF = get_comm("self")
rank, size = comm.rank, comm.size
OUT = sys.argv[1] if len(sys.argv) > 1 else None


def shard(a):
    """Uneven contiguous split: rank r holds a share proportional to r + 1."""
    n = a.shape[0]
    w = np.arange(1, size + 1, dtype=np.float64)
    bounds = np.concatenate([[0], np.round(np.cumsum(w) / w.sum() * n).astype(int)])
    return a[bounds[rank]:bounds[rank + 1]]


def gathered(a):
    return comm.allgatherv(np.ascontiguousarray(a)) if size > 1 else a


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-300)


def main():
    X, _ = make_blobs(n_samples=3000, n_features=5, centers=6, cluster_std=0.8, random_state=42)
    Xl = shard(X)
    rs = np.random.RandomState(7)
    init = X[rs.choice(len(X), 6, replace=False)]

    # 1. same initial centres -> same labels and inertia as scikit-learn (float64)
    km = KMeans(6, init=init, max_iter=300, tol=1e-4).fit(Xl)
    sk = SkKMeans(6, init=init, n_init=1, max_iter=300, tol=1e-4).fit(X)
    check(np.array_equal(gathered(km.labels_), sk.labels_), "labels differ from scikit-learn (init=array)")
    check(rel(km.inertia_, sk.inertia_) < 1e-6, f"inertia {km.inertia_} vs scikit-learn {sk.inertia_}")
    assert_close(km.cluster_centers_, sk.cluster_centers_, "centres vs scikit-learn", rtol=1e-6, atol=1e-9)
    check(km.n_iter_ == sk.n_iter_, f"n_iter {km.n_iter_} vs scikit-learn {sk.n_iter_}")
    check(km.labels_.shape == (Xl.shape[0],), "labels_ are the local rows' labels")

    # 2. sample weights, same init
    w = np.random.RandomState(3).uniform(0.5, 2.0, size=len(X))
    kmw = KMeans(6, init=init).fit(Xl, sample_weight=shard(w))
    skw = SkKMeans(6, init=init, n_init=1).fit(X, sample_weight=w)
    check(np.array_equal(gathered(kmw.labels_), skw.labels_), "weighted labels differ from scikit-learn")
    check(rel(kmw.inertia_, skw.inertia_) < 1e-6, f"weighted inertia {kmw.inertia_} vs {skw.inertia_}")

    # 3. an empty cluster is relocated like scikit-learn does (one far-away centre)
    init_e = init.copy()
    init_e[0] = 1e3
    kme = KMeans(6, init=init_e, max_iter=50).fit(Xl)
    ske = SkKMeans(6, init=init_e, n_init=1, max_iter=50).fit(X)
    check(rel(kme.inertia_, ske.inertia_) < 1e-6, f"empty-cluster inertia {kme.inertia_} vs {ske.inertia_}")
    check(np.array_equal(gathered(kme.labels_), ske.labels_), "empty-cluster labels differ")

    # 4. k-means|| within 1% of scikit-learn's best of n_init
    best = SkKMeans(6, n_init=10, random_state=0).fit(X).inertia_
    for init_name in ("k-means||", "k-means++"):
        kp = KMeans(6, init=init_name, random_state=0).fit(Xl)
        check(kp.inertia_ <= best * 1.01, f"{init_name} inertia {kp.inertia_} > 1.01 x scikit-learn {best}")

    # 5. results do not depend on the number of ranks (reference: one process, same seed)
    for init_name in ("k-means||", "k-means++", "random"):
        for dtype, tol in ((np.float64, 1e-10), (np.float32, 1e-5)):
            Xd = X.astype(dtype)
            ref = KMeans(6, init=init_name, n_init=2, random_state=5, comm=SELF).fit(Xd)
            got = KMeans(6, init=init_name, n_init=2, random_state=5).fit(shard(Xd))
            check(got.cluster_centers_.dtype == dtype, f"centres dtype {got.cluster_centers_.dtype}")
            assert_close(got.cluster_centers_, ref.cluster_centers_, f"{init_name} {dtype.__name__} centres "
                         "vs one process", rtol=tol, atol=tol)
            check(np.array_equal(gathered(got.labels_), ref.labels_), f"{init_name} {dtype.__name__} labels "
                  "vs one process")
            check(rel(got.inertia_, ref.inertia_) < tol, f"{init_name} inertia {got.inertia_} vs {ref.inertia_}")

    # 6. predict / transform are local; score is global
    check(np.array_equal(km.predict(Xl), km.labels_), "predict(X) != labels_")
    assert_close(km.transform(Xl), sk.transform(shard(X)), "transform vs scikit-learn", rtol=1e-6, atol=1e-9)
    check(rel(-km.score(Xl), sk.inertia_) < 1e-6, f"score {km.score(Xl)} vs -{sk.inertia_}")

    # 7. partial_fit: the same centres as one process fed the same global batches
    ref = KMeans(6, random_state=1, comm=SELF)
    got = KMeans(6, random_state=1)
    for b in range(3):
        batch = X[b * 1000:(b + 1) * 1000]
        ref.partial_fit(batch)
        got.partial_fit(shard(batch))
    assert_close(got.cluster_centers_, ref.cluster_centers_, "partial_fit centres vs one process", rtol=1e-10,
                 atol=1e-10)
    check(got.n_steps_ == 3, f"n_steps_ {got.n_steps_}")
    check(rel(got.inertia_, ref.inertia_) < 1e-8, "partial_fit batch inertia vs one process")

    # 8. bad input raises the same error on every rank, no hang
    bad = Xl.copy()
    if rank == size - 1 and len(bad):
        bad[0, 0] = np.nan
    try:
        KMeans(6, random_state=0).fit(bad)
        check(False, "NaN on one rank did not raise")
    except (DistributedInputError, ValueError) as exc:
        check("NaN" in str(exc), f"NaN message: {exc}")
    narrow = Xl[:, :4] if rank == 0 else Xl
    try:
        KMeans(6, random_state=0).fit(narrow)
        check(size == 1, "feature mismatch did not raise")
    except (DistributedInputError, ValueError) as exc:
        check(size > 1 and "features" in str(exc), f"feature message: {exc}")
    try:
        KMeans(0).fit(Xl)
        check(False, "n_clusters=0 did not raise")
    except ValueError as exc:
        check("n_clusters" in str(exc), f"param message: {exc}")
    try:
        KMeans(4000).fit(Xl)
        check(False, "n_clusters > n_samples did not raise")
    except ValueError as exc:
        check("n_samples=3000" in str(exc), f"n_samples message: {exc}")
    comm.barrier()

    # 8b. sparse CSR rows: the same model as dense rows (never densified), scikit-learn's result
    import scipy.sparse as sp

    Xs = X.copy()
    Xs[np.abs(Xs) < 1.0] = 0.0  # about half the entries zero
    Xs_l = sp.csr_matrix(shard(Xs))
    kms = KMeans(6, init=init, max_iter=300).fit(Xs_l)
    kmd = KMeans(6, init=init, max_iter=300).fit(shard(Xs))
    sks = SkKMeans(6, init=init, n_init=1, max_iter=300).fit(sp.csr_matrix(Xs))
    check(np.array_equal(gathered(kms.labels_), sks.labels_), "sparse labels differ from scikit-learn")
    check(rel(kms.inertia_, sks.inertia_) < 1e-6, f"sparse inertia {kms.inertia_} vs scikit-learn {sks.inertia_}")
    assert_close(kms.cluster_centers_, kmd.cluster_centers_, "sparse vs dense centres", rtol=1e-6, atol=1e-9)
    check(np.array_equal(kms.predict(Xs_l), kmd.predict(shard(Xs))), "sparse vs dense predict")
    assert_close(kms.transform(Xs_l), kmd.transform(shard(Xs)), "sparse vs dense transform", rtol=1e-6, atol=1e-9)
    check(rel(kms.score(Xs_l), kmd.score(shard(Xs))) < 1e-6, "sparse vs dense score")
    for init_name in ("k-means||", "k-means++", "random"):
        ref = KMeans(6, init=init_name, random_state=5, comm=SELF).fit(sp.csr_matrix(Xs))
        got = KMeans(6, init=init_name, random_state=5).fit(Xs_l)
        assert_close(got.cluster_centers_, ref.cluster_centers_, f"sparse {init_name} centres vs one process",
                     rtol=1e-9, atol=1e-9)

    # 9. model file written on N ranks (read back by the test in one process)
    if OUT:
        path = os.path.join(OUT, "kmeans.mpiml")
        mpiml.save(km, path)  # collective: rank 0 writes
        labels = gathered(km.labels_)
        if rank == 0:
            np.save(os.path.join(OUT, "labels.npy"), labels)
            np.save(os.path.join(OUT, "X.npy"), X)
        comm.barrier()
    check_node_step()


def check_node_step():
    """The Lloyd steps over the node's rows (the ranks' threads sharing its parts) against each rank stepping over
    its own rows and an allreduce: the same labels and centres (sums grouped otherwise: within rounding), with
    weights, empty clusters (their relocation reads the distances in node memory) and float32."""
    from mpiml.cluster import _kmeans_node

    X, _ = make_blobs(n_samples=2500, n_features=4, centers=5, cluster_std=1.0, random_state=3)
    w = np.random.RandomState(1).uniform(0.5, 2.0, X.shape[0])
    init = np.vstack([X[:4], X[:1] + 100.0])         # a far centre: an empty cluster at the first step
    for dtype, weight in ((np.float64, None), (np.float64, w), (np.float32, None)):
        fits = {}
        for mode in ("0", "1"):
            os.environ["MPIML_KMEANS_NODE"] = mode
            km = KMeans(5, init=init.astype(dtype), n_init=1, max_iter=30, tol=0.0, random_state=0)
            km.fit(shard(X.astype(dtype)), sample_weight=None if weight is None else shard(weight))
            fits[mode] = km
            check(_kmeans_node.LAST["node"] == (mode == "1" and size > 1),
                  f"node step used: {_kmeans_node.LAST} (MPIML_KMEANS_NODE={mode})")
        os.environ.pop("MPIML_KMEANS_NODE")
        a, b = fits["0"], fits["1"]
        what = f"node step {np.dtype(dtype).name} weights={weight is not None}"
        check(np.array_equal(a.labels_, b.labels_), f"{what}: labels differ")
        tol = 1e-4 if dtype == np.float32 else 1e-9
        assert_close(b.cluster_centers_, a.cluster_centers_, f"{what}: centres", rtol=tol, atol=tol)
        check(a.n_iter_ == b.n_iter_ and rel(b.inertia_, a.inertia_) < tol, f"{what}: {a.n_iter_} {b.n_iter_} "
              f"iterations, inertia {a.inertia_} {b.inertia_}")
    # every rank stepping (MPIML_OVERSUBSCRIBED=compute) against only one rank a core (on a 2-core machine, 3 and 4
    # ranks leave ranks that sleep through the iterations, and the workers relocate the empty cluster): the same bits
    os.environ["MPIML_OVERSUBSCRIBED"] = "compute"
    try:
        every = KMeans(5, init=init.astype(np.float32), n_init=1, max_iter=30, tol=0.0, random_state=0)
        every.fit(shard(X.astype(np.float32)))
    finally:
        del os.environ["MPIML_OVERSUBSCRIBED"]
    check(np.array_equal(every.cluster_centers_, b.cluster_centers_) and np.array_equal(every.labels_, b.labels_)
          and every.n_iter_ == b.n_iter_ and every.inertia_ == b.inertia_,
          "every rank stepping differs from one rank a core stepping")
    # a refit of the same shapes steps on the windows kept from the fit before: the same bits
    again = KMeans(5, init=init.astype(np.float32), n_init=1, max_iter=30, tol=0.0, random_state=0)
    again.fit(shard(X.astype(np.float32)))
    check(_kmeans_node.LAST["reused"] == (size > 1), f"kept windows reused: {_kmeans_node.LAST}")
    check(np.array_equal(again.cluster_centers_, b.cluster_centers_) and np.array_equal(again.labels_, b.labels_),
          "a refit on kept windows differs")
    # the partials added by the ranks together (each its share of the entries) or by each alone: the same bits
    split, _kmeans_node._SPLIT_SUM = _kmeans_node._SPLIT_SUM, 0
    try:
        shared = KMeans(5, init=init.astype(np.float32), n_init=1, max_iter=30, tol=0.0, random_state=0)
        shared.fit(shard(X.astype(np.float32)))
    finally:
        _kmeans_node._SPLIT_SUM = split
    check(np.array_equal(shared.cluster_centers_, b.cluster_centers_) and shared.inertia_ == b.inertia_,
          "partials added by the ranks together differ from each rank's own sum")
    # no room in the node's shared memory (agreed): the per-rank steps
    from mpiml.utils import _node_memory

    room, _node_memory.room_for = _node_memory.room_for, lambda nbytes: False
    try:
        small = KMeans(5, init=init[:, :3], n_init=1, max_iter=5, tol=0.0, random_state=0).fit(shard(X[:, :3]))
    finally:
        _node_memory.room_for = room
    check(not _kmeans_node.LAST["node"] and small.n_iter_ == 5, f"no room, yet node steps: {_kmeans_node.LAST}")


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    guarded(main, comm)
