"""What the main process and its workers say to each other, and how.

NOTE [ Worker protocol ]

Every message is a tuple whose first item says what it is, put on a ring
as one record: the worker's task ring (main process -> worker) or its
result ring (worker -> main process). Rings have a fixed capacity, so a
ring record is always small (at most ``INLINE_BYTES``): whatever has no
bound of its own travels beside it, never in it. A record is the message
pickled, except for the two messages every batch costs in their usual
form, which fastload_c.record writes and reads in a fixed format, without
pickle: a TASK whose index is a list of ints, and a DONE without a dataset
state. ``decode`` reads either; what a record holds never depends on which
format carried it.

Main process -> worker (task ring):
  (TASK, task_id, index, slot)     fetch ``index`` (a list of indices, one
                                   index, or None for an iterable dataset)
                                   and write the batch into ``slot``, a
                                   (segment_id, offset, capacity) triple;
                                   segment_id NO_SEGMENT: no slot yet, the
                                   worker asks for one of ``capacity`` bytes
                                   (NEED) once the batch is fetched (NOTE
                                   [ Late slots ] in fastload._process_slots)
  (TASK_INDEX_IN_SLOT, task_id, nbytes, slot)
                                   the same, with an index whose pickle is
                                   larger than a record: its ``nbytes``
                                   bytes start the slot, and the worker reads
                                   them before it writes anything there
  (RESLOT, task_id, slot, cap)     the bigger slot a NEED asked for; slot
                                   None when the pool can never hold it (its
                                   cap): the worker fails that batch. Also
                                   sent unasked: the late slot of a task
                                   sent without one, which the worker drops
                                   if that task ends without writing
  (SEGMENT, segment_id, nbytes)    a new pool segment, sent just before on
                                   the worker's Unix socket (shm.send_segments)
  (RETIRE, segment_id)             unmap a segment the pool dropped
  (REVOKE, task_ids, answered)    the slots of these tasks, queued behind
                                   the one the worker waits a RESLOT for,
                                   are taken back: each asks for a slot as
                                   a task sent without one does (NOTE [ Late
                                   slots ]); answered: some of them hold
                                   their index (TASK_INDEX_IN_SLOT), so the
                                   worker answers REVOKED, and only then
                                   are those slots free
  (RESET, epoch, pipe_seed, serial)
                                   a new epoch with persistent workers: start
                                   a fresh fetcher (a new dataset iterator);
                                   pipe_seed: its DataPipe seed, or None;
                                   serial: how many RESETs were sent, which
                                   its STARTED answer carries back
Worker -> main process (result ring):
  (DONE, task_id, layout, fetch_s, collate_s, has_state, state, ended)
                                   the batch is in the task's slot; the
                                   seconds it took to fetch and to collate;
                                   on snapshot steps the iterable dataset's
                                   state after this batch; whether the
                                   dataset ran out while filling it
  (NEED, task_id, nbytes, late)    the batch needs a slot of ``nbytes``; the
                                   worker keeps the fetched data meanwhile, so
                                   nothing is fetched twice (an iterable
                                   dataset cannot be rewound); late: the
                                   first ask of a task sent without a slot,
                                   ``nbytes`` the slot size then, which may
                                   have shrunk since: it gets a slot of the
                                   present size (a batch needing more asks
                                   again, not late)
  (ENDED, task_id, end_state)      an iterable dataset is exhausted; its own
                                   state then, or None (see
                                   IterableDatasetFetcher.end_state)
  (FAILED, task_id, WorkerError, has_state, state)
                                   loading the batch raised; the worker goes on
                                   with its next task (task_id INIT_TASK: the
                                   worker failed outside a task and exits);
                                   the replica's state after it, as with DONE
  (LARGE, nbytes)                  the next message is larger than a record:
                                   its ``nbytes`` bytes follow on the worker's
                                   Unix socket (a layout with long strings, a
                                   long traceback, a large dataset state)
  (REVOKED, task_ids)              the REVOKE of these tasks is read, and
                                   so is every index in their slots: a
                                   worker reads a task's index as it reads
                                   the task, and its ring keeps the order
  (STARTED, INIT_TASK, worker_id, serial, stream_state)
                                   the worker is set up (worker_init_fn ran,
                                   its replica is where a resume puts it) and
                                   takes tasks (serial 0), or (persistent
                                   workers) has the new stream the RESET of
                                   that serial asked for: iter() returns once
                                   every worker said so for the latest one, or
                                   failed (ProcessDispatcher.await_started;
                                   worker threads say it too); an answer to an
                                   earlier RESET is dropped; stream_state: the
                                   replica's state then, or None
                                   (_checkpoint.replica_start)

Why these two ways around the ring: a worker that streams a large message
into the socket only waits for the main process to read it, which the main
process does as soon as it sees LARGE, so the wait always ends. The main
process must never wait on a worker that way (the worker may be busy, or
waiting for a RESLOT the main process would then never send), so a large
index goes into the task's slot, which the main process owns until the
task is sent. Neither way has a size limit.

A worker handles its tasks in the order they were sent. Closing the task
ring is the request to exit: the worker's blocking get raises
RingClosedError once the ring is drained.
"""
from __future__ import annotations

