"""The worker-process dispatcher alone: no process, workers played by a
script (NOTE [ Task lifecycle ] in fastload/_task_table.py)."""
import collections
import types

import numpy as np
import pytest

import fastload as fl
from fastload._fetch import DatasetKind
from fastload._iterator import EpochDraw
from fastload._process_dispatch import ProcessDispatcher, WorkerSetupFailed
from fastload._process_slots import LATE_SLOT_BYTES
from fastload._progress import Progress
from fastload._protocol import (
    DONE,
    ENDED,
    FAILED,
    INIT_TASK,
    NEED,
    RESLOT,
    REVOKE,
    REVOKED,
    TASK,
    TASK_INDEX_IN_SLOT,
    decode,
)
from fastload._stats import WorkerStats
from fastload._task_table import Failure
from fastload_c.pack import collate_into
from fastload_c.slab import SlabPool


class ScriptedWorkers:
    """A worker group whose workers answer when the main thread waits:
    ``answer(worker_id, task_id, index)`` gives a task's messages."""

    def __init__(self, num_workers, answer, max_bytes=0, slot_bytes=4096):
        self.num_workers = num_workers
        self.sigchld = True
        self.batch_bytes = None  # batches of no size known up front
        self.pool = SlabPool(slot_bytes, slots_per_segment=2, max_bytes=max_bytes)
        self.answer = answer
        self.tasks = [[] for _ in range(num_workers)]  # (task id, index) received
        self.sent = []  # every message to a worker, in order
        self.slots = {}  # task id -> the slot its task was sent with
        self.results = [collections.deque() for _ in range(num_workers)]
        self.waiting = 0  # nested waits now (must never exceed one)
        self.dispatcher = None
        self.doorbell = types.SimpleNamespace(seq=0, wait=self.wait)

    def send_record(self, worker_id, data):
        message = decode(data)
        assert message[0] in (TASK, TASK_INDEX_IN_SLOT)
        self.tasks[worker_id].append((message[1], message[2]))
        self.slots[message[1]] = message[3]
        self.sent.append((worker_id, message))

    def send(self, worker_id, message):
        self.sent.append((worker_id, message))

    def asks_for_slot(self, worker_id, task_id, index, nbytes, late=False):
        """A worker's answer asking for a slot of ``nbytes`` (NEED; ``late``:
        a task sent without one asks first): it waits for it, and answers
        the task again once it has it."""
        self.tasks[worker_id].insert(0, (task_id, index))
        return [(NEED, task_id, nbytes, late)]

    def next_result(self, worker_id):
        results = self.results[worker_id]
        return results.popleft() if results else None

    def raise_if_dead(self):
        pass

    def reset(self, epoch, pipe_seed, serial):
        self.sent.append((None, ("reset", epoch)))

    def wait(self, seen, timeout):
        """Time passes: each worker answers its oldest unanswered task."""
        self.waiting += 1
        try:
            assert self.waiting == 1, "a wait was entered from inside another"
            answered = False
            for worker_id, tasks in enumerate(self.tasks):
                if tasks:
                    task_id, index = tasks.pop(0)
                    self.results[worker_id].extend(self.answer(worker_id, task_id, index))
                    answered = True
            assert answered, "the main thread waits for workers that have nothing to do"
        finally:
            self.waiting -= 1

    def done(self, task_id, value):
        """A DONE message for ``task_id`` with the batch ``value`` in its slot."""
        lease = self.dispatcher.table.in_flight[task_id].lease
        return (DONE, task_id, collate_into([value], lease), 0.0, 0.0, False, None, False)


def dispatcher_over(workers, indices, prefetch_factor=2, in_order=True,
                    kind=DatasetKind.MAP, look_ahead=False):
    """``look_ahead``: persistent workers with prefetch_next_epoch, over
    ``indices``, a batch sampler."""
    loader = types.SimpleNamespace(
        num_workers=workers.num_workers, prefetch_factor=prefetch_factor, in_order=in_order,
        timeout=0, persistent_workers=look_ahead, prefetch_next_epoch=look_ahead,
        _dataset_kind=kind, _index_sampler=indices if look_ahead else None)
    stats = [WorkerStats() for _ in range(workers.num_workers)]
    dispatcher = ProcessDispatcher(loader, workers, stats)
    workers.dispatcher = dispatcher
    dispatcher.begin_epoch(EpochDraw(iter(indices), frozenset(), 0, None, 0),
                           Progress(epoch=0, base_seed=0, map_style=True))
    return dispatcher


