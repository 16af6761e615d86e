"""DataLoader iterators: what they share, and loading in the calling thread.

``BaseIter`` holds what every iterator needs: the index sampler and its
position, the seed, output conversion, statistics and the ``Progress`` that
``DataLoader.state_dict()`` reads (NOTE [ Resume contract ] in
fastload._state). ``SingleProcessIter`` fetches through a fetcher from
``_fetch``, which worker processes use unchanged; the worker iterator is in
``_multiprocess``.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from fastload import _seed
from fastload._fetch import DatasetKind, create_fetcher, is_stateful, skip_batches
from fastload._sample_rng import context as sample_context
from fastload._state import dataset_state, sampler_state
from fastload._stats import LoaderStats
from fastload._torch import torch_or_none
from fastload._warnings import warn_at_caller
from fastload.collate import arrays_to_tensors, tensors_to_arrays
from fastload.errors import InvalidArgumentError


class WorkerProgress:
    """An iterable dataset's position in one worker (see Progress)."""

    __slots__ = ("yielded", "state", "state_step", "ended")

    def __init__(self, yielded: int = 0, state: Any = None, state_step: int = 0,
                 ended: bool = False) -> None:
        self.yielded = yielded
        self.state = state
        self.state_step = state_step
        self.ended = ended

    def as_dict(self) -> dict[str, Any]:
        return {"yielded": self.yielded, "state": self.state,
                "state_step": self.state_step, "ended": self.ended}


class Progress:
    """Where an epoch stands after the last batch the user received.

    ``sampler`` is the index sampler's state recorded when the indices of
    batch ``sampler_step`` were drawn; ``dataset`` likewise for an iterable
    dataset loaded in this process; ``workers`` for one loaded by workers.
    """

    def __init__(self, epoch: int, base_seed: int) -> None:
        self.epoch = epoch
        self.base_seed = base_seed
        self.yielded = 0
        self.finished = False
        self.sampler: Any = None
        self.sampler_step = 0
        self.dataset: Any = None
        self.dataset_step = 0
        self.dataset_ended = False
        self.workers: list[WorkerProgress] | None = None
        self.next_worker = 0
        # in_order=False: positions delivered past the first one missing,
        # each with the sampler's state recorded when it was drawn (or None).
        # ``yielded`` then counts the contiguous prefix only.
        self.beyond: dict[int, Any] = {}

    def deliver(self, position: int, sampler_state: Any) -> None:
        """Batch ``position`` of the epoch was delivered (map-style)."""
        if position != self.yielded:
            self.beyond[position] = sampler_state
            return
        while True:
            self.yielded += 1
            if sampler_state is not None:
                self.sampler, self.sampler_step = sampler_state, self.yielded
            if self.yielded not in self.beyond:
                return
            sampler_state = self.beyond.pop(self.yielded)

    def stream_ended(self, task: Any) -> None:
        """A worker's iterable stream ran out (its ENDED task): past its end
        a stream's state is where the next epoch starts (None: a new
        iterator then starts afresh)."""
        if self.workers is not None:
            worker = self.workers[task.worker_id]
            worker.ended = True
            worker.state, worker.state_step = task.dataset_state, worker.yielded

    def advance(self, task: Any) -> None:
        """Move past a batch a worker loaded, as it is delivered. ``task`` has
        ``worker_id``; ``position`` in the epoch (map-style: see ``deliver``);
        ``sampler_state`` (not None on a snapshot step);
        ``has_dataset_state`` and ``dataset_state`` (the worker's iterable
        dataset after that batch); ``dataset_ended``."""
        if self.workers is None:
            self.deliver(task.position, task.sampler_state)
            return
        self.yielded += 1
        if task.sampler_state is not None:
            self.sampler, self.sampler_step = task.sampler_state, self.yielded
        if self.workers is not None:
            worker = self.workers[task.worker_id]
            worker.yielded += 1
            if task.has_dataset_state:
                worker.state, worker.state_step = task.dataset_state, worker.yielded
            # A short last batch ran the worker's iterator out: a resume must
            # not start that iterator again.
            worker.ended = worker.ended or task.dataset_ended
            self.next_worker = (task.worker_id + 1) % len(self.workers)


