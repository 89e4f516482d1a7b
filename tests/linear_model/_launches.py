"""The CPU multi-rank checks of tests/linear_model in one launch per rank count (tests/_spmd_cases.py).

A rank's start (Python, mpi4py, NumPy, scikit-learn, mpiml) costs about as much as one of these scripts, so
the four scripts run at 1, 2, 3 and 4 ranks, and the behaviours at 3, run as the cases of four launches
instead of seventeen, each case still its own test: linear_spmd_script.py (test_linear_mpi.py),
liblinear_spmd_script.py (test_liblinear.py), logistic_prox_spmd_script.py (test_logistic_prox.py),
suite_params_spmd_script.py (test_suite_params_mpi.py) and linear_behaviour_script.py (3 ranks,
test_sklearn_behaviour.py).  The GPU runs (marker ``gpu``) share launches of their own, one per rank count
(:func:`gpu_launches`): linear_gpu_script.py at 1-4 ranks (test_gpu_linear.py), the liblinear and L1 /
elastic-net scripts with ``--gpu`` at 1 and 2 (test_liblinear.py, test_logistic_prox.py): four launches instead
of eight, each of which paid a CuPy import and a CUDA context per rank.
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


def gpu_launches(tmp_path_factory):
    """The session's GPU launches at 1-4 ranks (ranks share the GPUs there are; tests skip past the GPU count)."""
    cases = {n: [{"name": "linear_gpu", "script": os.path.join(HERE, "linear_gpu_script.py")}] for n in (1, 2, 3, 4)}
    for n in (1, 2):
        cases[n] += [{"name": name, "script": os.path.join(HERE, SCRIPTS[name][0]), "args": ["--gpu"]}
                     for name in ("liblinear", "logistic_prox")]
    return session_launches("linear_model_gpu", cases, tmp_path_factory, timeout=240)
