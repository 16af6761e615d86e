"""A batch's leaves turned into torch tensors or numpy arrays, sharing their
memory, the structure kept: what ``output=`` asks of a loader, and what
fastload.torch hands out."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from fastload._gathered import GatheredBatch
from fastload._torch import torch_if_imported, torch_or_none
from fastload.collate import NUMERIC_KINDS, rebuild_mapping, rebuild_sequence


def arrays_to_tensors(data: Any) -> Any:
    """``data`` with every numeric numpy array or scalar replaced by a torch
    tensor sharing its memory (``torch.from_numpy``); the structure is kept."""
    torch = torch_or_none()
    if torch is None:
        raise ImportError("output='torch' needs PyTorch installed (pip install torch)")

    def to_tensor(leaf: Any) -> Any:
        if isinstance(leaf, (np.bool_, np.number)):
            leaf = np.asarray(leaf)
        elif not isinstance(leaf, np.ndarray) or leaf.dtype.kind not in NUMERIC_KINDS:
            return leaf
        if not leaf.dtype.isnative or any(stride < 0 for stride in leaf.strides):
            # Another byte order or a negative stride (a column of an
            # ArrayDataset, a custom collate_fn's result), which torch cannot
            # view: a native, contiguous copy.
            leaf = np.array(leaf, dtype=leaf.dtype.newbyteorder("="), order="C")
        if leaf.dtype.char == "Q":
            # np.ulonglong, which torch refuses by name: the same bytes as
            # np.uint64, the name a pickle gives back (see _canonical).
            leaf = leaf.view(np.uint64)
        tensor = torch.from_numpy(leaf)
        if not leaf.size:
            # numpy's empty arrays have zero strides, torch's C strides.
            return tensor.clone(memory_format=torch.contiguous_format)
        return tensor

    return _map_leaves(to_tensor, data)


def tensors_to_arrays(data: Any) -> Any:
    """``data`` with every torch tensor replaced by a numpy array, a view of
    the tensor's memory wherever numpy can view it (``numpy(force=True)``
    copies the others: on a device, needing grad); the structure is kept."""
    torch = torch_if_imported()
    if torch is None:
        return data  # no tensor can exist

    def to_array(leaf: Any) -> Any:
        return leaf.numpy(force=True) if isinstance(leaf, torch.Tensor) else leaf

    return _map_leaves(to_array, data)


def _map_leaves(convert: Callable[[Any], Any], data: Any) -> Any:
    """``data`` with ``convert`` applied to every leaf of its containers."""
    if type(data) is dict:
        return {key: _map_leaves(convert, value) for key, value in data.items()}
    if type(data) is list:
        return [_map_leaves(convert, value) for value in data]
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_map_leaves(convert, value) for value in data))
    if isinstance(data, tuple):
        return tuple(_map_leaves(convert, value) for value in data)
    if isinstance(data, Mapping):
        return rebuild_mapping(data, {key: _map_leaves(convert, data[key]) for key in data})
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes, GatheredBatch)):
        # A list subclass, a deque, any other sequence: rebuilt as collation
        # and default_convert rebuild it (a GatheredBatch is a leaf, as a
        # custom collate_fn returned it).
        return rebuild_sequence(data, [_map_leaves(convert, value) for value in data])
    return convert(data)