def delivered(dispatcher):
    """Every batch of the epoch, as values or ("failed", error)."""
    out = []
    while (found := dispatcher.next_ready(lambda task: None)) is not None:
        task, batch = found
        out.append(("failed", batch.error) if isinstance(batch, Failure)
                   else (task.position, int(batch[0])))
    return out


def test_the_prefetch_goes_round_robin_and_each_delivery_sends_the_next_task():
    workers = ScriptedWorkers(2, lambda w, t, index: [workers.done(t, np.int64(index))])
    dispatcher = dispatcher_over(workers, range(10, 17))
    assert [(w, m[2]) for w, m in workers.sent] == [(0, 10), (1, 11), (0, 12), (1, 13)]
    assert delivered(dispatcher) == [(i, 10 + i) for i in range(7)]
    assert [m[2] for _, m in workers.sent] == list(range(10, 17))
    assert not dispatcher.table.in_flight and not dispatcher.table.ready


def test_a_failed_batch_is_delivered_in_its_place():
    def answer(worker_id, task_id, index):
        if index == 2:
            return [(FAILED, task_id, "a worker's error", False, None)]
        return [workers.done(task_id, np.int64(index))]

    workers = ScriptedWorkers(2, answer)
    assert delivered(dispatcher_over(workers, range(5))) == [
        (0, 0), (1, 1), ("failed", "a worker's error"), (3, 3), (4, 4)]


def test_a_bigger_slot_is_given_after_the_answers_are_handled():
    asked = set()

    def answer(worker_id, task_id, index):
        if task_id not in asked:
            asked.add(task_id)
            # Larger than the slots sent: the later tasks' slots were sized
            # for the first ones.
            return workers.asks_for_slot(worker_id, task_id, index, (3 if index < 2 else 5) * 4096)
        return [workers.done(task_id, np.int64(index))]

    workers = ScriptedWorkers(2, answer)
    dispatcher = dispatcher_over(workers, range(4), prefetch_factor=1)
    assert delivered(dispatcher) == [(i, i) for i in range(4)]
    reslots = [m for _, m in workers.sent if m[0] == RESLOT]
    assert [m[1] for m in reslots] == [0, 1, 2, 3]  # task ids, here the indices too
    assert all(m[2][2] >= (3 if m[1] < 2 else 5) * 4096 for m in reslots)


def test_an_ended_stream_hands_its_slot_to_the_task_that_replaces_it():
    def answer(worker_id, task_id, index):
        if worker_id == 1:
            return [(ENDED, task_id, None)]
        return [workers.done(task_id, np.int64(len(workers.sent)))]

    workers = ScriptedWorkers(2, answer)
    dispatcher = dispatcher_over(workers, [None] * 6, prefetch_factor=1,
                                 kind=DatasetKind.ITERABLE)
    ended = []
    got = [dispatcher.next_ready(ended.append)[0].worker_id]
    # Worker 1's task ended as worker 0's batch came: the task sent in its
    # place took its slot, and the pool did not grow.
    assert workers.pool.nbytes == 2 * 4096
    while (found := dispatcher.next_ready(ended.append)) is not None:
        got.append(found[0].worker_id)
    assert got == [0] * 5 and [t.worker_id for t in ended] == [1]
    assert [w for w, m in workers.sent] == [0, 1, 0, 0, 0, 0]


def test_in_order_false_passes_over_a_worker_with_its_share_in_flight():
    def answer(worker_id, task_id, index):
        if worker_id == 0:
            workers.tasks[0].insert(0, (task_id, index))  # worker 0 is stalled
            return []
        return [workers.done(task_id, np.int64(index))]

    workers = ScriptedWorkers(2, answer)
    dispatcher = dispatcher_over(workers, range(8), prefetch_factor=1, in_order=False)
    got = [dispatcher.next_ready(lambda task: None)[0].worker_id for _ in range(4)]
    assert got == [1, 1, 1, 1]
    assert workers.sent[0][0] == 0 and {w for w, _ in workers.sent[1:]} == {1}


def test_a_set_up_failure_is_handed_to_the_iterator():
    workers = ScriptedWorkers(1, lambda w, t, index: [(FAILED, INIT_TASK, "init failed", False, None)])
    dispatcher = dispatcher_over(workers, range(3))
    with pytest.raises(WorkerSetupFailed) as info:
        dispatcher.next_ready(lambda task: None)
    assert info.value.error == "init failed"


