"""SPMDEstimator and parameter constraints on one process."""

import pickle
from numbers import Integral, Real

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.utils.estimator_checks import parametrize_with_checks

import mpiml
from mpiml.base import COMM_CONSTRAINT, SPMDEstimator
from mpiml.comm import get_comm
from mpiml.utils import (HasMethods, Hidden, Interval, InvalidParameterError, Options, StrOptions,
                         validate_parameter_constraints)
from mpiml.utils._testing import MinimalSPMDTransformer


@parametrize_with_checks([MinimalSPMDTransformer(), MinimalSPMDTransformer(mode="none", shift=2.0)])
def test_sklearn_compatible(estimator, check):
    check(estimator)


CONSTRAINTS = {
    "n_clusters": [Interval(Integral, 1, None, closed="left")],
    "tol": [Interval(Real, 0, None, closed="left")],
    "alpha": [Interval(Real, 0, 1, closed="neither"), None],
    "algorithm": [StrOptions({"lloyd", "elkan"}), Hidden(StrOptions({"secret"}))],
    "random_state": ["random_state"],
    "copy_x": ["boolean"],
    "verbose": ["verbose"],
    "init": [StrOptions({"k-means++", "random"}), "array-like", callable],
    "n_init": [StrOptions({"auto"}), Interval(Integral, 1, None, closed="left")],
    "metric": [Options(int, {1, 2})],
    "comm": COMM_CONSTRAINT,
    "anything": ["object"],
    "skip": "no_validation",
}


@pytest.mark.parametrize("name, value, message", [
    ("n_clusters", 0, "The 'n_clusters' parameter of KMeans must be an int in the range [1, inf). Got 0 instead."),
    ("n_clusters", 2.0, "must be an int in the range [1, inf). Got 2.0 instead."),
    ("tol", -1, "The 'tol' parameter of KMeans must be a float in the range [0.0, inf). Got -1 instead."),
    ("alpha", 1.0, "must be a float in the range (0.0, 1.0) or None. Got 1.0 instead."),
    ("algorithm", "full", "must be a str among {'elkan', 'lloyd'}. Got 'full' instead."),
    ("random_state", -1, "must be an int in the range [0, 4294967295], an instance of "
                         "'numpy.random.mtrand.RandomState' or None. Got -1 instead."),
    ("copy_x", "yes", "must be an instance of 'bool' or an instance of 'numpy.bool'. Got 'yes' instead."),
    ("verbose", -1, "must be an int in the range [0, inf), an instance of 'bool' or an instance of 'numpy.bool'."),
    ("init", 3, "must be a str among {'k-means++', 'random'}, an array-like or a callable. Got 3 instead."),
    ("n_init", 0, "must be a str among {'auto'} or an int in the range [1, inf). Got 0 instead."),
    ("metric", 3, "The 'metric' parameter of KMeans must be a int among {1, 2}. Got 3 instead."),
    ("comm", "world", "must be None or an object implementing 'allreduce' and 'allgather_obj'. Got 'world'"),
])
def test_parameter_messages(name, value, message):
    with pytest.raises(InvalidParameterError) as info:
        validate_parameter_constraints(CONSTRAINTS, {name: value}, "KMeans")
    assert message in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)


def test_valid_parameters_pass():
    good = dict(n_clusters=3, tol=0.0, alpha=None, algorithm="secret", random_state=np.random.RandomState(0),
                copy_x=np.bool_(True), verbose=True, init=np.zeros((2, 2)), n_init="auto", metric=2,
                comm=get_comm("self"), anything=object(), skip=object(), unknown_param=1)
    validate_parameter_constraints(CONSTRAINTS, good, "KMeans")


def test_constraint_objects_reject_bad_definitions():
    with pytest.raises(TypeError):
        Interval(Integral, 1.5, None, closed="left")
    with pytest.raises(ValueError):
        Interval(Real, 2, 1, closed="both")
    with pytest.raises(ValueError):
        Interval(Real, 0, 1, closed="sideways")
    with pytest.raises(ValueError):
        validate_parameter_constraints({"x": ["no-such-constraint"]}, {"x": 1}, "f")
    assert "an object implementing 'fit'" == str(HasMethods("fit"))


def test_estimator_contract():
    est = MinimalSPMDTransformer(shift="a")
    with pytest.raises(InvalidParameterError, match="The 'shift' parameter of MinimalSPMDTransformer must be"):
        est.fit(np.ones((3, 2)))
    with pytest.raises(mpiml.NotFittedError, match="This MinimalSPMDTransformer instance is not fitted yet"):
        MinimalSPMDTransformer().transform(np.ones((3, 2)))
    assert MinimalSPMDTransformer()._get_comm() is get_comm()
    one = get_comm("self")
    est = MinimalSPMDTransformer(comm=one).fit(np.arange(6.0).reshape(3, 2))
    assert est._get_comm() is one
    copy = clone(est)
    assert copy.comm is one and not hasattr(copy, "mean_")  # the communicator is shared, not copied
    restored = pickle.loads(pickle.dumps(est))
    assert restored.comm is None and np.array_equal(restored.mean_, est.mean_)
    assert est.comm is one  # pickling did not touch the original


