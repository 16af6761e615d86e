"""The iterator of a DataLoader with thread workers (``worker_method="thread"``).

NOTE [ Thread workers ]

``num_workers`` threads of the main process load the batches, each with the
fetcher of ``num_workers=0`` (``_fetch``) and the loader's ``collate_fn``,
so a batch is what the main process would make, with no pickling: the batch
object itself crosses to the main thread. The main thread owns the
order exactly as with worker processes: it draws indices, sends each task
to the next worker (round robin, ``prefetch_factor`` tasks per worker;
with ``in_order=False`` an idle one), and delivers in task order.
With ``prefetch_next_epoch``, persistent thread workers look ahead into the
next epoch as worker processes do (NOTE [ Epoch lookahead ] in
fastload._lookahead), except over a map-style dataset with a state: the
threads share it, so the state taken at the next ``iter()`` would hold the
lookahead's reads.

* **The dataset.** A map-style dataset is shared by every thread, as in
  torch's thread workers: ``dataset[i]`` may run in several threads at
  once, unless it keeps a state (``state_dict`` and ``load_state_dict``):
  its fetches then take turns in the order the tasks were sent
  (``FetchTurns``), so what they do to that state (a draw from a
  generator it holds, say) happens in the sampler's order, as with
  ``num_workers=0``, and the state read right after a batch's fetch is
  the state at that batch, which a checkpoint records. Only the fetches
  wait for each other; the batches are still written in parallel. An
  iterable dataset is copied once per thread (``copy.deepcopy``),
  because each worker iterates its own replica, with its own position and
  state, exactly as each worker process does: a dataset that shards itself
  with ``get_worker_info()`` or in ``worker_init_fn`` (torch's documented
  idiom sets ``worker_info.dataset.start``) yields what it yields with
  worker processes, and its ``state_dict()`` describes one worker. What a
  forked worker would share with the main process stays shared: torch
  tensors in shared memory (Hugging Face's IterableDataset keeps its epoch
  in one, which ``set_epoch`` updates in place for persistent workers).
* **Slots.** Under default collation a worker thread takes the decision a
  worker process takes (``BatchWriter.plan``, NOTE [ Fast paths ]): the C
  writers of ``fastload_c.pack`` gather or collate into a slot of a slab
  pool the iterator owns (no worker needs to map it: one process), and the
  worker thread builds the views (``pack.unpack``), so the main thread
  only hands the batch over. A worker thread takes its slot when its batch
  is fetched and about to be written (``ThreadSlots``), so a task queued
  or still fetching holds none (NOTE [ Late slots ] in
  fastload._process_slots says why that matters for large batches);
  its reference keeps the slot leased while it writes (also for a task of
  an epoch given up, whose answer is dropped), then the batch's arrays
  hold the Lease, so a slot is reused only when the last view of its
  batch is gone (NOTE [ Slot ownership and lifetime ] in
  fastload_c.slab). A batch too large for its slot, or one written when
  the pool is at its cap (no Lease), is written into private memory of
  its size instead of waiting for a bigger slot, and its size raises the
  slot size for the batches after it. The copies release the GIL when they
  are large enough to be worth it (NOTE [ Copies and the GIL ] in
  fastload_c.pack).
* **Small gathers.** Batches of a few rows of an ``ArrayDataset`` are
  gathered by the main thread itself, as its tasks are sent (NOTE [ Small
  gathers ] in fastload._fast_path).
* **Per-thread state.** ``get_worker_info()`` and the ``sample_rng()``
  context are thread-local; ``WorkerInfo.rng`` holds the thread's own
  generators (fastload._worker_info.WorkerRNG). The global ``random``,
  numpy and torch generators are shared by all threads and are not seeded
  per worker: augmentations use ``sample_rng()`` or ``WorkerInfo.rng``.
  Draws from them in a worker thread would depend on the threads'
  scheduling, so each thread compares the global generators' states
  around its first batch and, if they moved, the main thread warns once.
  (The main thread's own code rarely runs in that window: at the start of
  an epoch it is waiting for the first batch.)
* **What relies on the GIL.** Threads and the main thread share the
  task and result queues (``queue.SimpleQueue``, locked), the stop event,
  and what the user shares (the map-style dataset, ``collate_fn``); each
  thread's fetcher, writer, replica, sample context and WorkerInfo are its
  own. fastload's own shared state that threads touch:
  ``default_collate``'s handler cache (fastload.collate), a dict each
  thread writes with single dict operations, which are atomic under the
  GIL and locked per object on free-threaded Python (its pruning,
  ``list(_handlers)`` then ``pop``, tolerates another thread pruning too);
  the one-time install of the thread-aware torch ``get_worker_info``
  (fastload._worker_info), where two threads installing at once install
  equivalent functions. Of the extensions, fastload_c.ring (each side of
  a ring has one user, the rest is atomics) and fastload_c.ragged (no
  state between calls) declare themselves free-threading compatible;
  fastload_c.shm and fastload_c.proc are used by the main thread only;
  two places rely on the GIL for correctness, so fastload_c.slab and
  fastload_c.pack do not declare it: the slab pool's free stacks (a worker
  thread takes a slot while another thread, the pinning thread too (NOTE
  [ Pinning by copy ] in fastload._pinning), may drop the last view of
  another, each a few unlocked C statements that the GIL keeps apart; the
  threads' takes are also under ``ThreadSlots``' lock, since growing the
  pool releases the GIL), and pack's
  module-level caches (``_last_plan``, ``_gather_layouts``, ``_decoded``,
  which each thread reads and replaces: without the GIL a reader could
  take a reference to a plan another thread is freeing).
* **Shutdown.** Threads are daemons and hold no reference to the iterator:
  when it is exhausted (without persistent workers), shut down or dropped,
  each thread is told to stop and joined for at most ``JOIN_SECONDS`` in
  all. A thread stuck in a long ``__getitem__`` is left to finish that
  sample and stop; it never holds up interpreter exit.
"""
from __future__ import annotations

