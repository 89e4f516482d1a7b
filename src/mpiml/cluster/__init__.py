"""Clustering estimators that run SPMD over NumPy or CuPy shards."""

from ._kmeans import KMeans

__all__ = ["KMeans"]
