"""Utilities for SPMD estimators: parameter constraints, input validation, array helpers."""

from ._param_validation import (
    HasMethods,
    Hidden,
    Interval,
    InvalidParameterError,
    Options,
    RealNotInt,
    StrOptions,
    validate_parameter_constraints,
)
from ._validation import (
    agree_on_error,
    check_random_state,
    global_row_offset,
    row_counts,
    to_device_like,
    validate_data,
    validate_sample_weight,
    xp_of,
)

__all__ = [
    "HasMethods", "Hidden", "Interval", "InvalidParameterError", "Options", "RealNotInt", "StrOptions",
    "validate_parameter_constraints",
    "agree_on_error", "check_random_state", "global_row_offset", "row_counts", "to_device_like",
    "validate_data", "validate_sample_weight", "xp_of",
]
