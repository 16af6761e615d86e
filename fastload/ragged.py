"""Collating samples of different lengths: padded or packed batches.

``pad_collate()`` and ``pack_collate()`` return collate functions with
``default_collate``'s structure rules, except for the variable-length leaves
(token sequences, audio frames, point sets): those become ``Padded`` or
``Packed``, the one kind of leaf a length may vary in. The policy (which
leaves, what size) is here; the copies run in C (fastload_c.ragged), each
sample's rows once, with the GIL released.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from fastload._torch import is_tensor
from fastload.collate import default_collate, rebuild_mapping, rebuild_sequence
from fastload.errors import CollateError, InvalidArgumentError
from fastload_c import ragged

__all__ = ["Packed", "Padded", "pack_collate", "pad_collate"]

# cu_seqlens is int32, the type varlen attention kernels take.
_MAX_PACKED_ROWS = 2**31 - 1


class _Outputs(threading.local):
    """Where this thread's pad and pack outputs are made (see outputs_from)."""

    empty: Callable[..., np.ndarray] = staticmethod(np.empty)


_outputs = _Outputs()


@contextlib.contextmanager
def outputs_from(empty: Callable[..., np.ndarray]) -> Iterator[None]:
    """Within the block, this thread's pad_collate and pack_collate make their
    output blocks with ``empty(shape, dtype)`` instead of ``np.empty``: a
    worker hands out its slot, so each sample's rows are copied once,
    straight into shared memory (NOTE [ Fast paths ] in fastload._fast_path)."""
    previous = _outputs.empty
    _outputs.empty = empty
    try:
        yield
    finally:
        _outputs.empty = previous


class Padded(NamedTuple):
    """A variable-length leaf of a padded batch: ``values`` ``(B, L, *rest)``,
    sample ``i`` in ``values[i, :lengths[i]]`` and padding after it;
    ``lengths`` int64 ``(B,)``."""

    values: np.ndarray
    lengths: np.ndarray


class Packed(NamedTuple):
    """A variable-length leaf of a packed batch: ``values`` the samples
    back to back ``(sum L, *rest)``, sample ``i`` in
    ``values[cu_seqlens[i]:cu_seqlens[i + 1]]``; ``cu_seqlens`` int32
    ``(B + 1,)`` (the offsets varlen attention kernels take);
    ``position_ids`` int64 ``(sum L,)``, each row's position in its sample."""

    values: np.ndarray
    cu_seqlens: np.ndarray
    position_ids: np.ndarray


def pad_collate(padding_value: float = 0, pad_to_multiple_of: int | None = None,
                fields: Collection[Hashable] | Hashable | None = None) -> _RaggedCollate:
    """A collate function that pads the variable-length leaves.

    Each variable-length leaf becomes ``Padded(values, lengths)``: the
    samples, which may differ only in their first dimension, in ``values`` of
    shape ``(B, L, *rest)``, L the batch's longest length rounded up to a
    multiple of ``pad_to_multiple_of``, and ``padding_value`` after each.
    ``fields`` names the variable-length leaves (top-level dict keys, tuple
    positions or namedtuple field names); None means every array leaf with
    at least one dimension, wherever it is. Those leaves are ``Padded`` even
    when a batch's lengths agree, so the output's type never depends on the
    data; the other leaves collate as ``default_collate`` does.
    """
    if isinstance(padding_value, (bool, np.bool_)) or not isinstance(
            padding_value, (int, float, np.integer, np.floating)):
        raise InvalidArgumentError(
            f"pad_collate: padding_value should be a number, got {padding_value!r}")
    if pad_to_multiple_of is not None and (
            not isinstance(pad_to_multiple_of, (int, np.integer))
            or isinstance(pad_to_multiple_of, bool) or pad_to_multiple_of < 1):
        raise InvalidArgumentError(
            "pad_collate: pad_to_multiple_of should be a positive integer or None, "
            f"got {pad_to_multiple_of!r}")
    return _PadCollate(_field_set(fields, "pad_collate"), padding_value,
                       1 if pad_to_multiple_of is None else int(pad_to_multiple_of))


def pack_collate(fields: Collection[Hashable] | Hashable | None = None) -> _RaggedCollate:
    """A collate function that packs the variable-length leaves.

    As ``pad_collate``, except that each variable-length leaf becomes
    ``Packed(values, cu_seqlens, position_ids)``: the samples concatenated
    along their first axis, with the offsets and positions that tell them
    apart. Raises CollateError when a batch holds more than 2**31 - 1 rows
    of one leaf (int32 offsets).
    """
    return _PackCollate(_field_set(fields, "pack_collate"))


def _field_set(fields: Any, who: str) -> frozenset[Hashable] | None:
    if fields is None:
        return None
    if isinstance(fields, (str, int)):
        return frozenset((fields,))
    try:
        selected = frozenset(fields)
    except TypeError:
        raise InvalidArgumentError(
            f"{who}: fields should be None, a key or position, or a collection of them; "
            f"got {fields!r}") from None
    if not selected:
        raise InvalidArgumentError(f"{who}: fields is empty; pass None for every array leaf")
    return selected


