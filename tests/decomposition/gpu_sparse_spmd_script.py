"""cupyx CSR (and dense CuPy) shards at N ranks (sharing the GPUs there are) against the one-process host fit.

Run under ``mpiexec -n N`` as a case of test_gpu_sparse_kernels.py's shared launches (tests/_spmd_cases.py):
TruncatedSVD (randomized and arpack, float64 and float32, sparse and dense), PCA "arpack" (implicit centring) and
Ridge "sparse_cg" with an intercept; uneven shards, the last rank empty at 3 and 4 ranks.  Tolerances: docs/decomposition.md and docs/linear_model.md (rounding of
float64 sums in another order; float32 shards to float32 rounding).
"""

import numpy as np
import scipy.sparse as sp

import mpiml
from mpiml.comm import get_comm
from mpiml.decomposition import PCA, TruncatedSVD
from mpiml.linear_model import Ridge

from _spmd import assert_close, guarded, uneven_shard

mpiml.init(device="gpu")
comm = get_comm()
SELF = get_comm("self")


def main():
    import cupy as cp
    import cupyx.scipy.sparse as csp

    rs = np.random.RandomState(0)
    X = sp.random(5000, 800, density=0.02, format="csr", random_state=rs)
    X = sp.csr_matrix(X @ sp.diags(3.0 * 0.97 ** np.arange(800)))
    y = X @ rs.standard_normal(800) + 0.05 * rs.standard_normal(5000)
    skip = comm.size > 2
    mine = csp.csr_matrix(uneven_shard(X, comm.rank, comm.size, skip_last=skip))
    my_y = cp.asarray(uneven_shard(y, comm.rank, comm.size, skip_last=skip))
    for algorithm in ("randomized", "arpack"):
        ref = TruncatedSVD(8, algorithm=algorithm, random_state=0, comm=SELF).fit(X)
        got = TruncatedSVD(8, algorithm=algorithm, random_state=0).fit(mine)
        assert_close(got.singular_values_, ref.singular_values_, f"TruncatedSVD {algorithm} singular values",
                     rtol=1e-8)
        assert_close(got.components_, ref.components_, f"TruncatedSVD {algorithm} components", rtol=1e-6,
                     atol=1e-8)
        assert_close(got.explained_variance_ratio_, ref.explained_variance_ratio_,
                     f"TruncatedSVD {algorithm} variance ratios", rtol=1e-8)
    ref = TruncatedSVD(8, random_state=0, comm=SELF).fit(X.astype(np.float32))
    got = TruncatedSVD(8, random_state=0).fit(mine.astype(cp.float32))
    assert_close(got.singular_values_, ref.singular_values_, "TruncatedSVD float32 singular values", rtol=1e-4)
    ref = PCA(6, svd_solver="arpack", random_state=0, comm=SELF).fit(X)
    got = PCA(6, svd_solver="arpack", random_state=0).fit(mine)
    assert_close(got.components_, ref.components_, "sparse PCA arpack components", rtol=1e-6, atol=1e-8)
    assert_close(got.explained_variance_, ref.explained_variance_, "sparse PCA variances", rtol=1e-8)
    # dense CuPy shards (the batched Xᵀ U, the one-read variances) against the host fit of the same rows
    D = rs.standard_normal((20000, 40)) @ np.diag(np.linspace(3, 0.1, 40)) + np.linspace(0, 50, 40)
    mine_d = cp.asarray(uneven_shard(D, comm.rank, comm.size, skip_last=skip))
    for algorithm in ("randomized", "arpack"):
        ref = TruncatedSVD(5, algorithm=algorithm, random_state=0, comm=SELF).fit(D)
        got = TruncatedSVD(5, algorithm=algorithm, random_state=0).fit(mine_d)
        assert_close(got.singular_values_, ref.singular_values_, f"dense TruncatedSVD {algorithm}", rtol=1e-8)
        assert_close(got.components_, ref.components_, f"dense TruncatedSVD {algorithm} components", rtol=1e-6,
                     atol=1e-8)
        assert_close(got.explained_variance_ratio_, ref.explained_variance_ratio_,
                     f"dense TruncatedSVD {algorithm} variance ratios", rtol=1e-8)
    ref = Ridge(alpha=1.0, solver="sparse_cg", tol=1e-10, comm=SELF).fit(X, y)
    got = Ridge(alpha=1.0, solver="sparse_cg", tol=1e-10).fit(mine, my_y)
    assert_close(cp.asnumpy(got.coef_), ref.coef_, "sparse Ridge coef", rtol=1e-6, atol=1e-8)


if __name__ == "__main__":   # (else a case of test_gpu_sparse_kernels.py's shared launches)
    guarded(main, comm)
