"""cupyx.scipy.sparse shards on several ranks (ranks may share a GPU), run by test_gpu_neighbors_sparse.py:
every exchange of the ring (CSR arrays travelling, staged through the host where MPI is not
CUDA-aware) gives the host SciPy result."""

import cupy as cp
import cupyx.scipy.sparse as csp
import numpy as np
import scipy.sparse as sp

from mpiml.comm import get_comm
from mpiml.neighbors import KNeighborsClassifier, NearestNeighbors

from _spmd import assert_close, check, gpu_shards, guarded

comm = get_comm()
rank, size = comm.rank, comm.size
shard = gpu_shards(comm)


def main():
    rs = np.random.RandomState(0)
    X = sp.random(3000, 500, density=0.02, format="csr", random_state=rs)
    Q = sp.random(400, 500, density=0.02, format="csr", random_state=rs)
    y = rs.randint(0, 5, 3000)
    for metric in ("euclidean", "cosine", "manhattan"):
        dh, ih = NearestNeighbors(n_neighbors=10, metric=metric).fit(shard(X)).kneighbors(shard(Q))
        for ex in ("blocking", "overlap", "onesided"):
            nn = NearestNeighbors(n_neighbors=10, metric=metric, exchange=ex).fit(csp.csr_matrix(shard(X)))
            d, i = nn.kneighbors(csp.csr_matrix(shard(Q)))
            check(isinstance(d, cp.ndarray), "distances follow X onto the GPU")
            assert_close(d, dh, f"{metric} {ex} distances", rtol=1e-9, atol=1e-9)
            assert_close(i, ih, f"{metric} {ex} indices", exact=True)
    clf = KNeighborsClassifier(n_neighbors=7, weights="distance").fit(csp.csr_matrix(shard(X)), cp.asarray(shard(y)))
    host = KNeighborsClassifier(n_neighbors=7, weights="distance").fit(shard(X), shard(y))
    assert_close(clf.predict_proba(csp.csr_matrix(shard(Q))), host.predict_proba(shard(Q)), "proba", rtol=1e-9)


guarded(main, comm)
