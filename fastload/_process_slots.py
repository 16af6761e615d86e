"""The slots of worker processes' tasks: when a task gets one, a worker's
request for a bigger one, and the pool at its cap. ``SlotPolicy`` is a part
of ``ProcessDispatcher`` (fastload._process_dispatch), kept apart for its
length: it reads and changes the dispatcher's task table and pool, and
calls back its ``_dispatch`` and ``_pump``.

NOTE [ Late slots ]
A task reserves its slot when it is sent, so that a worker never waits for
the main process before it writes. But a worker loads one task at a time:
with ``prefetch_factor`` 2, half the slots in flight would sit reserved for
tasks not started, two slots of 19 MiB on torchvision's batches of 32
images with 2 workers. So where slots are at least LATE_SLOT_BYTES, a task
whose worker is still busy with an earlier one is sent without a slot
(``_protocol.NO_SEGMENT``), and gets one when the worker's answer to the
earlier task is handled, i.e. as the worker starts it (``_offer_slot``:
RESLOT, unasked). A worker that reaches the write of such a task before its
slot came asks for it (NEED), answered on the main process's next wait or
next() as any NEED (``_settle``); with late slots next() reads the result
rings even when a batch is ready, so a request is not left waiting for the
batches ready to run out. A batch that large takes milliseconds to fetch,
so the slot is nearly always there first. Between epochs nobody reads the
workers' requests until the next iter(), so with prefetch_next_epoch each
worker's first task of the next epoch has its slot, and a late one behind
it is fetched at least and only written at iter().
Not for gathered rows (the batch size is known up front,
WorkerGroup.batch_bytes): there the worker's whole work is the copy into
the slot, which a late slot would only delay.
Nor near the pool's cap. There a task without a slot could wait for one
that only batches queued behind it hold (ready, not yet deliverable), so
late slots need room to grow the pool by twice the tasks in flight: a
late task is due within that many deliveries, and the pool meanwhile
grows by no more than the batches those deliver and the slots of the
tasks in flight, so it can always grow for the task awaited. Past that
every task reserves its slot as it is sent, as before; a wait for a slot
at the cap copies ready batches out of theirs, takes back the slots of
tasks queued behind one whose worker waits for a bigger slot (REVOKE: that
worker cannot reach them first, and each then asks for its slot as a late
task does; else a slot queued behind could be the one the task before it
waits for; a slot that holds its task's index is free once the worker says
it read it, REVOKED), and raises once no worker is loading or is to answer
(``_acquire_at_cap``).
"""
from __future__ import annotations

import math
import pickle
from typing import TYPE_CHECKING, Any

from fastload._dispatch import deadline_after, wait_seconds
from fastload._iterator import timed_out
from fastload._pinning import PinTimedOut
from fastload._protocol import RESLOT, REVOKE
from fastload._task_table import STREAM_ENDED, Failure, Task, TaskTable
from fastload.errors import ShmError

if TYPE_CHECKING:
    from fastload._worker_group import WorkerGroup

# Slots this large are given to a task when its worker starts it, not
# when it is sent (NOTE [ Late slots ]).
LATE_SLOT_BYTES = 4 << 20


def slot_of(lease: Any) -> tuple[int, int, int]:
    """How a task names its slot to a worker (NOTE [ Worker protocol ])."""
    return (lease.segment_id, lease.offset, lease.capacity)


def holds(task: Task, nbytes: int) -> bool:
    """Whether ``task`` has a slot of ``nbytes`` or more: a request for
    that much is answered already (NOTE [ Late slots ])."""
    return task.lease is not None and task.lease.capacity >= nbytes


def copy_out(batch: Any) -> Any:
    """The batch in private memory, for a pool at its cap (see _keeps_slot)."""
    return pickle.loads(pickle.dumps(batch, protocol=5))


