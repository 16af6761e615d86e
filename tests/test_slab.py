"""The slab pool: slots, leases and their lifetime, growth, pickle-5
transport, and batches crossing processes."""
import contextlib
import gc
import mmap
import multiprocessing as mp
import os
import pickle
import socket
import weakref

import numpy as np
import pytest
from _mapped import mapped_bytes

from fastload_c.pack import (
    SlotTooSmallError,
    collate_into,
    gather_into,
    layout_end,
    pickle_into,
    unpack,
)
from fastload_c.shm import recv_segments, send_segments
from fastload_c.slab import Lease, SlabPool

from _dev_shm import dev_shm_names

pytestmark = pytest.mark.usefixtures("earlier_garbage_collected")


def batch_in(pool, samples):
    lease = pool.acquire()
    return unpack(lease, collate_into(samples, lease))


def test_slots_are_whole_pages_and_leases_name_them():
    pool = SlabPool(5000, slots_per_segment=3)
    assert pool.slot_size == 8192 and pool.nbytes == 3 * 8192
    leases = [pool.acquire() for _ in range(3)]
    assert [(l.segment_id, l.slot, l.offset, l.capacity) for l in leases] == [
        (0, 0, 0, 8192), (0, 1, 8192, 8192), (0, 2, 16384, 8192)]
    assert pool.leased == 3 and pool.free_slots == 0
    assert len(memoryview(leases[1])) == 8192 and not memoryview(leases[1]).readonly
    with pytest.raises(TypeError):
        Lease()
    with pytest.raises(TypeError, match="cannot leave its process"):
        pickle.dumps(leases[0])


def test_views_keep_the_slot_and_it_is_reused_after_the_last_goes():
    pool = SlabPool(4096, slots_per_segment=1, max_bytes=4096)
    x, y = batch_in(pool, [(np.arange(4.0), 1), (np.arange(4.0), 2)])
    lease = x.base
    assert type(lease) is Lease and y.base is lease
    gone = weakref.ref(lease)
    del lease
    derived = x[1:].T.reshape(-1)[::2]   # views of views: numpy keeps the lease as base
    mv = memoryview(y)
    del x, y
    gc.collect()
    assert gone() is not None and pool.leased == 1
    assert pool.acquire() is None        # the only slot is still viewed
    del derived
    assert gone() is not None
    del mv
    assert gone() is None and pool.leased == 0
    again = pool.acquire()
    assert again.segment_id == 0 and again.slot == 0


def test_a_batch_in_a_garbage_cycle_gives_its_slot_back():
    pool = SlabPool(4096, slots_per_segment=1)
    for _ in range(10):
        lease = pool.acquire()
        holder = {"batch": unpack(lease, collate_into([np.arange(3)] * 2, lease)), "lease": lease}
        holder["self"] = holder
        del lease, holder
        gc.collect()
        assert pool.leased == 0


def test_torch_tensors_from_a_batch_keep_the_slot():
    torch = pytest.importorskip("torch")
    pool = SlabPool(4096, slots_per_segment=1)
    batch = batch_in(pool, [np.ones(3, np.float32)] * 2)
    tensor = torch.from_numpy(batch)
    del batch
    gc.collect()
    assert pool.leased == 1
    assert tensor.sum().item() == 6
    del tensor
    assert pool.leased == 0


def test_a_held_batch_is_never_overwritten_while_the_pool_serves():
    pool = SlabPool(4096, slots_per_segment=2)
    held = []
    for i in range(5):
        held.append(batch_in(pool, [np.full(64, i, np.int32), np.full(64, -i, np.int32)]))
    expected = [b.copy() for b in held]
    rng = np.random.default_rng(0)
    for _ in range(500):
        b = batch_in(pool, [rng.integers(0, 1000, 64, dtype=np.int32)] * 2)
        assert b.shape == (2, 64)
    for b, e in zip(held, expected):
        assert (b == e).all()
    # Five held, one cycling: the pool grew to what was held, no further.
    assert pool.leased == 5 and pool.nbytes == 4 * 2 * 4096


def test_growth_stops_at_the_cap_with_a_sentinel():
    pool = SlabPool(4096, slots_per_segment=2, max_bytes=5 * 4096)
    leases = [pool.acquire() for _ in range(5)]
    assert all(isinstance(l, Lease) for l in leases)
    assert [l.segment_id for l in leases] == [0, 0, 1, 1, 2]   # the last segment: what the cap allowed
    assert pool.acquire() is None and pool.nbytes == 5 * 4096
    del leases[0]
    assert pool.acquire() is not None
    with pytest.raises(ValueError, match="cannot hold one slot"):
        SlabPool(8192, max_bytes=4096)


