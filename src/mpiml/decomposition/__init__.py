"""Matrix decompositions of rows spread over ranks (SPMD): PCA and truncated SVD."""

from ._pca import PCA
from ._truncated_svd import TruncatedSVD

__all__ = ["PCA", "TruncatedSVD"]
