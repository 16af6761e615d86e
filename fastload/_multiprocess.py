"""The iterator of a DataLoader with worker processes.

The main process owns the order: it draws indices from the batch sampler,
takes a slot from the pool for each batch, sends the task to the next worker
(round robin, at most ``prefetch_factor`` tasks in flight per worker), and
yields results in task order (or as they come with ``in_order=False``).
Persistent workers go on into the next epoch's first batches once the
sampler has run out (NOTE [ Epoch lookahead ] in fastload._lookahead).
Batches are numpy views of their slot; the slot returns to the pool when the
user drops the last view (NOTE [ Slot ownership and lifetime ] in
fastload_c.slab).

While it waits the main thread sleeps on one doorbell that every result ring
and the SIGCHLD handler ring (NOTE [ Worker-death detection ] in
fastload_c/src/fl_proc.h): a result wakes it, and so does a worker's death.
"""
from __future__ import annotations

import contextlib
import pickle
import time
from collections.abc import Iterator
from typing import Any, NoReturn

from fastload import _checkpoint, _protocol
from fastload._checkpoint import LoaderState
from fastload._dispatch import WorkerIter
from fastload._iterator import pin_target
from fastload._lookahead import CarriedTasks, LookaheadTasks, next_epoch_head
from fastload._protocol import DONE, ENDED, FAILED, INIT_TASK, NEED, RESLOT
from fastload._stats import LoaderStats, WorkerStats
from fastload._task_table import STREAM_ENDED, Failure, Task
from fastload._worker_error import WorkerError
from fastload._worker_group import WorkerGroup, WorkerGroupDied, describe_exit
from fastload.errors import ShmError, WorkerDiedError
from fastload_c import pack

# Without SIGCHLD (forkserver workers are not our children) the waiting main
# thread looks at its workers this often, well inside the 100 ms the user
# is promised to hear of a death. With SIGCHLD it still looks now and then,
# in case a library replaced the handler after the workers started.
DEATH_POLL_SECONDS = 0.05
SIGCHLD_SAFETY_SECONDS = 1.0


def _slot_of(lease: Any) -> tuple[int, int, int]:
    """How a task names its slot to a worker (NOTE [ Worker protocol ])."""
    return (lease.segment_id, lease.offset, lease.capacity)


def _copy_out(batch: Any) -> Any:
    """The batch in private memory, for a pool at its cap (see _deliver)."""
    return pickle.loads(pickle.dumps(batch, protocol=5))


