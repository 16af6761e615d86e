"""What the two worker iterators (processes and threads) share: choosing
the worker that loads the next batch (``RoundRobin``), and the deadline of
a wait. The batches themselves are drawn by ``_iterator.EpochDraw``, as
without workers."""
from __future__ import annotations

import itertools
import os
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn

from fastload._fast_path import BatchWriter, small_gathers
from fastload._iterator import BaseIter, timed_out
from fastload._loader_state import LoaderState
from fastload._pinning import Pinner
from fastload._progress import Progress
from fastload._task_table import TaskTable

if TYPE_CHECKING:
    from fastload._iterator import EpochDraw
    from fastload._lookahead import CarriedTasks


def tasks_in_flight(loader: Any) -> int:
    """How many tasks an epoch keeps in flight: ``prefetch_factor`` per worker."""
    count: int = loader.prefetch_factor * loader.num_workers
    return count


def deadline_after(timeout: float) -> float | None:
    """When a wait that starts now must end (``timeout``, 0: never), in
    time.monotonic's clock."""
    return time.monotonic() + timeout if timeout > 0 else None


def wait_seconds(deadline: float | None, poll: float, timeout: float) -> float:
    """How long the next sleep of a wait until ``deadline`` may be: at most
    ``poll``; past the deadline, the user's timeout error."""
    if deadline is None:
        return poll
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise timed_out(timeout)
    return min(remaining, poll)


class RoundRobin:
    """Which worker loads the next task: the next one in turn whose iterable
    stream has not ended. With ``in_order=False``, a worker that already
    has its share of the prefetch in flight (the prefetch over the workers
    whose stream goes on) is passed over, as torch does: batches then go to
    idle workers instead of queueing behind a stalled one (an iterable
    dataset's other workers go on with their streams)."""

    def __init__(self, loader: Any) -> None:
        self._num_workers: int = loader.num_workers
        self._prefetch: int = loader.prefetch_factor * loader.num_workers
        self._pass_over_busy = not loader.in_order
        # The active workers in turn, from the next one.
        self._turns: Iterator[int] = iter(())
        self._rotation = 0  # how many workers one round of _turns has
        self._active: list[bool] = []
        # Whether any worker's stream goes on: tasks may still be sent.
        self.has_active = False
        self._share = 0  # tasks in flight a worker may hold (in_order=False)

    def begin(self, progress: Progress) -> None:
        """A new epoch's turns. They start after the worker of the last
        delivered batch, so a resumed iterable dataset interleaves as it
        would have; a worker whose stream had ended stays out."""
        workers = self._num_workers
        self._active = [not (progress.workers and progress.workers[w].ended)
                        for w in range(workers)]
        self._take_turns([(progress.next_worker + i) % workers for i in range(workers)])

    def retire(self, worker_id: int) -> None:
        """``worker_id``'s iterable stream ended: no more tasks this epoch."""
        self._active[worker_id] = False
        # One round of the turns, from the next: the same order without it.
        self._take_turns([next(self._turns) for _ in range(self._rotation)])

    def _take_turns(self, order: list[int]) -> None:
        """From now on the workers of ``order`` that are active, in turn."""
        active = [w for w in order if self._active[w]]
        self._turns = itertools.cycle(active)
        self._rotation = len(active)
        self.has_active = bool(active)
        self._share = self._prefetch // max(len(active), 1)

    def next_worker(self, table: TaskTable) -> int:
        """The worker of the next task (``has_active`` must hold)."""
        worker_id = next(self._turns)
        if not self._pass_over_busy:
            return worker_id
        in_flight = table.in_flight_per_worker()
        for _ in range(self._num_workers):
            if in_flight[worker_id] < self._share:
                break
            worker_id = next(self._turns)
        return worker_id


