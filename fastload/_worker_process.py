"""The body of a worker process: take tasks from its ring, fetch, write each
batch into its slot, answer on its result ring (NOTE [ Worker protocol ] in
fastload._protocol; how a batch is written: NOTE [ Fast paths ] in
fastload._fast_path).
"""
from __future__ import annotations

import gc
import os
import pickle
import random
import signal
import socket
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from fastload import _checkpoint, _datapipes, _memory, _protocol
from fastload._fast_path import BatchWriter
from fastload._fetch import DatasetFetcher, DatasetKind, create_fetcher, describe_failure
from fastload._loader_state import WorkerState
from fastload._protocol import (
    DONE,
    ENDED,
    FAILED,
    INIT_TASK,
    NEED,
    NO_SEGMENT,
    RESET,
    RESLOT,
    RETIRE,
    REVOKE,
    REVOKED,
    SEGMENT,
    STARTED,
    TASK,
    TASK_INDEX_IN_SLOT,
)
from fastload._sample_rng import context as sample_context
from fastload._torch import torch_if_imported
from fastload._worker_error import WorkerError
from fastload._worker_info import WorkerInfo, set_worker_info
from fastload.errors import RingClosedError, ShmError
from fastload_c import proc
from fastload_c.pack import SlotTooSmallError
from fastload_c.shm import Segment, recv_segments

# How long a worker waits on a ring before it checks that its parent lives.
PARENT_CHECK_SECONDS = 0.5


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs. A zombie does not: a parent killed and not yet
    reaped (its own parent busy) is dead to its workers."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # The state follows the command, which may hold any character.
            state = stat.read().rsplit(b")", 1)[-1].split()[:1]
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:  # /proc unreadable here: whether the pid exists at all
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    return state not in ([b"Z"], [b"X"], [])


def _exit_if_orphaned(parent_pid: int) -> None:
    """A worker whose parent died (and was not killed with it: see NOTE
    [ Shutdown protocol ] in fastload._worker_group) ends itself."""
    if os.getppid() != parent_pid and not _pid_alive(parent_pid):
        os._exit(0)


def seed_worker(base_seed: int, worker_id: int) -> int:
    """Seed Python's, numpy's (and torch's, if imported) global generators
    exactly as torch's workers do, so a dataset that draws from them makes
    torch's augmentations under the same base seed.

    Every worker gets its own stream: numpy's state comes from a
    SeedSequence of (worker id, the base seed's two 32-bit halves, 0), the
    words torch's ``_generate_state`` hashes the same way, so no two
    workers ever repeat each other's random augmentations.
    """
    seed = (base_seed + worker_id) % 2**64
    random.seed(seed)
    np.random.seed(np.random.SeedSequence(
        [worker_id, base_seed & 0xFFFFFFFF, base_seed >> 32, 0]).generate_state(4))
    torch = torch_if_imported()
    if torch is not None:
        torch.manual_seed(seed)
    return seed


# NOTE [ Worker heap ]
#
# A worker allocates one batch worth of samples, collates them into a slot
# and frees them, batch after batch. glibc's malloc gives the top of the
# heap back to the kernel as soon as more than M_TRIM_THRESHOLD (128 KiB) of
# it is free, and serves each block over M_MMAP_THRESHOLD (128 KiB) with a
# mapping of its own: so every batch faulted its samples' pages in again,
# twelve faults per 48 KiB sample, and workers spent 40% of their time in
# the kernel (the augment workload of ``python -m fastload bench``). The main
# process escapes this because glibc raises both thresholds when it frees a
# large mapped block, as each dropped batch is; a worker's batches go to
# shared memory, so its thresholds stay low. Workers therefore set them
# once: the peak memory of a worker does not change (the samples were
# resident a moment before), it only stops being returned between batches.

# Free heap a worker keeps; blocks up to glibc's own ceiling for its
# adaptive mmap threshold come from the heap.
HEAP_KEEP_BYTES = 64 << 20
HEAP_BLOCK_BYTES = 32 << 20


