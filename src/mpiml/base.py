"""The base class of every mpiml estimator: scikit-learn's contract, run SPMD.

An :class:`SPMDEstimator` is a scikit-learn estimator whose ``fit`` sees only
this rank's rows.  It adds to :class:`sklearn.base.BaseEstimator`:

* ``_parameter_constraints`` checked by :meth:`_validate_params` (before any
  communication: parameters are replicated, so every rank raises alike);
* :meth:`_get_comm` — the ``comm`` parameter, or the world communicator;
* :meth:`_check_is_fitted` raising :class:`mpiml.NotFittedError`;
* a communicator that is never copied by ``clone`` nor pickled;
* the model-file protocol used by :func:`mpiml.save` / :func:`mpiml.load`:
  ``_saved_attributes`` and the :meth:`_get_saved_state` /
  :meth:`_set_saved_state` pair (see ``docs/estimators.md``).
"""

import weakref

from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from .utils._param_validation import HasMethods, validate_parameter_constraints

__all__ = ["SPMDEstimator", "COMM_CONSTRAINT"]

#: The constraint of every estimator's ``comm`` parameter.
COMM_CONSTRAINT = [None, HasMethods(["allreduce", "allgather_obj"])]

# Per class: the constructor's parameter names (scikit-learn reads the signature on every
# get_params/set_params/clone, most of a fit's parameter check), kept with the __init__ they
# come from; and the constraint objects built from ``_parameter_constraints``.
_PARAM_NAMES = weakref.WeakKeyDictionary()
_CONSTRAINT_CACHES = weakref.WeakKeyDictionary()


class SPMDEstimator(BaseEstimator):
    """Base class of mpiml estimators (SPMD: one process per GPU or socket).

    Subclasses list their constructor arguments in ``__init__`` (which only
    stores them, scikit-learn's contract), declare ``_parameter_constraints``
    (include ``"comm": COMM_CONSTRAINT``, e.g. through
    ``{**SPMDEstimator._parameter_constraints, ...}``) and
    ``_saved_attributes``, the fitted attributes written by :func:`mpiml.save`.

    Attributes declared by subclasses are replicated on every rank unless
    their docstring says otherwise.
    """

    _parameter_constraints: dict = {"comm": COMM_CONSTRAINT}

    #: Fitted attributes written to model files: arrays (saved as ``.npy``)
    #: or JSON values (numbers, strings, booleans, None, lists, dicts of them).
    #: ``n_features_in_`` and ``feature_names_in_`` are always added when set.
    _saved_attributes: tuple = ()

    # ------------------------------------------------------------------ parameters
    def _validate_params(self):
        """Check every parameter against ``_parameter_constraints``.

        Raises
        ------
        mpiml.utils.InvalidParameterError
            "The 'n_clusters' parameter of KMeans must be an int in the range
            [1, inf). Got 0 instead."
        """
        cls = type(self)
        cache = _CONSTRAINT_CACHES.get(cls)
        if cache is None:
            cache = _CONSTRAINT_CACHES[cls] = {}
        validate_parameter_constraints(
            self._parameter_constraints, self.get_params(deep=False), caller_name=cls.__name__, cache=cache
        )

    @classmethod
    def _get_param_names(cls):
        # scikit-learn's, read once per class (and again if ``__init__`` is replaced)
        init = cls.__init__
        hit = _PARAM_NAMES.get(cls)
        if hit is None or hit[0] is not init:
            hit = _PARAM_NAMES[cls] = (init, tuple(super()._get_param_names()))
        return list(hit[1])

    def get_params(self, deep=True):
        """The estimator's parameters (scikit-learn's), ``comm`` among them only when it is set.

        ``comm`` binds the estimator to a group of processes; it is not a
        model parameter.  Left at its default (None: the world), it is not
        reported, so the parameters of an estimator at mpiml's defaults are
        exactly scikit-learn's and can be passed wherever scikit-learn takes
        its estimator's parameters (``type(est)(**est.get_params())`` and
        ``clone`` rebuild it as it was either way).  scikit-learn's own checks
        allow a parameter whose default is None to be absent from
        ``get_params``; :meth:`set_params` accepts ``comm`` in both cases.
        """
        params = super().get_params(deep=deep)
        if params.get("comm", True) is None:
            del params["comm"]
        return params

    def set_params(self, **params):
        """Set parameters (scikit-learn's ``set_params``); ``comm`` is accepted even while unset."""
        if "comm" in params and "comm" in self._get_param_names():
            self.comm = params.pop("comm")
        return super().set_params(**params)

    def _get_comm(self):
        """The communicator to use: the ``comm`` parameter, or :func:`mpiml.comm.get_comm`."""
        comm = getattr(self, "comm", None)
        if comm is not None:
            return comm
        from .comm import get_comm

        return get_comm()

    def _check_is_fitted(self, attributes=None):
        """Raise :class:`mpiml.NotFittedError` (scikit-learn's) unless fitted."""
        check_is_fitted(self, attributes)

    # ------------------------------------------------------------------ copies
    def __sklearn_clone__(self):
        # clone() deep-copies parameters; a communicator must be shared instead.
        comm = getattr(self, "comm", None)
        if comm is None:
            return super().__sklearn_clone__()
        self.comm = None
        try:
            new = super().__sklearn_clone__()
        finally:
            self.comm = comm
        new.comm = comm
        return new

    def __getstate__(self):
        # Pickles carry no communicator: the copy uses the world communicator.
        state = super().__getstate__()
        if state.get("comm") is not None:
            state = dict(state)
            state["comm"] = None
        return state

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        return tags

    # ------------------------------------------------------------------ model files
    def _saved_attribute_names(self):
        names = list(self._saved_attributes)
        for extra in ("n_features_in_", "feature_names_in_"):
            if extra not in names and hasattr(self, extra):
                names.append(extra)
        return names

    def _get_saved_state(self):
        """The fitted state written by :func:`mpiml.save`: ``{name: array or JSON value}``.

        The default collects ``_saved_attributes`` (plus ``n_features_in_`` and
        ``feature_names_in_``); override it together with
        :meth:`_set_saved_state` for derived state.
        """
        self._check_is_fitted()
        return {name: getattr(self, name) for name in self._saved_attribute_names() if hasattr(self, name)}

    def _set_saved_state(self, state):
        """Restore what :meth:`_get_saved_state` returned (arrays already on the target device)."""
        allowed = set(self._saved_attributes) | {"n_features_in_", "feature_names_in_"}
        for name, value in state.items():
            if name not in allowed:
                raise ValueError(f"{type(self).__name__} does not save an attribute named {name!r}")
            setattr(self, name, value)
