"""fastload_c.ring: Ring and Doorbell, in one process and across processes.

Child processes report through a Pipe and are killed at teardown whatever
happens, so a broken ring fails a test at its timeout instead of hanging.
"""
import collections
import gc
import multiprocessing as mp
import os
import resource
import signal
import statistics
import struct
import threading
import time
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastload_c.errors import FastloadError, RingClosedError
from fastload_c.ring import Doorbell, Ring
from fastload_c.shm import Segment

from _dev_shm import dev_shm_names

pytestmark = pytest.mark.usefixtures("earlier_garbage_collected")

HEADER = struct.Struct("<QI")  # sequence number, crc32 of the payload


@pytest.fixture
def spawn_child():
    """spawn_child(method, target, *args) -> (process, connection): starts
    target(conn, *args) in a child; children still alive at teardown are
    killed."""
    procs = []

    def start(method, target, *args):
        ctx = mp.get_context(method)
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=target, args=(theirs,) + args, daemon=True)
        proc.start()
        theirs.close()
        procs.append(proc)
        return proc, mine

    yield start
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        proc.join(10)


def _outcome(call):
    """What a blocking call did, for a child to report: (name, monotonic time)."""
    try:
        call()
        name = "returned"
    except BaseException as exc:  # noqa: BLE001 - the type is the report
        name = type(exc).__name__
    return name, time.monotonic()


# -- one process ---------------------------------------------------------------

@pytest.mark.timeout(10)
def test_put_accepts_any_buffer_and_get_returns_bytes():
    ring = Ring(1024)
    items = [b"bytes", bytearray(b"bytearray"), memoryview(b"view"), b"",
             np.arange(5, dtype=np.int32), np.zeros((3, 4), dtype=np.float64)]
    for item in items:
        ring.put(item)
    assert ring.count == len(items)
    for item in items:
        got = ring.get()
        assert type(got) is bytes and got == memoryview(item).tobytes()
    assert ring.try_get() is None and ring.count == 0
    with pytest.raises((ValueError, BufferError), match="contiguous"):
        ring.put(np.arange(10)[::2])


@pytest.mark.timeout(60)
@settings(max_examples=60, deadline=None)
@given(capacity=st.sampled_from([64, 128, 512]),
       ops=st.lists(st.one_of(st.integers(0, 504), st.just(-1)), max_size=120))
def test_behaves_like_a_fifo_at_every_wrap_offset(capacity, ops):
    """Sizes >= 0 try_put a message that size, -1 try_gets;
    checked against a deque and the record accounting of fl_ring.h."""
    ring, model, used, serial = Ring(capacity), collections.deque(), 0, 0
    record = lambda n: 8 + (n + 7) // 8 * 8  # noqa: E731
    for op in ops:
        if op >= 0:
            if op > ring.max_message:
                with pytest.raises(ValueError):
                    ring.try_put(b"x" * op)
                continue
            serial += 1
            msg = bytes((serial + i) % 251 for i in range(op))
            fits = used + record(op) <= capacity
            assert ring.space == max(capacity - used - 8, 0)
            assert ring.try_put(msg) is fits
            if fits:
                model.append(msg)
                used += record(op)
        else:
            got = ring.try_get()
            if not model:
                assert got is None
                continue
            expected = model.popleft()
            assert got == expected
            used -= record(len(expected))
        assert ring.count == len(model)


@pytest.mark.timeout(10)
def test_largest_message_fits_whatever_the_offset():
    ring = Ring(64)
    big = bytes(range(56))
    for _ in range(8):
        ring.put(b"")  # a record of 8 bytes: the next one starts 8 further
        ring.get()
        ring.put(big)  # a record of 64 bytes: starts and ends at that offset
        assert ring.get() == big


