"""Datasets: map-style and iterable, their combinations, and random_split."""
from __future__ import annotations

import bisect
import itertools
import math
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from fastload import _seed
from fastload._gathered import GatheredBatch, GatheredTensors, gather, index_array
from fastload._seed import GeneratorArg
from fastload._torch import is_tensor, torch_data_class, torch_data_classes, torch_or_none
from fastload.collate import is_stacked_column
from fastload.errors import InvalidArgumentError

__all__ = [
    "ArrayDataset",
    "ChainDataset",
    "ConcatDataset",
    "Dataset",
    "IterableDataset",
    "StackDataset",
    "Subset",
    "TensorDataset",
    "random_split",
]

T_co = TypeVar("T_co", covariant=True)
T = TypeVar("T")


class Dataset(Generic[T_co]):
    """A map from keys (usually ``0 .. len - 1``) to samples.

    Subclasses define ``__getitem__`` and usually ``__len__``; they may define
    ``__getitems__(indices) -> list of samples`` to fetch a whole batch at
    once, which the DataLoader then calls instead of ``__getitem__``.
    """

    def __getitem__(self, index: Any) -> T_co:
        raise NotImplementedError("Subclasses of Dataset should implement __getitem__.")

    def __add__(self, other: Dataset[T_co]) -> ConcatDataset[T_co]:
        return ConcatDataset([self, other])


class IterableDataset(Dataset[T_co], Iterable[T_co]):
    """A stream of samples: subclasses define ``__iter__``.

    With worker processes each worker iterates its own copy; use
    ``get_worker_info()`` inside ``__iter__`` to split the stream.
    """

    def __add__(self, other: Dataset[T_co]) -> ChainDataset:  # type: ignore[override]
        return ChainDataset([self, other])


def _is_iterable_dataset(dataset: Any) -> bool:
    """True for fastload's and (when torch is loaded) torch's IterableDataset."""
    if isinstance(dataset, IterableDataset):
        return True
    torch_iterable = torch_data_class("IterableDataset")
    return torch_iterable is not None and isinstance(dataset, torch_iterable)


def _as_array(value: Any) -> np.ndarray:
    if is_tensor(value):
        # Shares the tensor's memory; detach so tensors that require grad work,
        # and resolve a lazy conjugate or negation (a copy then, as numpy has
        # no such bit).
        tensor = value.detach().resolve_conj().resolve_neg()
        try:
            return tensor.numpy()
        except TypeError:
            # A dtype numpy lacks (bfloat16, the float8s): its elements' bytes,
            # as ints of their size, viewed back by TensorArrayDataset.
            int_type = _INT_OF_SIZE.get(tensor.element_size())
            if int_type is None or tensor.device.type != "cpu":
                raise
            return tensor.view(getattr(sys.modules["torch"], int_type)).numpy()
    return np.asarray(value)


# torch's int dtype of each element size (see _as_array).
_INT_OF_SIZE = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


class ArrayDataset(Dataset[tuple[Any, ...]]):
    """Samples are rows: sample ``i`` is ``tuple(array[i] for array in arrays)``.

    Takes numpy arrays or torch tensors with equal first dimensions; tensors
    are shared zero-copy as numpy arrays, and their rows come out as tensors
    (``TensorArrayDataset``). A batch is gathered with one ``take`` per
    array (see NOTE [ Gathered batches ] in _gathered).
    """

    arrays: tuple[np.ndarray, ...]

    def __new__(cls, *arrays: Any) -> ArrayDataset:
        if cls is ArrayDataset and any(is_tensor(a) for a in arrays):
            cls = TensorArrayDataset
        return super().__new__(cls)

    def __init__(self, *arrays: Any) -> None:
        if not arrays:
            raise InvalidArgumentError(f"{type(self).__name__} needs at least one array")
        converted = tuple(_as_array(a) for a in arrays)
        for position, array in enumerate(converted):
            if array.ndim == 0:
                raise InvalidArgumentError(
                    f"{type(self).__name__}: array {position} is a scalar; "
                    "every array needs a first (sample) dimension"
                )
        sizes = [len(a) for a in converted]
        if any(size != sizes[0] for size in sizes):
            described = ", ".join(f"array {i} has {size}" for i, size in enumerate(sizes))
            raise InvalidArgumentError(
                f"Size mismatch between arrays: the first dimensions differ ({described})"
            )
        self.arrays = converted

    @property
    def tensors(self) -> tuple[np.ndarray, ...]:
        """The arrays, under the name torch's TensorDataset uses."""
        return self.arrays

    @property
    def columns(self) -> tuple[Any, ...]:
        """What a batch's columns are rows of: the arrays here, tensors where
        a TensorArrayDataset was given tensors (NOTE [ Fast paths ])."""
        return self.arrays

    def __getitem__(self, index: Any) -> tuple[Any, ...]:
        return tuple(array[index] for array in self.arrays)

    def __getitems__(self, indices: Sequence[int]) -> GatheredBatch:
        return gather(self.arrays, indices)

    def __len__(self) -> int:
        return len(self.arrays[0])