import pickle
import socket
from collections.abc import Callable
from typing import Any

from fastload_c import record

TASK, TASK_INDEX_IN_SLOT, RESLOT, SEGMENT, RETIRE, RESET, REVOKE = range(7)
DONE, NEED, ENDED, FAILED, LARGE, STARTED, REVOKED = range(7)
# The task id of failures outside a task (worker_init_fn, the task loop).
INIT_TASK = -1
# The segment id of a task sent without a slot.
NO_SEGMENT = -1
# The largest record on a ring; rings are sized for many of them in flight.
INLINE_BYTES = 8192


def dumps(message: tuple[Any, ...]) -> bytes:
    return pickle.dumps(message, protocol=5)


def decode(data: bytes) -> tuple[Any, ...]:
    """The message of one record, in either format."""
    message = record.read(data, TASK, DONE)
    if message is None:
        message = pickle.loads(data)
    return message


def task_ring_bytes(prefetch_factor: int) -> int:
    """A task ring that holds every task a worker may have in flight, each
    at the largest record size, and room for segment messages besides: the
    main process then never waits for room (NOTE [ Worker protocol ])."""
    return max(1 << 20, (prefetch_factor + 16) * INLINE_BYTES * 2)


def task_message(task_id: int, index: Any,
                 slot: tuple[int, int, int]) -> tuple[bytes | None, bytes]:
    """(the record of one task, b""); or, when its index is too large for a
    record, (None, the index pickled): the index then starts a slot
    (``index_in_slot_message``)."""
    data = record.task_record(task_id, index, slot)
    if data is not None and len(data) <= INLINE_BYTES:
        return data, b""
    # A pickled int takes 2 bytes at the least: the task of a list of ints
    # that long is too large pickled whole too, and is not pickled whole
    # (70 us for 4096 ints).
    if data is None or 2 * len(index) < INLINE_BYTES:
        data = dumps((TASK, task_id, index, slot))
        if len(data) <= INLINE_BYTES:
            return data, b""
    return None, pickle.dumps(index, protocol=5)


def index_in_slot_message(task_id: int, nbytes: int, slot: tuple[int, int, int]) -> bytes:
    """The record of a task whose pickled index (``nbytes``) starts ``slot``."""
    return dumps((TASK_INDEX_IN_SLOT, task_id, nbytes, slot))


def send_result(put: Callable[[bytes], None], sock: socket.socket,
                message: tuple[Any, ...], on_wait: Callable[[], None]) -> None:
    """A worker's message: on its result ring, or announced there and
    streamed on its socket when larger than a record. ``on_wait`` runs
    whenever the main process has not read for a while (it raises when the
    loader is shutting down, or exits when the parent is gone)."""
    data = None
    if message[0] == DONE and not message[5]:
        data = record.done_record(message[1], message[2], message[3], message[4], message[7])
    if data is None:
        data = dumps(message)
    if len(data) <= INLINE_BYTES:
        put(data)
        return
    put(dumps((LARGE, len(data))))
    view = memoryview(data)
    sent = 0
    sock.settimeout(0.5)
    try:
        while sent < len(data):
            try:
                sent += sock.send(view[sent:])
            except TimeoutError:
                on_wait()
    finally:
        sock.settimeout(None)


def receive_large(sock: socket.socket, nbytes: int,
                  on_wait: Callable[[], None]) -> tuple[Any, ...]:
    """The message a LARGE record announced, read from the worker's socket.
    ``on_wait`` runs whenever nothing arrived for a while: it raises when
    the worker died (the socket then also reads as closed)."""
    buffer = bytearray(nbytes)
    view = memoryview(buffer)
    got = 0
    sock.settimeout(0.05)
    try:
        while got < nbytes:
            try:
                n = sock.recv_into(view[got:])
            except TimeoutError:
                on_wait()
                continue
            if n == 0:
                on_wait()
                raise EOFError(f"a worker's socket closed {nbytes - got} bytes into a message")
            got += n
    finally:
        sock.settimeout(None)
    return decode(bytes(buffer))
