"""A group of worker processes and everything they share with the main
process: task and result rings, the doorbell, the slab pool, the sockets that
carry new segments and large messages. The dispatcher
(``_process_dispatch``) decides what to load; this module starts, watches
and stops the processes.

NOTE [ Shutdown protocol ]

Shutting down must end every worker in bounded time and leave nothing
behind, on every path: the end of an epoch, ``break``, an exception in the
training loop, KeyboardInterrupt, the iterator being garbage collected, or
the interpreter exiting. ``_shutdown`` is that one path, run by a
``weakref.finalize`` (so collection and interpreter exit take it too):

1. Close every task ring. A worker blocked waiting for a task wakes and
   exits; a worker in the middle of a task sees the closed ring before its
   next one. Close every result ring too, so that a worker blocked on a full
   result ring wakes. Send SIGCONT to every worker still running, so that
   one stopped (SIGSTOP) sees the closed rings too, rather than sleeping
   through the join and being killed at its end.
2. Join each worker with a shared deadline; then SIGTERM the ones still
   alive (a dataset stuck in a C call), join briefly; then SIGKILL and join.
   Joining reaps: no zombie is left.
3. Stop ringing the doorbell on SIGCHLD, close the sockets. The joined
   processes are not closed: code written against torch joins its
   iterator's ``_workers`` after the shutdown, and each releases its
   descriptor when it is collected, with the group. The segments are
   unmapped when the last batch a user holds on them is gone (NOTE [ Slot
   ownership and lifetime ] in fastload_c.slab); being memfds, they vanish
   with the last process that maps them whatever killed it.

Workers hold their parent too: they get SIGKILL when the main process dies
(the parent-death signal, armed only when the iterator was made by the main
thread, because the kernel sends it when the creating *thread* exits), and
in every case they check that the parent is alive whenever they have waited
half a second for a task or for room in their result ring.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import gc
import multiprocessing
import os
import pickle
import signal
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from fastload import _cpus, _memory, _protocol
from fastload._protocol import RESET, RETIRE, SEGMENT
from fastload._worker_process import worker_main
from fastload_c import proc
from fastload_c.ring import Doorbell, Ring
from fastload_c.shm import send_segments

# Where SIGCHLD tells of deaths, the workers are still looked at this often,
# in case a library replaced the handler after they started.
SIGCHLD_SAFETY_SECONDS = 1.0
# Results are records of at most _protocol.INLINE_BYTES; the main process
# drains them as they come.
RESULT_RING_BYTES = 1 << 18
# A first guess at the batch size where it is not known beforehand
# (_memory.batch_slot_bytes); the first batch that needs more raises it.
INITIAL_SLOT_BYTES = 1 << 20
JOIN_SECONDS = 5.0


def _check_children_are_waitable(context: Any) -> None:
    """With SIGCHLD ignored the kernel reaps children at once, so a worker's
    exit status, and with it its death, could never be known: refuse."""
    if (context.get_start_method() != "forkserver"
            and signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN):
        raise RuntimeError(
            "DataLoader workers cannot start: this program sets SIGCHLD to SIG_IGN, so "
            "their exit could not be detected. Restore it with "
            "signal.signal(signal.SIGCHLD, signal.SIG_DFL) before iterating, use "
            "multiprocessing_context='forkserver', or num_workers=0.")


def _sigchld_wakes_us(context: Any) -> bool:
    """Whether a worker's death sends this process SIGCHLD: true for fork
    and spawn, whose workers are our children; a forkserver's workers are
    the forkserver's children, so their deaths are polled for instead."""
    if context.get_start_method() == "forkserver":
        return False
    try:
        proc.install_sigchld_handler()
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
        return False
    return True


# send_segments' errors when the worker's end of its socket is closed.
_PEER_GONE = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN})