@pytest.mark.parametrize("free_slots", [False, True])
def test_large_slots_are_given_as_each_worker_starts_a_task(free_slots):
    # NOTE [ Late slots ]: a task queued behind another of its worker is
    # sent without a slot and gets one when that worker answers the task
    # before it (RESLOT, unasked), or when it asks for it (NEED).
    needs, leased = [], []

    def answer(worker_id, task_id, index):
        leased.append(workers.pool.leased)
        if workers.dispatcher.table.in_flight[task_id].lease is None:
            needs.append(task_id)
            return workers.asks_for_slot(worker_id, task_id, index, LATE_SLOT_BYTES)
        return [workers.done(task_id, np.int64(index))]

    workers = ScriptedWorkers(2, answer, slot_bytes=LATE_SLOT_BYTES)
    if free_slots:
        grown = [workers.pool.acquire() for _ in range(6)]
        del grown
    dispatcher = dispatcher_over(workers, range(12), prefetch_factor=3)
    # The first task of each worker has its slot; those behind it do not.
    assert [workers.slots[t][0] < 0 for t in range(6)] == [False, False] + [True] * 4
    assert delivered(dispatcher) == [(i, i) for i in range(12)]
    late = {t for t, slot in workers.slots.items() if slot[0] < 0}
    reslots = [m[1] for _, m in workers.sent if m[0] == RESLOT]
    # Every late task got one slot, and no other task did.
    assert sorted(reslots) == sorted(late)
    if free_slots:
        # Offered as the worker starts the task: nobody had to ask, and
        # never more than a slot per worker and the batch delivered were
        # leased, where six would have been reserved.
        assert needs == [] and max(leased) <= 3
    else:
        # The pool grows only for the task the loop waits for: some ask.
        assert needs and workers.pool.nbytes <= 4 * LATE_SLOT_BYTES


def test_a_late_tasks_ask_gets_a_slot_of_the_present_size():
    # A task sent without a slot asks for one of the size slots had when
    # it was sent, which may have shrunk since (NOTE [ Slots after a spike ]
    # in fastload/_memory.py): it gets one of the present size, and the
    # slots do not grow back for it (they crept up after every shrink).
    asked = []

    def answer(worker_id, task_id, index):
        if workers.dispatcher.table.in_flight[task_id].lease is None:
            asked.append(task_id)
            return workers.asks_for_slot(worker_id, task_id, index, 2 * LATE_SLOT_BYTES,
                                         late=True)
        return [workers.done(task_id, np.int64(index))]

    workers = ScriptedWorkers(2, answer, slot_bytes=LATE_SLOT_BYTES)
    dispatcher = dispatcher_over(workers, range(12), prefetch_factor=3)
    assert delivered(dispatcher) == [(i, i) for i in range(12)]
    assert asked and workers.pool.slot_size == LATE_SLOT_BYTES


