"""The loaders the benchmark compares, each built over a workload's dataset.

A contender is a function ``(dataset, batch_size, workers, collate_fn) ->
loader`` whose loader yields one shuffled epoch per ``iter()`` and keeps its
workers between epochs (persistent workers; fastload's, processes and
threads, also with ``prefetch_next_epoch``); ``collate_fn`` None means the
loader's default.
"""
from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from fastload.loader import DataLoader

# Batches in flight per worker, as torch's and fastload's default prefetch_factor.
PREFETCH = 2

# The dataset of the python-mp workers, inherited through fork.
_pool_dataset: Any = None


_pool_collate: Any = None


def _set_pool_dataset(dataset: Any, collate: Any) -> None:
    global _pool_dataset, _pool_collate
    _pool_dataset, _pool_collate = dataset, collate


def stack_batch(dataset: Any, indices: list[int]) -> tuple[np.ndarray, ...]:
    """What a loader without batched fetching or shared memory does: one
    ``dataset[i]`` per sample, then ``np.stack`` per field."""
    samples = [dataset[i] for i in indices]
    return tuple(np.stack(field) for field in zip(*samples))


def _batch_in_pool(indices: list[int]) -> Any:
    return _batch(_pool_dataset, _pool_collate, indices)


def _batch(dataset: Any, collate: Any, indices: list[int]) -> Any:
    if collate is None:
        return stack_batch(dataset, indices)
    return collate([dataset[i] for i in indices])


class PoolLoader:
    """The pure-Python multiprocessing baseline: a ``multiprocessing.Pool``
    whose tasks fetch a batch's samples and return the stacked batch, pickled
    back through the pool's pipe; ``PREFETCH`` tasks per worker in flight.
    Without workers, the same fetch in this process."""

    def __init__(self, dataset: Any, batch_size: int, workers: int, collate: Any = None) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.workers = workers
        self.collate = collate
        self.rng = np.random.default_rng(0)
        self.pending: deque[Any] = deque()  # results of the tasks in flight
        self.pool = (multiprocessing.get_context("fork").Pool(
            workers, initializer=_set_pool_dataset, initargs=(dataset, collate))
            if workers else None)

    def _batches(self) -> Iterator[list[int]]:
        order = self.rng.permutation(len(self.dataset))
        for start in range(0, len(order), self.batch_size):
            yield order[start:start + self.batch_size].tolist()

    def __iter__(self) -> Iterator[tuple[np.ndarray, ...]]:
        if self.pool is None:
            for indices in self._batches():
                yield _batch(self.dataset, self.collate, indices)
            return
        pending = self.pending
        for indices in self._batches():
            pending.append(self.pool.apply_async(_batch_in_pool, (indices,)))
            if len(pending) >= PREFETCH * self.workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()

    def close(self) -> None:
        """Let the tasks in flight finish, then stop the pool. (Pool.terminate
        with tasks in flight can deadlock on the task queue's lock.)"""
        if self.pool is not None:
            for result in self.pending:
                result.wait()
            self.pool.close()
            self.pool.join()


def fastload_loader(dataset: Any, batch_size: int, workers: int, collate_fn: Any = None) -> Any:
    # The bench's datasets read nothing a program changes between epochs:
    # the next epoch's first batches may be loaded before its iter().
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, collate_fn=collate_fn,
                      num_workers=workers, persistent_workers=workers > 0,
                      prefetch_next_epoch=workers > 0)


def fastload_thread_loader(dataset: Any, batch_size: int, workers: int,
                           collate_fn: Any = None) -> Any:
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, collate_fn=collate_fn,
                      num_workers=workers, persistent_workers=workers > 0,
                      prefetch_next_epoch=workers > 0, worker_method="thread")


def torch_loader(dataset: Any, batch_size: int, workers: int, collate_fn: Any = None) -> Any:
    from torch.utils.data import DataLoader as TorchDataLoader

    return TorchDataLoader(dataset, batch_size=batch_size, shuffle=True, collate_fn=collate_fn,
                           num_workers=workers, persistent_workers=workers > 0)


def python_mp_loader(dataset: Any, batch_size: int, workers: int,
                     collate_fn: Any = None) -> Any:
    return PoolLoader(dataset, batch_size, workers, collate_fn)


CONTENDERS: dict[str, Callable[[Any, int, int, Any], Any]] = {
    "fastload": fastload_loader,
    "fastload-thread": fastload_thread_loader,
    "torch": torch_loader,
    "python-mp": python_mp_loader,
}
# The contenders fastload is compared with, in the table's ratio columns.
BASELINES = ("torch", "python-mp")
# fastload's own contenders: they load the workloads' fastload datasets.
FASTLOAD_CONTENDERS = ("fastload", "fastload-thread")
# Contenders that differ from another only with workers (worker threads
# without workers are fastload's main-process loading): measured with workers only.
WORKERS_ONLY = ("fastload-thread",)

# Not loaders: np.copyto of each batch's bytes, the bandwidth ceiling of
# the bandwidth-bound workloads; one process's np.take of each batch's rows,
# the reference for gathering small rows.
MEMCPY = "memcpy"
TAKE = "np.take"
REFERENCES = (MEMCPY, TAKE)


def without_workers(contender: str) -> str:
    """The contender whose 0-worker measurement is ``contender``'s own
    (worker threads without workers are fastload's main-process loading)."""
    return "fastload" if contender in WORKERS_ONLY else contender
