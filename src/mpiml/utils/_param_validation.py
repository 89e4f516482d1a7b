"""Parameter constraints declared as data, checked once at the start of ``fit``.

A small equivalent of scikit-learn's parameter validation with the same
message shape::

    The 'n_clusters' parameter of KMeans must be an int in the range [1, inf). Got 0 instead.

Parameters are replicated on every rank, so every rank raises the same error
before any communication happens.

Constraints accepted in a ``_parameter_constraints`` list:

- an :class:`Interval`, :class:`Options` or :class:`StrOptions` object;
- a type (any instance of it is valid), e.g. ``int``, ``object``;
- ``None`` (the value ``None`` is valid);
- the builtin ``callable`` (any callable is valid);
- the strings ``"array-like"``, ``"sparse matrix"``, ``"random_state"``,
  ``"boolean"``, ``"verbose"``, ``"callable"``, ``"nan"`` and ``"object"``
  (anything, including None);
- :class:`HasMethods`, :class:`Hidden` (valid but not shown in messages);
- the string ``"no_validation"`` instead of a list.
"""

import math
import operator
from numbers import Integral, Real

import numpy as np

__all__ = [
    "InvalidParameterError",
    "Interval",
    "Options",
    "StrOptions",
    "HasMethods",
    "Hidden",
    "RealNotInt",
    "make_constraint",
    "validate_parameter_constraints",
]


class InvalidParameterError(ValueError, TypeError):
    """A parameter has an invalid type or value (a ``ValueError`` and a ``TypeError``)."""


class RealNotInt(Real):
    """A real number that is not an integer (for ``Interval(RealNotInt, ...)``)."""


RealNotInt.register(float)


def _type_name(t):
    if t is Real:
        return "float"
    if t is Integral:
        return "int"
    if t.__module__ == "builtins":
        return t.__qualname__
    return f"{t.__module__}.{t.__qualname__}"


def _join(constraints):
    parts = [str(c) for c in constraints]
    if len(parts) == 1:
        return parts[0]
    return f"{', '.join(parts[:-1])} or {parts[-1]}"


class _Constraint:
    """A condition a parameter value may satisfy; ``str()`` describes it for messages."""

    hidden = False

    def is_satisfied_by(self, val):  # pragma: no cover - interface
        raise NotImplementedError


class _InstancesOf(_Constraint):
    def __init__(self, type):
        self.type = type

    def is_satisfied_by(self, val):
        return isinstance(val, self.type)

    def __str__(self):
        return f"an instance of {_type_name(self.type)!r}"


class _NoneConstraint(_Constraint):
    def is_satisfied_by(self, val):
        return val is None

    def __str__(self):
        return "None"


class _AnyObject(_Constraint):
    def is_satisfied_by(self, val):
        return True

    def __str__(self):
        return "an object"


class _NanConstraint(_Constraint):
    def is_satisfied_by(self, val):
        return not isinstance(val, Integral) and isinstance(val, Real) and math.isnan(val)

    def __str__(self):
        return "numpy.nan"


class _ArrayLikes(_Constraint):
    def is_satisfied_by(self, val):
        return (hasattr(val, "__len__") or hasattr(val, "shape") or hasattr(val, "__array__")
                or hasattr(val, "__dlpack__"))

    def __str__(self):
        return "an array-like"


class _SparseMatrices(_Constraint):
    def is_satisfied_by(self, val):
        try:
            import scipy.sparse as sp
        except ImportError:  # pragma: no cover
            return False
        return sp.issparse(val)

    def __str__(self):
        return "a sparse array or matrix"


class _Callables(_Constraint):
    def is_satisfied_by(self, val):
        return callable(val)

    def __str__(self):
        return "a callable"


class _Union(_Constraint):
    """Several constraints shown together (random_state, boolean, verbose)."""

    def __init__(self, *constraints):
        self._constraints = constraints

    def is_satisfied_by(self, val):
        return any(c.is_satisfied_by(val) for c in self._constraints)

    def __str__(self):
        return _join(self._constraints)


class Interval(_Constraint):
    """A range of ``int`` (``numbers.Integral``) or ``float`` (``numbers.Real``) values.

    Parameters
    ----------
    type : {numbers.Integral, numbers.Real, RealNotInt}
        The kind of number.
    left, right : float, int or None
        Bounds; None means unbounded.
    closed : {"left", "right", "both", "neither"}
        Which bounds belong to the interval.
    """

    def __init__(self, type, left, right, *, closed):
        if type not in (Integral, Real, RealNotInt):
            raise ValueError(f"type must be numbers.Integral, numbers.Real or RealNotInt. Got {type} instead.")
        if closed not in ("left", "right", "both", "neither"):
            raise ValueError(f"closed must be 'left', 'right', 'both' or 'neither'. Got {closed} instead.")
        for name, bound in (("left", left), ("right", right)):
            if bound is None:
                continue
            if type is Integral and not isinstance(bound, Integral):
                raise TypeError(f"Expecting {name} to be an int for an interval over the integers.")
            if not isinstance(bound, Real):
                raise TypeError(f"Expecting {name} to be a real number.")
        if left is not None and right is not None and right <= left:
            raise ValueError(f"right can't be less than left. Got left={left} and right={right}")
        self.type, self.left, self.right, self.closed = type, left, right, closed

    def __contains__(self, val):
        if not isinstance(val, Integral) and np.isnan(val):
            return False
        left_out = operator.lt if self.closed in ("left", "both") else operator.le
        right_out = operator.gt if self.closed in ("right", "both") else operator.ge
        if self.left is not None and left_out(val, self.left):
            return False
        if self.right is not None and right_out(val, self.right):
            return False
        return True

    def is_satisfied_by(self, val):
        return isinstance(val, self.type) and val in self

    def __str__(self):
        type_str = "an int" if self.type is Integral else "a float"
        lb = "[" if self.closed in ("left", "both") else "("
        rb = "]" if self.closed in ("right", "both") else ")"
        left = "-inf" if self.left is None else self.left
        right = "inf" if self.right is None else self.right
        if self.type is not Integral:
            left = float(left) if self.left is not None else left
            right = float(right) if self.right is not None else right
        return f"{type_str} in the range {lb}{left}, {right}{rb}"


