"""A dataset's or sampler's ``state_dict()`` as a value: recorded so that
what made it cannot change it later, and compared with another.

NOTE [ Recorded states ]

A state is recorded a few batches before a checkpoint may take it: at a
snapshot step (``snapshot_every_n_steps`` > 1), or when a worker fetched a
batch that is delivered later while others are prefetched. A
``state_dict()`` may return objects its maker keeps and updates (the dict
it counts in, the array it shuffles): recorded as they are, they would
show a later state than the step they are recorded for. Such a state is
copied as it is recorded (``snapshot``); one whose every container is made
anew by each call needs no copy, and is not copied, which keeps the cost
of a large state off every batch (``Recorder`` tells them apart at its
first call, by calling ``state_dict()`` twice). With ``num_workers=0``
and a snapshot at every batch (the default), a map-style dataset's and a
sampler's recorded state stays the latest until the next batch records
again, nothing running in between: it is recorded as returned. A
checkpoint copies what it takes (``_checkpoint.capture``), so the dict it
returns does not change as the loader goes on. Loading copies too: a
source may keep what ``load_state_dict`` is given, and the state given is
kept as recorded.
"""
from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

from fastload._torch import torch_if_imported

# Values no one can change in place.
_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, range, np.generic)


def snapshot(state: Any) -> Any:
    """A copy of ``state`` that what made it cannot change later:
    containers, arrays and tensors copied, immutable values kept, anything
    else deep-copied; a state that cannot be copied is kept as it is."""
    try:
        return _copied(state)
    except Exception:
        return state


def _copied(value: Any) -> Any:
    kind = type(value)
    if isinstance(value, _IMMUTABLE):
        return value
    if kind is dict:
        return {key: _copied(item) for key, item in value.items()}
    if kind is list:
        return [_copied(item) for item in value]
    if kind is tuple:
        return tuple(_copied(item) for item in value)
    if kind is np.ndarray and value.dtype != object:
        return value.copy()
    torch = torch_if_imported()
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().clone()
    return copy.deepcopy(value)


class Recorder:
    """Records what a ``state_dict`` method returns (NOTE [ Recorded
    states ]): a copy of it when it returns objects it keeps, else what it
    returned."""

    __slots__ = ("_state_dict", "_copies")

    def __init__(self, state_dict: Callable[[], Any]) -> None:
        self._state_dict = state_dict
        self._copies: bool | None = None  # known at the first call

    def __call__(self) -> Any:
        state = self._state_dict()
        if self._copies is None:
            try:
                self._copies = _shares_objects(state, self._state_dict())
            except Exception:
                self._copies = True
        return snapshot(state) if self._copies else state


def _shares_objects(first: Any, second: Any) -> bool:
    """Whether two results of one ``state_dict()`` share anything that can
    change in place (or differ in shape, which tells nothing: True)."""
    if isinstance(first, _IMMUTABLE) and isinstance(second, _IMMUTABLE):
        return False
    if first is second or type(first) is not type(second):
        return True
    if type(first) is dict:
        return first.keys() != second.keys() or any(
            _shares_objects(first[key], second[key]) for key in first)
    if type(first) in (list, tuple):
        return len(first) != len(second) or any(map(_shares_objects, first, second))
    if type(first) is np.ndarray:
        return first.dtype == object or np.may_share_memory(first, second)
    torch = torch_if_imported()
    if torch is not None and isinstance(first, torch.Tensor):
        return first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
    return True  # an object of another kind: copied, to be safe


def unmoved(loaded: Any, before: Any, after: Any) -> bool:
    """Whether an iteration that ran out at once left a restored state as it
    was: ``after`` is the state that was loaded, or the state as read
    before the iteration (a ``state_dict()`` may show a loaded state only
    once an iteration takes it up)."""
    return same_state(after, loaded) or same_state(after, before)


def same_state(first: Any, second: Any) -> bool:
    """Whether two snapshots hold the same state: containers item by item,
    arrays and tensors by dtype, shape and values, anything else by ==
    (or, where that raises, as pickles); False when that cannot tell."""
    try:
        return _same(first, second)
    except Exception:
        return False


def _same(first: Any, second: Any) -> bool:
    if type(first) is not type(second):
        return False
    if isinstance(first, dict):
        return first.keys() == second.keys() and all(
            _same(first[key], second[key]) for key in first)
    if isinstance(first, (list, tuple)):
        return len(first) == len(second) and all(map(_same, first, second))
    if isinstance(first, np.ndarray):
        if first.dtype != second.dtype or first.shape != second.shape:
            return False
        if first.dtype == object:
            return all(map(_same, first.flat, second.flat))
        return bool(np.array_equal(first, second))
    torch = torch_if_imported()
    if torch is not None and isinstance(first, torch.Tensor):
        return (first.dtype == second.dtype and first.shape == second.shape
                and first.device == second.device and bool(torch.equal(first, second)))
    try:
        return bool(first == second)
    except Exception:
        return pickle.dumps(first) == pickle.dumps(second)
