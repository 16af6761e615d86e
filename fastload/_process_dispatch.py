"""The tasks of worker processes: sending them, their slots, and the
workers' answers that move them (NOTE [ Task lifecycle ] in
fastload._task_table).

``ProcessDispatcher`` is what the iterator (``_multiprocess``) calls: it
sends each batch's task to the next worker (round robin, at most
``prefetch_factor`` tasks in flight per worker), takes a slot from the pool
for it, reads the result rings, and hands back the next batch due. While
a batch is ready to return it puts off growing the pool (``_settle``).
With ``prefetch_next_epoch``, persistent workers go on into the next
epoch's first batches once the sampler has run out (NOTE [ Epoch
lookahead ] in fastload._lookahead).

It waits in one place, ``_pump`` (for the workers' answers), which the
iterator's calls reach directly or through ``_acquire_at_cap`` (a slot at
the pool's cap, which comes back only as workers answer). Handling an
answer never waits: a request for a bigger slot is kept for ``_settle``,
and a worker whose stream ended hands its slot to the task sent in its
place. So a wait is never entered from inside another, and the state a
wait sees is never half-way through handling an answer.

While it waits the main thread sleeps on one doorbell that every result ring
and the SIGCHLD handler ring (NOTE [ Worker-death detection ] in
fastload_c/src/fl_proc.h): a result wakes it, and so does a worker's death.

Which slot a task gets, and when, is ``SlotPolicy``'s (fastload._process_slots,
NOTE [ Late slots ]).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastload import _checkpoint, _protocol
from fastload._dispatch import (
    DrawsTasks,
    RoundRobin,
    deadline_after,
    tasks_in_flight,
    wait_seconds,
)
from fastload._epoch_pieces import listed
from fastload._fast_path import SmallGathers
from fastload._fetch import DatasetKind, describe_indices
from fastload._iterator import EpochDraw
from fastload._loader_state import WorkerState
from fastload._lookahead import CarriedTasks, LookaheadTasks, next_epoch_head
from fastload._memory import WATCHED_SLOT_BYTES, SlotSizeWatch
from fastload._process_slots import SlotPolicy, copy_out, holds, slot_of
from fastload._progress import NO_SNAPSHOT, Progress
from fastload._protocol import (
    DONE,
    ENDED,
    FAILED,
    INIT_TASK,
    NEED,
    NO_SEGMENT,
    REVOKED,
    STARTED,
)
from fastload._stats import WorkerStats
from fastload._task_table import STREAM_ENDED, Failure, Task, TaskTable
from fastload._worker_error import WorkerError
from fastload._worker_group import SIGCHLD_SAFETY_SECONDS, WorkerGroup, WorkerGroupDied
from fastload_c import pack

# Without SIGCHLD (forkserver workers are not our children) the waiting main
# thread looks at its workers this often, well inside the 100 ms the user
# is promised to hear of a death. With SIGCHLD it still looks now and then
# (SIGCHLD_SAFETY_SECONDS).
DEATH_POLL_SECONDS = 0.05


class WorkerSetupFailed(Exception):
    """Internal: a worker failed outside a task (worker_init_fn, its task
    loop); the iterator raises ``error``, the worker's exception."""

    def __init__(self, error: WorkerError) -> None:
        super().__init__(error)
        self.error = error