class DrawsTasks:
    """How both dispatchers (worker processes' ProcessDispatcher, worker
    threads' ThreadIter) pick the next batch to send: the draw, the
    worker's turn, and the lookahead once the sampler ran out."""

    _draw: EpochDraw
    _round_robin: RoundRobin
    _carried: CarriedTasks

    if TYPE_CHECKING:
        def _start_lookahead(self) -> None: ...
        def _dispatch_lookahead(self) -> None: ...

    def _draw_task(self, table: TaskTable) -> tuple[Any, int, Any, int] | None:
        """The next batch of the epoch to send and its worker: (index,
        position, snapshot, worker id). None when there is none to send:
        no worker's stream goes on, the sampler raised (raised once the
        batches before it are delivered), or it ran out, the lookahead's
        next task sent instead."""
        if self._draw.done:
            self._dispatch_lookahead()
            return None
        if not self._round_robin.has_active:
            return None
        drawn = self._draw.next()
        if drawn is None:
            if self._draw.failure is None:
                table.abandon(self._carried.drop())
                self._start_lookahead()
                self._dispatch_lookahead()
            return None
        index, position, snapshot = drawn
        return index, position, snapshot, self._round_robin.next_worker(table)


class WorkerIter(BaseIter):
    """A DataLoader iterator whose batches worker processes or threads load."""

    # Every worker iterator alive in this process (see _inherited_by_fork).
    live: weakref.WeakSet[WorkerIter] = weakref.WeakSet()
    # Whether this process inherited it from the one that forked it.
    _inherited = False

    def __init__(self, loader: Any, resume: LoaderState | None,
                 base_seed: int | None = None) -> None:
        self._made_by = os.getpid()
        WorkerIter.live.add(self)
        # How the workers write the batches, as this process sees it, once
        # for what follows from it. Decided before the sampler's iteration
        # starts: where the main thread gathers every batch, it draws their
        # indices as arrays.
        writer = BatchWriter(loader.dataset, loader._dataset_kind, loader._auto_collation,
                             loader._engine_collation()[0])
        self._writes_through_files = writer.writes_through_files
        self._gathers_here = small_gathers(loader, writer)
        super().__init__(loader, resume, base_seed, index_arrays=self._gathers_here is not None)
        self._prefetch = tasks_in_flight(loader)
        self._in_order = loader.in_order
        # Pins the batches on a thread as they become ready (NOTE [ Pinning
        # by copy ] in fastload._pinning); the subclass gives it its table.
        self._pinner = None if self._pin_torch is None else Pinner(self._pin_torch)

    def _raise_stopped(self) -> NoReturn:
        """next() once the workers were stopped: the epoch ended there; or
        they serve the process that forked this one (_inherited_by_fork)."""
        if self._inherited:
            raise RuntimeError(
                f"this DataLoader iterator was made by process {self._made_by}, which "
                f"forked this one ({os.getpid()}): its workers serve that process. Make "
                "a new iterator here (iter(loader)); a loader with persistent workers "
                "then starts workers of this process's own")
        raise StopIteration

    def _disown(self) -> None:
        """This process was forked from the one that made this iterator."""
        self.reusable, self._inherited = False, True

    def _stop_pinning(self) -> None:
        """This iterator's epochs are over: its pinning thread stops, once
        it has finished the copy it is making (NOTE [ Pinning by copy ])."""
        if self._pinner is not None:
            self._forget_awaited_pin()
            self._pinner.stop()

    def _deadline(self) -> float | None:
        """When a wait that starts now must end (``timeout``), if ever."""
        return deadline_after(self._timeout)


def _inherited_by_fork() -> None:
    """In a child forked by user code (a worker process too): every worker
    iterator is the parent's. Its workers serve the parent (processes) or
    did not survive the fork (threads), so it loads nothing more here
    (``_raise_stopped``) and a persistent loader's next iter() starts
    workers of the child's own. Its processes are not the child's to shut
    down either (_worker_group._disown_after_fork)."""
    for iterator in list(WorkerIter.live):
        iterator._disown()
    WorkerIter.live.clear()


os.register_at_fork(after_in_child=_inherited_by_fork)
