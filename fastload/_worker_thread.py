"""The body of a worker thread (``worker_method="thread"``): its task
queue, fetcher and replica, and how it writes a batch (NOTE [ Thread
workers ] in fastload._thread_workers, whose ``ThreadIter`` drives it)."""
from __future__ import annotations

import copy
import queue
import random
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from fastload import _checkpoint, _datapipes, _memory
from fastload._fast_path import BatchWriter, Write
from fastload._fetch import (
    DatasetFetcher,
    DatasetKind,
    create_fetcher,
    describe_failure,
    is_stateful,
)
from fastload._loader_state import WorkerState
from fastload._protocol import DONE, ENDED, FAILED, INIT_TASK, STARTED
from fastload._sample_rng import context as sample_context
from fastload._torch import generator_state, torch_if_imported
from fastload._worker_error import WorkerError
from fastload._worker_info import WorkerInfo, set_thread_worker_info, worker_rng
from fastload.errors import InvalidArgumentError
from fastload_c import pack
from fastload_c.pack import SlotTooSmallError

# How long shutting down waits for the worker threads, all of them together.
JOIN_SECONDS = 1.0
# A first guess at the batch size; a batch that needs more raises it.
INITIAL_SLOT_BYTES = 1 << 16

# Messages to a worker thread: (TASK, task id, index, epoch, fetch turn or
# None), (RESET, epoch, DataPipe seed, serial), (STOP,).
TASK, RESET, STOP = "task", "reset", "stop"
# A worker thread's note that the global generators moved during its first
# batch: (GLOBAL_RNG_USED, worker id).
GLOBAL_RNG_USED = "global rng used"

GLOBAL_RNG_WARNING = (
    "a dataset loaded by worker threads (worker_method='thread') drew from the global "
    "random, numpy or torch generator: the threads share it, so what it draws depends on "
    "their scheduling and differs from worker processes; draw from fastload.sample_rng() "
    "or get_worker_info().rng instead")


def _global_rng_states() -> tuple[Any, ...]:
    """The states of the generators every thread of the process shares."""
    torch = sys.modules.get("torch")
    numpy_state = np.random.get_state(legacy=False)["state"]
    return (random.getstate(), numpy_state["key"].tobytes(), numpy_state["pos"],
            None if torch is None
            else generator_state(torch.default_generator).numpy().tobytes())


class ThreadSlots:
    """The slab pool of one iterator's worker threads (NOTE [ Thread
    workers ]). Each thread takes a slot as it writes a batch, not when its
    task is sent, so the pool holds slots for batches being written or
    held, never for tasks still queued (NOTE [ Late slots ] in
    fastload._process_slots). ``size``: the most a batch too large for
    its slot asked for, which later slots get, until the slots shrink
    after a spike (NOTE [ Slots after a spike ] in fastload._memory). The
    lock keeps the threads' acquires apart: making a segment releases the
    GIL."""

    def __init__(self, unmapped: bool) -> None:
        # ``unmapped``: fastload._fast_path.BatchWriter.writes_through_files.
        self.pool = _memory.new_pool(
            INITIAL_SLOT_BYTES, unmapped_slot_bytes=_memory.UNMAPPED_SLOT_BYTES if unmapped else 0)
        self.size = 0
        self._watch = _memory.SlotSizeWatch()
        self._lock = threading.Lock()

    def take(self) -> Any:
        """A Lease of at least ``size`` bytes, or None at the pool's cap."""
        with self._lock:
            return self.pool.acquire(self.size)

    def ask(self, needed: int) -> None:
        """Later slots hold ``needed`` bytes."""
        with self._lock:
            self.size = max(self.size, needed)

    def wrote(self, slot: Any, layout: bytes) -> None:
        """A batch of ``layout`` was written into ``slot``: watched where
        slots are large (NOTE [ Slots after a spike ])."""
        if slot.capacity < _memory.WATCHED_SLOT_BYTES:
            return
        with self._lock:
            if self._watch.saw(self.pool, layout):
                self.size = 0


