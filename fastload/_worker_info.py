"""Which worker this is, for code that runs inside datasets.

Kept apart from the worker loop so that datasets, the single-process loader
and the workers share it without importing each other. A worker process
has one WorkerInfo for the whole process; a thread worker has its own, seen
only by its thread (``set_thread_worker_info``).
"""
from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload._torch import torch_if_imported


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


@dataclass(frozen=True, slots=True)
class WorkerRNG:
    """A thread worker's own generators (torch 2.13's ``_RNG``): the global
    ``random``, numpy and torch generators are shared by every thread of a
    process, so a thread worker draws from these instead. Each comes from
    (base seed, worker id) alone: independent between workers and the same
    in every run with the same loader ``generator``. ``torch_generator`` is
    None where torch is not loaded."""

    random_generator: random.Random
    numpy_generator: np.random.Generator
    torch_generator: Any = None


def worker_rng(base_seed: int, worker_id: int) -> WorkerRNG:
    """The generators of thread worker ``worker_id`` under ``base_seed``."""
    seed = (base_seed + worker_id) % 2**64
    torch = torch_if_imported()
    torch_generator = None if torch is None else torch.Generator().manual_seed(seed)
    return WorkerRNG(random.Random(seed),
                     np.random.default_rng(np.random.SeedSequence([base_seed, worker_id])),
                     torch_generator)


_current: WorkerInfo | None = None
# A thread worker's WorkerInfo (``info``) and torch's (``torch_info``).
_thread = threading.local()


def get_worker_info() -> WorkerInfo | None:
    """The WorkerInfo of this worker (process or thread); None in the main
    process, outside thread workers."""
    info: WorkerInfo | None = getattr(_thread, "info", None)
    return _current if info is None else info


def set_worker_info(info: WorkerInfo | None) -> None:
    """Called once by a worker at start-up, before any dataset code. Where
    torch is loaded, torch's ``get_worker_info()`` answers the same, so
    datasets written against ``torch.utils.data`` shard themselves in
    fastload's workers as they do in torch's."""
    global _current
    _current = info
    if torch_if_imported() is not None:
        _set_torch_worker_info(info)


def set_thread_worker_info(info: WorkerInfo | None) -> None:
    """Called by a thread worker when it starts (and with None when it
    ends): ``get_worker_info()`` answers ``info`` in this thread only, and
    so does torch's where torch is loaded (see _torch_thread_aware)."""
    _thread.info = info
    if torch_if_imported() is not None:
        _torch_thread_aware()
        _thread.torch_info = None if info is None else _torch_worker_info(info)


def _set_torch_worker_info(info: WorkerInfo | None) -> None:
    from torch.utils.data._utils import worker as torch_worker

    torch_worker._worker_info = None if info is None else _torch_worker_info(info)


def _torch_thread_aware() -> None:
    """Make torch's ``get_worker_info()`` answer a thread worker's info in
    that thread. torch keeps its answer in one module global, which cannot
    differ between threads, so its function is replaced, once, by one that
    asks this thread first and torch's original otherwise. Code that bound
    torch's original (``from torch.utils.data import get_worker_info``)
    before the first thread worker started keeps the original, which
    answers None in a thread worker."""
    import torch.utils.data as torch_data
    from torch.utils.data import dataloader as torch_dataloader
    from torch.utils.data._utils import worker as torch_worker

    global _torch_original_get_worker_info
    original = torch_worker.get_worker_info
    if original is torch_get_worker_info:
        return
    _torch_original_get_worker_info = original
    torch_get_worker_info.__doc__ = original.__doc__
    for module in (torch_worker, torch_dataloader, torch_data):
        if getattr(module, "get_worker_info", None) is original:
            module.get_worker_info = torch_get_worker_info  # type: ignore[attr-defined]


# torch's own get_worker_info, once _torch_thread_aware replaced it.
_torch_original_get_worker_info: Any = None


def torch_get_worker_info() -> Any:
    """torch's ``get_worker_info()``, thread-aware (see _torch_thread_aware).
    A module-level function, so that what holds it still pickles (spawn)."""
    info = getattr(_thread, "torch_info", None)
    if info is not None:
        return info
    original = _torch_original_get_worker_info
    if original is None:  # unpickled where torch's was never replaced
        from torch.utils.data._utils import worker as torch_worker
        return torch_worker._worker_info
    return original()


def _torch_worker_info(info: WorkerInfo) -> Any:
    """torch's WorkerInfo with the fields of ``info``."""
    from torch.utils.data._utils import worker as torch_worker

    fields = dict(id=info.id, num_workers=info.num_workers, seed=info.seed,
                  dataset=info.dataset)
    try:
        torch_info = torch_worker.WorkerInfo(
            **fields, rng=info.rng, worker_method=info.worker_method)
    except TypeError:  # a torch before 2.13: no rng, no worker_method
        torch_info = torch_worker.WorkerInfo(**fields)
    return torch_info