def test_slots_grow_for_a_batch_that_does_not_fit_and_old_segments_retire():
    events = []
    pool = SlabPool(4096, slots_per_segment=2, on_segment=lambda *a: events.append(("new",) + a[:1] + a[2:]),
                    on_retire=lambda i: events.append(("retire", i)))
    small = pool.acquire()
    samples = [np.ones(1024, np.float64)] * 2
    with pytest.raises(SlotTooSmallError) as info:
        collate_into(samples, small)
    big = pool.acquire(info.value.needed)
    assert big.capacity >= info.value.needed and big.capacity % 4096 == 0
    assert (unpack(big, collate_into(samples, big)) == 1).all()
    assert events == [("new", 0, 4096, 2), ("new", 1, big.capacity, 2)]
    assert pool.acquire().capacity == big.capacity   # small slots get no new lease
    del small
    pool.acquire()
    assert events[-1] == ("retire", 0) and [s[0] for s in pool.segments] == [1]


def test_slots_shrink_on_request_and_segments_of_the_old_size_retire():
    events = []
    pool = SlabPool(4096, slots_per_segment=2, on_retire=lambda i: events.append(i))
    big = pool.acquire(64 * 4096)
    pool.shrink_to(64 * 4096 + 1)  # not smaller once page-rounded: no change
    assert pool.slot_size == big.capacity
    pool.shrink_to(5000)
    assert pool.slot_size == 2 * 4096
    small = pool.acquire()
    assert small.capacity == 2 * 4096 and small.segment_id != big.segment_id
    assert pool.free_slots == 1  # the big segment's free slot is no longer handed out
    big_segment = big.segment_id
    del big
    pool.acquire()  # a segment of another size is dropped once free
    assert big_segment in events and big_segment not in [s[0] for s in pool.segments]
    pool.close()
    with pytest.raises(ValueError, match="closed"):
        pool.shrink_to(4096)


def test_layout_end_of_a_pickled_batch_is_the_slot_size_it_needs():
    pool = SlabPool(1 << 20)
    slot = pool.acquire()
    batch = {"x": np.arange(1000.0), "meta": [object, "s" * 50]}
    end = layout_end(pickle_into(batch, slot))
    assert unpack(slot, pickle_into(batch, slot, 0, end))["x"].sum() == np.arange(1000.0).sum()
    with pytest.raises(SlotTooSmallError):
        pickle_into(batch, slot, 0, end - 1)


def test_segments_of_large_slots_hold_fewer_of_them():
    pool = SlabPool(4096, slots_per_segment=2, segment_bytes=3 * 4096)
    small = [pool.acquire() for _ in range(3)]
    assert [s[3] for s in pool.segments] == [2, 2]         # two 4 KiB slots fit in 12 KiB
    big = [pool.acquire(8192) for _ in range(2)]
    assert [(s[2], s[3]) for s in pool.segments][2:] == [(8192, 1), (8192, 1)]
    huge = pool.acquire(5 * 4096)                           # past segment_bytes: still one slot
    assert huge.capacity >= 5 * 4096 and pool.segments[-1][3] == 1
    assert pool.segment_bytes == 3 * 4096 and len(small) + len(big) == 5


@pytest.mark.parametrize("unmapped", [True, False])
def test_a_free_slot_of_unmapped_size_keeps_no_page_mapped_and_keeps_its_bytes(unmapped):
    pool = SlabPool(1 << 20, slots_per_segment=1, unmapped_slot_bytes=1 << 20 if unmapped else 0)
    lease = pool.acquire()
    address, slot = np.frombuffer(lease, np.uint8).ctypes.data, lease.slot
    np.frombuffer(lease, np.uint8)[:] = 7
    assert mapped_bytes(address, 1 << 20) == 1 << 20
    del lease
    # NOTE [ Unmapped slots ]: unmapped, not discarded.
    assert mapped_bytes(address, 1 << 20) == (0 if unmapped else 1 << 20)
    again = pool.acquire()
    assert again.slot == slot and (np.frombuffer(again, np.uint8) == 7).all()


def test_the_first_growth_is_exact_and_later_ones_keep_headroom():
    pool = SlabPool(4096, slots_per_segment=1)
    # Batches of one fixed size: slots of exactly that size, nothing spare.
    assert pool.acquire(10 * 4096).capacity == 10 * 4096
    # A larger batch shows that they vary: an eighth more than it needs.
    assert pool.acquire(16 * 4096).capacity == 18 * 4096
    assert pool.acquire(17 * 4096).capacity == 18 * 4096  # fits: no growth