class WorkerConfig:
    """What every worker thread of one iterator reads and never changes."""

    def __init__(self, loader: Any, base_seed: int) -> None:
        self.dataset = loader.dataset
        self.kind: DatasetKind = loader._dataset_kind
        self.auto_collation: bool = loader._auto_collation
        self.collate_fn, _ = loader._engine_collation()
        self.drop_last: bool = loader.drop_last
        self.batch_size = loader.batch_size if loader._auto_collation else None
        self.num_workers: int = loader.num_workers
        self.worker_init_fn = loader.worker_init_fn
        self.snapshot_every: int = loader.snapshot_every_n_steps
        self.base_seed = base_seed
        self.stop = threading.Event()
        self.fetch_turns = (FetchTurns(self.stop) if self.kind is DatasetKind.MAP
                            and is_stateful(self.dataset) else None)
        # Found once for every thread's replica (_replica).
        self.shared_tensors = ({} if self.kind is DatasetKind.MAP
                               else _shared_tensors(self.dataset))


class FetchTurns:
    """The fetches of a shared map-style dataset that keeps a state, one at
    a time in the order their tasks were sent (NOTE [ Thread workers ] in
    fastload._thread_workers). The main thread hands each task a ticket as
    it sends it; a worker thread waits until its ticket is served, fetches
    and reads the dataset's state (or, for a task of an epoch left before
    its end, does neither), and serves the next ticket. Every ticket is
    served: each thread takes its tasks in the order they were sent, and
    a wait ends when the workers stop."""

    # How often a wait looks at ``stop`` (a served ticket wakes it at once).
    STOP_CHECK_SECONDS = 0.05

    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop
        self._sent = 0  # tickets handed out, by the main thread only
        self._dropped_below = 0  # tickets of tasks whose epoch was left
        self._serving = 0
        self._served = threading.Condition()
        # The dataset's state recorded after the latest fetch (set in its
        # turn), read once the threads are stopped or idle.
        self.fetched: tuple[bool, Any] = (False, None)

    def ticket(self) -> int:
        ticket, self._sent = self._sent, self._sent + 1
        return ticket

    def drop_sent(self) -> None:
        """The tasks sent so far belong to an epoch left before its end:
        their turns pass without a fetch."""
        with self._served:
            self._dropped_below = self._sent

    def wait(self, ticket: int) -> bool:
        """Wait for ``ticket``'s turn; whether to fetch then (not for a
        dropped task, nor once the workers stop). ``done`` follows."""
        with self._served:
            while self._serving != ticket:
                if self._stop.is_set():
                    return False
                self._served.wait(self.STOP_CHECK_SECONDS)
            return ticket >= self._dropped_below

    def done(self, ticket: int) -> None:
        with self._served:
            if self._serving == ticket:
                self._serving = ticket + 1
                self._served.notify_all()


def _replica(config: WorkerConfig) -> Any:
    """A worker's own copy of an iterable dataset, sharing its shared-memory
    tensors (NOTE [ Thread workers ])."""
    try:
        # A memo of its own: deepcopy adds what it copies to it.
        return copy.deepcopy(config.dataset, dict(config.shared_tensors))
    except Exception as exc:
        raise InvalidArgumentError(
            "worker_method='thread' gives each worker thread its own copy of an "
            f"IterableDataset (copy.deepcopy), which failed: {exc!r}; give the dataset "
            "a __deepcopy__ that shares what cannot be copied") from exc


def _shared_tensors(root: Any) -> dict[int, Any]:
    """The torch tensors in shared memory that ``root`` holds through
    attributes and containers, each mapped to itself: as a deepcopy memo,
    what a copy then shares, as a forked worker shares them."""
    torch = torch_if_imported()
    if torch is None:
        return {}
    found: dict[int, Any] = {}
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, str, bytes)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.is_shared():
                found[id(obj)] = obj
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
    return found


