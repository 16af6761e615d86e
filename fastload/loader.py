"""DataLoader: checks its arguments, picks the index sampler, iterates.

The work is split so that worker processes slot in beside the single-process
path: ``DataLoader`` holds configuration; ``_BaseDataLoaderIter`` holds what
every iterator shares (index sampler, seed, output conversion, the length
warning of iterable datasets); ``_SingleProcessIter`` fetches in this process
through a fetcher from ``_fetch``, which worker processes use unchanged.
"""
from __future__ import annotations

import builtins
import math
import multiprocessing
import multiprocessing.context
import os
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

import numpy as np

from fastload import _checkpoint, _datapipes, _seed
from fastload._fetch import DatasetKind
from fastload._iterator import BaseIter, SingleProcessIter
from fastload._loader_state import LoaderState
from fastload._multiprocess import MultiProcessingIter
from fastload._progress import Progress
from fastload._seed import GeneratorArg
from fastload._stats import LoaderStats
from fastload._thread_workers import ThreadIter
from fastload._torch import torch_or_none
from fastload._torch_draws import (
    UNRESUMABLE_SAMPLER,
    refuse_unresumable,
    resumable,
    unresumable_sampler,
)
from fastload._torchdata_layout import fastload_fields, torchdata_keys
from fastload._warnings import warn_at_caller
from fastload.collate import default_collate, default_convert, engine_collation
from fastload.dataset import Dataset, _is_iterable_dataset
from fastload.distributed import warn_if_not_sharded
from fastload.errors import InvalidArgumentError, StateMismatchError
from fastload.sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    _InfiniteConstantSampler,
)

__all__ = ["DataLoader", "StatefulDataLoader"]

T_co = TypeVar("T_co", covariant=True)

_OUTPUTS = ("numpy", "torch")
_WORKER_METHODS = ("multiprocessing", "thread")
# Settings that decide which indices are fetched; changing them under a live
# iterator would silently break it, so they are fixed after construction.
_FROZEN = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")


