"""A rank with no rows (rank 1), at query time only (``query``) or at fit time as well (``fit``): every
family's local methods and score, run under mpiexec by test_io_empty_shards.py.

Usage: empty_shards_spmd_script.py query|fit
"""

import sys
import numpy as np
from sklearn.metrics import accuracy_score, r2_score
from _spmd import check, guarded
from mpiml.comm import get_comm
from mpiml.cluster import KMeans
from mpiml.linear_model import LinearRegression, Ridge, LogisticRegression
from mpiml.decomposition import PCA, TruncatedSVD
from mpiml.neighbors import NearestNeighbors, KNeighborsClassifier, KNeighborsRegressor
from mpiml.ensemble import RandomForestClassifier, RandomForestRegressor

comm = get_comm()
EMPTY = 1  # this rank holds no rows to query


def estimators():
    return [
        (KMeans(n_clusters=3, n_init=1, random_state=0), None),
        (LinearRegression(), "reg"), (Ridge(alpha=0.5), "reg"), (LogisticRegression(), "clf"),
        (PCA(n_components=2, random_state=0), None), (TruncatedSVD(n_components=2, random_state=0), None),
        (NearestNeighbors(n_neighbors=3), None),
        (KNeighborsClassifier(n_neighbors=3), "clf"), (KNeighborsRegressor(n_neighbors=3), "reg"),
        (RandomForestClassifier(n_estimators=4, max_depth=4, random_state=0), "clf"),
        (RandomForestRegressor(n_estimators=4, max_depth=4, random_state=0), "reg"),
    ]


def gathered(a):
    parts = comm.allgather_obj(np.asarray(a))
    return np.concatenate([p for p in parts if p.shape[0]])


def main(when):
    empty_at_fit = when == "fit"
    rng = np.random.default_rng(comm.rank)
    X = rng.normal(size=(30, 4))
    targets = {"reg": X @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1 * rng.normal(size=30),
               "clf": (X[:, 0] + X[:, 1] > 0).astype(np.int64), None: None}
    mine = comm.rank == EMPTY
    for est, kind in estimators():
        name = type(est).__name__
        y = targets[kind]
        Xfit, yfit = (X[:0], None if y is None else y[:0]) if (mine and empty_at_fit) else (X, y)
        est.fit(Xfit, yfit) if kind else est.fit(Xfit)
        Xq, yq = (X[:0], None if y is None else y[:0]) if mine else (X, y)
        for method in ("predict", "predict_proba", "decision_function", "transform", "kneighbors",
                       "score_samples"):
            if not hasattr(est, method):
                continue
            try:
                out = getattr(est, method)(Xq)
                outs = out if isinstance(out, tuple) else (out,)
                got = [(tuple(o.shape[1:]), str(o.dtype)) for o in outs]
                check(all(o.shape[0] == Xq.shape[0] for o in outs),
                      f"{name}.{method} on rank {comm.rank}: {[o.shape for o in outs]} for {Xq.shape[0]} rows")
            except Exception as exc:
                got = f"{type(exc).__name__}: {exc}"
            every = comm.allgather_obj(got)
            check(all(g == every[0] and not isinstance(g, str) for g in every),
                  f"{name}.{method}: (trailing shape, dtype) per rank: {every}")
        if not hasattr(est, "score"):  # TruncatedSVD, NearestNeighbors
            continue
        score = est.score(Xq, yq) if kind else est.score(Xq)
        scores = comm.allgather_obj(float(score))
        check(len(set(scores)) == 1, f"{name}.score differs across ranks: {scores}")
        if kind == "clf":
            want = accuracy_score(gathered(yq), gathered(est.predict(Xq)))
        elif kind == "reg":
            want = r2_score(gathered(yq), gathered(est.predict(Xq)))
        elif isinstance(est, KMeans):
            want = -float(np.sum(gathered(est.transform(Xq)).min(axis=1) ** 2))
        elif isinstance(est, PCA):
            want = float(np.mean(gathered(est.score_samples(Xq))))
        else:
            raise AssertionError(f"no reference score for {name}")
        check(np.isclose(score, want, rtol=1e-6, atol=1e-9), f"{name}.score {score} != {want} on the gathered rows")


if __name__ == "__main__":
    guarded(lambda: main(sys.argv[1]), comm)
