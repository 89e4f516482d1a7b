"""The CPU multi-rank checks of tests/neighbors in one launch per rank count (tests/_spmd_cases.py).

A rank's start (Python, mpi4py, NumPy, scikit-learn, mpiml) costs about as much as one of these scripts, so
the three scripts run at 1, 2, 3 and 4 ranks, and the behaviours at 3, run as the cases of four launches
instead of thirteen, each case still its own test: neighbors_spmd_script.py (test_neighbors_mpi.py),
neighbors_sparse_spmd_script.py (test_neighbors_sparse.py), neighbors_metrics_spmd_script.py
(test_neighbors_metrics.py) and neighbors_behaviour_spmd_script.py (3 ranks, test_neighbors_sklearn_behaviour.py).
"""

import os

from _spmd_cases import session_launches

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = {"dense": "neighbors_spmd_script.py", "sparse": "neighbors_sparse_spmd_script.py",
           "metrics": "neighbors_metrics_spmd_script.py"}


def launches(tmp_path_factory):
    """The session's launches of these cases at 1-4 ranks (each runs when a test first asks for it)."""
    cases = {n: [{"name": name, "script": os.path.join(HERE, script)} for name, script in SCRIPTS.items()]
             for n in (1, 2, 3, 4)}
    cases[3].append({"name": "behaviour", "script": os.path.join(HERE, "neighbors_behaviour_spmd_script.py")})
    return session_launches("neighbors", cases, tmp_path_factory, timeout=540)
