"""Fixtures of the linear models' tests."""

import pytest


@pytest.fixture
def direct_normal_routes(monkeypatch):
    """The route of every call of the compiled algebra (``_small_jit.direct_normal``), appended to the list
    returned, once the algebra is loaded (the fits before it is take the NumPy algebra)."""
    from mpiml.linear_model import _lsq_direct
    from mpiml.linear_model import _small_jit as jit

    assert _lsq_direct.wait_compiled_algebra(120)
    routes = []
    real = jit.direct_normal

    def spy(*args):
        out = real(*args)
        routes.append(out[0])
        return out

    monkeypatch.setattr(jit, "direct_normal", spy)
    return routes
