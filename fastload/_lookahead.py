"""The next epoch's first batches, known before its ``iter()``.

NOTE [ Epoch lookahead ]

With persistent workers, the workers would sit idle from the moment the
index sampler runs out until the user calls ``iter()`` again, and the first
batch of the new epoch would then cost a whole batch of work. With
``prefetch_next_epoch=True``, once the sampler runs out, the iterator asks
``next_epoch_head`` for the first batches the sampler's *next* iteration
will yield and dispatches them as lookahead tasks, in the slots the epoch's
last batches free.

Computing them must move nothing the user can observe: not the sampler's
position or generator, not numpy's or torch's global RNG. So the head is
drawn from an independent copy, made only for sampler types whose state is
known (fastload's and torch's stock samplers, and BatchSampler over them),
with the global RNGs restored afterwards; a custom sampler gets no
lookahead. A DistributedSampler is copied at ``epoch + 1``, the
``set_epoch`` a training loop makes before the next epoch. What a
RandomSampler's copy draws from a numpy generator (the epoch's
permutation) is kept for the sampler, which takes it instead of drawing it
again when its next epoch starts from the same token with the same length
(fastload._epoch_pieces.DrawnAhead): iter() then no longer waits for a second
permutation (4 ms for 262144 rows).

The head is a guess, and it is checked: at ``iter()`` each batch the real
sampler yields is compared with the lookahead task dispatched at that
position (same indices, same worker). A match is adopted as if it had been
dispatched then; from the first difference on, the lookahead tasks are
dropped as stale and loading goes on as it would have without them. So the
indices are always the right ones; the samples are not when the dataset
reads state the program changes between epochs (a value shared with the
workers, a file rewritten, a curriculum level): an adopted batch was read
before the change. That is why it is off by default: without it nothing of
an epoch is read before its ``iter()``, as in torch. What it also
changes: the dataset is read for batches that may be dropped (``set_epoch``
with another epoch, a generator reseeded between epochs), and that reading
advanced the worker's global RNGs (``sample_rng()`` streams are keyed on
the index and are unaffected). A lookahead task's exception is raised only
if the real epoch adopts that task, when its batch is due.
"""
from __future__ import annotations

import contextlib
import copy
import itertools
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from fastload._epoch_pieces import same_indices
from fastload._task_table import TaskTable
from fastload._torch import (
    generator_state,
    set_generator_state,
    torch_data_classes,
    torch_if_imported,
)
from fastload._torch_draws import TORCH_RANDOM_SAMPLERS
from fastload.distributed import DistributedSampler
from fastload.sampler import (
    BatchSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    index_batches,
)

_EPOCH_SAMPLERS = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)


def next_epoch_head(index_sampler: Any, count: int, as_arrays: bool) -> list[Any] | None:
    """The first ``count`` items (fewer if the epoch is shorter) that the
    next ``index_batches(index_sampler, as_arrays)`` will yield, or None
    when that cannot be known without disturbing the sampler."""
    independent = _independent_copy(index_sampler)
    if independent is None:
        return None
    with _global_rngs_kept():
        try:
            return list(itertools.islice(index_batches(independent, as_arrays), count))
        except Exception:
            # The real iteration raises it again, where the user expects it.
            return None


def _independent_copy(sampler: Any) -> Any:
    """A sampler whose next iteration yields what ``sampler``'s will (after
    ``set_epoch(epoch + 1)`` for a DistributedSampler) and whose iteration
    moves nothing of ``sampler``'s; None for types not known to allow it."""
    kind = type(sampler)
    fresh_epoch_draws = getattr(sampler, "fresh_epoch_draws", None)
    if callable(fresh_epoch_draws):
        # A wrapper whose next iteration draws what the sampler it wraps
        # would, unless a resumed epoch is pending (fastload.torch).
        inner = fresh_epoch_draws()
        return None if inner is None else _independent_copy(inner)
    if kind in torch_data_classes(SequentialSampler, "SequentialSampler"):
        return sampler  # iterating it moves nothing
    if kind in torch_data_classes(BatchSampler, "BatchSampler"):
        inner = _independent_copy(sampler.sampler)
        return None if inner is None else _copy_with(sampler, sampler=inner)
    if kind in _EPOCH_SAMPLERS:
        # Its draws are kept for the sampler, which takes them if its next
        # epoch is the one guessed (fastload._epoch_pieces.DrawnAhead).
        return _copy_with(sampler, _rng=_clone_generator(sampler._rng), _draws_ahead=True)
    if kind in torch_data_classes(None, *TORCH_RANDOM_SAMPLERS):
        return _copy_with(sampler, generator=_clone_generator(sampler.generator))
    if kind in torch_data_classes(DistributedSampler, "DistributedSampler"):
        return _copy_with(sampler, epoch=sampler.epoch + 1)
    return None