class _Worker:
    """One worker's state: its rings, mapped segments and fetcher."""

    def __init__(self, config: dict[str, Any], task_ring: Any, result_ring: Any,
                 segment_socket: socket.socket) -> None:
        self.config = config
        self.tasks = task_ring
        self.results = result_ring
        self.socket = segment_socket
        self.worker_id: int = config["worker_id"]
        self.segments: dict[int, Segment] = {}
        self.dataset = config["dataset"]
        self.datapipe = _datapipes.is_datapipe(self.dataset)
        self.kind: DatasetKind = config["dataset_kind"]
        self.auto_collation: bool = config["auto_collation"]
        self.collate_fn = config["collate_fn"]
        self.writer = BatchWriter(self.dataset, self.kind, self.auto_collation, self.collate_fn,
                                  unmapped_slot_bytes=_memory.UNMAPPED_SLOT_BYTES)
        self.backlog: deque[tuple[Any, ...]] = deque()
        # Tasks whose slots the main process took back (REVOKE): each asks
        # for one as a late task does (NOTE [ Late slots ]).
        self.revoked: set[int] = set()
        self.fetcher: Any = None
        self.ended = False
        self.snapshot_every: int = config["snapshot_every_n_steps"]
        self.batches_done = 0
        self.pipe_seed: int | None = config["pipe_seed"]

    def reply(self, *message: Any) -> None:
        _protocol.send_result(self.put_result, self.socket, message, self.check_main_reads)

    def put_result(self, data: bytes) -> None:
        while True:
            try:
                self.results.put(data, PARENT_CHECK_SECONDS)
                return
            except TimeoutError:
                self.exit_if_orphaned()

    def check_main_reads(self) -> None:
        """While a large message waits to be read: a loader shutting down
        (its rings closed) will not read it."""
        if self.results.closed:
            raise RingClosedError("the loader is shutting down")
        self.exit_if_orphaned()

    def receive(self) -> tuple[Any, ...]:
        while True:
            try:
                return _protocol.decode(self.tasks.get(PARENT_CHECK_SECONDS))
            except TimeoutError:
                self.exit_if_orphaned()

    def next_message(self) -> tuple[Any, ...]:
        if self.backlog:
            return self.backlog.popleft()
        return self.receive()

    def exit_if_orphaned(self) -> None:
        _exit_if_orphaned(self.config["parent_pid"])

    def new_fetcher(self) -> DatasetFetcher:
        if self.datapipe:
            seed = _datapipes.epoch_seed(self.pipe_seed, self.config["base_seed"],
                                         sample_context.epoch)
            _datapipes.prepare(self.dataset, seed, self.config["num_workers"], self.worker_id)
        self.fetcher = create_fetcher(self.kind, self.dataset, self.auto_collation,
                                      self.collate_fn, self.config["drop_last"])
        self.ended = False
        self.batches_done = 0
        return self.fetcher

    def resume(self, progress: dict[str, Any]) -> None:
        """Put this worker's dataset replica where a checkpoint left it
        (NOTE [ Resume contract ] in fastload._checkpoint)."""
        self.new_fetcher()
        replica = WorkerState(**progress)
        _checkpoint.resume_replica(self.fetcher, replica,
                                   self.config["batch_size"] if self.auto_collation else None)
        self.batches_done = replica.yielded
        self.ended = replica.ended

    def run(self, resume: dict[str, Any] | None) -> None:
        start_state = self.config["start_state"]
        if start_state is not None:  # then ``resume`` is a fresh replica's
            _checkpoint.resume_ended_replica(self.new_fetcher, start_state)
        elif resume is not None:
            self.resume(resume)
        else:
            self.new_fetcher()
        self.started(0)
        while True:
            try:
                message = self.next_message()
            except RingClosedError:
                return
            kind = message[0]
            if kind == TASK or kind == TASK_INDEX_IN_SLOT:
                if self.tasks.closed:
                    return  # shutting down: the rest of the queue is moot
                task_id, index, slot = self.with_index(message)[1:]
                self.load(task_id, index, slot)
            elif kind == SEGMENT:
                self.receive_segment(message[1], message[2])
            elif kind == RETIRE:
                self.segments.pop(message[1]).close()
            elif kind == REVOKE:
                self.revoke(message)
            elif kind == RESET:
                sample_context.epoch, self.pipe_seed = message[1], message[2]
                self.new_fetcher()
                self.started(message[3])
            # A RESLOT here is a late slot offered to a task that ended
            # without writing (it failed, or its stream had run out): dropped.

    def started(self, serial: int) -> None:
        """Say STARTED (NOTE [ Worker protocol ]): set up (serial 0), or the
        new stream of RESET ``serial`` ready."""
        self.reply(STARTED, INIT_TASK, self.worker_id, serial,
                   _checkpoint.replica_start(self.fetcher))

    def with_index(self, message: tuple[Any, ...]) -> tuple[Any, ...]:
        """A TASK as it is, or the TASK of a TASK_INDEX_IN_SLOT, its index
        read from the slot: read as the message is, since a later REVOKE
        may give that slot away once this worker says it read it."""
        if message[0] != TASK_INDEX_IN_SLOT:
            return message
        task_id, nbytes, slot = message[1], message[2], message[3]
        segment_id, offset, _ = slot
        with memoryview(self.segments[segment_id]) as whole, \
                whole[offset:offset + nbytes] as part:
            return (TASK, task_id, pickle.loads(part), slot)

    def revoke(self, message: tuple[Any, ...]) -> None:
        """The slots of the tasks a REVOKE names are another's from now on:
        each of those tasks asks for one as a late task does."""
        self.revoked.update(message[1])
        if message[2]:
            self.reply(REVOKED, message[1])

    def receive_segment(self, segment_id: int, nbytes: int) -> None:
        received, _ = recv_segments(self.socket)
        if len(received) != 1 or received[0].size != nbytes:
            raise RuntimeError(f"expected segment {segment_id} of {nbytes} bytes, "
                               f"got {[s.size for s in received]}")
        self.add_segment(segment_id, received[0])

    def add_segment(self, segment_id: int, segment: Segment) -> None:
        """Keep ``segment``, mapped; its descriptor only where its slots may
        be written unmapped (NOTE [ Unmapped slots ] in fastload._memory),
        as descriptors must not grow with the pool."""
        kept = sum(s.fd >= 0 for s in self.segments.values())
        if segment.size < _memory.UNMAPPED_SLOT_BYTES or kept >= _memory.UNMAPPED_SEGMENT_FDS:
            segment.close_fd()
        self.segments[segment_id] = segment

    def load(self, task_id: int, index: Any, slot: tuple[int, int, int]) -> None:
        if task_id in self.revoked:
            self.revoked.discard(task_id)
            slot = (NO_SEGMENT, 0, slot[2])
        if self.ended:
            self.reply(ENDED, task_id, self.fetcher.state())
            return
        started = time.perf_counter()
        try:
            write = self.writer.prepare(self.fetcher, index)
        except Exception as exc:
            if self.fetcher.ran_out(exc):
                self.ended = True
                self.reply(ENDED, task_id, self.fetcher.state())
                return
            self.batches_done += 1
            # What the failed fetch did to the replica counts too.
            self.fail(task_id, exc, index, _checkpoint.replica_snapshot(
                self.fetcher, self.batches_done, self.snapshot_every))
            return
        fetched = time.perf_counter()
        self.batches_done += 1
        snapshot = _checkpoint.replica_snapshot(self.fetcher, self.batches_done,
                                                self.snapshot_every)
        # A task sent without a slot takes the one the main process offered
        # since, or asks for it now that its batch is fetched (NOTE [ Late
        # slots ] in fastload._process_dispatch).
        needed = slot[2] if slot[0] == NO_SEGMENT else 0
        offered = bool(needed)
        while True:
            if needed:
                slot, cap = self.await_reslot(task_id, needed, offered)
                offered = False
                if slot is None:
                    self.fail(task_id, ShmError(
                        f"a batch of {needed} bytes cannot fit in the loader's shared "
                        f"memory ({cap} bytes: half of the memory available when it "
                        "started); use a smaller batch_size"), index, snapshot)
                    return
            segment_id, offset, capacity = slot
            # Outside the try: a slot this worker cannot find is its own
            # failure (its task loop's), not the batch's.
            segment = self.segments[segment_id]
            try:
                layout = write(segment, offset, capacity)
            except SlotTooSmallError as small:
                needed = small.needed
                continue
            except Exception as exc:
                self.fail(task_id, exc, index, snapshot)
                return
            self.reply(DONE, task_id, layout, fetched - started, time.perf_counter() - fetched,
                       *snapshot, self.ended or getattr(self.fetcher, "ended", False))
            return

    def fail(self, task_id: int, exc: BaseException, index: Any,
             snapshot: tuple[bool, Any]) -> None:
        """The batch's exception in its place, with the replica's state
        after it (``_checkpoint.replica_snapshot``)."""
        self.reply(FAILED, task_id, WorkerError(exc, self.worker_id, describe_failure(index)),
                   *snapshot)

    def await_reslot(self, task_id: int, needed: int, offered: bool) -> tuple[Any, int]:
        """The slot of ``needed`` bytes for task ``task_id``, keeping the
        tasks and segments that arrive meanwhile in order: (the slot, 0), or
        (None, the pool's cap) when no slot can be that large. ``offered``:
        the main process may have sent it unasked (a late slot), so look
        among the messages sent already before asking (NEED) and waiting."""
        for position, message in enumerate(self.backlog):
            if message[0] == RESLOT and message[1] == task_id:
                del self.backlog[position]
                return message[2], message[3]
        if offered:
            while (data := self.tasks.try_get()) is not None:
                found = self.slot_or_keep(_protocol.decode(data), task_id)
                if found is not None:
                    return found
        self.reply(NEED, task_id, needed, offered)
        while True:
            found = self.slot_or_keep(self.receive(), task_id)
            if found is not None:
                return found

    def slot_or_keep(self, message: tuple[Any, ...], task_id: int) -> tuple[Any, int] | None:
        """(slot, cap) when ``message`` is the RESLOT of task ``task_id``;
        else None, the message handled (a segment, whose descriptor comes
        now) or kept for later, after those kept already."""
        if message[0] == RESLOT and message[1] == task_id:
            return message[2], message[3]
        if message[0] == SEGMENT:
            self.receive_segment(message[1], message[2])
        elif message[0] == REVOKE:
            # Now, not kept: the slots it names are another task's from now on.
            self.revoke(message)
        else:
            self.backlog.append(self.with_index(message))
        return None


