"""The iterator of a DataLoader with worker processes.

The main process owns the order: it draws indices from the batch sampler
and yields results in task order (or as they come with ``in_order=False``).
Moving the tasks (sending them, their slots, the workers' answers) is the
dispatcher's (``_process_dispatch``); this iterator keeps what the user
sees: ``next()``, the epoch's progress, and the errors, a worker's
exception raised as itself and a worker's death as ``WorkerDiedError``.
Batches are numpy views of their slot; the slot returns to the pool when
the user drops the last view (NOTE [ Slot ownership and lifetime ] in
fastload_c.slab).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, NoReturn

from fastload import _checkpoint
from fastload._dispatch import WorkerIter
from fastload._fetch import describe_indices
from fastload._loader_state import LoaderState
from fastload._process_dispatch import ProcessDispatcher, WorkerSetupFailed
from fastload._stats import LoaderStats, WorkerStats
from fastload._task_table import Failure
from fastload._worker_error import WorkerError
from fastload._worker_group import WorkerGroup, WorkerGroupDied, describe_exit
from fastload.errors import WorkerDiedError


class MultiProcessingIter(WorkerIter):
    """Loads in worker processes."""

    def __init__(self, loader: Any, resume: LoaderState | None,
                 base_seed: int | None = None, start_states: list[Any] | None = None) -> None:
        """``start_states``: each worker's dataset state to start from (a
        persistent-workers run resumed between epochs)."""
        super().__init__(loader, resume, base_seed)
        self._stats.workers = [WorkerStats() for _ in range(loader.num_workers)]
        progress = self._progress
        progress.workers, progress.next_worker = _checkpoint.worker_states(
            resume, loader.num_workers, _checkpoint.tracks_replicas(loader),
            start_states if self._map_style else None)
        self._group = WorkerGroup(loader, self._base_seed, progress.epoch,
                                  progress.datapipe_seed, progress.workers, start_states,
                                  writes_through_files=self._writes_through_files)
        # torch's iterator keeps its worker processes under this name, and
        # code written against torch (its own tests among it) joins them.
        self._workers = self._group.processes
        self._dispatcher = ProcessDispatcher(loader, self._group, self._stats.workers,
                                             self._gathers_here, self._index_arrays)
        self._dispatcher.table.pinner = self._pinner
        draw = self._epoch_draw()
        with self._errors_raised():
            self._dispatcher.begin_epoch(draw, progress)
            self._dispatcher.await_started()
        if draw.failed_at_start:
            self._stop()
            draw.raise_failure()

    def stats(self) -> LoaderStats:
        stats = self._stats
        pool = self._group.pool
        stats.slots_leased = pool.leased
        stats.slots_free = pool.free_slots
        stats.pool_bytes = pool.nbytes
        stats.ring_messages = sum(ring.count for ring in self._group.result_rings)
        return stats

    def _shutdown(self) -> None:
        self._stop()

    @property
    def worker_pids(self) -> list[int]:
        """The pids of this iterator's worker processes, in worker-id order."""
        return self._group.pids

    def _reset(self, loader: Any) -> None:
        """Persistent workers: a new epoch over the same processes."""
        previous = self._progress.workers
        super()._reset(loader)
        if not self._map_style:
            # A new stream per worker.
            self._progress.workers, _ = _checkpoint.worker_states(
                None, self._group.num_workers, tracked=True)
        else:
            # A map-style replica goes on as it is.
            self._progress.workers = _checkpoint.replicas_carried(previous)
        draw = self._epoch_draw()
        with self._errors_raised():
            self._dispatcher.new_epoch(draw, self._progress)
        if draw.failed_at_start:
            draw.raise_failure()  # the workers wait for the next iter()

    def _next_data(self) -> Any:
        if not self.reusable:
            self._raise_stopped()  # a worker died: the epoch ended there
        try:  # not _errors_raised(): a context manager costs ~1 µs a batch
            found = self._dispatcher.next_ready(self._progress.stream_ended)
        except (WorkerSetupFailed, WorkerGroupDied) as error:
            self._raise_for(error)
        if found is None:
            self._dispatcher.raise_draw_failure()
            if not self._persistent_workers:
                self._stop()
            raise StopIteration
        task, batch = found
        if isinstance(batch, Failure):
            # A failed batch is delivered as its exception: the epoch goes
            # on after it, as in the main process and in torch.
            self._progress.advance(task)
            self._raise_failed_batch(batch.error, self._group.pids[batch.error.worker_id])
        return self._deliver_ready(task, batch)

    @contextlib.contextmanager
    def _errors_raised(self) -> Iterator[None]:
        """Turn the dispatcher's note of a worker's set-up failure or death
        into the user's error."""
        try:
            yield
        except (WorkerSetupFailed, WorkerGroupDied) as error:
            self._raise_for(error)

    def _raise_for(self, error: WorkerSetupFailed | WorkerGroupDied) -> NoReturn:
        """The user's error for the dispatcher's note of a worker's set-up
        failure or death."""
        if isinstance(error, WorkerSetupFailed):
            self._raise_setup_failure(error.error)
        last_words = self._dispatcher.last_words(error.worker_id)
        if last_words is not None:
            # A dead worker that reported why it ended (worker_init_fn
            # raised, say) gets that exception raised, not its death.
            self._raise_setup_failure(last_words)
        self._raise_worker_died(error)

    def _raise_setup_failure(self, error: WorkerError) -> NoReturn:
        """A worker's failure outside a task (worker_init_fn, its task loop),
        raised here with its type and traceback text, without the internal
        note it came in; the workers are shut down first (the epoch cannot
        go on)."""
        pid = self._group.pids[error.worker_id]
        self._stop()
        raise error.exception(pid) from None

    def _raise_worker_died(self, died: WorkerGroupDied) -> NoReturn:
        """The epoch ends here, as in torch; a persistent loader starts a
        fresh worker group at its next iter() (see ``reusable``). A worker
        that had not said STARTED held no batch, whatever was queued to it."""
        worker_id, process = died.worker_id, died.process
        task = self._dispatcher.held_by(worker_id) if died.started else None
        what = ("before it was ready (setting up, or between epochs)" if not died.started
                else "while idle" if task is None
                else f"while loading batch {task.position} of the epoch "
                f"(indices {describe_indices(task.index)})")
        pid, exitcode = process.pid, process.exitcode
        self._stop()
        raise WorkerDiedError(
            f"DataLoader worker (pid {pid}) {describe_exit(exitcode)} Worker {worker_id} "
            f"died {what}",
            worker_id=worker_id, pid=pid, exitcode=exitcode,
            batch=None if task is None else task.position,
            indices=None if task is None else task.index)

    def _stop(self) -> None:
        """Shut the workers down for good: this iterator's epoch is over."""
        self.reusable = False
        self._group.shutdown()
        self._stop_pinning()
