"""The multi-rank checks of tests/utils in one launch per rank count: the distributed QR checks
(``linalg_spmd_script.py``, for test_linalg.py) and the agreed input checks (``_validation_spmd_script.py``,
for test_utils_validation.py), each reported as its own test (``tests/_spmd_cases.py``): a rank's start is
most of either check.  Both test modules take the same launches from :func:`launches`."""

import os

from _spmd_cases import CaseLaunches

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = {"linalg": "linalg_spmd_script.py", "validation": "_validation_spmd_script.py"}
_shared = []


def launches(tmp_path_factory):
    """The test session's :class:`CaseLaunches` of these scripts at 1-4 ranks (made on first use)."""
    if not _shared:
        cases = {n: [{"name": name, "script": os.path.join(HERE, script)} for name, script in SCRIPTS.items()]
                 for n in (1, 2, 3, 4)}
        _shared.append(CaseLaunches(cases, tmp_path_factory, timeout=240))
    return _shared[0]