def test_a_failing_on_segment_discards_the_segment():
    def refuse(seg_id, segment, size, n):
        raise RuntimeError("no")
    with pytest.raises(RuntimeError, match="no"):
        SlabPool(4096, on_segment=refuse)


def test_closing_the_pool_keeps_held_batches_valid():
    pool = SlabPool(4096)
    batch = batch_in(pool, [np.arange(5)] * 3)
    segment = pool.segments[0][1]
    with pytest.raises(BufferError):
        segment.close()              # a lease still uses it
    pool.close()
    with pytest.raises(ValueError, match="closed"):
        pool.acquire()
    assert (batch == np.arange(5)).all()
    del batch, segment


def test_pickle_transport_puts_large_buffers_in_the_slot():
    pool = SlabPool(1 << 20)
    lease = pool.acquire()
    obj = {"big": np.arange(10000, dtype=np.float32).reshape(100, 100), "small": np.arange(3),
           "fortran": np.asfortranarray(np.arange(600.0).reshape(20, 30)),
           "text": ["a", "b"], "n": 7}
    got = unpack(lease, pickle_into(obj, lease))
    assert got["text"] == ["a", "b"] and got["n"] == 7
    for key in ("big", "small", "fortran"):
        assert got[key].dtype == obj[key].dtype and (got[key] == obj[key]).all()
    lo = np.frombuffer(lease, np.uint8).ctypes.data
    hi = lo + lease.capacity
    inside = lambda a: lo <= a.ctypes.data < hi
    assert inside(got["big"]) and inside(got["fortran"]) and got["fortran"].flags.f_contiguous
    assert not inside(got["small"])  # under inband_limit: in the stream
    del lease
    assert pool.leased == 1          # the big arrays hold the slot
    del got
    gc.collect()
    assert pool.leased == 0
    with pytest.raises(SlotTooSmallError):
        pickle_into(np.zeros(1000), pool.acquire(), 0, 1000)


PADDED = np.dtype({"names": ["a", "b"], "formats": ["i1", ">f4"], "offsets": [0, 8],
                   "itemsize": 16})


@pytest.mark.parametrize("array", [
    (np.arange(6) * 1.5).astype(">f4")[::2],              # numpy: native order back
    np.arange(4).astype(">M8[s]"),                        # numpy: native order back
    np.arange(4000, dtype=">f8").reshape(40, 100)[:, ::3],  # large, out of band
    np.arange(3, dtype=np.ulonglong),                     # numpy: np.uint64 back
    np.arange(6, dtype=">q")[::2],
    np.zeros(4, PADDED)[::2],
    np.array(5, dtype=">i4"),
], ids=["strided big-endian", "big-endian datetime", "large strided", "ulonglong",
        "big-endian longlong", "padded fields", "0-d"])
def test_pickle_transport_keeps_every_dtype_as_it_is(array):
    """What numpy's own pickle changes (byte order, the name of a dtype)
    comes back as it was: a batch is the same object with or without
    worker processes."""
    lease = SlabPool(1 << 20).acquire()
    got = unpack(lease, pickle_into([array], lease))[0]
    assert (got.dtype.str, got.dtype.char, got.dtype.descr, got.shape) == (
        array.dtype.str, array.dtype.char, array.dtype.descr, array.shape)
    assert got.tolist() == array.tolist()


@pytest.mark.parametrize("scalar", [np.longlong(-3), np.ulonglong(2**64 - 1), np.int64(7)])
def test_pickle_transport_keeps_a_scalars_type(scalar):
    """numpy's pickle gives np.longlong and np.ulonglong scalars back as
    np.int64's and np.uint64's; the transport gives them back as they were."""
    lease = SlabPool(1 << 20).acquire()
    got = unpack(lease, pickle_into([scalar], lease))[0]
    assert type(got) is type(scalar) and got == scalar


def test_layout_reaching_outside_the_slot_is_refused():
    pool = SlabPool(1 << 16)
    big = pool.acquire()
    layout = collate_into([np.zeros(4096)] * 2, big)
    small = bytearray(100)
    with pytest.raises(ValueError, match="reaches byte"):
        unpack(bytes(small), layout)


# -- across processes ----------------------------------------------------

