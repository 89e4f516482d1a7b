"""A rank with no rows: ``fit`` accepts it, so ``predict``/``transform``/``kneighbors``/``score`` must too.

On the empty rank the local methods return empty results of the right trailing shape and dtype;
``score`` is the same on every rank and equals the metric computed on the gathered rows. Run for
every estimator family, with the empty rank empty at query time only and at fit time as well.
"""

import os

import pytest

from _spmd_cases import CaseLaunches

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "empty_shards_spmd_script.py")
WHEN = [(2, "query"), (3, "query"), (3, "fit")]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One launch per rank count runs its cases (a rank's start, every family imported, is most of a case)."""
    cases = {}
    for n, when in WHEN:
        cases.setdefault(n, []).append({"name": when, "script": SCRIPT, "args": [when]})
    return CaseLaunches(cases, tmp_path_factory, timeout=300)


@pytest.mark.mpi
@pytest.mark.parametrize("n, when", WHEN)
def test_local_methods_and_score_on_an_empty_shard(launched, n, when):
    launched.verdict(n, when)
