"""Which worker this process is, for code that runs inside datasets.

Kept apart from the worker loop so that datasets, the single-process loader
and the worker processes share it without importing each other.
"""
from __future__ import annotations

from typing import Any


class WorkerInfo:
    """Read-only description of the current worker: ``id``, ``num_workers``,
    ``seed`` and ``dataset`` (this worker's copy)."""

    __initialized = False

    def __init__(self, *, id: int, num_workers: int, seed: int, dataset: Any) -> None:
        self.id = id
        self.num_workers = num_workers
        self.seed = seed
        self.dataset = dataset
        self.__initialized = True

    def __setattr__(self, key: str, val: Any) -> None:
        if self.__initialized:
            raise RuntimeError(
                f"Cannot assign attributes to {self.__class__.__name__} objects"
            )
        super().__setattr__(key, val)

    def __repr__(self) -> str:
        return (
            f"WorkerInfo(id={self.id}, num_workers={self.num_workers}, "
            f"seed={self.seed}, dataset={self.dataset!r})"
        )


_current: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """The WorkerInfo of this worker process; None in the main process."""
    return _current


def set_worker_info(info: WorkerInfo | None) -> None:
    """Called once by a worker process at start-up, before any dataset code."""
    global _current
    _current = info