class _Channels:
    """What the pool's segment callbacks need to reach the workers. Kept apart
    from WorkerGroup so that the pool holds no reference to the group: the
    group must die by reference counting, which is what shuts workers down
    at once when an iterator is dropped."""

    def __init__(self) -> None:
        self.task_rings: list[Ring] = []
        self.sockets: list[socket.socket] = []
        self.processes: list[Any] = []

    def send(self, worker_id: int, message: tuple[Any, ...]) -> None:
        """Put a small message on a worker's task ring."""
        self.send_record(worker_id, _protocol.dumps(message))

    def send_record(self, worker_id: int, data: bytes) -> None:
        """Put a record on a worker's task ring, noticing its death while
        the ring is full."""
        ring = self.task_rings[worker_id]
        while True:
            try:
                ring.put(data, 0.05)
                return
            except TimeoutError:
                self.raise_if_dead()

    def send_segment(self, seg_id: int, segment: Any, slot_size: int, nslots: int) -> None:
        # Segments made before the workers exist travel with their start.
        for worker_id, sock in enumerate(self.sockets):
            try:
                send_segments(sock, [segment])
            except OSError as exc:
                if exc.errno in _PEER_GONE:
                    # That worker has exited: the pool still grows for the
                    # others, and the death is raised by the next wait, once
                    # the batches already answered are delivered.
                    continue
                self.raise_if_dead()
                raise
            self.send(worker_id, (SEGMENT, seg_id, segment.size))
        if self.sockets:
            # Every worker has it: the segments a program keeps batches in
            # then cost no descriptor here either.
            segment.close_fd()

    def retire_segment(self, seg_id: int) -> None:
        for worker_id in range(len(self.task_rings)):
            self.send(worker_id, (RETIRE, seg_id))

    def dead_worker(self) -> tuple[int, Any] | None:
        """(worker id, process) of a worker that exited, if any."""
        for worker_id, process in enumerate(self.processes):
            if process.exitcode is not None:
                return worker_id, process
        return None

    def raise_if_dead(self) -> None:
        found = self.dead_worker()
        if found is not None:
            raise WorkerGroupDied(*found)


