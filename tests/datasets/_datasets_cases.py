"""Generator cases shared by the distributed test and its one-rank reference."""

import numpy as np

from mpiml.datasets import make_blobs, make_classification, make_low_rank_matrix, make_regression

# sizes cross the 65536-row (or, for wide data, smaller) random-number blocks
GENERATORS = {
    "blobs": (make_blobs, dict(n_samples=140_003, n_features=3, centers=5, random_state=3)),
    "blobs_counts": (make_blobs, dict(n_samples=[5, 70_000, 11], n_features=2, random_state=4,
                                      cluster_std=[0.5, 1.0, 2.0], return_centers=True)),
    "blobs_ordered_f32": (make_blobs, dict(n_samples=1001, centers=4, shuffle=False, random_state=5,
                                           dtype=np.float32)),
    "classification": (make_classification, dict(n_samples=70_011, n_features=30, n_informative=5,
                                                  n_redundant=3, n_repeated=2, n_classes=3, weights=[0.5, 0.3],
                                                  flip_y=0.05, shift=None, scale=None, random_state=6)),
    "regression_coef": (make_regression, dict(n_samples=70_001, n_features=20, n_informative=7, noise=0.5,
                                              coef=True, random_state=7)),
    "regression_lowrank": (make_regression, dict(n_samples=70_001, n_features=48, effective_rank=4,
                                                 n_targets=2, random_state=8)),
    "low_rank": (make_low_rank_matrix, dict(n_samples=70_001, n_features=64, effective_rank=6, random_state=9)),
}