class DataLoader(Generic[T_co]):
    """Iterates over a dataset in batches, with the arguments, defaults and
    errors of ``torch.utils.data.DataLoader``; batches hold numpy arrays where
    the samples hold numpy arrays or numbers, and tensors where they hold
    tensors.

    fastload's own keyword arguments:

    * ``output``: ``None`` (default: leaves as the samples have them),
      ``'numpy'`` or ``'torch'``, which turn every numeric leaf of a batch
      into a numpy array or a tensor, sharing its memory.
    * ``snapshot_every_n_steps``: how often a checkpointable loader records
      its state, as in torchdata's StatefulDataLoader.
    * ``prefetch_next_epoch``: with persistent workers, start on the
      next epoch's first batches once an epoch's sampler has run out, before
      its ``iter()`` (NOTE [ Epoch lookahead ] in fastload._lookahead). Off by
      default: those batches are then read before anything the program
      changes between epochs, such as a shared value the dataset reads.

    ``worker_method`` is ``'multiprocessing'`` (default: ``num_workers``
    worker processes) or ``'thread'`` (``num_workers`` threads of this
    process; NOTE [ Thread workers ] in fastload._thread_workers), as in
    torch.

    ``generator`` may be an int seed, a ``numpy.random.Generator`` or a
    ``torch.Generator`` (see NOTE [ Determinism contract ] in fastload._seed).
    """

    dataset: Dataset[T_co]
    batch_size: int | None
    num_workers: int
    pin_memory: bool
    drop_last: bool
    timeout: float
    sampler: Sampler[Any] | Iterable[Any]
    pin_memory_device: str
    prefetch_factor: int | None
    __initialized = False

    def __init__(
        self,
        dataset: Dataset[T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: str | multiprocessing.context.BaseContext | None = None,
        generator: GeneratorArg = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        output: str | None = None,
        snapshot_every_n_steps: int = 1,
        worker_method: str = "multiprocessing",
        prefetch_next_epoch: bool = False,
    ) -> None:
        if worker_method not in _WORKER_METHODS:
            raise ValueError(f"worker_method should be one of {_WORKER_METHODS}, "
                             f"but got worker_method={worker_method!r}")
        if worker_method == "thread" and multiprocessing_context is not None:
            raise ValueError("multiprocessing_context can only be used with "
                             "worker_method='multiprocessing'")
        if num_workers < 0:
            raise ValueError(
                "num_workers option should be non-negative; "
                "use num_workers=0 to disable multiprocessing."
            )
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor option could only be specified in multiprocessing. "
                "Let num_workers > 0 to enable multiprocessing, otherwise set "
                "prefetch_factor to None."
            )
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        elif prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        elif prefetch_factor == 0:
            # torch refuses it too (when iterating): no batch would ever be loaded.
            raise InvalidArgumentError(
                "prefetch_factor must be greater than 0 with worker processes "
                f"(num_workers={num_workers}); got 0")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if prefetch_next_epoch and not persistent_workers:
            raise ValueError("prefetch_next_epoch needs persistent workers "
                             "(num_workers > 0, persistent_workers=True)")
        if output is not None and output not in _OUTPUTS:
            raise ValueError(
                f"output should be None or one of {_OUTPUTS}, but got output={output!r}")
        if output == "torch" and torch_or_none() is None:
            raise ImportError("output='torch' needs PyTorch installed (pip install torch)")
        if (
            not isinstance(snapshot_every_n_steps, (int, np.integer))
            or isinstance(snapshot_every_n_steps, bool)
            or snapshot_every_n_steps < 0
        ):
            raise ValueError(
                "snapshot_every_n_steps should be a non-negative integer (0: no snapshot "
                f"within an epoch), but got snapshot_every_n_steps={snapshot_every_n_steps!r}"
            )

        if _datapipes.is_datapipe(dataset):
            # torch's rule: a pipe's shufflers follow shuffle (when given).
            dataset = _datapipes.apply_shuffle(dataset, shuffle)
            shuffle = None
        self.dataset = dataset
        self.num_workers = num_workers
        self.worker_method = worker_method
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.in_order = in_order
        self.output = output
        self.snapshot_every_n_steps = int(snapshot_every_n_steps)
        self.prefetch_next_epoch = bool(prefetch_next_epoch)

        if _is_iterable_dataset(dataset):
            self._dataset_kind = DatasetKind.ITERABLE
            if shuffle not in {False, None}:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified shuffle "
                    f"option, but got shuffle={shuffle}"
                )
            if sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified sampler "
                    f"option, but got sampler={sampler}"
                )
            if batch_sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified "
                    f"batch_sampler option, but got batch_sampler={batch_sampler}"
                )
        else:
            shuffle = bool(shuffle)
            self._dataset_kind = DatasetKind.MAP

        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive with batch_size, "
                    "shuffle, sampler, and drop_last"
                )
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError(
                "batch_size=None option disables auto-batching and is mutually "
                "exclusive with drop_last"
            )

        # One generator object serves the default sampler and the iterators'
        # seed draws, so that epochs advance one shared stream, as in torch.
        self._rng = _seed.resolve_generator(generator)
        self.generator = self._rng if isinstance(generator, (int, np.integer)) else generator

        if sampler is None:
            if self._dataset_kind is DatasetKind.ITERABLE:
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=self._rng)  # type: ignore[arg-type]
            else:
                sampler = SequentialSampler(dataset)  # type: ignore[arg-type]
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)  # type: ignore[arg-type]

        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        # What the iterators draw indices from (torch's random samplers made
        # resumable: fastload._torch_draws).
        self._draws = resumable(batch_sampler if batch_sampler is not None else sampler,
                                self._rng)
        self._unresumable = unresumable_sampler(self._draws)
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        # See __len__: the length an iterable dataset reported, to warn if it lied.
        self._IterableDataset_len_called: int | None = None
        self._iterator: BaseIter | None = None
        self._latest_iterator: weakref.ref[BaseIter] | None = None
        self._latest_stats: LoaderStats | None = None
        # Epochs started so far; the position the latest one reached; a
        # loaded state waiting for the next iter() (NOTE [ Resume contract ]).
        self._epoch = 0
        self._progress: Progress | None = None
        self._resume_state: LoaderState | None = None
        self._resume_restored = True  # see _checkpoint.load
        self._restored_at_an_end: LoaderState | None = None  # see _checkpoint.start
        self.__initialized = True
        self.check_worker_number_rationality()

    @property
    def multiprocessing_context(self) -> multiprocessing.context.BaseContext | None:
        return self.__multiprocessing_context

    @multiprocessing_context.setter
    def multiprocessing_context(
        self, context: str | multiprocessing.context.BaseContext | None
    ) -> None:
        if context is not None:
            if self.num_workers == 0:
                raise ValueError(
                    "multiprocessing_context can only be used with multi-process "
                    f"loading (num_workers > 0), but got num_workers={self.num_workers}"
                )
            if isinstance(context, str):
                methods = multiprocessing.get_all_start_methods()
                if context not in methods:
                    raise ValueError(
                        "multiprocessing_context option should specify a valid start "
                        f"method in {methods!r}, but got multiprocessing_context={context!r}"
                    )
                context = multiprocessing.get_context(context)
            if not isinstance(context, multiprocessing.context.BaseContext):
                raise TypeError(
                    "multiprocessing_context option should be a valid context object "
                    "or a string specifying the start method, but got "
                    f"multiprocessing_context={context}"
                )
        self.__multiprocessing_context = context

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__initialized and name in _FROZEN:
            raise ValueError(
                f"{name} attribute should not be set after {type(self).__name__} is initialized"
            )
        super().__setattr__(name, value)

    def __getstate__(self) -> dict[str, Any]:
        # As torch's loader pickles at any time: the link to the latest
        # iterator is this process's only (its statistics stay). Persistent
        # workers' iterator refuses, as torch's does.
        state = self.__dict__.copy()
        state["_latest_iterator"] = None
        return state

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self) -> Any:
        return self._draws

    def _engine_collation(self) -> tuple[Callable[[Any], Any], str | None]:
        """The collate_fn and output its iterators run (collate.engine_collation)."""
        return engine_collation(self.collate_fn, self.output)

    def _get_iterator(self, resume: LoaderState | None = None,
                      base_seed: int | None = None,
                      start_states: list[Any] | None = None) -> BaseIter:
        iterator: BaseIter
        if self.num_workers == 0:
            iterator = SingleProcessIter(self, resume)
        elif self.worker_method == "thread":
            iterator = ThreadIter(self, resume, base_seed, start_states)
        else:
            iterator = MultiProcessingIter(self, resume, base_seed, start_states)
        self._latest_iterator = weakref.ref(iterator)
        self._latest_stats = iterator._stats
        return iterator

    def stats(self) -> LoaderStats | None:
        """Statistics of this loader's latest iterator (None before the first
        ``iter()``): batches/s, time the loop waited for data versus time in
        its own step, per-worker fetch and collate time, ring and slot
        occupancy, and a one-line ``verdict`` on whether data loading is the
        bottleneck. They outlive the iterator (occupancy as last seen)."""
        iterator = self._latest_iterator() if self._latest_iterator is not None else None
        return iterator.stats() if iterator is not None else self._latest_stats

    def __iter__(self) -> BaseIter:
        warn_if_not_sharded(self._index_sampler, self._dataset_kind is DatasetKind.MAP)
        pending, self._resume_state = self._resume_state, None
        resume, kept_base_seed, start_states = None, None, None
        if pending is not None:
            try:
                start = _checkpoint.start(self, pending, self._resume_restored)
            except StateMismatchError:
                self._resume_state = pending  # every iter() refuses it until another load
                raise
            resume, kept_base_seed, start_states = (start.state, start.base_seed,
                                                    start.replica_states)
            if self._iterator is not None:
                # Persistent workers hold the old position; start afresh.
                self._iterator._shutdown()
                self._iterator = None
        try:
            iterator = self._next_iterator(resume, kept_base_seed, start_states)
        except BaseException:
            # The resume did not happen (a dataset that cannot load its
            # state, say): every iter() tries it again, as torchdata's does,
            # rather than start the epoch afresh.
            if pending is not None:
                self._resume_state = pending
            raise
        self._epoch += 1
        return iterator

    def enumerate(self, start: int = 0) -> Iterator[tuple[int, Any]]:
        """A new epoch's batches with their positions in it, counted from
        ``start``: ``enumerate(loader, start)``, except that an epoch resumed
        from a loaded state counts on from where the state left it (as
        torchdata's ``StatefulDataLoader.enumerate``), so the numbers are
        those of the run that took the state."""
        iterator = iter(self)
        return builtins.enumerate(iterator, start + iterator._progress.delivered)

    def _next_iterator(self, resume: LoaderState | None, kept_base_seed: int | None,
                       start_states: list[Any] | None) -> BaseIter:
        iterator: BaseIter
        # Persistent workers live in the first iterator, which every later
        # epoch resets instead of starting new processes.
        if self.persistent_workers and self.num_workers > 0:
            if self._iterator is not None and not self._iterator.reusable:
                # Its workers died: a fresh group, with the seed the old one
                # had, so the generator is not drawn from again.
                kept_base_seed = self._iterator._base_seed
                self._iterator = None
            if self._iterator is None:
                self._iterator = iterator = self._get_iterator(resume, kept_base_seed,
                                                               start_states)
            else:
                self._iterator._reset(self)
                iterator = self._iterator
        else:
            iterator = self._get_iterator(resume)
        return iterator

    def state_dict(self) -> dict[str, Any]:
        """The loader's position after the last batch it delivered, as a plain
        dict: ``load_state_dict`` of it on a loader built the same way makes
        the next ``iter()`` deliver exactly the batches that were still to
        come (NOTE [ Resume contract ] in fastload._checkpoint). The sampler
        and dataset states inside are the snapshots themselves, not copies:
        treat the dict as read-only (or copy it) if the loader runs on."""
        state = _checkpoint.capture(self)
        # torchdata's keys too, for code that reads its layout (NOTE
        # [ torchdata's keys ] in fastload._torchdata_layout).
        state.update(torchdata_keys(state, self.num_workers, self.snapshot_every_n_steps,
                                    self._IterableDataset_len_called))
        if self._unresumable is not None:
            state[UNRESUMABLE_SAMPLER] = self._unresumable
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a ``state_dict()`` at the next ``iter()`` (a state taken
        after an epoch ran out restores the sampler at once, so that, as in the
        original run, a ``set_epoch`` before that ``iter()`` applies). An empty
        state is a no-op. Raises ValueError for anything that is not such a
        state. A state of a loader with another dataset length, batch size,
        drop_last, or (datasets whose replicas keep a state) number of
        workers is refused at the next ``iter()``, as torchdata refuses it,
        with StateMismatchError naming what differs (a ValueError and an
        AssertionError), and at every ``iter()`` until another state is
        loaded."""
        refuse_unresumable(state)
        self._resume_state, self._resume_restored = _checkpoint.load(self, fastload_fields(state))

    def __len__(self) -> int:
        if self._dataset_kind is DatasetKind.ITERABLE:
            # NOTE [ IterableDataset and __len__ ]: the loader cannot know how
            # many samples a stream holds; it trusts len(dataset), estimates
            # the number of batches from it, and warns if more arrive.
            length = self._IterableDataset_len_called = len(self.dataset)  # type: ignore[arg-type]
            if self.batch_size is not None:
                if self.drop_last:
                    return length // self.batch_size
                return math.ceil(length / self.batch_size)
            return length
        return len(self._index_sampler)

    def check_worker_number_rationality(self) -> None:
        """Warn when more workers are requested than this process may use CPUs."""
        if not self.num_workers:
            return
        if hasattr(os, "sched_getaffinity"):
            cpus: int | None = len(os.sched_getaffinity(0))
        else:
            cpus = os.cpu_count()
        if cpus is None or self.num_workers > cpus:
            suggestion = (
                f"Our suggested max number of worker in current system is {cpus}, which "
                "is smaller than what this DataLoader is going to create."
                if cpus is not None
                else "DataLoader is not able to compute a suggested max number of worker "
                "in current system."
            )
            warn_at_caller(
                f"This DataLoader will create {self.num_workers} worker processes in "
                f"total. {suggestion} Please be aware that excessive worker creation "
                "might get DataLoader running slow or even freeze, lower the worker "
                "number to avoid potential slowness/freeze if necessary."
            )


StatefulDataLoader = DataLoader