class WorkerGroup:
    """Started worker processes; ``shutdown()`` (or losing the last
    reference) ends them as NOTE [ Shutdown protocol ] says."""

    # Every group alive in this process (see _disown_after_fork).
    live: weakref.WeakSet[WorkerGroup] = weakref.WeakSet()

    def __init__(self, loader: Any, base_seed: int, epoch: int, pipe_seed: int | None,
                 resume: list[Any] | None, start_states: list[Any] | None = None, *,
                 writes_through_files: bool) -> None:
        """``writes_through_files``: BatchWriter's, of the loader's batches."""
        context = loader.multiprocessing_context or multiprocessing.get_context()
        _check_children_are_waitable(context)
        self.num_workers: int = loader.num_workers
        self._task_ring_bytes = _protocol.task_ring_bytes(loader.prefetch_factor)
        self._ring_spin = _cpus.ring_spin(self.num_workers)
        self.method: str = context.get_start_method()
        self.doorbell = Doorbell()
        self.sigchld = _sigchld_wakes_us(context)
        if self.sigchld:
            try:
                proc.ring_on_sigchld(self.doorbell)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                # More live worker groups than the handler rings: this one
                # looks for deaths, as a forkserver's does.
                self.sigchld = False
        # raise_if_dead's last look: SIGCHLDs counted then, and when the
        # next look is due anyway.
        self._sigchlds_seen = -1
        self._next_look = 0.0
        self.channels = channels = _Channels()
        self.task_rings = channels.task_rings
        self.sockets = channels.sockets
        self.processes = channels.processes
        self.pids: list[int] = []
        self.result_rings: list[Ring] = []
        self._finalizer = weakref.finalize(
            self, _shutdown, self.processes, self.task_rings, self.result_rings,
            self.sockets, self.doorbell, self.sigchld)
        WorkerGroup.live.add(self)
        # The size of every batch, where gathered rows make it known now.
        self.batch_bytes = _memory.batch_slot_bytes(loader.dataset, loader.batch_size)
        collate_fn = loader._engine_collation()[0]
        self.pool = _memory.new_pool(
            self.batch_bytes or INITIAL_SLOT_BYTES,
            unmapped_slot_bytes=_memory.UNMAPPED_SLOT_BYTES if writes_through_files else 0,
            on_segment=channels.send_segment, on_retire=channels.retire_segment)
        initial_segments = {seg_id: segment for seg_id, segment, _, _ in self.pool.segments}
        parent_death = threading.current_thread() is threading.main_thread()
        for worker_id in range(self.num_workers):
            config = {
                "dataset": loader.dataset,
                "dataset_kind": loader._dataset_kind,
                "auto_collation": loader._auto_collation,
                "collate_fn": collate_fn,
                "drop_last": loader.drop_last,
                "base_seed": base_seed,
                "worker_init_fn": loader.worker_init_fn,
                "worker_id": worker_id,
                "num_workers": self.num_workers,
                "parent_pid": os.getpid(),
                "parent_death_signal": parent_death and self.method != "forkserver",
                "epoch": epoch,
                "pipe_seed": pipe_seed,
                "batch_size": loader.batch_size,
                "snapshot_every_n_steps": loader.snapshot_every_n_steps,
                "resume": None if resume is None else resume[worker_id].as_dict(),
                "start_state": None if start_states is None else start_states[worker_id],
            }
            self._start(context, config, initial_segments)
        for segment in initial_segments.values():
            segment.close_fd()  # every worker has it now (see send_segment)

    def _start(self, context: Any, config: dict[str, Any], segments: dict[int, Any]) -> None:
        # Each handle, the worker's too (pickled or forked), spins as set here.
        tasks = Ring(self._task_ring_bytes, spin=self._ring_spin)
        results = Ring(RESULT_RING_BYTES, self.doorbell, spin=self._ring_spin)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        forking = self.method == "fork"
        # Forked: whether the worker collects once it froze what it inherits.
        config["inherited_collector"] = gc.isenabled() if forking else None
        process = context.Process(
            target=worker_main, args=(config, tasks, results, theirs, segments),
            name=f"fastload-worker-{config['worker_id']}", daemon=True)
        try:
            with _collector_paused(forking):
                process.start()
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            ours.close()
            theirs.close()
            self.shutdown()
            # The pickler's own kind of error, which torch lets through (code
            # written for torch catches it), saying what to do.
            kind = next(k for k in (pickle.PicklingError, AttributeError, TypeError)
                        if isinstance(exc, k))
            raise kind(
                f"cannot start DataLoader workers with the '{self.method}' start method: "
                f"{exc}. With 'spawn' and 'forkserver' the dataset, collate_fn and "
                "worker_init_fn are pickled, so they must be defined at module level "
                "(not in a function or a lambda); or use multiprocessing_context='fork'."
            ) from exc
        finally:
            theirs.close()
        self.task_rings.append(tasks)
        self.result_rings.append(results)
        self.sockets.append(ours)
        self.processes.append(process)
        self.pids.append(process.pid)

    def send(self, worker_id: int, message: tuple[Any, ...]) -> None:
        self.channels.send(worker_id, message)

    def send_record(self, worker_id: int, data: bytes) -> None:
        # Every task passes here: the usual case, room on the ring, first.
        if not self.task_rings[worker_id].try_put(data):
            self.channels.send_record(worker_id, data)

    def next_result(self, worker_id: int) -> tuple[Any, ...] | None:
        """The next message waiting on a worker's result ring (a large one
        read from its socket), or None."""
        data = self.result_rings[worker_id].try_get()
        if data is None:
            return None
        message = _protocol.decode(data)
        if message[0] == _protocol.LARGE:
            message = self.receive_large(worker_id, message[1])
        return message

    def receive_large(self, worker_id: int, nbytes: int) -> tuple[Any, ...]:
        """The large message a worker announced (NOTE [ Worker protocol ])."""
        try:
            return _protocol.receive_large(self.sockets[worker_id], nbytes, self._death_check)
        except EOFError:
            deadline = time.monotonic() + JOIN_SECONDS
            while time.monotonic() < deadline:
                self.raise_if_dead()  # the socket closes as the worker dies
                time.sleep(0.01)
            raise

    def _death_check(self) -> None:
        self.raise_if_dead()

    def reset(self, epoch: int, pipe_seed: int | None, serial: int) -> None:
        """A new epoch with persistent workers: fresh fetchers everywhere
        (``pipe_seed``: its DataPipe seed, Progress.datapipe_seed; ``serial``:
        see NOTE [ Worker protocol ])."""
        for worker_id in range(self.num_workers):
            self.send(worker_id, (RESET, epoch, pipe_seed, serial))

    def raise_if_dead(self) -> None:
        """WorkerGroupDied when a worker exited. Where SIGCHLD tells of
        deaths, the processes are looked at (a waitpid each) only after a
        SIGCHLD came, or SIGCHLD_SAFETY_SECONDS after the last look: every
        wait of the main loop passes here (issue 18's budget)."""
        if not self.sigchld:
            self.channels.raise_if_dead()
            return
        count, now = proc.sigchld_count(), time.monotonic()
        if count == self._sigchlds_seen and now < self._next_look:
            return
        self.channels.raise_if_dead()
        # Only a look that found every worker alive settles that SIGCHLD: a
        # death found here and put off by the caller is looked for again.
        self._sigchlds_seen, self._next_look = count, now + SIGCHLD_SAFETY_SECONDS

    def shutdown(self) -> None:
        self._finalizer()


