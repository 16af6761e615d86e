"""The task table alone, without processes (NOTE [ Task lifecycle ])."""
from fastload._task_table import STREAM_ENDED, Failure, Task, TaskTable


def task(worker, position):
    return Task(worker, [position], lease=f"slot{position}", position=position,
                sampler_state=None)


def table_with(count, workers=2):
    table = TaskTable()
    ids = [table.add(task(i % workers, i)) for i in range(count)]
    table.order.extend(ids)
    return table, ids


def test_in_order_waits_for_the_first_task_of_the_epoch():
    table, ids = table_with(3)
    table.finish(ids[1], "batch 1")
    assert table.pop_next(in_order=True) is None
    table.finish(ids[0], "batch 0")
    assert table.pop_next(in_order=True)[2] == "batch 0"
    assert table.pop_next(in_order=True)[2] == "batch 1"
    assert table.pop_next(in_order=True) is None and table.order == [ids[2]]


def test_out_of_order_takes_the_first_ready_one():
    table, ids = table_with(3)
    table.finish(ids[2], Failure("an exception"))
    table.finish(ids[1], STREAM_ENDED)
    assert [table.pop_next(in_order=False)[0] for _ in range(2)] == [ids[1], ids[2]]
    assert table.pop_next(in_order=False) is None


def test_abandoned_tasks_go_stale_or_are_dropped():
    table, ids = table_with(3)
    table.finish(ids[0], "batch 0")
    table.abandon(ids[:2])
    assert set(table.stale) == {ids[1]} and ids[0] not in table.ready
    assert table.get(ids[1]) is None  # stale tasks are not the epoch's
    assert table.answered_stale(ids[1]).lease == "slot1" and not table.stale
    assert table.answered_stale(ids[1]) is None


def test_tasks_in_flight_per_worker():
    table, ids = table_with(5, workers=2)
    table.finish(ids[0], "batch 0")
    assert table.in_flight_per_worker() == {0: 2, 1: 2}


def test_carried_lookahead_tasks_are_adopted_in_order_until_a_wrong_guess():
    from collections import deque

    from fastload._lookahead import CarriedTasks

    carried = CarriedTasks(deque([(10, [0, 1], 0), (11, [2, 3], 1), (12, [4, 5], 0)]))
    assert carried.adopt([0, 1], 0) == (10, [])
    assert carried.adopt([2, 3], 0) == (None, [11, 12])  # another worker: a wrong guess
    assert carried.adopt([4, 5], 0) == (None, []) and carried.ids() == set()


def test_a_task_added_ready_takes_its_turn_among_those_sent():
    # A small gather's task is ready as it is sent, never in flight, and is
    # still delivered in dispatch order.
    table, ids = table_with(1)
    gathered = table.add_ready(task(1, 1), "batch 1")
    table.order.append(gathered)
    assert gathered not in table.in_flight and gathered != ids[0]
    assert table.get(gathered).position == 1
    assert table.pop_next(in_order=True) is None  # the first still loads
    table.finish(ids[0], "batch 0")
    assert [table.pop_next(in_order=True)[2] for _ in range(2)] == ["batch 0", "batch 1"]
