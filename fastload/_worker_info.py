"""Which worker this is, for code that runs inside datasets.

Kept apart from the worker loop so that datasets, the single-process loader
and the worker processes share it without importing each other.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """The current worker, read-only, with the fields of torch's WorkerInfo:
    ``id`` (0 to ``num_workers - 1``), ``num_workers``, ``seed`` (the seed of
    this worker's global generators), ``dataset`` (this worker's copy),
    ``rng`` (per-thread generators; None in a worker process) and
    ``worker_method`` ("multiprocessing" or "thread")."""

    id: int
    num_workers: int
    seed: int
    dataset: Any
    rng: Any = None
    worker_method: str | None = "multiprocessing"


_current: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """The WorkerInfo of this worker; None in the main process."""
    return _current


def set_worker_info(info: WorkerInfo | None) -> None:
    """Called once by a worker at start-up, before any dataset code. Where
    torch is loaded, torch's ``get_worker_info()`` answers the same, so
    datasets written against ``torch.utils.data`` shard themselves in
    fastload's workers as they do in torch's."""
    global _current
    _current = info
    if "torch" in sys.modules:
        _set_torch_worker_info(info)


def _set_torch_worker_info(info: WorkerInfo | None) -> None:
    from torch.utils.data._utils import worker as torch_worker

    if info is None:
        torch_worker._worker_info = None
        return
    fields = dict(id=info.id, num_workers=info.num_workers, seed=info.seed,
                  dataset=info.dataset)
    try:
        torch_info = torch_worker.WorkerInfo(
            **fields, rng=info.rng, worker_method=info.worker_method)
    except TypeError:  # a torch before 2.13: no rng, no worker_method
        torch_info = torch_worker.WorkerInfo(**fields)
    torch_worker._worker_info = torch_info