def _length_or_none(sampler: Any) -> float:
    """len(sampler), or infinity for a sampler without one."""
    try:
        return len(sampler)
    except TypeError:
        return float("inf")


def _continues_an_epoch(sampler: Any) -> bool:
    """Whether a sampler restored from a state continues that state's epoch
    at its next iteration rather than starting a new one: fastload's
    samplers (under a BatchSampler too) keep that pending in ``_resume``;
    others are not known to."""
    while not hasattr(sampler, "_resume") and hasattr(sampler, "sampler"):
        sampler = sampler.sampler
    return getattr(sampler, "_resume", None) is not None


def pin_target(loader: Any) -> Any:
    """torch when batches can and should be pinned, else None (with torch's
    warnings when pinning was asked for but cannot happen)."""
    if not loader.pin_memory:
        return None
    if loader.pin_memory_device:
        warn_at_caller(
            "pin_memory_device is deprecated, the current accelerator will be used "
            f"as the device, ignore pin_memory_device='{loader.pin_memory_device}'."
        )
    torch = torch_or_none()
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not accelerator.is_available():
        warn_at_caller(
            "'pin_memory' argument is set as true but no accelerator is found, "
            "then device pinned memory won't be used."
        )
        return None
    return torch


def pin_batch(torch: Any, data: Any) -> Any:
    """Copy each numeric array of ``data`` into page-locked memory, keeping
    numpy arrays numpy (a view of the pinned tensor) and tensors tensors; a
    batch type with its own ``pin_memory()`` method pins itself."""
    if isinstance(data, np.ndarray):
        if data.dtype.kind not in "biufc":
            return data
        return torch.from_numpy(data).pin_memory().numpy()
    if isinstance(data, torch.Tensor):
        return data.pin_memory()
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(pin_batch(torch, d) for d in data))
    if isinstance(data, (list, tuple)):
        return type(data)(pin_batch(torch, d) for d in data)
    if isinstance(data, dict):
        return type(data)({k: pin_batch(torch, v) for k, v in data.items()})
    if hasattr(data, "pin_memory"):
        return data.pin_memory()
    return data


