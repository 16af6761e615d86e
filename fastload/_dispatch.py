"""What the two worker iterators (processes and threads) share: drawing the
next batch of the epoch and choosing the worker that loads it."""
from __future__ import annotations

import itertools
import time
from typing import Any

from fastload._checkpoint import LoaderState, sampler_state
from fastload._iterator import BaseIter
from fastload._task_table import TaskTable


class WorkerIter(BaseIter):
    """A DataLoader iterator whose batches worker processes or threads load;
    subclasses send tasks (``_dispatch``) and collect answers."""

    def __init__(self, loader: Any, resume: LoaderState | None,
                 base_seed: int | None = None) -> None:
        super().__init__(loader, resume, base_seed)
        self._prefetch = loader.prefetch_factor * loader.num_workers
        self._in_order = loader.in_order
        self._table = TaskTable()  # NOTE [ Task lifecycle ]

    def _deadline(self) -> float | None:
        """When a wait that starts now must end (``timeout``), if ever."""
        return time.monotonic() + self._timeout if self._timeout > 0 else None

    def _begin_round_robin(self, workers: int) -> None:
        """A new epoch's order, round robin and draw position."""
        progress = self._progress
        self._table.order = []
        # The round robin starts after the worker of the last delivered batch,
        # so a resumed iterable dataset interleaves as it would have.
        self._next_worker = itertools.cycle(
            [(progress.next_worker + i) % workers for i in range(workers)])
        self._active = [not (progress.workers and progress.workers[w].ended)
                        for w in range(workers)]
        self._dispatched = progress.yielded
        self._sampler_done = False

    def _draw(self) -> tuple[Any, int, Any]:
        """The next batch of the epoch: (index, position, the sampler's state
        when it is a snapshot step, else None). StopIteration once the
        sampler ran out."""
        index = next(self._sampler_iter)
        # Delivered before the checkpoint (see BaseIter._skip).
        while self._dispatched in self._skip:
            self._dispatched += 1
            index = next(self._sampler_iter)
        self._dispatched += 1
        snapshot = None
        every = self._snapshot_every
        if self._map_style and every and self._dispatched % every == 0:
            snapshot = sampler_state(self._index_sampler)
        return index, self._dispatched - 1, snapshot

    def _next_worker_for_task(self) -> int:
        """The next active worker in the round robin. With in_order=False
        (map-style), a worker that already has its share of the tasks in
        flight is passed over, as torch does: batches then go to idle
        workers instead of queueing behind a stalled one."""
        worker_id = next(self._next_worker)
        while not self._active[worker_id]:
            worker_id = next(self._next_worker)
        if self._in_order or not self._map_style:
            return worker_id
        workers = len(self._active)
        share = self._prefetch // workers
        in_flight = self._table.in_flight_per_worker()
        for _ in range(workers):
            if in_flight[worker_id] < share:
                break
            worker_id = next(self._next_worker)
        return worker_id
