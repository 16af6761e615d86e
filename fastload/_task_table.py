"""The tasks of a worker iterator and the states they go through.

NOTE [ Task lifecycle ]

A task is one batch being loaded by one worker (``Task``). Each worker
iterator keeps its tasks in a ``TaskTable``, every task in exactly one of
these states (for worker processes the table is the dispatcher's,
``fastload._process_dispatch``; for threads, ``fastload._thread_workers``):

  in flight   sent to its worker, no answer yet. A worker process's task
              holds its slot's lease: the worker may be writing into it.
  ready       the worker answered: the batch (views of the slot), the
              exception it raised (``Failure``) or ``STREAM_ENDED`` (its iterable
              stream ran out). The slot lease moves into the batch (an
              ended stream's, to the task sent in its place). With
              pin_memory, a batch is handed to a pinning thread as it
              becomes ready and is held as its ``PinnedLater`` (NOTE [
              Pinning by copy ] in fastload._pinning).
  stale       in flight, but of an epoch given up (``iter()`` again before
              the end, a lookahead guess that was wrong): its answer is
              awaited only to release the slot, never delivered.
  (gone)      yielded to the user, raised, passed (STREAM_ENDED), or a stale
              task's answer arrived.

Who moves a task, all in the main thread: sending it (``_dispatch``)
creates it in flight (``add``), or ready where the main thread made its
batch itself (``add_ready``: a small gather), and, for a batch of the
current epoch, appends it to the epoch's ``order``; handling its worker's answer makes it
ready (``finish``) or, if stale, gone (``answered_stale``); each
``next()`` takes the next deliverable ready task (``pop_next``) in dispatch
order (or any ready one with ``in_order=False``); a new epoch (``iter()``
again) and a wrong lookahead guess ``abandon`` tasks: those in flight turn
stale, ready ones are dropped (their slots come back at once). A lookahead
task is in flight or ready without being in ``order`` until the new epoch
adopts it (NOTE [ Epoch lookahead ]). A worker process that asks for a
bigger slot (NEED) keeps its task in flight, giving up the slot the batch
did not fit; the answer waits until the dispatcher settles (``_settle``),
never inside the handling of another answer.
"""
from __future__ import annotations

import collections
import itertools
from collections.abc import Callable
from typing import Any

from fastload._pinning import PinnedLater, Pinner
from fastload._worker_error import WorkerError


class Task:
    """One batch a worker loads (see NOTE [ Task lifecycle ])."""

    __slots__ = ("worker_id", "index", "lease", "position", "sampler_state", "dataset_state",
                 "has_dataset_state", "dataset_ended", "awaits_slot", "index_in_slot")

    def __init__(self, worker_id: int, index: Any, lease: Any, position: int | None,
                 sampler_state: Any) -> None:
        self.worker_id = worker_id
        self.index = index
        self.lease = lease
        # The batch's place in its epoch (None: a lookahead task not adopted yet).
        self.position = position
        # When this batch is a snapshot step (NOTE [ Resume contract ]): the
        # index sampler's state right after its indices were drawn
        # (_progress.NO_SNAPSHOT on other steps), and the
        # iterable dataset's state in its worker right after it was fetched
        # (or, for ENDED, where its stream ended).
        self.sampler_state = sampler_state
        self.dataset_state: Any = None
        self.has_dataset_state = False
        self.dataset_ended = False
        # Its worker asked for a slot (NEED) and waits for the answer.
        self.awaits_slot = False
        # Its index starts its slot (TASK_INDEX_IN_SLOT): the slot stays its own.
        self.index_in_slot = False


class Failure:
    """A worker's exception in place of its batch: raised when the batch
    is due, as torch does, so the batches before it are delivered first."""

    __slots__ = ("error",)

    def __init__(self, error: Any) -> None:
        self.error = error


# The result of a task whose iterable stream had run out: no batch.
STREAM_ENDED = object()


