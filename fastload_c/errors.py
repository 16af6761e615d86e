"""Exceptions raised by the compiled core. fastload re-exports these and adds
its own subclasses of FastloadError."""


class FastloadError(Exception):
    """Base class of every error fastload raises for its own reasons."""


class ShmError(FastloadError, OSError):
    """Shared memory could not be created, mapped or pinned."""