class _RaggedCollate:
    """Walks the structure as default_collate does and hands each
    variable-length leaf's samples to ``_leaf``. A class rather than a
    closure so that worker processes can receive it by pickle."""

    who = ""

    def __init__(self, fields: frozenset[Hashable] | None) -> None:
        self.fields = fields

    def __call__(self, batch: Sequence[Any]) -> Any:
        if len(batch) == 0:
            raise ValueError(f"{self.who}: cannot collate an empty batch")
        elem = batch[0]
        if self.fields is None:
            return self._collate(batch, elem, "")
        present: Collection[Hashable]
        if isinstance(elem, Mapping):
            present = elem.keys()
        elif isinstance(elem, Sequence) and not isinstance(elem, (str, bytes)):
            present = set(range(len(elem))) | set(getattr(elem, "_fields", ()))
        else:
            raise InvalidArgumentError(
                f"{self.who}: fields names keys or positions, but the samples are "
                f"{type(elem).__name__}, not dicts or tuples")
        missing = [field for field in self.fields if field not in present]
        if missing:
            raise InvalidArgumentError(
                f"{self.who}: fields {sorted(map(repr, missing))} are not in the samples, "
                f"whose keys or positions are {sorted(map(repr, present))}")
        return self._collate(batch, elem, "")

    def _leaf(self, samples: Sequence[Any], path: str) -> Any:
        """The batch form of one variable-length leaf; ``path`` (as
        ``['tokens']``) names it in errors."""
        raise NotImplementedError

    def _collate(self, batch: Sequence[Any], elem: Any, path: str) -> Any:
        """default_collate of ``batch``, but with the variable-length leaves
        as ``_leaf`` makes them. Without ``fields`` every array leaf of at
        least one dimension is one; with ``fields`` only the named top-level
        ones, so this runs only at the top (``_child`` collates the rest).
        ``path`` is where ``batch`` lies in the structure."""
        if is_tensor(elem) or isinstance(elem, np.ndarray):
            if self.fields is None and np.ndim(elem) >= 1:
                return self._leaf(_as_arrays(batch), path)
            return default_collate(batch)
        if isinstance(elem, Mapping):
            values = {key: self._child([sample[key] for sample in batch], elem, key,
                                       f"{path}[{key!r}]") for key in elem}
            return values if type(elem) is dict else rebuild_mapping(elem, values)
        if isinstance(elem, Sequence) and not isinstance(elem, (str, bytes)):
            size = len(elem)
            if any(len(sample) != size for sample in batch):
                raise RuntimeError("each element in list of batch should be of equal size")
            items = [self._child(list(column), elem, position, f"{path}[{position}]")
                     for position, column in enumerate(zip(*batch))]
            if isinstance(elem, tuple) and hasattr(elem, "_fields"):
                return type(elem)(*items)
            if isinstance(elem, (tuple, list)):
                return items  # tuples collate to lists, as in default_collate
            return rebuild_sequence(elem, items)
        return default_collate(batch)

    def _child(self, column: list[Any], parent: Any, key: Hashable, path: str) -> Any:
        if self.fields is None:
            return self._collate(column, column[0], path)
        named = key in self.fields or (isinstance(key, int) and hasattr(parent, "_fields")
                                       and parent._fields[key] in self.fields)
        if named:
            return self._leaf(_as_arrays(column), path)
        return default_collate(column)


def _as_arrays(samples: Sequence[Any]) -> Sequence[Any]:
    """Torch tensors as numpy arrays, when the first sample is one (a leaf
    is of one type; the kernel names a sample that is not an array)."""
    if not is_tensor(samples[0]):
        return samples
    return [s.numpy(force=True) if is_tensor(s) else s for s in samples]


def _where(who: str, path: str) -> str:
    return f"{who}, leaf batch{path}" if path else who


def writes_in_place(collate_fn: Any) -> bool:
    """Whether ``collate_fn`` is one of ours, whose outputs outputs_from places."""
    return type(collate_fn) in (_PadCollate, _PackCollate)


class _PadCollate(_RaggedCollate):
    who = "pad_collate"

    def __init__(self, fields: frozenset[Hashable] | None, padding_value: float,
                 multiple: int) -> None:
        super().__init__(fields)
        self.padding_value = padding_value
        self.multiple = multiple

    def _leaf(self, samples: Sequence[Any], path: str) -> Padded:
        who = _where(self.who, path)
        lengths, dtype, rest = ragged.leaf_lengths(samples, who)
        longest = int(lengths.max())
        padded_length = -(-longest // self.multiple) * self.multiple
        values = _outputs.empty((len(samples), padded_length, *rest), dtype)
        ragged.pad_into(samples, values, self._padding(dtype, who))
        return Padded(values, lengths)

    def _padding(self, dtype: np.dtype, who: str) -> np.ndarray:
        """padding_value in ``dtype``; InvalidArgumentError when an integer
        dtype cannot hold it (-1 in uint8, 0.5 in int32), instead of padding
        with another value than asked for. Floats round, as any float does."""
        try:
            padding = np.array(self.padding_value, dtype=dtype)
        except (OverflowError, ValueError):
            padding = None
        if padding is None or (dtype.kind in "iub" and padding != self.padding_value):
            raise InvalidArgumentError(
                f"{who}: padding_value={self.padding_value!r} cannot be stored in the "
                f"samples' dtype {dtype}")
        return padding


class _PackCollate(_RaggedCollate):
    who = "pack_collate"

    def _leaf(self, samples: Sequence[Any], path: str) -> Packed:
        lengths, dtype, rest = ragged.leaf_lengths(samples, _where(self.who, path))
        total = int(lengths.sum())
        if total > _MAX_PACKED_ROWS:
            raise CollateError(f"{_where(self.who, path)}: the batch holds {total} rows, more "
                               "than int32 cu_seqlens can count; use smaller batches")
        values = _outputs.empty((total, *rest), dtype)
        cu_seqlens = _outputs.empty((len(samples) + 1,), np.dtype(np.int32))
        position_ids = _outputs.empty((total,), np.dtype(np.int64))
        ragged.pack_into(samples, values, cu_seqlens, position_ids)
        return Packed(values, cu_seqlens, position_ids)