@pytest.mark.timeout(10)
def test_too_large_message_names_both_sizes():
    ring = Ring(4096)
    with pytest.raises(ValueError, match=r"5000 bytes.*capacity 4096.*4088"):
        ring.put(b"x" * 5000)
    with pytest.raises(ValueError, match="4089"):
        ring.try_put(np.zeros(4089, dtype=np.uint8))
    ring.put(b"x" * 4088)
    assert ring.space == 0


@pytest.mark.timeout(10)
@pytest.mark.parametrize("capacity", [0, 32, 63, 100, 4095, 2**41, -4096, 4096.0])
def test_bad_capacity_is_rejected(capacity):
    with pytest.raises(TypeError if isinstance(capacity, float) else ValueError,
                       match=r"power of two from 64 to 2\*\*40 bytes, got|integer"):
        Ring(capacity)


@pytest.mark.timeout(10)
def test_close_drains_then_raises():
    ring = Ring(1024)
    ring.put(b"one")
    ring.put(b"two")
    ring.close()
    ring.close()  # idempotent
    assert ring.closed
    with pytest.raises(RingClosedError, match="closed"):
        ring.put(b"three")
    with pytest.raises(RingClosedError):
        ring.try_put(b"three")
    assert ring.get() == b"one"
    assert ring.get() == b"two"
    for call in (ring.get, ring.try_get):
        with pytest.raises(RingClosedError, match="drained"):
            call()
    assert isinstance(RingClosedError(), EOFError)


@pytest.mark.timeout(10)
def test_bad_timeouts_are_rejected():
    ring = Ring(1024)
    with pytest.raises(ValueError, match="non-negative"):
        ring.get(timeout=-1)
    with pytest.raises(ValueError, match="non-negative"):
        ring.get(timeout=float("nan"))
    with pytest.raises(TypeError):
        ring.get(timeout="1")
    with pytest.raises(ValueError, match="non-negative"):
        Doorbell().wait(0, timeout=-0.5)


def _overshoots(call, timeout, repeats=5):
    """How late each of `repeats` calls that time out returns, in seconds."""
    out = []
    for _ in range(repeats):
        start = time.monotonic()
        call(timeout)
        out.append(time.monotonic() - start - timeout)
    return out


def _times_out(call):
    def timing_out(timeout):
        with pytest.raises(TimeoutError, match="timed out"):
            call(timeout)
    return timing_out


@pytest.mark.timing
@pytest.mark.timeout(20)
@pytest.mark.parametrize("timeout", [0.0, 0.02, 0.1])
def test_timeouts_are_honoured_within_milliseconds(timeout):
    ring = Ring(64)
    ring.put(b"x" * 56)
    full_put = _overshoots(_times_out(lambda t: ring.put(b"y", timeout=t)), timeout)
    ring.get()
    empty_get = _overshoots(_times_out(lambda t: ring.get(timeout=t)), timeout)
    bell = Doorbell()
    bell_wait = _overshoots(lambda t: bell.wait(bell.seq, timeout=t) and pytest.fail("rang"), timeout)
    for over in (full_put, empty_get, bell_wait):
        assert min(over) >= 0  # never early: the deadline is on the monotonic clock
        assert statistics.median(over) < 0.005


@pytest.mark.timeout(10)
def test_shared_memory_is_validated_not_trusted():
    ring = Ring(1024)
    ring.put(b"abc")
    shared = np.frombuffer(ring.segment, dtype=np.uint8)
    data_start = ring.segment.size - ring.capacity
    shared[data_start:data_start + 8] = np.frombuffer(struct.pack("<Q", 900), dtype=np.uint8)
    with pytest.raises(FastloadError, match="corrupt"):
        ring.get()
    with pytest.raises(ValueError, match="holds no ring"):
        Ring(None, _segment=Segment(4096))


@pytest.mark.timeout(30)
def test_threads_stream_with_the_gil_released():
    ring, n = Ring(256), 100_000
    ring.spin = 0  # every wait sleeps on the futex
    received = []

    def consume():
        get = ring.get
        received.extend(get(timeout=10) for _ in range(n))

    thread = threading.Thread(target=consume)
    thread.start()
    put = ring.put
    for i in range(n):
        put(i.to_bytes(4, "little") * (i % 8))
    thread.join(20)
    assert received == [i.to_bytes(4, "little") * (i % 8) for i in range(n)]