def test_comm_is_a_parameter_reported_only_when_set():
    from sklearn.pipeline import make_pipeline

    plain = MinimalSPMDTransformer(shift=2.0)
    assert "comm" not in plain.get_params() and plain.get_params()["shift"] == 2.0
    assert type(plain)(**plain.get_params()).get_params() == plain.get_params()
    one = get_comm("self")
    bound = MinimalSPMDTransformer(comm=one)
    assert bound.get_params()["comm"] is one and type(bound)(**bound.get_params()).comm is one
    assert clone(bound).comm is one and clone(plain).comm is None
    assert plain.set_params(comm=one).comm is one and plain.get_params()["comm"] is one
    assert plain.set_params(comm=None).comm is None and "comm" not in plain.get_params()
    pipe = make_pipeline(MinimalSPMDTransformer())
    pipe.set_params(minimalspmdtransformer__comm=one)
    assert pipe[0].comm is one and pipe.get_params()["minimalspmdtransformer__comm"] is one
    with pytest.raises(ValueError, match="Invalid parameter"):
        plain.set_params(not_a_parameter=1)
    with pytest.raises(InvalidParameterError, match="The 'comm' parameter"):
        MinimalSPMDTransformer(comm="world").fit(np.ones((3, 2)))


def test_saved_state_protocol():
    est = MinimalSPMDTransformer().fit(np.arange(6.0).reshape(3, 2))
    state = est._get_saved_state()
    assert set(state) == {"mean_", "n_samples_seen_", "n_features_in_"}
    new = MinimalSPMDTransformer()
    new._set_saved_state(state)
    assert np.array_equal(new.transform([[1.0, 1.0]]), est.transform([[1.0, 1.0]]))
    with pytest.raises(ValueError, match="does not save an attribute named 'evil'"):
        new._set_saved_state({"evil": 1})
    with pytest.raises(mpiml.NotFittedError):
        MinimalSPMDTransformer()._get_saved_state()
    assert issubclass(MinimalSPMDTransformer, SPMDEstimator)


def test_parameter_check_is_cached_per_class_and_still_sees_every_change(monkeypatch):
    """The signature and the constraint objects are read once per class, the check itself runs on every fit."""
    import inspect

    class Shifted(MinimalSPMDTransformer):
        _parameter_constraints = {**MinimalSPMDTransformer._parameter_constraints,
                                  "shift": [Interval(Real, 0, None, closed="left")]}

    X = np.arange(6.0).reshape(3, 2)
    est = Shifted(shift=1.0).fit(X)
    calls = []
    real_signature = inspect.signature
    monkeypatch.setattr(inspect, "signature", lambda *a, **k: calls.append(a) or real_signature(*a, **k))
    for _ in range(3):
        est.fit(X)
        clone(est).get_params()
    assert calls == []                      # no constructor read after the first
    # a value changed by set_params is checked again, after the same name's other values were accepted
    with pytest.raises(InvalidParameterError, match="The 'shift' parameter of Shifted must be a float in the range"):
        est.set_params(shift=-1.0).fit(X)
    with pytest.raises(InvalidParameterError, match="The 'mode' parameter of Shifted"):
        est.set_params(shift=1.0, mode="median").fit(X)
    with pytest.raises(ValueError, match="Invalid parameter 'bogus'"):
        est.set_params(bogus=1)
    est.set_params(mode="none").fit(X)
    # constraints edited in place, replaced on the class or on the instance are seen at the next fit
    Shifted._parameter_constraints["shift"][0] = Interval(Real, 2, None, closed="left")
    with pytest.raises(InvalidParameterError, match=r"range \[2.0, inf\)"):
        est.fit(X)
    Shifted._parameter_constraints = {**Shifted._parameter_constraints, "shift": [Interval(Real, 0, 1, closed="both")]}
    est.set_params(shift=0.5).fit(X)
    est._parameter_constraints = {"shift": [StrOptions({"a"})]}
    with pytest.raises(InvalidParameterError, match="must be a str among {'a'}. Got 0.5 instead."):
        est.fit(X)
    # the cache is per class: the parent's check is untouched by the subclass's
    MinimalSPMDTransformer(shift=-1.0).fit(X)
    # a new __init__ is read again
    monkeypatch.setattr(Shifted, "__init__", lambda self, shift=0.0, *, mode="mean", comm=None, extra=1: None)
    assert "extra" in Shifted._get_param_names() and "extra" not in MinimalSPMDTransformer._get_param_names()


def test_parameter_check_with_a_cache_gives_the_same_verdicts():
    """Accepted plain values are remembered by type and value: 3 accepted does not let 3.0, True or "3" through."""
    constraints = {"n": [Interval(Integral, 1, None, closed="left"), StrOptions({"auto"})], "skip": "no_validation"}

    def verdict(value, cache):
        try:
            validate_parameter_constraints(constraints, {"n": value, "skip": object()}, "F", cache=cache)
        except InvalidParameterError as exc:
            return str(exc)
        return "ok"

    values = [3, 3, 3.0, True, False, 0, "3", "auto", "auto", np.int64(3), np.float64(3.0), None, float("nan"), 2**70]
    cache = {}
    assert [verdict(v, cache) for v in values * 2] == [verdict(v, None) for v in values * 2]
    assert verdict(3, cache) == "ok" and "Got 3.0 instead" in verdict(3.0, cache)