class Options(_Constraint):
    """A finite set of values of one type.

    Options are listed in sorted order in messages so that every rank (each
    with its own string hash seed) prints the same text.
    """

    def __init__(self, type, options, *, deprecated=None):
        self.type = type
        self.options = set(options)
        self.deprecated = set(deprecated or ())
        if self.deprecated - self.options:
            raise ValueError("The deprecated options must be a subset of the options.")

    def is_satisfied_by(self, val):
        return isinstance(val, self.type) and val in self.options

    def __str__(self):
        names = sorted((repr(o) + (" (deprecated)" if o in self.deprecated else "")) for o in self.options)
        return f"a {_type_name(self.type)} among {{{', '.join(names)}}}"


class StrOptions(Options):
    """A finite set of strings, e.g. ``StrOptions({"lloyd", "elkan"})``."""

    def __init__(self, options, *, deprecated=None):
        super().__init__(str, options, deprecated=deprecated)


class HasMethods(_Constraint):
    """Objects that expose the named method(s)."""

    def __init__(self, methods):
        self.methods = [methods] if isinstance(methods, str) else list(methods)

    def is_satisfied_by(self, val):
        return all(callable(getattr(val, m, None)) for m in self.methods)

    def __str__(self):
        names = [repr(m) for m in self.methods]
        shown = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        return f"an object implementing {shown}"


class Hidden:
    """Wrap a constraint that is valid but not advertised in error messages."""

    def __init__(self, constraint):
        self.constraint = constraint


def make_constraint(constraint):
    """The :class:`_Constraint` object for one entry of a constraints list."""
    if isinstance(constraint, Hidden):
        c = make_constraint(constraint.constraint)
        c = _HiddenConstraint(c)
        return c
    if isinstance(constraint, _Constraint):
        return constraint
    if constraint is None:
        return _NoneConstraint()
    if constraint is callable:
        return _Callables()
    if isinstance(constraint, type):
        return _InstancesOf(constraint)
    if isinstance(constraint, str):
        simple = {
            "array-like": _ArrayLikes,
            "sparse matrix": _SparseMatrices,
            "callable": _Callables,
            "nan": _NanConstraint,
            "object": _AnyObject,
        }
        if constraint in simple:
            return simple[constraint]()
        if constraint == "random_state":
            return _Union(Interval(Integral, 0, 2**32 - 1, closed="both"),
                          _InstancesOf(np.random.RandomState), _NoneConstraint())
        if constraint == "boolean":
            return _Union(_InstancesOf(bool), _InstancesOf(np.bool_))
        if constraint == "verbose":
            return _Union(Interval(Integral, 0, None, closed="left"), _InstancesOf(bool), _InstancesOf(np.bool_))
    raise ValueError(f"Unknown constraint type: {constraint!r}")


class _HiddenConstraint(_Constraint):
    hidden = True

    def __init__(self, inner):
        self.inner = inner

    def is_satisfied_by(self, val):
        return self.inner.is_satisfied_by(val)

    def __str__(self):
        return str(self.inner)


def validate_parameter_constraints(constraints, params, caller_name, *, cache=None):
    """Check ``params`` against ``constraints``; raise :class:`InvalidParameterError`.

    Parameters
    ----------
    constraints : dict
        ``{name: [constraint, ...]}`` or ``{name: "no_validation"}``. Parameters
        without an entry are not checked.
    params : dict
        ``{name: value}``, typically ``estimator.get_params(deep=False)``.
    caller_name : str
        Named in the message (the estimator's class name).
    cache : dict, optional
        Kept by the caller between calls (one per estimator class): the
        constraint objects built from each list, reused while that list is
        the same object holding the same entries (a list replaced or edited
        in place is rebuilt, and forgets what it had accepted), and the
        plain values (``None``, ``bool``, ``int``, ``float``, ``str``, by
        type and value) those objects already accepted, up to 256 a name.
        Any other value is checked every time.

    Raises
    ------
    InvalidParameterError
        "The 'n_clusters' parameter of KMeans must be an int in the range
        [1, inf). Got 0 instead."
    """
    for name, value in params.items():
        allowed = constraints.get(name)
        if allowed is None or (isinstance(allowed, str) and allowed == "no_validation"):
            continue
        if cache is None:
            objs, accepted = [make_constraint(c) for c in allowed], None
        else:
            hit = cache.get(name)
            if hit is None or hit[0] is not allowed or hit[1] != tuple(allowed):
                hit = cache[name] = (allowed, tuple(allowed), [make_constraint(c) for c in allowed], set())
            objs, accepted = hit[2], hit[3]
            key = (type(value), value) if type(value) in _PLAIN else None
            if key is not None and key in accepted:
                continue
        if any(c.is_satisfied_by(value) for c in objs):
            if accepted is not None and key is not None and len(accepted) < 256:   # a sweep stays bounded
                accepted.add(key)
            continue
        shown = [c for c in objs if not c.hidden]
        raise InvalidParameterError(
            f"The {name!r} parameter of {caller_name} must be {_join(shown)}. Got {value!r} instead."
        )


# values whose acceptance by the built-in constraints depends on their type and value alone
_PLAIN = frozenset({type(None), bool, int, float, str})
