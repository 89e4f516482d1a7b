"""Linear models fitted SPMD over the rows of every rank, on NumPy or CuPy shards."""

from ._least_squares import LinearRegression, Ridge
from ._logistic import LogisticRegression

__all__ = ["LinearRegression", "Ridge", "LogisticRegression"]