# -- processes -----------------------------------------------------------------

def _plan(seed, n, max_message):
    """Sizes (-1: an empty message), payload offsets and payload pool of a
    stress run, the same in producer and consumer."""
    rng = np.random.default_rng(seed)
    largest = max_message - HEADER.size
    pick = rng.random(n)
    sizes = np.where(pick < 0.85, rng.integers(0, 48, n),
                     np.where(pick < 0.97, rng.integers(48, largest // 4 + 49, n),
                              rng.integers(largest // 4, largest + 1, n)))
    sizes[rng.random(n) < 0.02] = -1
    pool = rng.bytes(1 << 16)
    offsets = rng.integers(0, len(pool) - largest, n)
    return sizes.tolist(), offsets.tolist(), pool


def _produce(conn, ring, seed, n):
    sizes, offsets, pool = _plan(seed, n, ring.max_message)
    put, pack, crc32 = ring.put, HEADER.pack, zlib.crc32
    for i in range(n):
        size = sizes[i]
        if size < 0:
            put(b"", timeout=30)
        else:
            payload = pool[offsets[i]:offsets[i] + size]
            put(pack(i, crc32(payload)) + payload, timeout=30)
    ring.close()


def _consume_and_verify(ring, seed, n):
    """Every message in order, intact, none missing or extra."""
    sizes, _, _ = _plan(seed, n, ring.max_message)
    get, unpack, crc32 = ring.get, HEADER.unpack_from, zlib.crc32
    for i in range(n):
        msg = get(timeout=30)
        size = sizes[i]
        if size < 0:
            ok = len(msg) == 0
        else:
            ok = len(msg) == size + HEADER.size and unpack(msg) == (i, crc32(msg[HEADER.size:]))
        if not ok:
            pytest.fail("message {} of seed {}: expected {} payload bytes, got {!r}"
                        .format(i, seed, size, bytes(msg[:64])))
    with pytest.raises(RingClosedError):
        ring.get(timeout=30)


def _stress(spawn_child, method, seed, n, spin):
    capacity = [256, 1024, 4096][seed % 3]
    ring = Ring(capacity, spin=spin)
    proc, _ = spawn_child(method, _produce, ring, seed, n)
    _consume_and_verify(ring, seed, n)
    proc.join(30)
    assert proc.exitcode == 0


# Messages: 4 x 260_000 (fork) + 2 x 100_000 (spawn) + the rest of the file,
# over 1.2 million. spin=0 makes every wait sleep on the futex; the default
# spin mostly catches the peer while spinning.
@pytest.mark.timeout(120)
@pytest.mark.parametrize("spin", [0, None])
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1))
def test_stress_two_processes_fork(spawn_child, spin, seed):
    _stress(spawn_child, "fork", seed, 260_000, spin)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("spin", [0, None])
@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1))
def test_stress_two_processes_spawn(spawn_child, spin, seed):
    _stress(spawn_child, "spawn", seed, 100_000, spin)


def _echo(conn, requests, replies):
    for msg in iter(lambda: requests.get(timeout=30), b"stop"):
        replies.put(msg[::-1])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_rings_reach_children_of_every_start_method(spawn_child, method):
    requests, replies = Ring(4096), Ring(4096)
    proc, _ = spawn_child(method, _echo, requests, replies)
    for i in range(200):
        requests.put(b"ping %d" % i)
        assert replies.get(timeout=30) == (b"ping %d" % i)[::-1]
    requests.put(b"stop")
    proc.join(30)
    assert proc.exitcode == 0


