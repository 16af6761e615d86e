"""An exception raised in a worker (a process or a thread), in a form that
reaches the main process and is raised there when its batch is due."""
from __future__ import annotations

import pickle
import traceback
from typing import Any, NoReturn


class WorkerError:
    """An exception raised in a worker, in a form that crosses processes:
    its type, message and traceback text, the worker and the index."""

    def __init__(self, exc: BaseException, worker_id: int, where: str) -> None:
        self.exc_type = type(exc)
        # Kept apart: the message names the type the worker raised, also
        # where only RuntimeError can cross (see __reduce__).
        self.type_name = type(exc).__name__
        self.text = "".join(traceback.format_exception(exc))
        self.worker_id = worker_id
        self.where = where

    def __reduce__(self) -> Any:
        # An exception type that cannot be pickled (defined in a closure, say)
        # still reaches the main process as RuntimeError with its text.
        try:
            pickle.dumps(self.exc_type)
            exc_type: type = self.exc_type
        except Exception:
            exc_type = RuntimeError
        return (_rebuild_worker_error,
                (exc_type, self.type_name, self.text, self.worker_id, self.where))

    def reraise(self, pid: int, thread: bool = False) -> NoReturn:
        # Raised from a call, so no frame of ours holds the exception in a
        # local: a cycle would keep the iterator (and its workers) alive.
        raise self.exception(pid, thread)

    def exception(self, pid: int, thread: bool = False) -> BaseException:
        """The worker's exception, rebuilt in this process: its message
        starts as torch's does ("Caught ValueError in DataLoader worker
        process 0", which logs and tools look for), then says more."""
        worker = "thread" if thread else "process"
        message = (
            f"Caught {self.type_name} in DataLoader worker {worker} {self.worker_id} "
            f"(pid {pid}) {self.where}.\nOriginal {self.text}"
        )
        if self.exc_type is KeyError:
            # KeyError's str() is the repr of its argument: keep the text readable.
            message = _ReadableKeyErrorMessage(message)
        try:
            exc: BaseException = self.exc_type(message)
        except Exception:
            exc = RuntimeError(message)
        return exc


class _ReadableKeyErrorMessage(str):
    def __repr__(self) -> str:
        return self


def _rebuild_worker_error(exc_type: type, type_name: str, text: str, worker_id: int,
                          where: str) -> WorkerError:
    error = WorkerError.__new__(WorkerError)
    error.exc_type, error.type_name, error.text = exc_type, type_name, text
    error.worker_id, error.where = worker_id, where
    return error