class BaseIter:
    """What every DataLoader iterator shares; subclasses define ``_next_data``."""

    # Whether a persistent-workers loader may start its next epoch on this
    # iterator (False once its workers are gone).
    reusable = True

    def __init__(self, loader: Any, resume: dict[str, Any] | None,
                 base_seed: int | None = None) -> None:
        """``base_seed``, when given, is used instead of drawing one (a
        resumed persistent-workers run whose saved run reused its iterator)."""
        self._dataset = loader.dataset
        self._dataset_kind = loader._dataset_kind
        self._IterableDataset_len_called = loader._IterableDataset_len_called
        self._auto_collation = loader._auto_collation
        self._drop_last = loader.drop_last
        self._index_sampler = loader._index_sampler
        self._num_workers = loader.num_workers
        self._timeout = loader.timeout
        self._collate_fn = loader.collate_fn
        self._persistent_workers = loader.persistent_workers
        self._snapshot_every = loader.snapshot_every_n_steps
        self._output = loader.output
        self._map_style = self._dataset_kind is DatasetKind.MAP
        # Whether the dataset's position is checkpointed: a map-style
        # dataset's own state in this process, an iterable one's stream.
        self._dataset_stateful = is_stateful(self._dataset)
        self._stats = LoaderStats()
        self._returned_at: float | None = None
        if resume is None:
            # Same order as torch: the (lazy) sampler iterator first, then the
            # seed draw, so a shared torch.Generator advances exactly as in torch.
            self._sampler_iter = iter(self._index_sampler)
            if base_seed is None:
                loader._rng = _seed.own_generator(loader._rng)
                base_seed = _seed.draw_seed(loader._rng)
            self._progress = Progress(loader._epoch, base_seed)
            self._progress.sampler = sampler_state(self._index_sampler)
        else:
            self._progress = self._resume(resume)
        # Batches an in_order=False loader delivered past its first missing
        # one before the checkpoint: drawn from the sampler, never loaded.
        self._skip = frozenset(self._progress.beyond)
        self._base_seed = self._progress.base_seed
        loader._progress = self._progress

    def _resume(self, state: dict[str, Any]) -> Progress:
        """Continue the epoch ``state`` describes (the loader's generator was
        restored already): the sampler from its snapshot, then the batches
        delivered after it skipped by counting, without fetching them."""
        progress = Progress(state["epoch"], state["base_seed"])
        progress.yielded = state["yielded"]
        progress.beyond = dict.fromkeys(
            position for start, stop in state.get("delivered_beyond", ())
            for position in range(start, stop))
        progress.sampler, progress.sampler_step = state["sampler"], state["sampler_step"]
        skip = progress.yielded
        if progress.sampler is not None:
            self._index_sampler.load_state_dict(progress.sampler)
            skip -= progress.sampler_step
        self._sampler_iter = iter(self._index_sampler)
        if self._map_style:
            if progress.yielded >= _length_or_none(self._index_sampler):
                # Every batch was delivered, only the StopIteration was not.
                # A sampler still inside that epoch runs out of its (empty)
                # remainder now, so that its next iteration is a new epoch.
                if progress.sampler is not None and _continues_an_epoch(self._index_sampler):
                    for _ in self._sampler_iter:
                        pass
                self._sampler_iter = iter(())
            for _ in range(skip):
                next(self._sampler_iter, None)
        return progress

    def __iter__(self) -> BaseIter:
        return self

    def _reset(self, loader: Any) -> None:
        """Start a new epoch on this iterator (persistent workers)."""
        self._skip = frozenset()
        self._sampler_iter = iter(self._index_sampler)
        self._progress = Progress(loader._epoch, self._base_seed)
        self._progress.sampler = sampler_state(self._index_sampler)
        loader._progress = self._progress
        self._returned_at = None
        self._IterableDataset_len_called = loader._IterableDataset_len_called

    def _shutdown(self) -> None:
        """Release what the iterator holds (worker processes, if any)."""

    def _snapshot_due(self) -> bool:
        """Whether the batch about to be delivered records a snapshot (never
        with snapshot_every_n_steps=0: states then count from the epoch's
        start)."""
        every = self._snapshot_every
        return every > 0 and (self._progress.yielded + 1) % every == 0

    def _next_data(self) -> Any:
        raise NotImplementedError

    def _end_epoch(self) -> None:
        """The sampler ran out: the state now says "epoch finished"."""
        self._progress.finished = True
        self._progress.sampler = sampler_state(self._index_sampler)

    def _convert(self, data: Any) -> Any:
        """The batch in the types ``output`` asks for: leaves as the samples
        had them (None), numpy arrays or tensors, sharing memory either way."""
        if self._output is None:
            return data
        if self._output == "torch":
            return arrays_to_tensors(data)
        return tensors_to_arrays(data)

    def stats(self) -> LoaderStats:
        """What this iterator measured: see fastload._stats."""
        return self._stats

    def __next__(self) -> Any:
        asked_at = time.perf_counter()
        stats = self._stats
        if self._returned_at is not None:
            stats.step_seconds += asked_at - self._returned_at
        try:
            data = self._next_data()
        except StopIteration:
            self._end_epoch()
            raise
        self._returned_at = time.perf_counter()
        stats.wait_seconds += self._returned_at - asked_at
        stats.batches += 1
        if (
            not self._map_style
            and self._IterableDataset_len_called is not None
            and self._progress.yielded > self._IterableDataset_len_called
        ):
            warn_at_caller(
                f"Length of IterableDataset {self._dataset} was reported to be "
                f"{self._IterableDataset_len_called} (when accessing len(dataloader)), "
                f"but {self._progress.yielded} samples have been fetched. "
            )
        return data

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __getstate__(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} cannot be pickled")