def freeze_inherited_objects(collector: bool | None) -> None:
    """A forked worker (``collector`` not None) starts with the collector
    off (_worker_group._collector_paused): every object it inherited is
    frozen, so its collections never finalize the parent's garbage; then it
    collects if the parent did (``collector``)."""
    if collector is None:
        return
    gc.freeze()
    if collector:
        gc.enable()


def worker_main(config: dict[str, Any], task_ring: Any, result_ring: Any,
                segment_socket: socket.socket, segments: dict[int, Segment]) -> None:
    """Entry point of a worker process (any start method)."""
    freeze_inherited_objects(config["inherited_collector"])
    # The main process handles Ctrl-C and shuts workers down; a worker that
    # died of the same SIGINT would only turn a clean stop into a crash report.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker = _Worker(config, task_ring, result_ring, segment_socket)
    where = "while starting"
    try:
        _watch_parent(config["parent_pid"])
        proc.keep_freed_heap(HEAP_KEEP_BYTES, HEAP_BLOCK_BYTES)
        if config["parent_death_signal"]:
            proc.die_with_parent(config["parent_pid"])
        torch = torch_if_imported()
        if torch is not None:
            # As torch's own workers: a forked copy of torch's intra-op thread
            # pool can deadlock, and workers x threads oversubscribe the CPUs.
            torch.set_num_threads(1)
        worker_id = config["worker_id"]
        seed = seed_worker(config["base_seed"], worker_id)
        sample_context.base_seed = config["base_seed"]
        sample_context.epoch = config["epoch"]
        set_worker_info(WorkerInfo(id=worker_id, num_workers=config["num_workers"], seed=seed,
                                   dataset=config["dataset"]))
        # Under fork, ``segments`` are the parent's own Segment objects, which
        # the parent's slab pool (inherited too) holds buffer views of: a RETIRE
        # could never unmap them. The worker maps each one itself instead.
        for segment_id, segment in segments.items():
            worker.add_segment(segment_id, Segment.attach(os.dup(segment.fd), segment.size))
        if config["worker_init_fn"] is not None:
            where = "in worker_init_fn"
            config["worker_init_fn"](worker_id)
        where = "in its task loop"
        worker.run(config["resume"])
    except RingClosedError:
        pass  # the loader is shutting down
    except ProcessLookupError:
        os._exit(0)  # the parent is gone already
    except Exception as exc:
        # Set-up failures and faults of the loop itself (a resume that cannot
        # load its state, a segment that cannot be mapped) end this worker:
        # the main process raises them.
        try:
            worker.reply(FAILED, INIT_TASK, WorkerError(exc, worker.worker_id, where), False, None)
        except RingClosedError:
            pass


# How often a worker checks that its parent lives, whatever it is doing.
PARENT_POLL_SECONDS = 0.2


def _watch_parent(parent_pid: int) -> None:
    """End this worker within PARENT_POLL_SECONDS of its parent's death, also
    in the middle of a long __getitem__ and where no parent-death signal
    is armed (forkserver, an iterator made outside the main thread)."""
    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_SECONDS)
            _exit_if_orphaned(parent_pid)

    threading.Thread(target=watch, name="fastload-parent-watch", daemon=True).start()