import functools
import os
import queue
import threading
import weakref
from typing import Any, NoReturn

from fastload import _checkpoint
from fastload._dispatch import DrawsTasks, RoundRobin, WorkerIter, wait_seconds
from fastload._epoch_pieces import listed
from fastload._fast_path import not_gathered, writes_in_c
from fastload._fetch import describe_indices, is_stateful
from fastload._loader_state import LoaderState, WorkerState
from fastload._lookahead import CarriedTasks, LookaheadTasks, next_epoch_head
from fastload._progress import NO_SNAPSHOT, Progress
from fastload._protocol import DONE, ENDED, FAILED, INIT_TASK, STARTED
from fastload._state_values import same_state, snapshot
from fastload._stats import WorkerStats
from fastload._task_table import STREAM_ENDED, Task, TaskTable
from fastload._warnings import warn_at_caller
from fastload._worker_error import WorkerError
from fastload._worker_thread import (
    GLOBAL_RNG_USED,
    GLOBAL_RNG_WARNING,
    RESET,
    TASK,
    ThreadSlots,
    WorkerConfig,
    WorkerThread,
    batch_in_slot,
    stop_workers,
)
from fastload.errors import WorkerDiedError

# How often the waiting main thread checks that its worker threads live.
LIVENESS_POLL_SECONDS = 0.1


