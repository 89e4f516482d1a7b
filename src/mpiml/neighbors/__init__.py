"""Exact nearest neighbours over an index sharded across ranks (SPMD), on NumPy or CuPy shards."""

from ._base import NearestNeighbors
from ._supervised import KNeighborsClassifier, KNeighborsRegressor

__all__ = ["NearestNeighbors", "KNeighborsClassifier", "KNeighborsRegressor"]
