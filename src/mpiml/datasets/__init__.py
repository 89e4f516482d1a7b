"""Distributed datasets: generators that draw only this rank's rows, and partitioned loaders.

>>> from mpiml.datasets import make_blobs
>>> X, y = make_blobs(n_samples=10**6, n_features=64, centers=32, random_state=0)  # this rank's shard

For a given ``random_state`` the global dataset (shards concatenated in rank
order) does not depend on the number of ranks.
"""

from ._generators import make_blobs, make_classification, make_low_rank_matrix, make_regression
from ._loaders import load_csv, load_npy, load_svmlight
from ._partition import shard_bounds

__all__ = [
    "make_blobs", "make_classification", "make_regression", "make_low_rank_matrix",
    "load_npy", "load_csv", "load_svmlight", "shard_bounds",
]
