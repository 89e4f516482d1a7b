"""Seed 000's hyperparameter search, on a Higgs-shaped synthetic set (client script of ``mpiml dask``).

    mpiexec -n 4 python -m mpiml.dask benchmarks/dask/hpo_higgs.py --out benchmarks/results/hpo_higgs_vm.json
    # the full size of the study: --n-samples 11000000 (GPU host: add --device gpu)

The study (seed 000, Listing 2) tuned k-means on the Higgs boson set (11·10^6
rows x 28 features, binary label) with dask-ml's HyperbandSearchCV:
``n_clusters`` in 1..99, ``oversampling_factor`` in 1..4, ``tol`` log-uniform
in [1e-5, 1e-3], ``max_iter=100``, ``aggressiveness=3``, ``random_state=123``.
The real file cannot be downloaded here, so the rows are drawn to its shape:
21 "low-level" features (7 momentum-like log-normal, 7 pseudo-rapidity-like
normal, 7 azimuth-like uniform) and 7 "high-level" ones derived from them
(mass-like combinations), a label that is 1 for 53 % of the rows and shifts
the distributions slightly. Each block is drawn from its own seed on the
worker that holds it.

Steps and what is reported (JSON, and a table on the terminal):

1. ``mpiml.dask.model_selection.HyperbandSearchCV`` with the study's space,
   over ``mpiml.cluster.KMeans.partial_fit`` (one model per task on the
   workers, size-1 communicator); score = ``KMeans.score`` (minus the
   inertia of the held-out rows), as in the study;
2. the best parameters refitted by ``mpiml.dask.cluster.KMeans`` across all
   workers (SPMD), on all training rows;
3. both models' cluster-purity accuracy on the held-out rows (each cluster
   predicts the majority label of its training rows): the "accuracy is kept
   at scale" check of the study.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np


def higgs_block(seed, rows, dtype=np.float32):
    """``rows`` Higgs-shaped rows and labels from one seed: ``(X, y)`` with 28 features."""
    rng = np.random.default_rng(seed)
    y = (rng.random(rows) < 0.53).astype(np.int64)
    s = y[:, None]
    pt = rng.lognormal(mean=0.0 + 0.25 * s, sigma=0.55, size=(rows, 7))
    eta = rng.normal(0.0, 1.0 - 0.12 * s, size=(rows, 7))
    phi = rng.uniform(-np.pi, np.pi, size=(rows, 7))
    px, py, pz = pt * np.cos(phi), pt * np.sin(phi), pt * np.sinh(eta)
    e = np.sqrt(px**2 + py**2 + pz**2)
    pairs = [(0, 1), (0, 2), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6)]
    mass = np.stack([np.sqrt(np.maximum((e[:, a] + e[:, b]) ** 2 - (px[:, a] + px[:, b]) ** 2
                                        - (py[:, a] + py[:, b]) ** 2 - (pz[:, a] + pz[:, b]) ** 2, 0.0))
                     for a, b in pairs], axis=1)
    mass *= 1.0 + 0.2 * s
    X = np.concatenate([pt, eta, phi, np.log1p(mass)], axis=1).astype(dtype)
    return X, y


def _block_x(seed, rows, device):
    X = higgs_block(seed, rows)[0]
    if device == "gpu":
        import cupy

        return cupy.asarray(X)
    return X


def _block_y(seed, rows):
    return higgs_block(seed, rows)[1]


def make_higgs(n_samples, block_rows, seed, device):
    """Dask arrays ``X`` (n x 28, float32) and ``y``; block i drawn from seed + i on its worker."""
    import dask
    import dask.array as da

    sizes = [block_rows] * (n_samples // block_rows) + ([n_samples % block_rows] if n_samples % block_rows else [])
    meta = np.empty((0, 28), np.float32)
    if device == "gpu":
        import cupy

        meta = cupy.empty((0, 28), cupy.float32)
    xs = [da.from_delayed(dask.delayed(_block_x)(seed + i, r, device), shape=(r, 28), dtype=np.float32, meta=meta)
          for i, r in enumerate(sizes)]
    ys = [da.from_delayed(dask.delayed(_block_y)(seed + i, r), shape=(r,), dtype=np.int64)
          for i, r in enumerate(sizes)]
    return da.concatenate(xs), da.concatenate(ys)


def purity_accuracy(train_labels, y_train, test_labels, y_test, n_clusters):
    """Accuracy when each cluster predicts the majority label of its training rows."""
    ones = np.bincount(train_labels, weights=y_train, minlength=n_clusters)
    counts = np.bincount(train_labels, minlength=n_clusters)
    majority = (ones * 2 > counts).astype(np.int64)
    return float((majority[test_labels] == y_test).mean())


def to_host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-samples", type=int, default=200_000, help="rows (the study: 11000000)")
    parser.add_argument("--block-rows", type=int, default=25_000, help="rows per block (one partial_fit call)")
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--aggressiveness", type=int, default=3)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--seed", type=int, default=123)
    parser.add_argument("--out", default=None, help="JSON file for the results")
    args = parser.parse_args(argv)

    from scipy.stats import loguniform

    from mpiml.cluster import KMeans
    from mpiml.dask import get_client, worker_addresses
    from mpiml.dask.cluster import KMeans as DaskKMeans
    from mpiml.dask.model_selection import HyperbandSearchCV

    client = get_client()
    workers = worker_addresses(client)
    X, y = make_higgs(args.n_samples, args.block_rows, args.seed, args.device)
    X, y = client.persist([X, y])
    t0 = time.perf_counter()
    params = {"n_clusters": list(range(1, 100)), "oversampling_factor": list(range(1, 5)),
              "tol": loguniform(1e-5, 1e-3)}
    model = KMeans(init="k-means||", n_clusters=5, random_state=123, oversampling_factor=3)
    search = HyperbandSearchCV(model, params, max_iter=args.max_iter, aggressiveness=args.aggressiveness,
                               random_state=123)
    search.fit(X, y)
    search_seconds = time.perf_counter() - t0

    # refit the winner across all workers (SPMD) on every row; held-out rows: a fresh draw
    best = search.best_params_
    t1 = time.perf_counter()
    spmd = DaskKMeans(init="k-means||", random_state=123, max_iter=args.max_iter, **best).fit(X)
    refit_seconds = time.perf_counter() - t1
    X_test, y_test = make_higgs(max(args.n_samples // 10, 1000), args.block_rows, args.seed + 10**6, args.device)
    k = best["n_clusters"]
    y_train = to_host(y.compute())
    acc = {}
    for name, est in (("hyperband_best", DaskKMeans.from_spmd_estimator(search.best_estimator_)),
                      ("spmd_refit", spmd)):
        train_labels = to_host(est.predict(X).compute())
        test_labels = to_host(est.predict(X_test).compute())
        acc[name] = purity_accuracy(train_labels, y_train, test_labels, to_host(y_test.compute()), k)

    result = {
        "benchmark": "hpo_higgs",
        "what": "seed 000 Listing 2: HyperbandSearchCV over KMeans on a Higgs-shaped synthetic set",
        "n_samples": args.n_samples, "n_features": 28, "block_rows": args.block_rows,
        "n_workers": len(workers), "device": args.device,
        "max_iter": args.max_iter, "aggressiveness": args.aggressiveness,
        "n_models": search.metadata_["n_models"], "partial_fit_calls": search.metadata_["partial_fit_calls"],
        "search_seconds": search_seconds, "best_params": {k_: (float(v) if isinstance(v, np.floating) else v)
                                                          for k_, v in best.items()},
        "best_score": search.best_score_,
        "refit_seconds": refit_seconds, "refit_n_iter": int(spmd.n_iter_), "refit_inertia": float(spmd.inertia_),
        "purity_accuracy": acc, "majority_class_rate": float(max(y_train.mean(), 1 - y_train.mean())),
        "machine": platform.node(), "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    print(f"{'rows':>10} {'workers':>7} {'models':>6} {'calls':>6} {'search s':>8} {'best k':>6} "
          f"{'refit s':>7} {'acc best':>8} {'acc refit':>9}")
    print(f"{args.n_samples:>10} {len(workers):>7} {result['n_models']:>6} {result['partial_fit_calls']:>6} "
          f"{search_seconds:>8.1f} {k:>6} {refit_seconds:>7.2f} {acc['hyperband_best']:>8.3f} "
          f"{acc['spmd_refit']:>9.3f}", flush=True)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
