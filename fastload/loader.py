"""DataLoader: checks its arguments, picks the index sampler, iterates.

The work is split so that worker processes slot in beside the single-process
path: ``DataLoader`` holds configuration; ``_BaseDataLoaderIter`` holds what
every iterator shares (index sampler, seed, output conversion, the length
warning of iterable datasets); ``_SingleProcessIter`` fetches in this process
through a fetcher from ``_fetch``, which worker processes use unchanged.
"""
from __future__ import annotations

import math
import multiprocessing
import multiprocessing.context
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

import numpy as np

from fastload import _seed
from fastload._fetch import DatasetKind, create_fetcher
from fastload._seed import GeneratorArg
from fastload._torch import torch_or_none
from fastload.collate import arrays_to_tensors, default_collate, default_convert
from fastload.dataset import Dataset, _is_iterable_dataset
from fastload.errors import InvalidArgumentError
from fastload.sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler

__all__ = ["DataLoader", "StatefulDataLoader"]

T_co = TypeVar("T_co", covariant=True)

_OUTPUTS = ("numpy", "torch")
# Settings that decide which indices are fetched; changing them under a live
# iterator would silently break it, so they are fixed after construction.
_FROZEN = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _warn_at_caller(message: str) -> None:
    """Warn pointing at the first frame outside fastload: the user's line,
    however deep in the loader the condition was found."""
    frame, level = sys._getframe(0), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, UserWarning, stacklevel=level)


class _InfiniteConstantSampler(Sampler[None]):
    """The sampler of an iterable dataset: the dataset decides what comes
    next, so the sampler only says "one more", forever."""

    def __iter__(self) -> Iterator[None]:
        while True:
            yield None


class DataLoader(Generic[T_co]):
    """Iterates over a dataset in batches, with the arguments, defaults and
    errors of ``torch.utils.data.DataLoader``; batches are numpy arrays.

    fastload's own keyword arguments:

    * ``output``: ``'numpy'`` (default) or ``'torch'``, which turns every
      numeric array of a batch into a tensor sharing its memory.
    * ``snapshot_every_n_steps``: how often a checkpointable loader records
      its state, as in torchdata's StatefulDataLoader.

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
        output: str = "numpy",
        snapshot_every_n_steps: int = 1,
    ) -> None:
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
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if output not in _OUTPUTS:
            raise ValueError(f"output should be one of {_OUTPUTS}, but got output={output!r}")
        if output == "torch" and torch_or_none() is None:
            raise ImportError("output='torch' needs PyTorch installed (pip install torch)")
        if (
            not isinstance(snapshot_every_n_steps, (int, np.integer))
            or isinstance(snapshot_every_n_steps, bool)
            or snapshot_every_n_steps < 1
        ):
            raise ValueError(
                "snapshot_every_n_steps should be a positive integer, "
                f"but got snapshot_every_n_steps={snapshot_every_n_steps!r}"
            )

        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.in_order = in_order
        self.output = output
        self.snapshot_every_n_steps = int(snapshot_every_n_steps)

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
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        # See __len__: the length an iterable dataset reported, to warn if it lied.
        self._IterableDataset_len_called: int | None = None
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

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self) -> Any:
        return self.batch_sampler if self._auto_collation else self.sampler

    def _get_iterator(self) -> _BaseDataLoaderIter:
        if self.num_workers == 0:
            return _SingleProcessIter(self)
        raise NotImplementedError(
            f"fastload does not support num_workers > 0 yet (got num_workers="
            f"{self.num_workers}); use num_workers=0 to load in this process."
        )

    def __iter__(self) -> _BaseDataLoaderIter:
        return self._get_iterator()

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
            _warn_at_caller(
                f"This DataLoader will create {self.num_workers} worker processes in "
                f"total. {suggestion} Please be aware that excessive worker creation "
                "might get DataLoader running slow or even freeze, lower the worker "
                "number to avoid potential slowness/freeze if necessary."
            )


StatefulDataLoader = DataLoader


def _pin_target(loader: DataLoader[Any]) -> Any:
    """torch when batches can and should be pinned, else None (with torch's
    warnings when pinning was asked for but cannot happen)."""
    if not loader.pin_memory:
        return None
    if loader.pin_memory_device:
        _warn_at_caller(
            "pin_memory_device is deprecated, the current accelerator will be used "
            f"as the device, ignore pin_memory_device='{loader.pin_memory_device}'."
        )
    torch = torch_or_none()
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not accelerator.is_available():
        _warn_at_caller(
            "'pin_memory' argument is set as true but no accelerator is found, "
            "then device pinned memory won't be used."
        )
        return None
    return torch


def _pin(torch: Any, data: Any) -> Any:
    """Copy each numeric array of ``data`` into page-locked memory, keeping
    numpy arrays numpy (a view of the pinned tensor) and tensors tensors."""
    if isinstance(data, np.ndarray):
        if data.dtype.kind not in "biufc":
            return data
        return torch.from_numpy(data).pin_memory().numpy()
    if isinstance(data, torch.Tensor):
        return data.pin_memory()
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_pin(torch, d) for d in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_pin(torch, d) for d in data)
    if isinstance(data, dict):
        return type(data)({k: _pin(torch, v) for k, v in data.items()})
    return data


class _BaseDataLoaderIter:
    """What every DataLoader iterator shares; subclasses define ``_next_data``."""

    def __init__(self, loader: DataLoader[Any]) -> None:
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
        self._pin_torch = _pin_target(loader)
        self._to_torch = loader.output == "torch"
        # Same order as torch: the (lazy) sampler iterator first, then the
        # seed draw, so a shared torch.Generator advances exactly as in torch.
        self._sampler_iter = iter(self._index_sampler)
        self._base_seed = _seed.draw_seed(loader._rng)
        self._num_yielded = 0

    def __iter__(self) -> _BaseDataLoaderIter:
        return self

    def _next_data(self) -> Any:
        raise NotImplementedError

    def _finish(self, data: Any) -> Any:
        """Pinning and output conversion, applied to every batch."""
        if self._pin_torch is not None:
            data = _pin(self._pin_torch, data)
        if self._to_torch:
            data = arrays_to_tensors(data)
        return data

    def __next__(self) -> Any:
        data = self._next_data()
        self._num_yielded += 1
        if (
            self._dataset_kind is DatasetKind.ITERABLE
            and self._IterableDataset_len_called is not None
            and self._num_yielded > self._IterableDataset_len_called
        ):
            _warn_at_caller(
                f"Length of IterableDataset {self._dataset} was reported to be "
                f"{self._IterableDataset_len_called} (when accessing len(dataloader)), "
                f"but {self._num_yielded} samples have been fetched. "
            )
        return data

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __getstate__(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} cannot be pickled")


class _SingleProcessIter(_BaseDataLoaderIter):
    """Fetches and collates each batch in the calling thread."""

    def __init__(self, loader: DataLoader[Any]) -> None:
        super().__init__(loader)
        if self._timeout != 0:
            raise InvalidArgumentError(
                f"timeout={self._timeout} needs worker processes (num_workers > 0); "
                "loading in the main process cannot time out"
            )
        self._fetcher = create_fetcher(
            self._dataset_kind,
            self._dataset,
            self._auto_collation,
            self._collate_fn,
            self._drop_last,
        )

    def _next_data(self) -> Any:
        index = next(self._sampler_iter)
        return self._finish(self._fetcher.fetch(index))
