"""The exceptions fastload raises for its own reasons.

The compiled core defines the base of the hierarchy (``fastload_c.errors``);
this module re-exports it and adds the errors of the Python layer.
"""
from __future__ import annotations

from typing import Any

from fastload_c.errors import CollateError, FastloadError, RingClosedError, ShmError

__all__ = [
    "CollateError",
    "FastloadError",
    "InvalidArgumentError",
    "RingClosedError",
    "ShmError",
    "StateMismatchError",
    "WorkerDiedError",
]


class InvalidArgumentError(FastloadError, ValueError, AssertionError):
    """A dataset was built from arguments that do not fit together (arrays of
    different lengths, an empty or mixed list of datasets).

    A ValueError by meaning; also an AssertionError because that is what torch
    raises in these cases, so code written against torch still catches it."""


class StateMismatchError(FastloadError, ValueError, AssertionError):
    """A loaded ``state_dict`` was taken with settings this loader does not
    have (another dataset length, batch size, number of workers), raised at
    the ``iter()`` that would resume from it.

    A ValueError by meaning; also an AssertionError because that is what
    torchdata's StatefulDataLoader raises there."""


class WorkerDiedError(FastloadError, RuntimeError):
    """A worker process exited while the loader needed it (killed by a
    signal, out of memory, ``os._exit`` in a dataset, ...).

    ``worker_id``, ``pid``, ``exitcode`` (negative: the signal number, as in
    multiprocessing), ``batch`` (the position in its epoch of the batch the
    worker was loading, counting from 0, or None) and ``indices`` (that
    batch's dataset indices, or None) say which and how (each None when the
    error is built from a message alone, as torch's ExceptionWrapper does).
    A RuntimeError, as torch raises in this case."""

    def __init__(self, message: str, *, worker_id: int | None = None, pid: int | None = None,
                 exitcode: int | None = None, batch: int | None = None,
                 indices: Any = None) -> None:
        super().__init__(message)
        self.worker_id = worker_id
        self.pid = pid
        self.exitcode = exitcode
        self.batch = batch
        self.indices = indices

    def __reduce__(self) -> Any:
        # Keyword-only arguments: rebuilt through a function, so the
        # exception crosses processes (pytest-xdist, multiprocessing pools).
        return (_rebuild_worker_died, (str(self), self.worker_id, self.pid, self.exitcode,
                                       self.batch, self.indices))


def _rebuild_worker_died(message: str, worker_id: int | None, pid: int | None,
                         exitcode: int | None, batch: int | None,
                         indices: Any) -> WorkerDiedError:
    return WorkerDiedError(message, worker_id=worker_id, pid=pid, exitcode=exitcode,
                           batch=batch, indices=indices)