class WorkerThread:
    """One worker thread: its task queue, fetcher and (iterable dataset)
    replica. It holds no reference to the iterator."""

    def __init__(self, worker_id: int, config: WorkerConfig, slots: ThreadSlots | None,
                 results: queue.SimpleQueue[Any], epoch: int, pipe_seed: int | None,
                 resume: WorkerState | None, start_state: Any = None) -> None:
        """``slots``: where C writers put batches (None: no C writer);
        ``pipe_seed``: the epoch's DataPipe seed (Progress.datapipe_seed);
        ``start_state``: the replica's dataset state to start from (a
        persistent-workers run resumed between epochs)."""
        self.worker_id = worker_id
        self.config = config
        self.slots = slots
        self.results = results
        self.tasks: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.map_style = config.kind is DatasetKind.MAP
        self.dataset = config.dataset if self.map_style else _replica(config)
        self.writer = BatchWriter(self.dataset, config.kind, config.auto_collation,
                                  config.collate_fn,
                                  unmapped_slot_bytes=_memory.UNMAPPED_SLOT_BYTES)
        self.fetcher: Any = None
        self.ended = False
        self.batches_done = 0
        self.first_batch = True
        self.pipe_seed = pipe_seed
        self.start_state = start_state
        self.thread = threading.Thread(target=self.run, args=(epoch, resume), daemon=True,
                                       name=f"fastload-worker-{worker_id}")

    def run(self, epoch: int, resume: WorkerState | None) -> None:
        config, worker_id = self.config, self.worker_id
        where = "while starting"
        try:
            set_thread_worker_info(WorkerInfo(
                id=worker_id, num_workers=config.num_workers,
                seed=(config.base_seed + worker_id) % 2**64, dataset=self.dataset,
                rng=worker_rng(config.base_seed, worker_id), worker_method="thread"))
            sample_context.base_seed = config.base_seed
            sample_context.epoch = epoch
            if config.worker_init_fn is not None:
                where = "in worker_init_fn"
                config.worker_init_fn(worker_id)
            where = "in its task loop"
            if self.start_state is not None:
                _checkpoint.resume_ended_replica(self.new_fetcher, self.start_state)
            else:
                self.new_fetcher(resume)
            self.started(0)
            self.serve()
        except Exception as exc:
            self.results.put((FAILED, INIT_TASK, WorkerError(exc, worker_id, where)))
        finally:
            set_thread_worker_info(None)

    def started(self, serial: int) -> None:
        """Say STARTED (NOTE [ Worker protocol ]): set up (serial 0), or the
        new stream of RESET ``serial`` ready."""
        self.results.put((STARTED, INIT_TASK, self.worker_id, serial,
                          _checkpoint.replica_start(self.fetcher)))

    def new_fetcher(self, resume: WorkerState | None = None) -> DatasetFetcher:
        """A fresh fetcher; with ``resume``, an iterable dataset put where a
        checkpoint left this worker (as a worker process does)."""
        config = self.config
        if _datapipes.is_datapipe(self.dataset):
            seed = _datapipes.epoch_seed(self.pipe_seed, config.base_seed, sample_context.epoch)
            _datapipes.prepare(self.dataset, seed, config.num_workers, self.worker_id)
        self.fetcher = create_fetcher(config.kind, self.dataset, config.auto_collation,
                                      config.collate_fn, config.drop_last)
        self.ended, self.batches_done = False, 0
        if resume is not None:
            _checkpoint.resume_replica(self.fetcher, resume, config.batch_size)
            self.ended, self.batches_done = resume.ended, resume.yielded
        return self.fetcher

    def serve(self) -> None:
        stop = self.config.stop
        while True:
            message = self.tasks.get()
            if message[0] == STOP or stop.is_set():
                return
            if message[0] == RESET:
                sample_context.epoch, self.pipe_seed = message[1], message[2]
                if not self.map_style:
                    self.new_fetcher()
                self.started(message[3])
                continue
            sample_context.epoch = message[3]
            self.load(message[1], message[2], message[4])

    def snapshot(self) -> tuple[bool, Any]:
        """What this worker's next answer records of its replica
        (``_checkpoint.replica_snapshot``)."""
        return _checkpoint.replica_snapshot(self.fetcher, self.batches_done + 1,
                                            self.config.snapshot_every)

    def load(self, task_id: int, index: Any, turn: int | None) -> None:
        """Load a task; ``turn``: its ticket of ``FetchTurns``, if fetches
        take turns."""
        fetcher = self.fetcher
        if self.ended:
            self.results.put((ENDED, task_id, fetcher.state()))
            return
        turns = self.config.fetch_turns
        if turn is not None and turns is not None and not turns.wait(turn):
            turns.done(turn)
            return  # a dropped task (its answer would be), or stopping
        watched = _global_rng_states() if self.first_batch else None
        self.first_batch = False
        started = time.perf_counter()
        snapshot: tuple[bool, Any] = (False, None)
        try:
            try:
                try:
                    fast, general = self.writer.plan(fetcher, index)
                except Exception:
                    if self.map_style:  # what the failed fetch did counts too
                        snapshot = self.snapshot()
                    raise
                # The replica's state right after this fetch, before another
                # thread's on a shared dataset.
                snapshot = self.snapshot()
            finally:
                if turn is not None and turns is not None:
                    turns.fetched = snapshot
                    turns.done(turn)
            fetched = time.perf_counter()
            batch = batch_in_slot(fast, general, self.slots)
        except Exception as exc:
            if fetcher.ran_out(exc):
                self.ended = True
                self.results.put((ENDED, task_id, fetcher.state()))
                return
            # The batch is delivered as its exception; the epoch goes on.
            self.batches_done += 1
            self.results.put((FAILED, task_id, WorkerError(
                exc, self.worker_id, describe_failure(index)), *snapshot))
            return
        if watched is not None and _global_rng_states() != watched:
            self.results.put((GLOBAL_RNG_USED, self.worker_id))
        self.batches_done += 1
        self.results.put((DONE, task_id, batch, fetched - started,
                          time.perf_counter() - fetched, *snapshot,
                          getattr(fetcher, "ended", False)))