def test_a_late_task_keeps_the_slot_offered_before_its_ask():
    # A task sent without a slot is offered one as its worker starts it
    # (RESLOT); a worker that looked for the offer before it came asks as
    # well (a late NEED) and writes into the first slot it reads: the
    # offered one. The ask must leave that slot with the task, also where
    # slots shrank since the task was sent (NOTE [ Slots after a spike ] in
    # fastload/_memory.py) and grew again since the offer: the batch was
    # read from another slot, or failed.
    workers = ScriptedWorkers(2, answer=None, slot_bytes=4 * LATE_SLOT_BYTES)
    dispatcher = dispatcher_over(workers, [[i] for i in range(8)])
    late = {task_id: slot for task_id, slot in workers.slots.items() if slot[0] < 0}
    assert sorted(late) == [2, 3]  # each worker's second task
    pool = workers.pool
    pool.shrink_to(LATE_SLOT_BYTES)
    assert pool.acquire() is not None  # a segment of the new size: slots to offer

    def offered(task_id):
        return [m[2] for _, m in workers.sent if m[0] == RESLOT and m[1] == task_id]

    # Worker 1 answers task 1 and starts task 3, whose batch needs more than
    # the slot offered: the slots grow.
    workers.results[1].append(workers.done(1, np.int64(1)))
    dispatcher._drain()
    assert offered(3)[0][2] == LATE_SLOT_BYTES
    # Worker 0 answers task 0: task 2 is offered a slot of the present size.
    workers.results[0].append(workers.done(0, np.int64(0)))
    dispatcher._drain()
    assert [slot[2] for slot in offered(2)] == [LATE_SLOT_BYTES]
    workers.results[1].append((NEED, 3, LATE_SLOT_BYTES * 3 // 2, False))
    dispatcher._drain()
    dispatcher._settle()
    assert pool.slot_size > LATE_SLOT_BYTES
    # Worker 0's late ask, sent before the offer reached it.
    workers.results[0].append((NEED, 2, late[2][2], True))
    dispatcher._drain()
    dispatcher._settle()
    assert [slot[2] for slot in offered(2)] == [LATE_SLOT_BYTES]
    lease = dispatcher.table.in_flight[2].lease
    assert (lease.segment_id, lease.offset) == offered(2)[0][:2]
    # It writes there, and that batch is delivered.
    workers.results[0].append(workers.done(2, np.int64(2)))
    dispatcher._drain()
    assert dispatcher.table.ready[2][1] == 2


def test_lookahead_tasks_take_late_slots_too():
    def answer(worker_id, task_id, index):
        table = workers.dispatcher.table
        if (table.in_flight.get(task_id) or table.stale.get(task_id)).lease is None:
            return workers.asks_for_slot(worker_id, task_id, index, LATE_SLOT_BYTES)
        return [workers.done(task_id, np.int64(task_id))]  # task i loads [i, ...]

    workers = ScriptedWorkers(2, answer, slot_bytes=LATE_SLOT_BYTES)
    sampler = fl.BatchSampler(fl.SequentialSampler(range(6)), 1, False)
    dispatcher = dispatcher_over(workers, sampler, look_ahead=True)
    assert delivered(dispatcher) == [(i, i) for i in range(6)]
    # The next epoch's first four batches: each worker's first with its slot
    # (nobody answers a request between epochs), the one behind it late.
    looked_ahead = [task_id for task_id, _, _ in dispatcher._lookahead.tasks]
    assert [workers.slots[t][0] < 0 for t in looked_ahead] == [False, False, True, True]


def test_near_the_pools_cap_every_task_reserves_its_slot():
    # A late task there could wait for slots only batches behind it hold.
    def answer(worker_id, task_id, index):
        return [workers.done(task_id, np.int64(index))]

    workers = ScriptedWorkers(2, answer, slot_bytes=LATE_SLOT_BYTES,
                              max_bytes=12 * LATE_SLOT_BYTES)
    dispatcher = dispatcher_over(workers, range(12), prefetch_factor=3)
    assert delivered(dispatcher) == [(i, i) for i in range(12)]
    # Room for 10 more slots, not for twice the 6 tasks in flight: none is late.
    assert all(slot[0] >= 0 for slot in workers.slots.values())


@pytest.mark.parametrize("in_order", [True, False])
def test_round_robin_passes_retired_workers_over_in_the_same_turns(in_order):
    # Worker processes and threads share RoundRobin: after a worker's stream
    # ends, the others keep their turns, from where the turns had got to.
    from fastload._dispatch import RoundRobin
    from fastload._task_table import TaskTable

    loader = types.SimpleNamespace(num_workers=4, prefetch_factor=2, in_order=in_order)
    robin = RoundRobin(loader)
    progress = Progress(0, 0, map_style=False)
    progress.next_worker = 1
    robin.begin(progress)
    table = TaskTable()  # nothing in flight: nobody is passed over as busy
    assert [robin.next_worker(table) for _ in range(5)] == [1, 2, 3, 0, 1]
    robin.retire(3)
    assert [robin.next_worker(table) for _ in range(4)] == [2, 0, 1, 2]
    robin.retire(2)
    robin.retire(0)
    assert robin.has_active
    assert [robin.next_worker(table) for _ in range(2)] == [1, 1]
    robin.retire(1)
    assert not robin.has_active


def test_a_request_for_a_slot_outlives_the_error_at_the_cap():
    # The user holds batch 0 while task 1 asks for a bigger slot that the
    # cap leaves no room for: ShmError. Once the batch is dropped, the next
    # call answers the request (it hung before: the request was dropped
    # with the error, and its worker waited for ever), and every batch
    # after it arrives.
    asked = set()

    def answer(worker_id, task_id, index):
        if index == 1 and task_id not in asked:
            asked.add(task_id)
            return workers.asks_for_slot(worker_id, task_id, index, 3 * 4096)
        return [workers.done(task_id, np.int64(index))]

    # Two slots of 4096, or one of 3 * 4096 beside them: not both.
    workers = ScriptedWorkers(1, answer, max_bytes=4 * 4096)
    dispatcher = dispatcher_over(workers, range(4), prefetch_factor=1)
    task, held = dispatcher.next_ready(lambda task: None)
    assert int(held[0]) == 0
    with pytest.raises(fl.ShmError, match="held by batches this program still references"):
        dispatcher.next_ready(lambda task: None)
    with pytest.raises(fl.ShmError):  # still held: the same error, not a hang
        dispatcher.next_ready(lambda task: None)
    del task, held
    assert delivered(dispatcher) == [(1, 1), (2, 2), (3, 3)]
    assert [m[1] for _, m in workers.sent if m[0] == RESLOT] == [1]


def test_at_the_cap_a_task_queued_behind_one_that_asks_gives_its_slot_up():
    # Task 0 asks for a bigger slot while task 1, queued behind it on the
    # same worker, holds the other slot the cap allows. Its worker cannot
    # reach task 1 before task 0 is written, so that slot is taken back
    # (REVOKE, sent before the answer) and task 1 asks for one in its turn
    # (it raised ShmError before, as if the program held the batches).
    def answer(worker_id, task_id, index):
        lease = workers.dispatcher.table.in_flight[task_id].lease
        if lease is None or lease.capacity < 3 * 4096:
            return workers.asks_for_slot(worker_id, task_id, index, 3 * 4096)
        return [workers.done(task_id, np.int64(index))]

    workers = ScriptedWorkers(1, answer, max_bytes=4 * 4096)
    dispatcher = dispatcher_over(workers, range(4), prefetch_factor=2)
    assert delivered(dispatcher) == [(i, i) for i in range(4)]
    told = [m[:2] for _, m in workers.sent if m[0] in (REVOKE, RESLOT)]
    assert told[:2] == [(REVOKE, [1]), (RESLOT, 0)]


def test_at_the_cap_a_slot_holding_its_tasks_index_is_free_once_its_worker_read_it():
    # Task 1's index starts its slot (too large for a record). Task 0
    # asks for a bigger slot than the cap leaves: task 1's slot is taken
    # back too, but stays leased until its worker says it read the REVOKE
    # (and so the index) with REVOKED; then it is free, and every batch
    # arrives (this raised ShmError before).
    held_when_read = []  # the revoked slots still leased as each REVOKED came

    def answer(worker_id, task_id, index):
        lease = workers.dispatcher.table.in_flight[task_id].lease
        if lease is None or lease.capacity < 3 * 4096:
            return workers.asks_for_slot(worker_id, task_id, index, 3 * 4096)
        return [workers.done(task_id, np.int64(task_id))]  # task i loads [i, ...]

    def send(worker_id, message):
        workers.sent.append((worker_id, message))
        if message[0] == REVOKE:
            assert message[2]  # the worker must answer
            workers.results[worker_id].append((REVOKED, message[1]))

    workers = ScriptedWorkers(1, answer, max_bytes=5 * 4096)
    workers.send = send
    dispatcher = dispatcher_over(workers, [[0], list(range(1, 3000))], prefetch_factor=2)
    assert dispatcher.table.in_flight[1].index_in_slot
    revoked = dispatcher._revoked
    dispatcher._revoked = lambda task_ids: (
        held_when_read.append(sorted(dispatcher._revoked_leases)), revoked(task_ids))
    assert delivered(dispatcher) == [(0, 0), (1, 1)]
    assert held_when_read == [[1]]
    assert not dispatcher._revoked_leases
    told = [m[:2] for _, m in workers.sent if m[0] in (REVOKE, RESLOT)]
    assert told[:2] == [(REVOKE, [1]), (RESLOT, 0)]


def test_at_the_cap_the_task_being_sent_is_not_revoked():
    # A task whose index starts its slot may wait for a bigger slot at the
    # cap while it is being sent, and that wait takes back the slots of
    # tasks queued behind one that asks for a slot (REVOKE). The task being
    # sent is not one of them: its worker would read the REVOKE first, take
    # the slot the task then comes with for one taken back, and ask for
    # another, which the task, holding a slot, would never be sent.
    class Stop(Exception):
        pass

    def answer(worker_id, task_id, index):
        raise Stop

    workers = ScriptedWorkers(1, answer)
    dispatcher = dispatcher_over(workers, [[0], [1], list(range(2, 3000))], prefetch_factor=2)
    dispatcher._handle((NEED, 0, 3 * 4096, False))  # task 0 waits for a bigger slot
    small = workers.pool.acquire()
    workers.pool = _DryPool(workers.pool)
    workers.pool.dry = True
    with pytest.raises((Stop, fl.ShmError)):
        dispatcher._dispatch(small)  # task 2: its index needs a bigger slot
    assert [m[1] for _, m in workers.sent if m[0] == REVOKE] == [[1]]


def test_at_the_cap_the_task_being_sent_answers_nothing_yet():
    # Its worker is not loading it: with nothing else in flight and the
    # program holding the pool, the wait for a slot for its index raises
    # what holds the pool, rather than waiting for an answer (which it did
    # for ever without a timeout).
    def answer(worker_id, task_id, index):
        raise AssertionError("the main thread waits for a worker with nothing to do")

    workers = ScriptedWorkers(1, answer)
    dispatcher = dispatcher_over(workers, [[0], list(range(1, 3000))], prefetch_factor=1)
    workers.results[0].append(workers.done(0, np.int64(0)))
    dispatcher._drain()
    held = dispatcher.table.pop_next_batch(True, lambda task: None)  # noqa: F841
    small = workers.pool.acquire()
    workers.pool = _DryPool(workers.pool)
    workers.pool.dry = True
    with pytest.raises(fl.ShmError, match="held by batches this program still references"):
        dispatcher._dispatch(small)


def test_a_slot_no_whole_pages_under_the_cap_can_make_fails_its_batch():
    # Slots are whole pages: a request a few bytes under a cap that is no
    # whole number of pages cannot be met. Its worker is told so and fails
    # that batch, rather than being sent smaller slots for ever.
    def answer(worker_id, task_id, index):
        raise AssertionError("no worker answers in this test")

    cap = 5 * 4096 + 100
    workers = ScriptedWorkers(1, answer, max_bytes=cap)
    dispatcher = dispatcher_over(workers, [[0]], prefetch_factor=1)
    dispatcher._handle((NEED, 0, cap - 50, False))
    dispatcher._settle()
    assert [m for _, m in workers.sent if m[0] == RESLOT] == [(RESLOT, 0, None, cap)]


class _DryPool:
    """A pool that, while ``dry``, has no free slot and cannot grow (at its cap)."""

    def __init__(self, pool):
        self._pool = pool
        self.dry = False

    def __getattr__(self, name):
        return getattr(self._pool, name)

    @property
    def free_slots(self):
        return 0 if self.dry else self._pool.free_slots

    def acquire(self, nbytes=0):
        return None if self.dry else self._pool.acquire(nbytes)


def test_a_batch_drawn_when_the_wait_at_the_cap_raised_is_sent_by_the_next_call():
    # A delivery with no free slot leaves the next batch's dispatch owed;
    # in the next call the pool is at its cap and the wait for a slot
    # raises (a timeout, here). The batch drawn for it was lost before:
    # the epoch went on without position 2.
    def answer(worker_id, task_id, index):
        return [workers.done(task_id, np.int64(index))]

    def times_out():
        raise RuntimeError("DataLoader timed out after 1 seconds")

    workers = ScriptedWorkers(1, answer)
    dispatcher = dispatcher_over(workers, range(6), prefetch_factor=2)
    pool = workers.pool = _DryPool(workers.pool)
    assert dispatcher.next_ready(lambda task: None)[0].position == 0  # the next one owed
    pool.dry, dispatcher._acquire_at_cap = True, times_out
    with pytest.raises(RuntimeError, match="timed out"):
        dispatcher.next_ready(lambda task: None)
    pool.dry = False
    del dispatcher._acquire_at_cap
    assert delivered(dispatcher) == [(i, i) for i in range(1, 6)]


def test_a_failed_send_after_a_delivery_keeps_the_batch_and_is_made_again():
    # Sending the task that replaces a delivered batch raises (the ring to
    # a worker, say): the delivered batch is still returned, and the send
    # is made again, raising if it must, by the next call; no batch is lost.
    def answer(worker_id, task_id, index):
        return [workers.done(task_id, np.int64(index))]

    workers = ScriptedWorkers(1, answer)
    send_record, refused = workers.send_record, []

    def refuses_index_3_once(worker_id, data):
        if decode(data)[2] == 3 and not refused:
            refused.append(3)
            raise RuntimeError("the task ring refused the record")
        send_record(worker_id, data)

    workers.send_record = refuses_index_3_once
    dispatcher = dispatcher_over(workers, range(6), prefetch_factor=3)
    assert dispatcher.next_ready(lambda task: None)[0].position == 0  # then sends index 3
    assert refused == [3]
    assert delivered(dispatcher) == [(i, i) for i in range(1, 6)]