def _block_then_report(conn, ring, side):
    # Ctrl-C raises here even where the test runner was started with SIGINT
    # ignored (a background job of a non-interactive shell).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if side == "put":
        while ring.try_put(b"z" * 100):
            pass
    conn.send("ready")
    conn.send(_outcome(lambda: ring.put(b"z" * 100, timeout=10) if side == "put"
                       else ring.get(timeout=10)))


def _assert_prompt(spawn_child, side, act, expected, attempts=3):
    """A child blocked on a ring returns with `expected` soon after act(ring,
    child): within 0.1 s in the best of up to `attempts` tries (the call
    would otherwise wait out its 10 s timeout)."""
    lags = []
    while len(lags) < attempts and (not lags or min(lags) >= 0.1):
        ring = Ring(1024)
        proc, conn = spawn_child("fork", _block_then_report, ring, side)
        assert conn.recv() == "ready"
        time.sleep(0.2)  # past the spin: asleep on the futex
        acted_at = time.monotonic()
        act(ring, proc)
        name, returned_at = conn.recv()
        assert name == expected
        lags.append(returned_at - acted_at)
    assert min(lags) < 0.1, lags


@pytest.mark.timing
@pytest.mark.timeout(60)
@pytest.mark.parametrize("side", ["get", "put"])
def test_close_wakes_a_blocked_peer(spawn_child, side):
    _assert_prompt(spawn_child, side, lambda ring, _: ring.close(), "RingClosedError")


@pytest.mark.timing
@pytest.mark.timeout(60)
def test_sigint_reaches_a_blocked_get(spawn_child):
    _assert_prompt(spawn_child, "get", lambda _, proc: os.kill(proc.pid, signal.SIGINT),
                   "KeyboardInterrupt")


def _cpu_while_blocked(conn, ring, side):
    if side == "put":
        while ring.try_put(b"z" * 100):
            pass
    before = resource.getrusage(resource.RUSAGE_SELF)
    name, _ = _outcome(lambda: ring.put(b"z" * 100, timeout=1.0) if side == "put"
                       else ring.get(timeout=1.0))
    after = resource.getrusage(resource.RUSAGE_SELF)
    conn.send((name, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime))


@pytest.mark.timeout(30)
def test_blocked_sides_use_no_cpu(spawn_child):
    children = [spawn_child("fork", _cpu_while_blocked, Ring(1024), side) for side in ("get", "put")]
    for _, conn in children:
        name, cpu_seconds = conn.recv()
        assert name == "TimeoutError"
        assert cpu_seconds < 0.02  # under 2% of a core over the 1 s wait


def _put_then_hang(conn, ring, count):
    for i in range(count):
        ring.put(b"m%d" % i)
    conn.send("sent")
    time.sleep(60)


def _get_forever(conn, ring):
    conn.send("ready")
    ring.get()


@pytest.mark.timeout(30)
def test_producer_killed_while_consumer_waits(spawn_child):
    ring = Ring(1024)
    proc, conn = spawn_child("fork", _put_then_hang, ring, 3)
    assert conn.recv() == "sent"
    assert [ring.get(timeout=5) for _ in range(3)] == [b"m0", b"m1", b"m2"]
    threading.Timer(0.1, os.kill, (proc.pid, signal.SIGKILL)).start()
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        ring.get(timeout=0.5)
    assert time.monotonic() - start >= 0.5  # waited out its timeout, not woken by the death
    proc.join(5)
    assert proc.exitcode == -signal.SIGKILL


@pytest.mark.timeout(30)
def test_consumer_killed_asleep_leaves_a_working_ring(spawn_child):
    ring = Ring(1 << 20)
    proc, conn = spawn_child("fork", _get_forever, ring)
    assert conn.recv() == "ready"
    time.sleep(0.2)
    proc.kill()
    proc.join(5)
    # The dead sleeper stays counted (each put then makes a useless
    # FUTEX_WAKE: NOTE [ Doorbell protocol ]), but the ring keeps working.
    put, get = ring.put, ring.get
    for round_ in range(3):
        for i in range(20_000):
            put(b"after %d" % i)
        assert [get() for _ in range(20_000)] == [b"after %d" % i for i in range(20_000)]
    while ring.try_put(b"after"):
        pass
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        ring.put(b"after", timeout=0.2)
    assert time.monotonic() - start >= 0.2
    assert ring.get() == b"after"