def _disown_after_fork() -> None:
    """In a child that user code forked (a worker too): the parent's groups
    are not this process's to shut down. Their shutdown at the child's exit
    would close the parent's rings and signal its workers."""
    # multiprocessing's own exit handler would SIGTERM them too, as daemonic
    # children of this process: they are not.
    children: set[Any] = getattr(multiprocessing.process, "_children", set())
    for group in list(WorkerGroup.live):
        group._finalizer.detach()
        for process in group.processes:
            children.discard(process)
    WorkerGroup.live.clear()


os.register_at_fork(after_in_child=_disown_after_fork)


class WorkerGroupDied(Exception):
    """Internal: a worker exited; the iterator turns it into WorkerDiedError
    naming the batch it held."""

    def __init__(self, worker_id: int, process: Any) -> None:
        super().__init__(worker_id, process)
        self.worker_id = worker_id
        self.process = process
        # Whether it had said STARTED: before that it was loading nothing,
        # whatever tasks were queued to it.
        self.started = True


def describe_exit(exitcode: int) -> str:
    """How a worker ended, in torch's words for a signal ("is killed by
    signal: Segmentation fault.") with the signal's name."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"is killed by signal: {signal.strsignal(-exitcode) or name}. ({name})"
    return f"exited unexpectedly with exit code {exitcode}."


def _shutdown(processes: list[Any], task_rings: list[Ring], result_rings: list[Ring],
              sockets: list[socket.socket], doorbell: Doorbell, sigchld: bool) -> None:
    """NOTE [ Shutdown protocol ], every step whatever the others do: a step
    that raises (or is interrupted) does not keep the later ones from
    running, and the first exception is raised at the end. Ctrl-C waits for
    the end of the shutdown (see _interrupts_deferred)."""
    deadline = time.monotonic() + JOIN_SECONDS
    steps: list[Callable[[], None]] = [ring.close for ring in task_rings + result_rings]
    steps.append(lambda: _continue_stopped(processes))
    steps += [functools.partial(_join_until, p, deadline) for p in processes]
    steps.append(lambda: _stop_stubborn(processes))
    steps += [sock.close for sock in sockets]
    if sigchld:
        steps.append(lambda: proc.stop_ringing(doorbell))
    with _interrupts_deferred():
        first: BaseException | None = None
        for step in steps:
            try:
                step()
            except BaseException as exc:
                first = first or exc
        if first is not None:
            raise first


@contextlib.contextmanager
def _collector_paused(forking: bool) -> Iterator[None]:
    """Around a fork: the collector off, so that a forked worker starts with
    it off and freezes every object it inherits before it collects anything
    (_worker_process.freeze_inherited_objects). Garbage the parent had not
    collected yet is the parent's to finalize: a worker that collected it
    ran its finalizers a second time (a torch iterator's __del__ printed
    errors from the worker; a finalizer that closes or removes something
    would do it under the parent). The parent's own generations stay as
    they were: freezing there moved its young objects, garbage too, to the
    oldest generation, which only full collections visit, and iterators
    dropped in reference cycles piled up with their worker processes."""
    if not forking or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _continue_stopped(processes: list[Any]) -> None:
    """SIGCONT each worker not yet reaped (so its pid is still its own);
    a running one ignores it."""
    for process in processes:
        if process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)


def _join_until(process: Any, deadline: float) -> None:
    process.join(max(0.0, deadline - time.monotonic()))


def _stop_stubborn(processes: list[Any]) -> None:
    """SIGTERM the workers still alive, then SIGKILL; join each (no zombie)."""
    for stop, grace in ((lambda p: p.terminate(), 1.0), (lambda p: p.kill(), None)):
        stubborn = [p for p in processes if p.exitcode is None]
        for process in stubborn:
            stop(process)
        for process in stubborn:
            process.join(grace)


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT back while the body runs (in the main thread, where
    Python delivers it): a second Ctrl-C during a shutdown then arrives as
    KeyboardInterrupt once everything is released, not half way."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