def _copy_with(original: Any, **attributes: Any) -> Any:
    duplicate = copy.copy(original)
    for name, value in attributes.items():
        setattr(duplicate, name, value)
    return duplicate


def _clone_generator(rng: Any) -> Any:
    """A generator in ``rng``'s state that does not share it; None (a
    global RNG, restored by _global_rngs_kept) stays None."""
    if rng is None:
        return None
    if isinstance(rng, np.random.Generator):
        return copy.deepcopy(rng)
    torch = torch_if_imported()
    assert torch is not None  # a torch.Generator exists only once torch is loaded
    clone = torch.Generator(device=rng.device)
    clone.set_state(generator_state(rng))  # the clone is not shared yet
    return clone


@contextlib.contextmanager
def _global_rngs_kept() -> Iterator[None]:
    """Put numpy's and torch's global RNGs back as they were: samplers
    without a generator draw their epoch's seed from them."""
    numpy_state = np.random.get_state()
    torch = torch_if_imported()
    torch_state = generator_state(torch.default_generator) if torch is not None else None
    try:
        yield
    finally:
        np.random.set_state(numpy_state)
        if torch is not None:
            set_generator_state(torch.default_generator, torch_state)


class LookaheadTasks:
    """The next epoch's first tasks, dispatched before its iter()."""

    __slots__ = ("epoch", "indices", "workers", "tasks", "serial", "starts")

    def __init__(self, epoch: int, indices: list[Any], num_workers: int, serial: int) -> None:
        self.epoch = epoch
        # The serial of the RESET that began it, and what the workers' STARTED
        # answers to it said of their replicas (worker id -> state): where
        # the next epoch starts, should it adopt this one.
        self.serial = serial
        self.starts: dict[int, Any] = {}
        self.indices = deque(indices)  # not dispatched yet
        # The round robin a new map-style epoch starts (see RoundRobin.begin).
        self.workers = itertools.cycle(range(num_workers))
        # (task id, index, worker id) of each task dispatched, in order.
        self.tasks: deque[tuple[int, Any, int]] = deque()


class CarriedTasks:
    """A finished lookahead's tasks, waiting for the new epoch to adopt
    them in order; the first wrong guess drops the rest."""

    def __init__(self, tasks: deque[tuple[int, Any, int]] | None = None) -> None:
        # (task id, index, worker id) of each task still to adopt, in order.
        self.tasks = tasks if tasks is not None else deque()

    def ids(self) -> set[int]:
        return {task_id for task_id, _, _ in self.tasks}

    def adopt(self, index: Any, worker_id: int) -> tuple[int | None, list[int]]:
        """(the task that loads ``index`` on ``worker_id`` at this position
        of the epoch, if the guess was right; the tasks given up, if not)."""
        if not self.tasks:
            return None, []
        task_id, guessed_index, guessed_worker = self.tasks[0]
        if guessed_worker == worker_id and same_indices(guessed_index, index):
            self.tasks.popleft()
            return task_id, []
        return None, self.drop()

    def adopt_into(self, table: TaskTable, index: Any, worker_id: int, position: int,
                   sampler_state: Any) -> int | None:
        """The carried task that loads ``index`` on ``worker_id``, made the
        epoch's batch at ``position`` (with the sampler's ``sampler_state``)
        if the guess was right; else None, and the tasks given up are
        abandoned in ``table``."""
        task_id, dropped = self.adopt(index, worker_id)
        table.abandon(dropped)
        if task_id is not None:
            task = table.get(task_id)
            assert task is not None  # carried tasks are in flight or ready
            task.sampler_state, task.position = sampler_state, position
        return task_id

    def abandon_others(self, table: TaskTable) -> None:
        """Give up every task of ``table`` in flight or ready but these."""
        carried = self.ids()
        table.abandon([t for t in (*table.in_flight, *table.ready) if t not in carried])

    def drop(self) -> list[int]:
        """Give every carried task up; their ids."""
        dropped = [task_id for task_id, _, _ in self.tasks]
        self.tasks.clear()
        return dropped