class TaskTable:
    """Every task of one iterator, each in one state (NOTE [ Task lifecycle ])."""

    def __init__(self) -> None:
        self._ids = itertools.count()
        self.in_flight: dict[int, Task] = {}
        self.ready: dict[int, tuple[Task, Any]] = {}
        self.stale: dict[int, Task] = {}
        # The current epoch's tasks in dispatch order, not yet delivered.
        self.order: list[int] = []
        # Pins each batch as it becomes ready (pin_memory with workers).
        self.pinner: Pinner | None = None

    def add(self, task: Task) -> int:
        """A new task, in flight; its id."""
        task_id = next(self._ids)
        self.in_flight[task_id] = task
        return task_id

    def add_ready(self, task: Task, result: Any) -> int:
        """A new task whose batch was made as it was sent (NOTE [ Small
        gathers ] in fastload._fast_path), ready at once; its id."""
        task_id = next(self._ids)
        if self.pinner is not None:
            result = _pinned(self.pinner, task, result)
        self.ready[task_id] = (task, result)
        return task_id

    def get(self, task_id: int) -> Task | None:
        """The task in flight or ready under ``task_id``, if any."""
        task = self.in_flight.get(task_id)
        if task is None and task_id in self.ready:
            task = self.ready[task_id][0]
        return task

    def finish(self, task_id: int, result: Any) -> Task:
        """The worker answered task ``task_id`` (in flight) with ``result``."""
        task = self.in_flight.pop(task_id)
        if self.pinner is not None:  # a call less per batch without (issue 18)
            result = _pinned(self.pinner, task, result)
        self.ready[task_id] = (task, result)
        return task

    def answered_stale(self, task_id: int) -> Task | None:
        """A stale task's worker answered: the task is gone (its lease with it)."""
        return self.stale.pop(task_id, None)

    def pop_next(self, in_order: bool) -> tuple[int, Task, Any] | None:
        """The next ready task of the epoch, removed: the first in dispatch
        order, or with ``in_order=False`` the first of the order that is
        ready; None when that one (or every one) is still in flight."""
        order = self.order
        if in_order:
            position = 0 if order and order[0] in self.ready else -1
        else:
            position = next((i for i, t in enumerate(order) if t in self.ready), -1)
        if position < 0:
            return None
        task_id = order.pop(position)
        task, result = self.ready.pop(task_id)
        return task_id, task, result

    def pop_next_batch(self, in_order: bool,
                       stream_ended: Callable[[Task], None]) -> tuple[Task, Any] | None:
        """``pop_next``'s (task, batch or Failure), passing over the tasks
        whose iterable stream had run out, each handed to ``stream_ended``."""
        order, ready = self.order, self.ready
        while True:
            # The in-order case inlined: every batch passes here (issue 18's
            # main-loop budget).
            if in_order and order and order[0] in ready:
                task, result = ready.pop(order.pop(0))
            else:
                found = None if in_order else self.pop_next(in_order)
                if found is None:
                    return None
                _, task, result = found
            if result is not STREAM_ENDED:
                return task, result
            stream_ended(task)

    def abandon(self, task_ids: list[int]) -> None:
        """Give tasks up: those in flight become stale (their slots stay
        leased until the worker answers), ready ones are dropped (not pinned,
        if their pinning had not begun)."""
        for task_id in task_ids:
            task = self.in_flight.pop(task_id, None)
            if task is not None:
                self.stale[task_id] = task
            result = self.ready.pop(task_id, (None, None))[1]
            if isinstance(result, PinnedLater):
                result.discard()

    def in_flight_per_worker(self) -> collections.Counter[int]:
        return collections.Counter(task.worker_id for task in self.in_flight.values())


def _pinned(pinner: Pinner, task: Task, result: Any) -> Any:
    """``result``, or a batch given to ``pinner`` (NOTE [ Pinning by copy ]
    in fastload._pinning), which then holds its slot until it is pinned."""
    if result is STREAM_ENDED or isinstance(result, (Failure, WorkerError)):
        return result
    task.lease = None
    return pinner.submit(result)