class TensorArrayDataset(ArrayDataset):
    """What ``ArrayDataset(...)`` makes when some arrays are torch tensors:
    the same rows, as tensors at those positions (as torch's TensorDataset
    gives them), so batches hold tensors there whatever ``num_workers``.
    Its batches are ``GatheredTensors``; workers gather their rows from
    ``columns`` as for numpy-only ArrayDatasets, and ``gather_into`` gives
    the tensor columns back as tensors."""

    def __init__(self, *arrays: Any) -> None:
        super().__init__(*arrays)
        self.tensor_columns = tuple(is_tensor(a) for a in arrays)
        # Each tensor's dtype where its array holds another (bfloat16's bytes
        # as int16, see _as_array), else None.
        torch = torch_or_none()
        assert torch is not None, "some arrays are torch tensors"
        self.viewed_dtypes = tuple(
            a.dtype if is_tensor(a) and torch.from_numpy(array[:0]).dtype != a.dtype else None
            for a, array in zip(arrays, self.arrays))

    def _as_tensors(self, values: Sequence[Any]) -> tuple[Any, ...]:
        torch = torch_or_none()  # a spawned worker has not imported it yet
        assert torch is not None, "the arrays were torch tensors"
        return tuple(_as_tensor(torch, value, dtype) if tensor else value
                     for value, tensor, dtype in zip(values, self.tensor_columns,
                                                     self.viewed_dtypes))

    @property
    def columns(self) -> tuple[Any, ...]:
        return self._as_tensors(self.arrays)

    def __getitem__(self, index: Any) -> tuple[Any, ...]:
        return self._as_tensors(super().__getitem__(index))

    def __getitems__(self, indices: Sequence[int]) -> GatheredBatch:
        return GatheredTensors(self._as_tensors(gather(self.arrays, indices).columns))


def _as_tensor(torch: Any, value: Any, viewed_dtype: Any) -> Any:
    """A row or batch of a tensor column, as a tensor of its tensor's dtype."""
    tensor = torch.from_numpy(np.asarray(value))
    return tensor if viewed_dtype is None else tensor.view(viewed_dtype)


TensorDataset = ArrayDataset


def is_plain_subset(dataset: Any) -> bool:
    """Whether ``dataset`` is exactly fastload's or torch's ``Subset``, whose
    sample ``i`` is ``dataset.dataset[dataset.indices[i]]`` (a subclass may
    override that)."""
    return type(dataset) in torch_data_classes(Subset, "Subset")


def gathered_columns(dataset: Any) -> tuple[Any, ...] | None:
    """The columns whose rows a batch of ``dataset`` is, under any plain
    Subsets, when a batch is those rows and nothing else: exactly an
    ``ArrayDataset`` (a subclass may override its methods) or torch's
    ``TensorDataset`` of CPU tensors numpy can view, every column numeric;
    tensors where the batch holds tensors. Else None (NOTE [ Fast paths ])."""
    while is_plain_subset(dataset):
        dataset = dataset.dataset
    kind = type(dataset)
    if kind is TensorArrayDataset and any(dataset.viewed_dtypes):
        return None  # numpy cannot view those tensors: the C gather cannot read them
    if kind in (ArrayDataset, TensorArrayDataset):
        columns, views = dataset.columns, dataset.arrays
    elif kind is torch_data_class("TensorDataset"):
        columns = tuple(dataset.tensors)
        try:
            views = tuple(tensor.numpy() for tensor in columns)
        except (TypeError, RuntimeError):  # on a device, needing grad, bfloat16...
            return None
    else:
        return None
    return columns if all(is_stacked_column(view) for view in views) else None


def _fetch_many(dataset: Any, indices: np.ndarray | list[Any]) -> Sequence[Any]:
    """Samples ``indices`` of ``dataset``, through ``__getitems__`` if it has it.

    fastload's own datasets take an index array as it is; any other
    ``__getitems__`` gets a list, as torch passes it."""
    getitems = getattr(dataset, "__getitems__", None)
    if callable(getitems) and isinstance(dataset, (ArrayDataset, Subset, ConcatDataset)):
        return getitems(indices)
    keys = indices.tolist() if isinstance(indices, np.ndarray) else list(indices)
    if callable(getitems):
        return getitems(keys)
    return [dataset[key] for key in keys]


