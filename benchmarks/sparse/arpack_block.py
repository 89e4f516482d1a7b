"""``TruncatedSVD(algorithm="arpack")`` on one GPU: the default block of one vector against blocks of ``k``.

    python3 benchmarks/sparse/arpack_block.py --out OUT.json [--rows 400000] [--features 20000]
        [--density 0.0005] [--components 16] [--repeats 3]

The solver's thick-restart Lanczos makes the fewest products with blocks of one vector (ARPACK's), which is
also the fastest on CPU ranks (docs/decomposition.md); on a GPU a product of one vector costs nearly a block's
launches and reads of ``X``, so both are timed here on the same cupyx CSR matrix of uniform values at random
places (a flat spectrum, the hard case), with ``cupyx.scipy.sparse.linalg.svds`` (thick-restart Lanczos, one
vector a product, on ``X`` directly) as the plain-CuPy peer in the same run.  Best of ``--repeats`` fits after
one warm-up each; the JSON holds the machine, date, command, every time, the products and restarts, and the
singular values' largest relative difference from the default's.
"""

import argparse
import datetime
import json
import socket
import sys
import time

import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--features", type=int, default=20_000)
    p.add_argument("--density", type=float, default=0.0005)
    p.add_argument("--components", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    import cupy as cp
    import cupyx.scipy.sparse as csp
    import cupyx.scipy.sparse.linalg as cspl

    from mpiml.comm import get_comm
    from mpiml.decomposition import TruncatedSVD, _lanczos

    comm = get_comm("self")
    rng = np.random.default_rng(0)
    nnz = int(a.rows * a.features * a.density)
    X = csp.csr_matrix((cp.asarray(rng.random(nnz)), (cp.asarray(rng.integers(0, a.rows, nnz)),
                                                       cp.asarray(rng.integers(0, a.features, nnz)))),
                       shape=(a.rows, a.features))
    X.sum_duplicates()
    k = a.components
    products = []
    plain = _lanczos._matvec

    def counted(A, V, padded=False):
        products[-1] += V.shape[1]
        return plain(A, V, padded)

    _lanczos._matvec = counted

    def timed(fit):
        products.append(0)
        fit()                                           # warm-up (kernels, memory pool)
        times = []
        for _ in range(a.repeats):
            products[-1] = 0
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            out = fit()
            cp.cuda.Device().synchronize()
            times.append(time.perf_counter() - t0)
        return out, times

    rows = {}
    ref = None
    for name, block in (("block 1 (default)", None), (f"block {k}", k)):
        saved = _lanczos._LANCZOS_BLOCK
        if block is not None:
            _lanczos._LANCZOS_BLOCK = block
        try:
            est, times = timed(lambda: TruncatedSVD(k, algorithm="arpack", random_state=0, comm=comm).fit(X))
        finally:
            _lanczos._LANCZOS_BLOCK = saved
        s = cp.asnumpy(est.singular_values_)
        ref = s if ref is None else ref
        rows[name] = {"fit_s": min(times), "times_s": times, "restarts": int(est.n_iter_),
                      "products": products[-1], "rel_to_default": float(np.max(np.abs(s - ref) / ref))}
        print(f"{name}: {min(times):.4f} s, {est.n_iter_} restarts, {products[-1]} products", flush=True)
    _lanczos._matvec = plain
    svds, times = timed(lambda: cspl.svds(X, k=k))
    s = np.sort(cp.asnumpy(svds[1]))[::-1]
    rows["cupyx svds (peer)"] = {"fit_s": min(times), "times_s": times,
                                 "rel_to_default": float(np.max(np.abs(s - ref) / ref))}
    print(f"cupyx svds: {min(times):.4f} s", flush=True)
    doc = {"machine": f"{socket.gethostname()} {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join(["python3"] + sys.argv), "rows": a.rows, "features": a.features, "nnz": int(X.nnz),
           "components": k, "singular_values": ref.tolist(), "fits": rows}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
