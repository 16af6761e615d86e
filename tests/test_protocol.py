"""The records between the main process and its workers (NOTE [ Worker
protocol ]): a message reads back as itself whichever format carried it."""
import socket
import threading

import numpy as np
import pytest

from fastload import _protocol
from fastload._protocol import DONE, FAILED, INLINE_BYTES, TASK, decode

SLOT = (3, 1 << 20, 1 << 16)


def _task(index):
    data, index_bytes = _protocol.task_message(7, index, SLOT)
    assert data is not None and index_bytes == b"", "no slot needed"
    return data


def _same(a, b):
    """Equal, item by item of the same types (a bool is not an int)."""
    assert type(a) is type(b)
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("index", [[0], [5, -1, 2**62], list(range(900))])
def test_a_task_of_ints_is_a_fixed_record(index):
    data = _task(index)
    assert data[0] != 0x80  # not a pickle
    _same(decode(data), (TASK, 7, index, SLOT))


@pytest.mark.parametrize("index", [[], [True, 1], [1, 2.0], [np.int64(3)], [2**70], (1, 2), 4,
                                   None, list(range(1100))])
def test_any_other_index_is_pickled_and_reads_back_as_itself(index):
    data = _task(index)
    assert data[0] == 0x80
    _same(decode(data), (TASK, 7, index, SLOT))


def _sent(message):
    records = []
    _protocol.send_result(records.append, None, message, lambda: None)
    assert len(records) == 1
    return records[0]


def test_a_result_without_state_is_a_fixed_record():
    for ended in (False, True):
        message = (DONE, 12, b"layout" * 40, 0.25, 1e-6, False, None, ended)
        data = _sent(message)
        assert data[0] != 0x80
        _same(decode(data), message)


@pytest.mark.parametrize("message", [
    (DONE, 12, b"layout", 0.25, 0.5, True, {"position": 3}, False),  # a dataset state
    (DONE, 12, b"layout", 0.25, 0.5, False, None, 1),  # ended not a bool
    (DONE, 12, b"layout", 1, 0.5, False, None, False),  # seconds not floats
    (FAILED, 12, "error"),
])
def test_other_results_are_pickled_and_read_back_as_themselves(message):
    data = _sent(message)
    assert data[0] == 0x80
    _same(decode(data), message)


def test_a_result_larger_than_a_record_streams_and_reads_back_as_itself():
    message = (DONE, 4, b"x" * (2 * INLINE_BYTES), 0.5, 0.5, False, None, False)
    records = []
    ours, theirs = socket.socketpair()
    with ours, theirs:
        sender = threading.Thread(target=_protocol.send_result,
                                  args=(records.append, theirs, message, lambda: None))
        sender.start()
        while not records:
            sender.join(0.01)
        kind, nbytes = decode(records[0])
        assert kind == _protocol.LARGE
        _same(_protocol.receive_large(ours, nbytes, lambda: None), message)
        sender.join()


def test_a_fixed_record_of_a_wrong_length_is_refused():
    data = _task([1, 2, 3])
    with pytest.raises(ValueError):
        decode(data[:-3])