class ProcessDispatcher(SlotPolicy, DrawsTasks):
    """The tasks of one iterator's worker processes, each in one state of
    ``table``. Holds no reference to the iterator: the worker group must
    die with the iterator by reference counting (see _worker_group)."""

    def __init__(self, loader: Any, workers: WorkerGroup, stats: list[WorkerStats],
                 gathers_here: SmallGathers | None = None, index_arrays: bool = False) -> None:
        """``gathers_here``: the batches this process gathers itself (NOTE [
        Small gathers ] in fastload._fast_path); ``index_arrays``: their
        indices are arrays the iterator drew (BaseIter)."""
        self.table = TaskTable()
        self.workers = workers
        self._stats = stats
        self._round_robin = RoundRobin(loader)
        self._prefetch = tasks_in_flight(loader)
        self._in_order: bool = loader.in_order
        self._timeout: float = loader.timeout
        self._index_sampler = loader._index_sampler
        self._may_look_ahead = (loader.prefetch_next_epoch
                                and loader._dataset_kind is DatasetKind.MAP)
        # Whether large slots are given late (NOTE [ Late slots ]).
        self._may_slot_late = workers.batch_bytes is None
        self._draw = EpochDraw(iter(()), frozenset(), 0, None, 0)  # until begin_epoch
        self._epoch = 0
        self._lookahead: LookaheadTasks | None = None
        self._carried = CarriedTasks()
        # Work that grows the pool, put off while a batch is ready to return
        # (see _settle): workers' requests for a bigger slot (their NEED
        # messages), and dispatches owed for delivered batches.
        self._needs: list[tuple[Any, ...]] = []
        self._owed = 0
        # Task id -> the slot that holds its index, revoked, until its
        # worker says it read the REVOKE (SlotPolicy._revoke_queued_slots).
        self._revoked_leases: dict[int, Any] = {}
        # The task whose sending waits for a slot for its index, if any.
        self._unsent: int | None = None
        self._slot_watch = SlotSizeWatch()
        # A batch drawn (index, position, snapshot, worker) whose sending
        # raised (the wait for a slot at the cap, an index pickle cannot
        # write): the next dispatch sends it, to the same worker, so the
        # error loses no batch.
        self._held_back: tuple[Any, int, Any, int] | None = None
        self._copy_out = False
        self._resets = 0  # RESETs sent: the serial their STARTED answers carry
        # The serial whose answers this epoch's start waits for (0: set-up),
        # how many came, and what they said of each replica (worker id ->
        # state), recorded into the epoch's replicas once all came
        # (await_started). A lookahead's answers are kept with it instead.
        self._awaited = 0
        self._started = 0
        self._starts: dict[int, Any] = {}
        self._replicas: list[WorkerState] | None = None
        self._gathers_here = gathers_here
        self._index_arrays = index_arrays

    def begin_epoch(self, draw: EpochDraw, progress: Progress) -> None:
        """Start loading the epoch ``progress`` describes: a task for each
        batch of the prefetch."""
        self._draw = draw
        self._epoch = progress.epoch
        self._replicas = progress.workers
        self._round_robin.begin(progress)
        self.table.order = []
        self._owed, self._held_back = 0, None
        for _ in range(self._prefetch):
            self._dispatch()

    def await_started(self, after_reset: bool = False) -> None:
        """Wait until every worker said STARTED (NOTE [ Worker protocol ]):
        set up, so that a set-up failure or a death before STARTED raises
        here, in iter(), whatever the timing (a death in a task after it,
        next() raises, after the batches answered before it); or,
        ``after_reset`` (a persistent epoch's), with its new stream. Answers
        to tasks that come meanwhile are kept. After a RESET, a worker still
        loading an abandoned task gets the bigger slot it asks for: it reads
        the RESET only after that task. (At set-up a worker says STARTED
        before any task: requests wait for _settle.)"""
        deadline = deadline_after(self._timeout)
        while self._started < self.workers.num_workers:
            try:
                self._pump(deadline)
            except WorkerGroupDied as died:
                if died.worker_id not in self._starts:
                    died.started = False
                    raise  # it died setting up: iter() raises
                # It died in a task after it started: next() raises that,
                # once the batches answered before it are delivered.
                break
            if after_reset:
                self._serve_needs(None)
        for worker_id, state in self._starts.items():
            _checkpoint.record_replica_start(self._replicas, worker_id, state)
        self._starts = {}

    def new_epoch(self, draw: EpochDraw, progress: Progress) -> None:
        """Persistent workers: give the unfinished epoch up and begin the one
        ``progress`` describes, adopting the lookahead's tasks if it guessed it."""
        lookahead, self._lookahead = self._lookahead, None
        if lookahead is not None and lookahead.epoch == progress.epoch:
            self._carried = CarriedTasks(lookahead.tasks)
            # Its RESET began this epoch: await the rest of its answers.
            self._awaited, self._starts = lookahead.serial, lookahead.starts
            self._started = len(lookahead.starts)
        else:
            lookahead, self._carried = None, CarriedTasks()
        table = self.table
        self._carried.abandon_others(table)
        # Abandoned tasks hold their slots until their worker answers: wait
        # for all but one epoch's worth, so that iter() after iter() without
        # next() cannot grow the pool (or the rings) for ever.
        deadline = deadline_after(self._timeout)
        self._drain()
        self._serve_needs(None)
        while len(table.stale) > self._prefetch:
            self._pump(deadline)
            self._serve_needs(None)
        if lookahead is None:  # a lookahead sent this already
            self._awaited = self._reset_workers(progress.epoch, progress.datapipe_seed)
            self._started, self._starts = 0, {}
        self.begin_epoch(draw, progress)
        # A state taken now holds where each replica starts (their STARTED).
        self.await_started(after_reset=True)

    def next_ready(self, stream_ended: Callable[[Task], None]) -> tuple[Task, Any] | None:
        """The next batch due and its task (the batch a Failure when the
        worker raised), waiting for it for at most ``timeout``; None when the
        epoch has no task left. ``stream_ended`` gets each task passed over
        because its worker's iterable stream had run out."""
        table, pool = self.table, self.workers.pool
        if self._gathers_here is not None:
            # Batches made here never wait for a worker, whose death is
            # then noticed here (NOTE [ Small gathers ] in fastload._fast_path).
            self.workers.raise_if_dead()
        if self._may_slot_late and self._slots_late():  # no call for gathered rows
            # Workers may wait for late slots: hear them now, not only once
            # the batches ready run out (NOTE [ Late slots ]).
            self._drain()
        if self._needs or self._owed:
            self._settle()
        waiting = False
        while True:
            found = table.pop_next_batch(self._in_order, stream_ended)
            if found is not None:
                task, batch = found
                # A free slot means the pool is not at its cap: the batch
                # keeps its slot without asking _keeps_slot (issue 18's
                # main-loop budget).
                if (task.lease is not None and not isinstance(batch, Failure)
                        and (self._copy_out or not pool.free_slots) and not self._keeps_slot()):
                    # The user gets a private copy; the slot comes back now
                    # (the worker is done with it).
                    batch = copy_out(batch)
                    task.lease = None
                if not pool.free_slots:
                    self._owed += 1  # growing the pool can wait for the next call
                else:
                    try:
                        self._dispatch()
                    except Exception:
                        # The batch taken is the user's: the dispatch is
                        # made again, raising if it must, by the next call
                        # (its batch held back, _held_back).
                        self._owed += 1
                return task, batch
            if not table.order:
                return None
            if not waiting:  # the timeout counts from the first wait
                deadline, waiting = deadline_after(self._timeout), True
            if self._needs or self._owed:
                awaited = table.in_flight.get(table.order[0]) if self._in_order else None
                self._settle(awaited.worker_id if awaited is not None else None)
            self._pump(deadline)

    def raise_draw_failure(self) -> None:
        """Raise what the sampler raised, if it did, once every batch
        before it was delivered (EpochDraw.raise_failure)."""
        self._draw.raise_failure()

    def held_by(self, worker_id: int) -> Task | None:
        """The first task of the epoch in flight on ``worker_id``, if any."""
        held = [task for _, task in sorted(self.table.in_flight.items())
                if task.worker_id == worker_id and task.position is not None]
        return held[0] if held else None

    def last_words(self, worker_id: int) -> WorkerError | None:
        """The set-up failure a dead worker reported before it ended
        (worker_init_fn raised, say), if it did."""
        while True:
            try:
                message = self.workers.next_result(worker_id)
            except (EOFError, WorkerGroupDied):
                return None  # a large message its death cut short
            if message is None:
                return None
            if message[0] == FAILED and message[1] == INIT_TASK:
                error: WorkerError = message[2]
                return error

    # -- sending tasks ---------------------------------------------------

    def _dispatch(self, lease: Any = None) -> None:
        """Send the next batch's task to the next active worker, if any;
        once the sampler ran out, the next lookahead task. ``lease``: a slot
        to send it in, instead of one from the pool."""
        drawn = self._held_back or self._draw_task(self.table)
        self._held_back = None
        if drawn is None:
            return
        index, position, snapshot, worker_id = drawn
        task_id = None
        if self._carried.tasks:
            task_id = self._carried.adopt_into(self.table, index, worker_id, position, snapshot)
        if task_id is None:
            try:
                if lease is None and not (self._may_slot_late and self._starts_later(worker_id)):
                    lease = self.workers.pool.acquire() or self._acquire_at_cap()
                task_id = self._send_task(worker_id, index, lease, position, snapshot)
            except BaseException:
                self._held_back = (index, position, snapshot, worker_id)
                raise
        self.table.order.append(task_id)

    def _send_task(self, worker_id: int, index: Any, lease: Any, position: int | None,
                   snapshot: Any) -> int:
        """``lease`` None: the task is sent without a slot (NOTE [ Late slots ]).
        A small gather is made here, in ``lease``, not sent (NOTE [ Small
        gathers ])."""
        task = Task(worker_id, index, lease, position, snapshot)
        if lease is not None and self._gathers_here is not None:
            batch = self._gathers_here.gather(
                index, lambda fast: pack.unpack(lease, fast(lease, 0, lease.capacity)),
                self._stats[worker_id])
            if batch is not None:
                return self.table.add_ready(task, batch)
        if self._index_arrays:
            index = task.index = listed(index)  # a worker's fetch sees it
        task_id = self.table.add(task)
        slot = (slot_of(lease) if lease is not None
                else (NO_SEGMENT, 0, self.workers.pool.slot_size))
        try:
            data, index_bytes = _protocol.task_message(task_id, index, slot)
        except Exception as exc:
            # An index pickle cannot write (a sampler's own objects): that
            # batch raises in its place, as a failed fetch would, and the
            # epoch goes on.
            self.table.finish(task_id, Failure(WorkerError(
                exc, worker_id, f"while the main process sent the indices "
                                f"{describe_indices(index)} to the worker")))
            return task_id
        try:
            if data is None:
                data = self._index_in_slot(task, task_id, index_bytes)
            self.workers.send_record(worker_id, data)
        except BaseException:
            del self.table.in_flight[task_id]  # never sent: no answer will come
            raise
        return task_id

    def _index_in_slot(self, task: Task, task_id: int, index_bytes: bytes) -> bytes:
        """The record of a task whose index is too large for one: the index
        (``index_bytes``, pickled) starts the task's slot (a bigger one if
        it must)."""
        task.index_in_slot = True
        if task.lease is None or task.lease.capacity < len(index_bytes):
            # At the cap the wait takes back queued slots: not this task's,
            # which its worker has not read (_revoke_queued_slots).
            self._unsent = task_id
            try:
                task.lease = self.workers.pool.acquire(len(index_bytes)) or self._acquire_at_cap()
            finally:
                self._unsent = None
        with memoryview(task.lease) as slot:
            slot[:len(index_bytes)] = index_bytes
        return _protocol.index_in_slot_message(task_id, len(index_bytes), slot_of(task.lease))

    def _start_lookahead(self) -> None:
        """Persistent workers, map-style: guess the next epoch's first
        batches (NOTE [ Epoch lookahead ] in fastload._lookahead)."""
        if not self._may_look_ahead:
            return
        head = next_epoch_head(self._index_sampler, self._prefetch, self._index_arrays)
        if not head:
            return
        epoch = self._epoch + 1
        # Map-style only: no drawn DataPipe seed (_datapipes.epoch_seed).
        serial = self._reset_workers(epoch, None)
        self._lookahead = LookaheadTasks(epoch, head, self.workers.num_workers, serial)

    def _reset_workers(self, epoch: int, pipe_seed: int | None) -> int:
        """RESET every worker; the serial their STARTED answers will carry."""
        self._resets += 1
        self.workers.reset(epoch, pipe_seed, self._resets)
        return self._resets

    def _dispatch_lookahead(self) -> None:
        """The next lookahead task, in the slot a delivered batch freed, or
        late (NOTE [ Late slots ]). It never waits for a slot: at the pool's
        cap the lookahead stops."""
        lookahead = self._lookahead
        if lookahead is None or not lookahead.indices:
            return
        worker_id = next(lookahead.workers)
        lease = None
        # A worker's first task of the lookahead has its slot: between
        # epochs nobody reads a worker's request for one until iter().
        if not (self._slots_late() and any(w == worker_id for _, _, w in lookahead.tasks)):
            lease = self.workers.pool.acquire()
            if lease is None:
                lookahead.indices.clear()
                return
        index = lookahead.indices.popleft()
        lookahead.tasks.append(
            (self._send_task(worker_id, index, lease, None, NO_SNAPSHOT), index, worker_id))

    # -- the workers' answers --------------------------------------------

    def _pump(self, deadline: float | None) -> None:
        """Handle the messages waiting on the result rings, first sleeping
        until there is one. A worker's death or the ``deadline``
        (time.monotonic) raise."""
        workers = self.workers
        while True:
            seen = workers.doorbell.seq
            if self._drain():
                return
            try:
                workers.raise_if_dead()
            except WorkerGroupDied:
                # What a worker said before it died comes first (its last
                # exception, say); its death is noticed on a later wait.
                if self._drain():
                    return
                raise
            poll = SIGCHLD_SAFETY_SECONDS if workers.sigchld else DEATH_POLL_SECONDS
            workers.doorbell.wait(seen, wait_seconds(deadline, poll, self._timeout))

    def _drain(self) -> bool:
        """Handle every message waiting on the result rings; whether any was."""
        workers = self.workers
        handled = False
        for worker_id in range(workers.num_workers):
            while (message := workers.next_result(worker_id)) is not None:
                self._handle(message)
                handled = True
        return handled

    def _handle(self, message: tuple[Any, ...]) -> None:
        """Move a task as its worker's answer says; never waits (see the
        module's docstring)."""
        kind, task_id = message[0], message[1]
        table = self.table
        if kind == DONE:  # every batch's answer: first
            task = table.in_flight.get(task_id)
            if task is None:
                self._answered_stale(task_id)
                return
            try:
                batch = pack.unpack(task.lease, message[2])
            except Exception as exc:
                # This process cannot rebuild what the worker wrote (an
                # object whose unpickling raises): that batch fails, in its
                # place, and the epoch goes on.
                batch = Failure(WorkerError(
                    exc, task.worker_id,
                    f"while the main process rebuilt the batch of indices "
                    f"{describe_indices(task.index)}"))
            else:
                if task.lease.capacity >= WATCHED_SLOT_BYTES:
                    # NOTE [ Slots after a spike ] in fastload._memory
                    self._slot_watch.saw(self.workers.pool, message[2])
            table.finish(task_id, batch)
            self._stats[task.worker_id].add(message[3], message[4])
            task.has_dataset_state, task.dataset_state = message[5], message[6]
            task.dataset_ended = message[7]
            if self._may_slot_late and self._slots_late():  # no call for gathered rows
                self._offer_slot(task.worker_id)
            return
        if kind == FAILED and task_id == INIT_TASK:
            raise WorkerSetupFailed(message[2])
        if kind == STARTED:
            serial, lookahead = message[3], self._lookahead
            if serial == self._awaited:
                self._started += 1
                self._starts[message[2]] = message[4]
            elif lookahead is not None and serial == lookahead.serial:
                lookahead.starts[message[2]] = message[4]
            return  # else an answer to a RESET given up
        if kind == REVOKED:
            self._revoked(message[1])
            return
        if kind == NEED:
            task = table.in_flight.get(task_id) or table.stale.get(task_id)
            if message[3]:
                if task is not None and task.lease is not None:
                    # A late task's first ask, sent before the slot offered
                    # to it since (_offer_slot) reached its worker: the
                    # worker takes that RESLOT, the first for the task, and
                    # writes there, asking again (not late) if the batch
                    # needs more. Whatever the slot sizes did meanwhile, the
                    # task keeps that slot.
                    return
                # It asks for a slot of the size it was sent with, not more:
                # the present size (NOTE [ Slots after a spike ]).
                message = (NEED, task_id, min(message[2], self.workers.pool.slot_size), False)
            if task is not None and not holds(task, message[2]):
                # Its worker waits for the RESLOT and writes nothing more
                # into a slot the batch did not fit: that slot is free now,
                # which at the pool's cap may be what lets the request be
                # served.
                task.lease, task.awaits_slot = None, True
            self._needs.append(message)
            return
        task = table.in_flight.get(task_id)
        if task is None:
            self._answered_stale(task_id)
        elif kind == ENDED:
            task.dataset_state = message[2]
            table.finish(task_id, STREAM_ENDED)
            self._round_robin.retire(task.worker_id)
            # Its slot holds no batch: the task that replaces it takes it.
            lease, task.lease = task.lease, None
            self._dispatch(lease)
        elif kind == FAILED:
            table.finish(task_id, Failure(message[2]))
            task.has_dataset_state, task.dataset_state = message[3], message[4]
            if self._slots_late():
                self._offer_slot(task.worker_id)

    def _answered_stale(self, task_id: int) -> None:
        """A stale task's worker answered: the task is gone, and the worker
        starts its next (NOTE [ Late slots ])."""
        task = self.table.answered_stale(task_id)
        if task is not None and self._slots_late():
            self._offer_slot(task.worker_id)
