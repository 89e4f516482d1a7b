"""The CPU multi-rank checks of tests/linear_model in one launch per rank count (tests/_spmd_cases.py).

A rank's start (Python, mpi4py, NumPy, scikit-learn, mpiml) costs about as much as one of these scripts, so
the four scripts run at 1, 2, 3 and 4 ranks, and the behaviours at 3, run as the cases of four launches
instead of seventeen, each case still its own test: linear_spmd_script.py (test_linear_mpi.py),
liblinear_spmd_script.py (test_liblinear.py), logistic_prox_spmd_script.py (test_logistic_prox.py),
suite_params_spmd_script.py (test_suite_params_mpi.py) and linear_behaviour_script.py (3 ranks,
test_sklearn_behaviour.py).  The GPU runs of the same scripts keep their own launches (``--gpu``).
"""

import os

from _spmd_cases import session_launches

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = {"linear": ("linear_spmd_script.py", ["{out}"]), "liblinear": ("liblinear_spmd_script.py", []),
           "logistic_prox": ("logistic_prox_spmd_script.py", []), "suite_params": ("suite_params_spmd_script.py", [])}


def launches(tmp_path_factory):
    """The session's launches of these cases at 1-4 ranks (each runs when a test first asks for it)."""
    cases = {n: [{"name": name, "script": os.path.join(HERE, script), "args": args}
                 for name, (script, args) in SCRIPTS.items()] for n in (1, 2, 3, 4)}
    cases[3].append({"name": "behaviour", "script": os.path.join(HERE, "linear_behaviour_script.py")})
    return session_launches("linear_model", cases, tmp_path_factory, timeout=540)