class ConcatDataset(Dataset[T_co]):
    """Several map-style datasets one after the other."""

    datasets: list[Dataset[T_co]]
    cumulative_sizes: list[int]

    @staticmethod
    def cumsum(sequence: Iterable[Any]) -> list[int]:
        sizes = [len(d) for d in sequence]
        return list(itertools.accumulate(sizes))

    def __init__(self, datasets: Iterable[Dataset[Any]]) -> None:
        self.datasets = list(datasets)
        if len(self.datasets) == 0:
            raise InvalidArgumentError("datasets should not be an empty iterable")
        for dataset in self.datasets:
            if _is_iterable_dataset(dataset):
                raise InvalidArgumentError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = self.cumsum(self.datasets)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx: int) -> T_co:
        size = len(self)
        if idx < 0:
            if -idx > size:
                raise ValueError("absolute value of index should not exceed dataset length")
            idx += size
        if idx >= size:
            raise IndexError(f"index {idx} is out of range for ConcatDataset of length {size}")
        dataset_idx = bisect.bisect_right(self.cumulative_sizes, idx)
        start = self.cumulative_sizes[dataset_idx - 1] if dataset_idx else 0
        return self.datasets[dataset_idx][idx - start]

    def __getitems__(self, indices: Sequence[int]) -> Sequence[Any]:
        size = len(self)
        index = index_array(indices).reshape(-1)
        if index.size and index.min() < -size:
            raise ValueError("absolute value of index should not exceed dataset length")
        index = np.where(index < 0, index + size, index)
        if index.size and index.max() >= size:
            raise IndexError(
                f"index {int(index.max())} is out of range for ConcatDataset of length {size}"
            )
        cumulative = np.asarray(self.cumulative_sizes)
        which = np.searchsorted(cumulative, index, side="right")
        local = index - np.concatenate(([0], cumulative[:-1]))[which]
        parts = []
        for dataset_idx in np.unique(which).tolist():
            positions = np.flatnonzero(which == dataset_idx)
            parts.append((positions, _fetch_many(self.datasets[dataset_idx], local[positions])))
        if not parts:
            return []
        if len(parts) == 1:
            return parts[0][1]
        return _interleave(parts, len(index))


def _interleave(parts: list[tuple[np.ndarray, Sequence[Any]]], count: int) -> Sequence[Any]:
    """Merge per-dataset results back into request order; columns stay columns
    when every part is a GatheredBatch of the same row shapes."""
    batches = [part for _, part in parts]
    # Tensor columns (GatheredTensors) merge sample by sample, staying tensors.
    if all(type(b) is GatheredBatch for b in batches):
        width = len(batches[0].columns)  # type: ignore[attr-defined]
        if all(
            len(b.columns) == width  # type: ignore[attr-defined]
            and all(
                c.shape[1:] == first.shape[1:]
                for c, first in zip(b.columns, batches[0].columns)  # type: ignore[attr-defined]
            )
            for b in batches
        ):
            columns = []
            for j in range(width):
                pieces = [b.columns[j] for b in batches]  # type: ignore[attr-defined]
                out = np.empty((count,) + pieces[0].shape[1:], np.result_type(*pieces))
                for (positions, _), piece in zip(parts, pieces):
                    out[positions] = piece
                columns.append(out)
            return GatheredBatch(tuple(columns))
    samples: list[Any] = [None] * count
    for positions, part in parts:
        for position, sample in zip(positions.tolist(), part):
            samples[position] = sample
    return samples


class ChainDataset(IterableDataset):
    """Several iterable datasets, streamed one after the other."""

    def __init__(self, datasets: Iterable[Dataset[Any]]) -> None:
        self.datasets = datasets

    def __iter__(self) -> Iterator[Any]:
        for dataset in self.datasets:
            if not _is_iterable_dataset(dataset):
                raise InvalidArgumentError("ChainDataset only supports IterableDataset")
            yield from dataset  # type: ignore[misc]

    def __len__(self) -> int:
        total = 0
        for dataset in self.datasets:
            if not _is_iterable_dataset(dataset):
                raise InvalidArgumentError("ChainDataset only supports IterableDataset")
            total += len(dataset)  # type: ignore[arg-type]
        return total


