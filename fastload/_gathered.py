"""GatheredBatch: the samples of one batch, held as columns.

NOTE [ Gathered batches ]

An ArrayDataset answers ``__getitems__(indices)`` with one fancy-index
(``take``) per array instead of one Python tuple per sample. The result is a
GatheredBatch: it behaves as the list of samples a collate_fn expects
(``len``, indexing, iteration give the same tuples ``dataset[i]`` would), while
``default_collate`` recognises it and returns its columns as they are, since
they already are the stacked batch. A batch of 256 small samples thus costs a
few numpy calls instead of hundreds of Python objects.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from fastload_c import pack


class GatheredBatch(Sequence[tuple[Any, ...]]):
    """A sequence of ``len(columns[0])`` samples; sample ``i`` is
    ``tuple(column[i] for column in columns)``."""

    __slots__ = ("columns",)

    def __init__(self, columns: tuple[np.ndarray, ...]) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns[0])

    @overload
    def __getitem__(self, index: int) -> tuple[Any, ...]: ...

    @overload
    def __getitem__(self, index: slice) -> GatheredBatch: ...

    def __getitem__(self, index: int | slice) -> tuple[Any, ...] | GatheredBatch:
        if isinstance(index, slice):
            return type(self)(tuple(column[index] for column in self.columns))
        return tuple(column[index] for column in self.columns)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return zip(*self.columns)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{c.dtype}{list(c.shape)}" for c in self.columns)
        return f"GatheredBatch({len(self)} samples: {shapes})"


class GatheredTensors(GatheredBatch):
    """A GatheredBatch some of whose columns are torch tensors (an
    ArrayDataset over tensors): ``default_collate`` returns those as they
    are, which is ``torch.stack`` of their rows."""

    __slots__ = ()


def index_array(indices: Any) -> np.ndarray:
    """``indices`` as an intp array; the usual batch index, a list of ints,
    read in C (a sixth of numpy's cost for 256 ints). IndexError for
    indices that are no integers (floats, bools), which a cast would
    silently turn into other rows, as numpy's indexing refuses them."""
    index = pack.int_rows(indices)
    if index is not None:
        return index
    array = np.asarray(indices)
    if array.size and array.dtype.kind not in "iuO":
        raise IndexError(f"indices must be integers, not {array.dtype} "
                         f"(got {array.reshape(-1)[:4].tolist()}...)")
    return array.astype(np.intp)


def gather(arrays: tuple[np.ndarray, ...], indices: Any) -> GatheredBatch:
    """Rows ``indices`` of every array (negative indices count from the end)."""
    index = index_array(indices)
    return GatheredBatch(tuple(array.take(index, axis=0) for array in arrays))