class SingleProcessIter(BaseIter):
    """Fetches and collates each batch in the calling thread."""

    def __init__(self, loader: Any, resume: dict[str, Any] | None) -> None:
        super().__init__(loader, resume)
        if self._timeout != 0:
            raise InvalidArgumentError(
                f"timeout={self._timeout} needs worker processes (num_workers > 0); "
                "loading in the main process cannot time out"
            )
        self._pin_torch = pin_target(loader)
        self._drawn = self._progress.yielded  # epoch positions drawn so far
        self._fetcher = create_fetcher(
            self._dataset_kind,
            self._dataset,
            self._auto_collation,
            self._collate_fn,
            self._drop_last,
        )
        if not self._map_style:
            self._dataset_stateful = self._fetcher.stateful
        progress = self._progress
        if resume is None:
            # A state taken before the first batch then holds the stream's
            # start, not whatever the dataset does later.
            if self._dataset_stateful:
                progress.dataset = self._stream_state()
        elif self._dataset_stateful or self._map_style:
            progress.dataset = resume["dataset"]
            progress.dataset_step = resume["dataset_step"]
            self._restore_stream(resume["dataset"])
        if resume is not None and not self._map_style:
            # An iterable dataset is rewound only by its own state; what it
            # yielded after that state is read again and dropped.
            progress.dataset_ended = resume["dataset_ended"]
            if resume["dataset_ended"]:
                self._fetcher.ended = True  # type: ignore[attr-defined]
            else:
                skip_batches(self._fetcher, progress.yielded - progress.dataset_step,
                             loader.batch_size if self._auto_collation else None)

    def _stream_state(self) -> Any:
        """The dataset's position now: a map-style dataset's own state, or
        an iterable stream's (its iterator's or its dataset's)."""
        if self._map_style:
            return dataset_state(self._dataset)
        return self._fetcher.state()

    def _restore_stream(self, state: Any) -> None:
        if state is None:
            return
        if self._map_style:
            self._dataset.load_state_dict(state)
        else:
            self._fetcher.restore(state)

    def _end_epoch(self) -> None:
        super()._end_epoch()
        if self._dataset_stateful and not self._map_style:
            # The dataset has seen the end of its stream (a counter of epochs
            # moved on, say): that is what the next epoch starts from.
            progress = self._progress
            progress.dataset = self._fetcher.end_state()  # type: ignore[attr-defined]
            progress.dataset_step = progress.yielded
            progress.dataset_ended = True

    def _next_data(self) -> Any:
        progress = self._progress
        index = next(self._sampler_iter)
        self._drawn += 1
        while self._drawn - 1 in self._skip:
            index = next(self._sampler_iter)
            self._drawn += 1
        snapshot = self._snapshot_due()
        if snapshot and self._map_style:
            progress.sampler = sampler_state(self._index_sampler)
            progress.sampler_step = progress.yielded + 1
        sample_context.base_seed = progress.base_seed
        sample_context.epoch = progress.epoch
        try:
            data = self._fetcher.fetch(index)
        except StopIteration:
            raise
        except Exception:
            # The batch is delivered as its exception; the epoch goes on
            # after it, whichever iterator loads (NOTE [ Fast paths ]).
            progress.deliver(progress.yielded, None)
            raise
        if snapshot and self._dataset_stateful:
            progress.dataset = self._stream_state()
            progress.dataset_step = progress.yielded + 1
        if not self._map_style:
            progress.dataset_ended = self._fetcher.ended  # type: ignore[attr-defined]
        progress.deliver(progress.yielded, None)
        if self._pin_torch is not None:
            data = pin_batch(self._pin_torch, data)
        return self._convert(data)
