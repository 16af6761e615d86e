"""The exceptions fastload raises for its own reasons.

The compiled core defines the base of the hierarchy (``fastload_c.errors``);
this module re-exports it and adds the errors of the Python layer.
"""
from fastload_c.errors import CollateError, FastloadError, RingClosedError, ShmError

__all__ = [
    "CollateError",
    "FastloadError",
    "InvalidArgumentError",
    "RingClosedError",
    "ShmError",
]


class InvalidArgumentError(FastloadError, ValueError, AssertionError):
    """A dataset was built from arguments that do not fit together (arrays of
    different lengths, an empty or mixed list of datasets).

    A ValueError by meaning; also an AssertionError because that is what torch
    raises in these cases, so code written against torch still catches it."""