def batch_in_slot(fast: Write | None, general: Callable[[], Any], slots: ThreadSlots | None) -> Any:
    """A worker thread's batch (NOTE [ Thread workers ]): written by the C
    writer ``fast`` into a slot it takes now and viewed there; when the slot
    is too small, or there is none (the pool is at its cap), into private
    memory of the size it needs, which later slots then get; where there is
    no C writer, or it raised, the general path's batch (NOTE [ Fast
    paths ])."""
    if fast is None:
        return general()
    slot = None if slots is None else slots.take()
    try:
        try:
            if slot is None:
                nothing = bytearray()
                return pack.unpack(nothing, fast(nothing, 0, 0))
            # Written as a worker process writes, in its segment at its
            # offset (NOTE [ Unmapped slots ] in fastload._memory).
            layout = fast(slot.segment, slot.offset, slot.capacity)
            if slots is not None:
                slots.wrote(slot, layout)
            return pack.unpack(slot, layout)
        except SlotTooSmallError as small:
            # A memoryview: the batch's arrays keep the memory alive through
            # it, and nothing can resize it under them.
            private = memoryview(bytearray(small.needed))
            batch = pack.unpack(private, fast(private, 0, small.needed))
            if slot is not None and slots is not None:
                slots.ask(small.needed)
            return batch
    except Exception:
        return general()


def stop_workers(workers: list[WorkerThread], stop: threading.Event) -> None:
    """Tell every worker thread to stop, and wait for them, in all at most
    JOIN_SECONDS (NOTE [ Thread workers ])."""
    stop.set()
    for worker in workers:
        worker.tasks.put((STOP,))
    deadline = time.monotonic() + JOIN_SECONDS
    for worker in workers:
        if worker.thread.is_alive() and worker.thread is not threading.current_thread():
            worker.thread.join(max(0.0, deadline - time.monotonic()))