def _ring_bell_later(conn, bell, delay):
    conn.recv()
    time.sleep(delay)
    bell.ring()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_doorbell_wakes_another_process(spawn_child, method):
    bell = Doorbell()
    proc, conn = spawn_child(method, _ring_bell_later, bell, 0.1)
    seen = bell.seq
    conn.send("go")
    assert bell.wait(seen, timeout=10) is True
    rung_seq = bell.seq
    assert rung_seq == (seen + 1) % 2**32
    assert bell.wait(seen, timeout=0) is True  # already rung since seen
    proc.join(10)
    assert bell.wait(rung_seq, timeout=0.05) is False


def _produce_numbered(conn, ring, worker, count):
    for i in range(count):
        ring.put(struct.pack("<II", worker, i), timeout=10)
        if i % 50 == 0:
            time.sleep(0.001)  # let the parent fall asleep on the doorbell


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_one_doorbell_gathers_many_rings(spawn_child, method):
    bell = Doorbell()
    rings = [Ring(256, bell) for _ in range(3)]
    assert all(r.doorbell is bell for r in rings)
    for worker, ring in enumerate(rings):
        spawn_child(method, _produce_numbered, ring, worker, 500)
    got = {w: [] for w in range(3)}
    while sum(map(len, got.values())) < 1500:
        seen = bell.seq
        progress = False
        for worker, ring in enumerate(rings):
            msg = ring.try_get()
            while msg is not None:
                w, i = struct.unpack("<II", msg)
                got[w].append(i)
                progress = True
                msg = ring.try_get()
        if not progress:
            assert bell.wait(seen, timeout=10), "doorbell not rung: messages lost"
    assert all(got[w] == list(range(500)) for w in range(3))


@pytest.mark.timeout(10)
def test_no_file_in_dev_shm():
    before = dev_shm_names()
    bell = Doorbell()
    rings = [Ring(4096, bell) for _ in range(4)]
    for ring in rings:
        ring.put(b"x")
    assert dev_shm_names() == before
    fds = {ring.segment.fd for ring in rings}
    assert all(os.readlink("/proc/self/fd/%d" % fd).startswith("/memfd:") for fd in fds)


@pytest.mark.timeout(30)
def test_no_descriptor_leak_over_many_cycles():
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(1000):
        ring = Ring(4096, Doorbell())
        ring.put(b"payload")
        ring.get()
        ring.close()
        del ring
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == before


def _put_into_received_ring(conn):
    ring = conn.recv()
    ring.put(b"from a running child")


@pytest.mark.timeout(30)
def test_ring_sent_to_a_running_process_carries_its_doorbell(spawn_child):
    bell = Doorbell()
    ring = Ring(1024, bell, spin=0)
    proc, conn = spawn_child("spawn", _put_into_received_ring)
    seen = bell.seq
    conn.send(ring)  # pickled by value: descriptors through resource_sharer
    assert bell.wait(seen, timeout=20)
    assert ring.get(timeout=1) == b"from a running child"
    proc.join(10)
    assert proc.exitcode == 0


@pytest.mark.timeout(10)
def test_unpickled_handle_shares_the_ring():
    bell = Doorbell()
    ring = Ring(1024, bell, spin=0)
    rebuild, args = ring.__reduce__()
    assert args[0] is ring.segment and args[1] is bell and args[2] == 0
    twin = rebuild(*args)
    assert twin.spin == 0 and twin.doorbell is bell
    seen = bell.seq
    twin.put(b"shared")
    assert bell.seq == (seen + 1) % 2**32
    assert ring.get() == b"shared"