class SlotPolicy:
    """The slot methods of ProcessDispatcher (NOTE [ Late slots ])."""

    # The dispatcher's, set in its __init__.
    table: TaskTable
    workers: WorkerGroup
    _prefetch: int
    _timeout: float
    _may_slot_late: bool
    _needs: list[tuple[Any, ...]]
    _owed: int
    _revoked_leases: dict[int, Any]
    _unsent: int | None
    _copy_out: bool

    if TYPE_CHECKING:
        def _dispatch(self, lease: Any = None) -> None: ...
        def _pump(self, deadline: float | None) -> None: ...

    def _slots_late(self) -> bool:
        """Whether tasks get their slots late (NOTE [ Late slots ])."""
        if not self._may_slot_late:
            return False
        pool = self.workers.pool
        return pool.slot_size >= LATE_SLOT_BYTES and (
            not pool.max_bytes
            or pool.max_bytes - pool.nbytes >= 2 * self._prefetch * pool.slot_size)

    def _loaded_next(self) -> dict[int, tuple[int, Task]]:
        """Worker id -> (task id, task): of the tasks a worker has not
        answered, the one it loads first (it loads them in the order sent)."""
        table = self.table
        first: dict[int, tuple[int, Task]] = {}
        for tasks in (table.in_flight, table.stale):
            for task_id, task in tasks.items():
                if task.worker_id not in first or task_id < first[task.worker_id][0]:
                    first[task.worker_id] = (task_id, task)
        return first

    def _starts_later(self, worker_id: int) -> bool:
        """Whether a task sent to ``worker_id`` now is sent without a slot:
        it has an earlier task to load first (NOTE [ Late slots ])."""
        return self._slots_late() and worker_id in self._loaded_next()

    def _offer_slot(self, worker_id: int) -> None:
        """The worker has answered a task and starts its next: that one's
        slot, if it was sent without one and a slot is free (handling an
        answer never grows the pool). NOTE [ Late slots ]."""
        pool = self.workers.pool
        if not pool.free_slots:
            return
        found = self._loaded_next().get(worker_id)
        if found is not None and found[1].lease is None:
            task_id, task = found
            task.lease = pool.acquire()
            if task.lease is not None:  # None: at the cap; the worker will ask
                task.awaits_slot = False
                self.workers.send(worker_id, (RESLOT, task_id, slot_of(task.lease), 0))

    def _acquire_at_cap(self) -> Any:
        """A slot when the pool may not grow: from now on batches are copied
        out of their slots, until the pool has room again (see
        _keeps_slot). Batches waiting to be delivered are copied out first,
        and tasks queued behind one that waits for a slot give theirs up;
        then it waits for a worker's answer, as long as a worker is loading
        rather than waiting for a slot itself."""
        self._copy_out = True
        deadline = deadline_after(self._timeout)
        while True:
            # Batches waiting to be delivered hold slots, and the one
            # awaited may be the task that needs this slot: copy them out to
            # private memory first (every batch is a copy at the cap anyway).
            if self._copy_ready_batch_out(deadline) or self._revoke_queued_slots():
                lease = self.workers.pool.acquire()
                if lease is not None:
                    return lease
                continue
            if not self._a_worker_can_answer():
                raise self._cap_error()
            self._pump(deadline)
            lease = self.workers.pool.acquire()
            if lease is not None:
                return lease

    def _cap_error(self) -> ShmError:
        """What holds the pool at its cap, no worker being able to answer:
        batches the program keeps, or else the loader's own tasks, each
        holding a slot while tasks before it on its worker wait for one."""
        pool, table = self.workers.pool, self.table
        tasks = [*table.in_flight.values(), *table.stale.values(),
                 *(task for task, _ in table.ready.values())]
        held_by_tasks = sum(task.lease is not None for task in tasks)
        if pool.leased > held_by_tasks:
            return ShmError(
                f"every slot of the loader's shared memory ({pool.nbytes} bytes, its cap) "
                "is held by batches this program still references; drop or copy "
                "(np.copy) batches you keep")
        return ShmError(
            f"the loader's shared memory ({pool.nbytes} bytes, its cap) is held by the "
            f"slots of the batches in flight ({held_by_tasks}), while batches before them "
            "need bigger ones; use a smaller batch_size, prefetch_factor or num_workers")

    def _a_worker_can_answer(self) -> bool:
        """Whether a worker is loading a task, not waiting for a slot (a
        worker that waits for one answers nothing until it gets it), or is
        to answer a REVOKE. The task being sent (``_unsent``) is nobody's
        yet."""
        return bool(self._revoked_leases) or any(
            not task.awaits_slot and task_id != self._unsent
            for task_id, task in self._loaded_next().values())

    def _copy_ready_batch_out(self, deadline: float | None) -> bool:
        """Wait until a batch being pinned is (NOTE [ Pinning by copy ]), at
        most until ``deadline`` (the user's timeout error past it), or copy
        one waiting to be delivered out of its slot: either slot is then
        free; whether there was one."""
        pinner = self.table.pinner
        if pinner is not None:
            seconds = None if deadline is None else wait_seconds(deadline, math.inf,
                                                                 self._timeout)
            try:
                if pinner.wait_for_one(seconds):
                    return True  # its slot is free once it is pinned
            except PinTimedOut:
                raise timed_out(self._timeout) from None
        ready = self.table.ready
        for task_id, (task, batch) in ready.items():
            if task.lease is not None and not isinstance(batch, Failure) \
                    and batch is not STREAM_ENDED:
                ready[task_id] = (task, copy_out(batch))
                task.lease = None
                return True
        return False

    def _keeps_slot(self) -> bool:
        """Whether a batch handed to the user may keep its slot: not once
        the pool is at its cap with every slot taken, since the user may
        keep every batch (see _acquire_at_cap); again only once the pool
        has room for twice the tasks in flight, in growth (its slots shrank
        after a spike: NOTE [ Slots after a spike ] in fastload._memory) or
        in segments with no slot leased (the program dropped the batches it
        kept), since a batch kept at the edge of the cap takes the slot a
        task may need, or keeps a segment of a size outgrown from being
        given back for a bigger one."""
        pool = self.workers.pool
        if self._copy_out and (pool.max_bytes - pool.nbytes + pool.idle_bytes
                               < 2 * self._prefetch * pool.slot_size):
            return False
        self._copy_out = (pool.free_slots == 0 and pool.max_bytes > 0
                          and pool.max_bytes - pool.nbytes < pool.slot_size)
        return not self._copy_out

    def _settle(self, awaited_worker: int | None = None) -> None:
        """Do the work put off to return a ready batch sooner: growing the
        pool (a new segment, tens of milliseconds for large slots) for a
        worker that waits for a bigger slot, or to replace a delivered task.
        Only the pool's growth phase puts anything off. While the next batch
        is awaited from ``awaited_worker``, only what it waits on (every
        request of that worker, which loads its tasks in order) and what
        costs no growth is done."""
        if self._needs:
            self._serve_needs(awaited_worker)
        if awaited_worker is None and self._owed:
            while self._owed:
                self._dispatch()  # counted once sent: a dispatch may raise at the cap
                self._owed -= 1
            if self._needs:  # those that came while a dispatch waited at the cap
                self._serve_needs(None)

    def _serve_needs(self, awaited_worker: int | None) -> None:
        """Answer the workers' requests for a bigger slot (see _settle for
        ``awaited_worker``), those that come while one waits at the pool's
        cap too: a worker whose request stayed unanswered here could keep
        the wait that follows from ever ending."""
        pool = self.workers.pool
        needs, put_off = self._needs, []
        try:
            while needs:
                # Those that come during a wait at the cap are appended.
                message = needs[0]
                task = self.table.in_flight.get(message[1]) or self.table.stale.get(message[1])
                if (awaited_worker is None or task is None or task.worker_id == awaited_worker
                        or (message[2] <= pool.slot_size and pool.free_slots)):
                    self._reslot(message[1], message[2])
                else:
                    put_off.append(message)
                del needs[0]
        finally:
            # A request whose slot could not be had (the error raised at
            # the cap) stays, with those put off: its worker waits for the
            # answer, which a later call gives, once the user dropped the
            # batches holding the pool.
            needs[:0] = put_off

    def _reslot(self, task_id: int, nbytes: int) -> None:
        """A bigger slot for task ``task_id``, whose worker waits for it."""
        table, pool = self.table, self.workers.pool
        task = table.in_flight.get(task_id) or table.stale.get(task_id)
        if task is None or holds(task, nbytes):
            return  # answered already, or a late slot offered before it asked
        if not pool.can_hold(nbytes):
            # No slot will ever hold it: the worker fails that batch instead.
            task.awaits_slot = False
            self.workers.send(task.worker_id, (RESLOT, task_id, None, pool.max_bytes))
            return
        task.lease = pool.acquire(nbytes) or self._acquire_at_cap()
        task.awaits_slot = False
        self.workers.send(task.worker_id, (RESLOT, task_id, slot_of(task.lease), 0))

    def _revoke_queued_slots(self) -> bool:
        """At the pool's cap: take back the slots of the tasks queued behind
        one whose worker waits for a bigger slot (REVOKE); whether any was.
        That worker writes nothing before its answer, and loads its tasks in
        the order sent, so those slots are untouched; each such task asks
        for one when its worker reaches it, as a late task does (NOTE [
        Late slots ]). A slot that holds its task's index is free once the
        worker says it read the REVOKE (REVOKED), by which time it has read
        that index: until then the lease waits in _revoked_leases."""
        table, any_revoked = self.table, False
        for worker_id, (first_id, first) in self._loaded_next().items():
            if not first.awaits_slot:
                continue
            queued = [(task_id, task) for tasks in (table.in_flight, table.stale)
                      for task_id, task in tasks.items()
                      if task.worker_id == worker_id and task_id > first_id
                      and task.lease is not None and task_id != self._unsent]
            if not queued:
                continue
            holding_indices = [(task_id, task) for task_id, task in queued if task.index_in_slot]
            # Sent before the slots are free: the worker reads it before the
            # answer that lets it go on (its ring keeps the order).
            self.workers.send(worker_id, (REVOKE, sorted(task_id for task_id, _ in queued),
                                          bool(holding_indices)))
            for task_id, task in holding_indices:
                self._revoked_leases[task_id] = task.lease
            for _, task in queued:
                task.lease = None
            any_revoked = True
        return any_revoked

    def _revoked(self, task_ids: list[int]) -> None:
        """A worker read the REVOKE of ``task_ids``: the slots that held
        their indices are free."""
        for task_id in task_ids:
            self._revoked_leases.pop(task_id, None)
