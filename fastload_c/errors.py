"""Exceptions raised by the compiled core. fastload re-exports these and adds
its own subclasses of FastloadError."""


class FastloadError(Exception):
    """Base class of every error fastload raises for its own reasons."""


class ShmError(FastloadError, OSError):
    """Shared memory could not be created, mapped or pinned."""


class RingClosedError(FastloadError, EOFError):
    """The ring was closed (by either side) and holds no more messages."""


class CollateError(FastloadError, RuntimeError):
    """Samples of one batch cannot be collated together (shape or type disagree).

    A RuntimeError, as torch's collate raises for unequal sizes. ``positions``
    is (the disagreeing sample, the sample it was compared with) within the
    batch, when known, so that the loader can name their dataset indices."""

    def __init__(self, message, positions=None):
        super().__init__(message)
        self.positions = positions

    def __reduce__(self):
        return (type(self), (str(self), self.positions))
