"""KMeans on cupyx.scipy.sparse shards on several ranks (ranks may share a GPU), run by
test_kmeans_sparse_gpu.py: the fit equals one process's on the whole SciPy CSR matrix."""

import cupy as cp
import cupyx.scipy.sparse as csp
import numpy as np
import scipy.sparse as sp

from mpiml.cluster import KMeans
from mpiml.comm import get_comm

from _spmd import assert_close, check, gpu_shards, guarded

comm = get_comm()
rank, size = comm.rank, comm.size
gpu_shards(comm)  # binds this rank's GPU; the shards here are even (bounds below)


def main():
    rs = np.random.RandomState(0)
    n, d, k = 4000, 600, 6
    centres = sp.random(k, d, density=0.2, random_state=rs, format="csr").toarray() * 4
    X = (sp.csr_matrix(centres[rs.randint(0, k, n)] * (rs.rand(n, d) < 0.5))
         + sp.random(n, d, density=0.02, random_state=rs, format="csr")).tocsr()
    bounds = np.linspace(0, n, size + 1).astype(int)
    mine = X[bounds[rank]:bounds[rank + 1]]
    init = X[:k].toarray()
    ref = KMeans(k, init=init, max_iter=30, comm=get_comm("self")).fit(X)
    km = KMeans(k, init=init, max_iter=30).fit(csp.csr_matrix(mine))
    check(isinstance(km.cluster_centers_, cp.ndarray), "centres on the GPU")
    assert_close(km.cluster_centers_, ref.cluster_centers_, "centres vs one process", rtol=1e-9, atol=1e-9)
    assert_close(km.labels_, ref.labels_[bounds[rank]:bounds[rank + 1]].astype(np.int32), "labels", exact=True)
    check(abs(km.inertia_ - ref.inertia_) <= 1e-9 * ref.inertia_, f"inertia {km.inertia_} vs {ref.inertia_}")
    check(abs(km.score(csp.csr_matrix(mine)) - ref.score(X)) <= 1e-9 * ref.inertia_, "score")
    kp = KMeans(k, init="k-means||", random_state=3, max_iter=30).fit(csp.csr_matrix(mine))
    kr = KMeans(k, init="k-means||", random_state=3, max_iter=30, comm=get_comm("self")).fit(X)
    check(abs(kp.inertia_ - kr.inertia_) <= 0.05 * kr.inertia_, f"k-means|| inertia {kp.inertia_} vs {kr.inertia_}")


guarded(main, comm)