class ThreadIter(WorkerIter, DrawsTasks):
    """Loads in worker threads of this process (NOTE [ Thread workers ])."""

    def __init__(self, loader: Any, resume: LoaderState | None,
                 base_seed: int | None = None, start_states: list[Any] | None = None) -> None:
        """``start_states``: as for MultiProcessingIter."""
        left = loader._progress  # the last epoch's, until super() starts this one
        super().__init__(loader, resume, base_seed)
        workers = loader.num_workers
        self._results: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._warned_global_rng = False
        self._table = TaskTable()  # NOTE [ Task lifecycle ]
        self._table.pinner = self._pinner
        self._round_robin = RoundRobin(loader)
        self._stats.workers = [WorkerStats() for _ in range(workers)]
        progress = self._progress
        progress.workers, progress.next_worker = _checkpoint.worker_states(
            resume, workers, _checkpoint.tracks_replicas(loader))
        resumed: list[WorkerState | None] = [None] * workers
        if resume is not None and progress.workers is not None:
            resumed = list(progress.workers)
        if resume is None:
            latest = loader._latest_iterator
            previous = None if latest is None else latest()
            if previous is None or not previous.reusable:  # its threads stopped
                self._restore_left_epoch(left)
            self._record_shared_start()
        config = WorkerConfig(loader, self._base_seed)
        # Slots for the batches C writes (NOTE [ Thread workers ]).
        slots = (ThreadSlots(self._writes_through_files)
                 if writes_in_c(config.auto_collation, config.collate_fn) else None)
        # Small gathers (WorkerIter) are this thread's own (NOTE [ Small
        # gathers ] in fastload._fast_path), written as a worker thread
        # writes a batch.
        self._write_here = functools.partial(batch_in_slot, general=not_gathered, slots=slots)
        self._slots = slots
        self._fetch_turns = config.fetch_turns
        if self._fetch_turns is not None:
            # Fetched one at a time in task order, batches arrive in order,
            # but for collation: delivering them in order keeps each state
            # the state at a step (in_order=False only permits otherwise).
            self._in_order = True
        self._workers = [
            WorkerThread(i, config, slots, self._results, progress.epoch,
                         progress.datapipe_seed, resumed[i],
                         None if start_states is None else start_states[i])
            for i in range(workers)]
        self._stop_all = weakref.finalize(self, stop_workers, self._workers, config.stop)
        self._started = 0  # threads that said STARTED to the latest RESET (or set-up)
        self._resets = 0  # RESETs sent: the serial their STARTED answers carry
        # NOTE [ Epoch lookahead ]: not over a map-style dataset with a state,
        # which the threads share: a state taken at iter() would then hold
        # the next epoch's first batches already read.
        self._may_look_ahead = (loader.prefetch_next_epoch and self._map_style
                                and not is_stateful(self._dataset))
        self._lookahead: LookaheadTasks | None = None
        self._carried = CarriedTasks()
        for worker in self._workers:
            worker.thread.start()
        self._begin_epoch()
        # As worker processes: a set-up failure raises in iter(), whatever
        # the timing (NOTE [ Worker protocol ]).
        self._await_started()
        if self._draw.failed_at_start:
            self._stop()
            self._draw.raise_failure()

    def _await_started(self) -> None:
        """Wait until every thread said STARTED (set up, or its new stream
        after a RESET)."""
        deadline = self._deadline()
        while self._started < len(self._workers):
            self._wait(deadline)

    def _restore_left_epoch(self, left: Progress | None) -> None:
        """A map-style dataset the threads share, with a state, whose last
        epoch was left before its end (``left``, its progress): put back
        where its last delivered batch left it, as num_workers=0 leaves it,
        undoing the fetches of batches prefetched and never delivered (by
        threads stopped since, or that answered a RESET). Only if nothing
        else moved it since the last of those fetches (a ``set_epoch``, a
        loaded state): that is the program's, and stays."""
        if (left is None or left.finished or left.shared_fetches is None
                or left.dataset is None):
            return
        fetched, state = left.shared_fetches.fetched
        if not fetched or not same_state(snapshot(self._dataset.state_dict()), state):
            return
        # A copy: a state taken from that epoch may hold this very object.
        self._dataset.load_state_dict(snapshot(left.dataset))

    def _record_shared_start(self) -> None:
        """A map-style dataset the threads share, with a state: a state taken
        before the epoch's first batch holds where it starts (taken before
        any thread fetches for this epoch)."""
        if self._map_style and is_stateful(self._dataset):
            self._progress.dataset = snapshot(self._dataset.state_dict())
            self._progress.dataset_step = 0

    @property
    def worker_threads(self) -> list[threading.Thread]:
        """This iterator's worker threads, in worker-id order."""
        return [worker.thread for worker in self._workers]

    def _shutdown(self) -> None:
        self._stop()

    def _disown(self) -> None:
        # No thread of it survived the fork, and one may have held a lock
        # that stopping them would wait on.
        super()._disown()
        self._stop_all.detach()

    def _stop(self) -> None:
        """Stop the worker threads for good: this iterator's epoch is over."""
        self.reusable = False
        self._stop_all()
        self._stop_pinning()

    def _begin_epoch(self) -> None:
        # What _restore_left_epoch asks of this epoch, if it is left early.
        self._progress.shared_fetches = self._fetch_turns
        self._table.order = []
        self._round_robin.begin(self._progress)
        self._draw = self._epoch_draw()
        for _ in range(self._prefetch):
            self._dispatch()

    def _reset(self, loader: Any) -> None:
        """Persistent workers: a new epoch on the same threads, adopting the
        lookahead's tasks if it guessed it. Other tasks still in flight
        finish first (each thread takes its messages in order); their
        batches are dropped when they arrive."""
        left = self._progress
        super()._reset(loader)
        if not self._map_style:
            self._progress.workers, _ = _checkpoint.worker_states(
                None, len(self._workers), tracked=True)
        lookahead, self._lookahead = self._lookahead, None
        if lookahead is not None and lookahead.epoch == self._progress.epoch:
            self._carried = CarriedTasks(lookahead.tasks)
        else:
            lookahead, self._carried = None, CarriedTasks()
        table = self._table
        self._carried.abandon_others(table)
        table.stale.clear()  # their answers are dropped when they arrive
        if self._fetch_turns is not None:
            self._fetch_turns.drop_sent()
        if lookahead is None:  # a lookahead sent this already
            self._reset_workers(self._progress.epoch, self._progress.datapipe_seed)
        # Each thread answers once done with its abandoned tasks: then the
        # shared dataset is where the new epoch starts (put back where the
        # left epoch's last delivered batch left it, if it keeps a state),
        # and so is each stream (their STARTED), for a state taken now.
        self._await_started()
        self._restore_left_epoch(left)
        self._record_shared_start()
        self._begin_epoch()
        if self._draw.failed_at_start:
            self._draw.raise_failure()  # the threads wait for the next iter()

    def _reset_workers(self, epoch: int, pipe_seed: int | None) -> int:
        """RESET every thread; the serial their STARTED answers will carry."""
        self._started = 0
        self._resets += 1
        for worker in self._workers:
            worker.tasks.put((RESET, epoch, pipe_seed, self._resets))
        return self._resets

    def _dispatch(self) -> None:
        """Send the next batch's task to the next active worker, if any;
        once the sampler ran out, the next lookahead task."""
        table = self._table
        drawn = self._draw_task(table)
        if drawn is None:
            return
        index, position, snapshot, worker_id = drawn
        task_id = None
        if self._carried.tasks:
            task_id = self._carried.adopt_into(table, index, worker_id, position, snapshot)
        if task_id is None:
            task_id = self._send_task(worker_id, index, position, snapshot,
                                      self._progress.epoch)
        table.order.append(task_id)

    def _send_task(self, worker_id: int, index: Any, position: int | None, snapshot: Any,
                   epoch: int) -> int:
        """A new task for ``worker_id``, which loads it, or this thread now
        if it is a small gather."""
        task = Task(worker_id, index, None, position, snapshot)
        batch = None if self._gathers_here is None else self._gathers_here.gather(
            index, self._write_here, self._stats.workers[worker_id])
        if batch is not None:
            return self._table.add_ready(task, batch)
        if self._index_arrays:
            index = task.index = listed(index)  # a worker's fetch sees it
        task_id = self._table.add(task)
        turns = self._fetch_turns
        self._workers[worker_id].tasks.put(
            (TASK, task_id, index, epoch, None if turns is None else turns.ticket()))
        return task_id

    def _start_lookahead(self) -> None:
        """Guess the next epoch's first batches (NOTE [ Epoch lookahead ])."""
        if not self._may_look_ahead:
            return
        head = next_epoch_head(self._index_sampler, self._prefetch, self._index_arrays)
        if not head:
            return
        epoch = self._progress.epoch + 1
        # Map-style only: no drawn DataPipe seed (_datapipes.epoch_seed).
        serial = self._reset_workers(epoch, None)
        self._lookahead = LookaheadTasks(epoch, head, len(self._workers), serial)

    def _dispatch_lookahead(self) -> None:
        """The next lookahead task, in place of a delivered batch."""
        lookahead = self._lookahead
        if lookahead is None or not lookahead.indices:
            return
        index = lookahead.indices.popleft()
        worker_id = next(lookahead.workers)
        task_id = self._send_task(worker_id, index, None, NO_SNAPSHOT, lookahead.epoch)
        lookahead.tasks.append((task_id, index, worker_id))

    def _next_data(self) -> Any:
        if not self.reusable:
            self._raise_stopped()
        table, progress = self._table, self._progress
        waiting = False
        while True:
            next_ready = table.pop_next_batch(self._in_order, progress.stream_ended)
            if next_ready is not None:
                task, batch = next_ready
                self._dispatch()
                if isinstance(batch, WorkerError):
                    progress.advance(task)
                    self._raise_failed_batch(batch, os.getpid(), thread=True)
                return self._deliver_ready(task, batch)
            if not table.order:
                self._draw.raise_failure()
                if not self._persistent_workers:
                    self._stop()
                raise StopIteration
            if not waiting:  # the timeout counts from the first wait
                deadline, waiting = self._deadline(), True
            self._wait(deadline)

    def _wait(self, deadline: float | None) -> None:
        """Handle the next result and those already waiting, first sleeping
        until there is one; the ``deadline`` (time.monotonic) raises, and
        so does a worker thread that ended without saying why."""
        while True:
            timeout = wait_seconds(deadline, LIVENESS_POLL_SECONDS, self._timeout)
            try:
                self._handle(self._results.get(timeout=timeout))
            except queue.Empty:
                self._check_alive()
                continue
            self._drain()
            return

    def _drain(self) -> bool:
        """Handle every result waiting; whether there was one."""
        results = self._results
        handled = False
        # Only this thread takes results, so what empty() denies is there.
        while not results.empty():
            self._handle(results.get_nowait())
            handled = True
        return handled

    def _check_alive(self) -> None:
        for worker_id, worker in enumerate(self._workers):
            if not worker.thread.is_alive() and not self._drain():
                self._raise_worker_ended(worker_id)

    def _raise_worker_ended(self, worker_id: int) -> NoReturn:
        """A worker thread ended without a result (a BaseException such as
        SystemExit in the dataset): the epoch ends here, as for a dead
        worker process."""
        held = [task for _, task in sorted(self._table.in_flight.items())
                if task.worker_id == worker_id]
        what = ("while idle" if not held
                else f"while loading indices {describe_indices(held[0].index)}")
        self._stop()
        raise WorkerDiedError(f"DataLoader worker thread {worker_id} ended {what}",
                              worker_id=worker_id, pid=os.getpid(), exitcode=0, batch=None,
                              indices=held[0].index if held else None)

    def _handle(self, message: tuple[Any, ...]) -> None:
        kind, task_id = message[0], message[1]
        if kind != DONE and self._handled_outside_tasks(message):
            return
        table = self._table
        task = table.in_flight.get(task_id)
        if task is None:
            return  # a task of an epoch left before its end (see _reset)
        if kind == DONE:  # every batch's answer
            self._stats.workers[task.worker_id].add(message[3], message[4])
            task.has_dataset_state, task.dataset_state = message[5], message[6]
            task.dataset_ended = message[7]
            table.finish(task_id, message[2])
        elif kind == ENDED:
            task.dataset_state = message[2]
            self._round_robin.retire(task.worker_id)
            table.finish(task_id, STREAM_ENDED)
            self._dispatch()
        else:  # FAILED, with the replica's state after it
            task.has_dataset_state, task.dataset_state = message[3], message[4]
            table.finish(task_id, message[2])

    def _handled_outside_tasks(self, message: tuple[Any, ...]) -> bool:
        """Handle a message about no task (a set-up failure, STARTED, the
        global RNGs' use); whether it was one."""
        kind = message[0]
        if kind == FAILED and message[1] == INIT_TASK:
            # worker_init_fn or the thread's set-up failed: the epoch cannot go on.
            self._stop()
            message[2].reraise(os.getpid(), thread=True)
        if kind == STARTED:
            if message[3] == self._resets:  # else an answer to an earlier RESET
                self._started += 1
                _checkpoint.record_replica_start(self._progress.workers, message[2], message[4])
            return True
        if kind == GLOBAL_RNG_USED:
            if not self._warned_global_rng:
                self._warned_global_rng = True
                warn_at_caller(GLOBAL_RNG_WARNING)
            return True
        return False
