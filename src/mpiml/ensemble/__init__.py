"""Random forests trained SPMD on the rows of every rank: exact global training or cuML-style local training.

>>> from mpiml.ensemble import RandomForestClassifier
>>> rf = RandomForestClassifier(n_estimators=100, max_depth=12, random_state=0).fit(X_local, y_local)
"""

from ._forest import RandomForestClassifier, RandomForestRegressor

__all__ = ["RandomForestClassifier", "RandomForestRegressor"]