class Subset(Dataset[T_co]):
    """The samples of ``dataset`` at ``indices``, renumbered from 0.

    A subclass that overrides ``__getitem__`` must override ``__getitems__``
    too, since the DataLoader fetches batches through the latter.
    """

    dataset: Dataset[T_co]
    indices: Sequence[int]

    def __init__(self, dataset: Dataset[T_co], indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices
        cls = type(self)
        if cls.__getitem__ is not Subset.__getitem__ and cls.__getitems__ is Subset.__getitems__:
            raise NotImplementedError(
                f"{cls.__name__} overrides __getitem__ but not __getitems__; the "
                "DataLoader fetches batches through __getitems__, so override it "
                "too, e.g. `def __getitems__(self, indices): "
                "return [self[i] for i in indices]`"
            )

    def __getitem__(self, idx: Any) -> T_co:
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices: Sequence[int]) -> Sequence[T_co]:
        inner: np.ndarray | list[Any]
        if isinstance(self.indices, np.ndarray):
            inner = self.indices[index_array(indices)]
        else:
            own = self.indices
            inner = [own[i] for i in indices]
        return _fetch_many(self.dataset, inner)

    def __len__(self) -> int:
        return len(self.indices)


class StackDataset(Dataset[Any]):
    """Several datasets of equal length side by side: sample ``i`` is the
    tuple (positional datasets) or dict (keyword datasets) of their ``i``-th
    samples."""

    datasets: tuple[Any, ...] | dict[str, Any]

    def __init__(self, *args: Dataset[Any], **kwargs: Dataset[Any]) -> None:
        if args and kwargs:
            raise ValueError(  # torch's words, then ours
                "Supported either ``tuple``- (via ``args``) or``dict``- (via ``kwargs``) "
                "like input/output, but both types are given: StackDataset takes either "
                "positional datasets (tuple samples) or keyword datasets (dict samples)."
            )
        if not args and not kwargs:
            raise ValueError("At least one dataset should be passed")
        members = list(args) if args else list(kwargs.values())
        self._length = len(members[0])  # type: ignore[arg-type]
        lengths = [len(d) for d in members]  # type: ignore[arg-type]
        if any(length != self._length for length in lengths):
            raise ValueError(f"Size mismatch between datasets: lengths {lengths}")
        self.datasets = args if args else kwargs

    def __getitem__(self, index: Any) -> Any:
        if isinstance(self.datasets, dict):
            return {key: dataset[index] for key, dataset in self.datasets.items()}
        return tuple(dataset[index] for dataset in self.datasets)

    def _column(self, dataset: Any, indices: list[Any]) -> Sequence[Any]:
        getitems = getattr(dataset, "__getitems__", None)
        if not callable(getitems):
            return [dataset[i] for i in indices]
        items = getitems(indices)
        if len(items) != len(indices):
            raise ValueError(
                f"Nested dataset's output size mismatch. Expected {len(indices)}, got {len(items)}"
            )
        return items

    def __getitems__(self, indices: list[Any]) -> list[Any]:
        if isinstance(self.datasets, dict):
            keys = list(self.datasets)
            columns = [self._column(self.datasets[key], indices) for key in keys]
            return [dict(zip(keys, values)) for values in zip(*columns)]
        columns = [self._column(dataset, indices) for dataset in self.datasets]
        return list(zip(*columns))

    def __len__(self) -> int:
        return self._length


def random_split(
    dataset: Dataset[T],
    lengths: Sequence[int | float],
    generator: GeneratorArg = None,
) -> list[Subset[T]]:
    """Split ``dataset`` into non-overlapping random Subsets of ``lengths``.

    ``lengths`` are sizes summing to ``len(dataset)``, or fractions summing to
    1: then each size is ``floor(fraction * len)`` and the remainder is dealt
    out one by one, round-robin from the first split.
    """
    total = len(dataset)  # type: ignore[arg-type]
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        sizes = []
        for i, fraction in enumerate(lengths):
            if fraction < 0 or fraction > 1:
                raise ValueError(f"Fraction at index {i} is not between 0 and 1")
            sizes.append(math.floor(total * fraction))
        for i in range(total - sum(sizes)):
            sizes[i % len(sizes)] += 1
        for i, size in enumerate(sizes):
            if size == 0:
                warnings.warn(
                    f"Length of split at index {i} is 0. This might result in an empty dataset.",
                    stacklevel=2,
                )
        lengths = sizes
    if sum(lengths) != total:
        raise ValueError("Sum of input lengths does not equal the length of the input dataset!")
    rng = _seed.resolve_generator(generator)
    count = int(sum(lengths))
    order = np.random.permutation(count) if rng is None else _seed.permutation(rng, count)
    indices = order.tolist()
    return [
        Subset(dataset, indices[end - int(length) : end])
        for end, length in zip(itertools.accumulate(int(n) for n in lengths), lengths)
    ]