def _worker_collate(segment, offset, capacity, conn):
    samples = [(np.full((2, 3), i, np.float32), i, "n%d" % i) for i in range(4)]
    conn.send(collate_into(samples, segment, offset, capacity))
    conn.send(gather_into(np.arange(100).reshape(50, 2), [3, -1], segment, offset + 4096, 4096))
    conn.close()


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.timeout(60)
def test_a_child_writes_a_batch_the_parent_views(method):
    pool = SlabPool(8192, slots_per_segment=2)
    lease = pool.acquire()
    lease = pool.acquire()           # slot 1: offsets must be honoured
    ctx = mp.get_context(method)
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_worker_collate,
                       args=(lease.segment, lease.offset, 4096, there))
    proc.start()
    layout, gathered = here.recv(), here.recv()
    proc.join(30)
    assert proc.exitcode == 0
    x, n, names = unpack(lease, layout)
    assert x.shape == (4, 2, 3) and (x[:, 0, 0] == np.arange(4)).all()
    assert n.tolist() == [0, 1, 2, 3] and names == ("n0", "n1", "n2", "n3")
    g = unpack(memoryview(lease)[4096:], gathered)
    assert g.tolist() == [[6, 7], [98, 99]]


def _socket_worker(sock, conn):
    segments = {}
    while True:
        msg = conn.recv()
        if msg is None:
            return
        if msg == "segments":
            got, meta = recv_segments(sock)
            segments.update(zip(meta, got))
            continue
        seg_id, offset, capacity, value = msg
        conn.send(collate_into([np.full(100, value, np.int16)] * 3, segments[seg_id], offset, capacity))


@pytest.mark.timeout(60)
def test_pool_growth_reaches_a_running_worker_over_a_unix_socket():
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    ours, theirs = socket.socketpair()

    def send_new_segment(seg_id, segment, size, nslots):
        here.send("segments")
        send_segments(ours, [segment], meta=bytes([seg_id]))

    proc = ctx.Process(target=_socket_worker, args=(theirs, there))
    proc.start()
    pool = SlabPool(4096, slots_per_segment=1, on_segment=send_new_segment)
    held = []
    for value in range(4):           # every batch held: each needs a new segment
        lease = pool.acquire()
        here.send((lease.segment_id, lease.offset, lease.capacity, value))
        held.append(unpack(lease, here.recv()))
    here.send(None)
    proc.join(30)
    assert proc.exitcode == 0 and len(pool.segments) == 4
    assert [int(b[0, 0]) for b in held] == [0, 1, 2, 3]
    ours.close()
    theirs.close()


# -- no residue ----------------------------------------------------------

def _maps_and_fds():
    """Mappings and descriptors of fastload's memfds in this process (only
    those: a helper thread of an earlier test may open or close others)."""
    with open("/proc/self/maps") as f:
        maps = sum(1 for line in f if "memfd:fastload" in line)
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own, closed since
            fds += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:fastload")
    return maps, fds


def test_no_dev_shm_file_and_no_leak_over_1000_pool_cycles():
    before_shm = dev_shm_names()
    gc.collect()
    before = _maps_and_fds()
    for i in range(1000):
        pool = SlabPool(4096, slots_per_segment=2)
        batch = batch_in(pool, [np.arange(8)] * 2)
        if i % 2:
            pool.close()             # closed with a batch held, or just dropped
        del pool, batch
    gc.collect()
    assert _maps_and_fds() == before
    assert dev_shm_names() == before_shm


def test_a_slot_grown_just_under_the_cap_is_still_leased():
    cap = 64 * 4096
    pool = SlabPool(4096, slots_per_segment=2, max_bytes=cap)
    # The usual growth margin (an eighth) would round this past the cap.
    lease = pool.acquire(cap - 4096)
    assert isinstance(lease, Lease) and lease.capacity <= cap
    del lease
    assert isinstance(pool.acquire(4096), Lease)  # the pool is still usable
    # A batch no slot under the cap can hold is refused, and sizes stay.
    assert pool.acquire(cap + 1) is None and pool.slot_size <= cap


def test_can_hold_says_what_a_slot_of_whole_pages_fits_under_the_cap():
    page = mmap.PAGESIZE
    cap = 5 * page + 100  # no whole number of pages
    pool = SlabPool(page, slots_per_segment=2, max_bytes=cap)
    assert pool.can_hold(5 * page) and pool.can_hold(1)
    # Under the cap, but its page-rounded slot is not.
    assert not pool.can_hold(5 * page + 50)
    assert pool.acquire(5 * page + 50) is None and pool.slot_size == page
    assert SlabPool(page).can_hold(1 << 40)  # no cap


def test_idle_bytes_counts_the_segments_with_no_slot_leased():
    page = mmap.PAGESIZE
    pool = SlabPool(page, slots_per_segment=2)
    assert pool.idle_bytes == 2 * page  # the first segment, made at once
    first = pool.acquire()
    assert pool.idle_bytes == 0
    second, third = pool.acquire(), pool.acquire()  # a second segment
    del second
    assert pool.idle_bytes == 0  # each segment has a slot leased
    del third
    assert pool.idle_bytes == 2 * page
    del first
    assert pool.idle_bytes == 4 * page