class MultiProcessingIter(WorkerIter):
    """Loads in worker processes."""

    def __init__(self, loader: Any, resume: LoaderState | None,
                 base_seed: int | None = None, start_states: list[Any] | None = None) -> None:
        """``start_states``: each worker's dataset state to start from (a
        persistent-workers run resumed between epochs)."""
        super().__init__(loader, resume, base_seed)
        self._may_look_ahead = loader.persistent_workers and self._map_style
        self._lookahead: LookaheadTasks | None = None
        self._carried = CarriedTasks()
        # Work that grows the pool, put off while a batch is ready to return
        # (see _settle): workers' requests for a bigger slot, and dispatches.
        self._needs: list[tuple[Any, ...]] = []
        self._owed = 0
        self._copy_out = False
        # A batch type with its own pin_memory() pins itself, when an
        # accelerator is there to pin for (the slots themselves are pinned).
        self._pin_custom = pin_target(loader) is not None
        self._stats.workers = [WorkerStats() for _ in range(loader.num_workers)]
        progress = self._progress
        progress.workers, progress.next_worker = _checkpoint.worker_states(
            resume, loader.num_workers, _checkpoint.tracks_replicas(loader))
        self._workers = WorkerGroup(loader, self._base_seed, progress.epoch, progress.workers,
                                    start_states)
        with self._deaths_reported():
            self._begin_epoch()

    def stats(self) -> LoaderStats:
        stats = self._stats
        pool = self._workers.pool
        stats.slots_leased = pool.leased
        stats.slots_free = pool.free_slots
        stats.pool_bytes = pool.nbytes
        stats.ring_messages = sum(ring.count for ring in self._workers.result_rings)
        return stats

    def _shutdown(self) -> None:
        self._stop()

    @property
    def worker_pids(self) -> list[int]:
        """The pids of this iterator's worker processes, in worker-id order."""
        return self._workers.pids

    def _begin_epoch(self) -> None:
        self._begin_round_robin(self._workers.num_workers)
        self._owed = 0
        for _ in range(self._prefetch):
            self._dispatch()

    def _reset(self, loader: Any) -> None:
        """Persistent workers: a new epoch over the same processes."""
        super()._reset(loader)
        epoch = self._progress.epoch
        if not self._map_style:
            # A new stream per worker (a map-style replica goes on as it is).
            self._progress.workers, _ = _checkpoint.worker_states(
                None, self._workers.num_workers, tracked=True)
        lookahead, self._lookahead = self._lookahead, None
        if lookahead is not None and lookahead.epoch == epoch:
            self._carried = CarriedTasks(lookahead.tasks)
        else:
            lookahead, self._carried = None, CarriedTasks()
        carried = self._carried.ids()
        table = self._table
        table.abandon([t for t in (*table.in_flight, *table.ready) if t not in carried])
        with self._deaths_reported():
            # Abandoned tasks hold their slots until their worker answers:
            # wait for all but one epoch's worth, so that iter() after iter()
            # without next() cannot grow the pool (or the rings) for ever.
            self._drain(defer_needs=False)
            while len(self._table.stale) > self._prefetch:
                self._pump(self._deadline())
            if lookahead is None:
                self._workers.reset(epoch)  # a lookahead sent this already
            self._begin_epoch()

    def _dispatch(self) -> None:
        """Send the next batch's task to the next active worker, if any;
        once the sampler ran out, the next lookahead task."""
        if self._sampler_done:
            self._dispatch_lookahead()
            return
        if not any(self._active):
            return
        try:
            index, position, snapshot = self._draw()
        except StopIteration:
            self._sampler_done = True
            self._table.abandon(self._carried.drop())
            self._start_lookahead()
            self._dispatch_lookahead()
            return
        worker_id = self._next_worker_for_task()
        task_id, dropped = self._carried.adopt(index, worker_id)
        self._table.abandon(dropped)
        if task_id is None:
            lease = self._workers.pool.acquire() or self._acquire_at_cap()
            task_id = self._send_task(worker_id, index, lease, position, snapshot)
        else:
            task = self._table.get(task_id)
            assert task is not None  # carried tasks are in flight or ready
            task.sampler_state = snapshot
            task.position = position
        self._table.order.append(task_id)

    def _send_task(self, worker_id: int, index: Any, lease: Any, position: int | None,
                   snapshot: Any) -> int:
        task = Task(worker_id, index, lease, position, snapshot)
        task_id = self._table.add(task)

        def place_index(index_bytes: bytes) -> tuple[int, int, int]:
            # An index too large for a record starts the task's slot.
            if task.lease.capacity < len(index_bytes):
                task.lease = (self._workers.pool.acquire(len(index_bytes))
                              or self._acquire_at_cap())
            with memoryview(task.lease) as slot:
                slot[:len(index_bytes)] = index_bytes
            return _slot_of(task.lease)

        self._workers.send_record(
            worker_id, _protocol.task_message(task_id, index, _slot_of(lease), place_index))
        return task_id

    def _start_lookahead(self) -> None:
        """Persistent workers, map-style: guess the next epoch's first
        batches (NOTE [ Epoch lookahead ] in fastload._lookahead)."""
        if not self._may_look_ahead:
            return
        head = next_epoch_head(self._index_sampler, self._prefetch)
        if not head:
            return
        epoch = self._progress.epoch + 1
        self._workers.reset(epoch)
        self._lookahead = LookaheadTasks(epoch, head, self._workers.num_workers)

    def _dispatch_lookahead(self) -> None:
        """The next lookahead task, in the slot a delivered batch freed. It
        never waits for a slot: at the pool's cap the lookahead stops."""
        lookahead = self._lookahead
        if lookahead is None or not lookahead.indices:
            return
        lease = self._workers.pool.acquire()
        if lease is None:
            lookahead.indices.clear()
            return
        index = lookahead.indices.popleft()
        worker_id = next(lookahead.workers)
        lookahead.tasks.append(
            (self._send_task(worker_id, index, lease, None, None), index, worker_id))

    def _acquire_at_cap(self) -> Any:
        """A slot when the pool may not grow: from now on batches are copied
        out of their slots (see _keeps_slot); wait for one to come back."""
        self._copy_out = True
        deadline = self._deadline()
        while True:
            if not self._table.in_flight:
                pool = self._workers.pool
                raise ShmError(
                    f"every slot of the loader's shared memory ({pool.nbytes} bytes, "
                    "its cap) is held by batches this program still references; "
                    "drop or copy (np.copy) batches you keep")
            self._pump(deadline)
            lease = self._workers.pool.acquire()
            if lease is not None:
                return lease

    @contextlib.contextmanager
    def _deaths_reported(self) -> Iterator[None]:
        """Turn the group's note of a dead worker into the user's error."""
        try:
            yield
        except WorkerGroupDied as died:
            self._raise_last_words(died.worker_id)
            self._raise_worker_died(died.worker_id, died.process)

    def _raise_last_words(self, worker_id: int) -> None:
        """A dead worker that reported why it ended (worker_init_fn raised,
        say) gets that exception raised, rather than its death."""
        while True:
            try:
                message = self._workers.next_result(worker_id)
            except (EOFError, WorkerGroupDied):
                return  # a large message its death cut short
            if message is None:
                return
            if message[0] == FAILED and message[1] == INIT_TASK:
                self._raise_setup_failure(message[2])

    def _next_data(self) -> Any:
        if not self.reusable:
            raise StopIteration  # a worker died: the epoch ended there
        with self._deaths_reported():
            return self._next_batch()

    def _next_batch(self) -> Any:
        deadline = self._deadline()
        self._settle()
        while True:
            next_ready = self._table.pop_next_batch(self._in_order, self._progress.stream_ended)
            if next_ready is not None:
                task, batch = next_ready
                if not isinstance(batch, Failure) and not self._keeps_slot():
                    # The user gets a private copy; the slot comes back now
                    # (the worker is done with it).
                    batch = _copy_out(batch)
                    task.lease = None
                # A failed batch is delivered as its exception: the epoch
                # goes on after it, as in the main process and in torch.
                self._progress.advance(task)
                if self._workers.pool.free_slots:
                    self._dispatch()
                else:
                    self._owed += 1  # growing the pool can wait for the next call
                if isinstance(batch, Failure):
                    batch.error.reraise(self._workers.pids[batch.error.worker_id])
                if self._pin_custom and hasattr(batch, "pin_memory"):
                    batch = batch.pin_memory()  # the slots themselves are pinned
                return self._convert(batch)
            table = self._table
            if not table.order:
                if not self._persistent_workers:
                    self._stop()
                raise StopIteration
            awaited = table.in_flight.get(table.order[0]) if self._in_order else None
            self._settle(awaited.worker_id if awaited is not None else None)
            self._pump(deadline, defer_needs=True)

    def _settle(self, awaited_worker: int | None = None) -> None:
        """Do the work put off to return a ready batch sooner: growing the
        pool (a new segment, tens of milliseconds for large slots) for a
        worker that waits for a bigger slot, or to replace a delivered task.
        Only the pool's growth phase puts anything off. While the next batch
        is awaited from ``awaited_worker``, only what it waits on (every
        request of that worker, which loads its tasks in order) and what
        costs no growth is done."""
        pool = self._workers.pool
        needs, self._needs = self._needs, []
        for message in needs:
            task = self._table.in_flight.get(message[1]) or self._table.stale.get(message[1])
            if (awaited_worker is None or task is None or task.worker_id == awaited_worker
                    or (message[2] <= pool.slot_size and pool.free_slots)):
                self._handle(message)
            else:
                self._needs.append(message)
        if awaited_worker is None:
            while self._owed:
                self._owed -= 1
                self._dispatch()

    def _pump(self, deadline: float | None, defer_needs: bool = False) -> None:
        """Handle the messages waiting on the result rings, first sleeping
        until there is one; with ``defer_needs``, requests for a bigger slot
        are kept for _settle. A worker's death or the ``deadline``
        (time.monotonic) raise."""
        workers = self._workers
        while True:
            seen = workers.doorbell.seq
            if self._drain(defer_needs):
                return
            try:
                workers.raise_if_dead()
            except WorkerGroupDied:
                # What a worker said before it died comes first (its last
                # exception, say); its death is noticed on a later wait.
                if self._drain(defer_needs):
                    return
                raise
            timeout = SIGCHLD_SAFETY_SECONDS if workers.sigchld else DEATH_POLL_SECONDS
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
                timeout = min(remaining, timeout)
            workers.doorbell.wait(seen, timeout)

    def _drain(self, defer_needs: bool) -> bool:
        """Handle every message waiting on the result rings; whether any was."""
        workers = self._workers
        handled = False
        for worker_id in range(workers.num_workers):
            while (message := workers.next_result(worker_id)) is not None:
                if defer_needs and message[0] == NEED:
                    self._needs.append(message)
                else:
                    self._handle(message)
                handled = True
        return handled

    def _raise_worker_died(self, worker_id: int, process: Any) -> NoReturn:
        """The epoch ends here, as in torch; a persistent loader starts a
        fresh worker group at its next iter() (see ``reusable``)."""
        held = [task for _, task in sorted(self._table.in_flight.items())
                if task.worker_id == worker_id and task.position is not None]
        task = held[0] if held else None
        what = ("while idle" if task is None
                else f"while loading batch {task.position} of the epoch (indices {task.index})")
        pid, exitcode = process.pid, process.exitcode
        self._stop()
        raise WorkerDiedError(
            f"DataLoader worker {worker_id} (pid {pid}) {describe_exit(exitcode)} {what}",
            worker_id=worker_id, pid=pid, exitcode=exitcode,
            batch=None if task is None else task.position,
            indices=None if task is None else task.index)

    def _stop(self) -> None:
        """Shut the workers down for good: this iterator's epoch is over."""
        self.reusable = False
        self._workers.shutdown()

    def _handle(self, message: tuple[Any, ...]) -> None:
        kind, task_id = message[0], message[1]
        table = self._table
        task = table.in_flight.get(task_id)
        if kind == FAILED and task_id == INIT_TASK:
            self._raise_setup_failure(message[2])
        if task is None:
            self._handle_stale(kind, task_id, message)
            return
        if kind == DONE:
            table.finish(task_id, self._deliver(task, message[2]))
            self._stats.workers[task.worker_id].add(message[3], message[4])
            task.has_dataset_state, task.dataset_state = message[5], message[6]
            task.dataset_ended = message[7]
        elif kind == NEED:
            self._reslot(task_id, task, message[2])
        elif kind == ENDED:
            task.dataset_state = message[2]
            table.finish(task_id, STREAM_ENDED)
            self._active[task.worker_id] = False
            self._dispatch()
        elif kind == FAILED:
            table.finish(task_id, Failure(message[2]))

    def _raise_setup_failure(self, error: WorkerError) -> None:
        """A worker's failure outside a task (worker_init_fn, its task loop),
        raised here with its type and traceback text; the workers are shut
        down first (the epoch cannot go on)."""
        pid = self._workers.pids[error.worker_id]
        self._stop()
        error.reraise(pid)

    def _reslot(self, task_id: int, task: Task, nbytes: int) -> None:
        pool = self._workers.pool
        if pool.max_bytes and nbytes > pool.max_bytes:
            # No slot will ever hold it: the worker fails that batch instead.
            self._workers.send(task.worker_id, (RESLOT, task_id, None, pool.max_bytes))
            return
        task.lease = pool.acquire(nbytes) or self._acquire_at_cap()
        self._workers.send(task.worker_id, (RESLOT, task_id, _slot_of(task.lease), 0))

    def _handle_stale(self, kind: int, task_id: int, message: tuple[Any, ...]) -> None:
        if kind == NEED:
            task = self._table.stale.get(task_id)
            if task is not None:
                self._reslot(task_id, task, message[2])  # the worker waits for it
        else:
            self._table.answered_stale(task_id)

    def _deliver(self, task: Task, layout: bytes) -> Any:
        return pack.unpack(task.lease, layout)

    def _keeps_slot(self) -> bool:
        """Whether a batch handed to the user may keep its slot: not once
        the pool is at its cap with every slot taken, since the user may
        keep every batch (see _acquire_at_cap)."""
        if not self._copy_out:
            pool = self._workers.pool
            self._copy_out = (pool.free_slots == 0 and pool.max_bytes > 0
                              and pool.max_bytes - pool.nbytes < pool.slot_size)
        return not self._copy_out

