"""num_workers > 0: torch's semantics over rings and slabs."""
import collections
import gc
import os
import pickle
import subprocess
import sys
import time
import weakref

import numpy as np
import pytest
from _mapped import mapped_shared_memory

import fastload as fl

START_METHODS = ["fork", "spawn", "forkserver"]


class Rows(fl.Dataset):
    """Map-style: sample i is (a float32 row derived from i, the int i)."""

    def __init__(self, n=103, width=5):
        self.n = n
        self.width = width

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return np.arange(self.width, dtype=np.float32) + i, i


class Shards(fl.IterableDataset):
    """Iterable: each worker yields its own share of range(n)."""

    def __init__(self, n=50):
        self.n = n

    def __iter__(self):
        info = fl.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield np.full(3, i, dtype=np.int64)


def epoch(loader):
    return [b for b in loader]


def assert_batches_equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert type(g) is type(w)
        for gl, wl in zip(g, w):
            assert gl.dtype == wl.dtype and gl.shape == wl.shape
            assert gl.tobytes() == wl.tobytes()


@pytest.mark.parametrize("method", START_METHODS)
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_map_style_matches_single_process(method, workers):
    ds = Rows()
    want = epoch(fl.DataLoader(ds, batch_size=8))
    got = epoch(fl.DataLoader(ds, batch_size=8, num_workers=workers,
                              multiprocessing_context=method))
    assert_batches_equal(got, want)
    seen = np.concatenate([b[1] for b in got])
    assert sorted(seen.tolist()) == list(range(len(ds)))


@pytest.mark.parametrize("method", START_METHODS)
def test_iterable_with_sharding_delivers_each_item_once(method):
    loader = fl.DataLoader(Shards(50), batch_size=4, num_workers=2,
                           multiprocessing_context=method)
    items = np.concatenate([b[:, 0] for b in loader]).tolist()
    assert collections.Counter(items) == collections.Counter(range(50))


def test_iterable_drop_last_applies_per_worker():
    # 50 items over 2 workers: 25 each, batches of 4 -> 6 full batches each.
    batches = epoch(fl.DataLoader(Shards(50), batch_size=4, num_workers=2, drop_last=True))
    assert len(batches) == 12
    assert all(len(b) == 4 for b in batches)


def test_in_order_false_yields_each_batch_once():
    ds = Rows(200)
    got = epoch(fl.DataLoader(ds, batch_size=7, num_workers=3, in_order=False))
    seen = np.concatenate([b[1] for b in got])
    assert sorted(seen.tolist()) == list(range(200))


def test_shuffle_matches_single_process_order_for_same_generator():
    ds = Rows(64)
    want = epoch(fl.DataLoader(ds, batch_size=5, shuffle=True, generator=7))
    got = epoch(fl.DataLoader(ds, batch_size=5, shuffle=True, generator=7, num_workers=2))
    assert_batches_equal(got, want)


def test_batch_size_none_and_custom_sampler():
    ds = Rows(20)
    got = epoch(fl.DataLoader(ds, batch_size=None, sampler=[3, 1, 2], num_workers=2))
    assert [int(s[1]) for s in got] == [3, 1, 2]
    assert got[0][0].shape == (5,)


class Labelled:
    def __init__(self, x, names):
        self.x = x
        self.names = names


def collate_to_object(samples):
    return Labelled(np.stack([s[0] for s in samples]), ["s%d" % s[1] for s in samples])


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_custom_collate_result_travels(method):
    got = epoch(fl.DataLoader(Rows(10), batch_size=4, num_workers=2,
                              collate_fn=collate_to_object, multiprocessing_context=method))
    assert [b.names for b in got] == [["s0", "s1", "s2", "s3"], ["s4", "s5", "s6", "s7"], ["s8", "s9"]]
    np.testing.assert_array_equal(got[1].x[0], np.arange(5, dtype=np.float32) + 4)


def test_held_batches_are_never_overwritten():
    loader = fl.DataLoader(Rows(400), batch_size=4, num_workers=2)
    held = epoch(loader)
    copies = [(x.copy(), y.copy()) for x, y in held]
    for _ in range(2):
        epoch(loader)
    for (x, y), (cx, cy) in zip(held, copies):
        assert np.array_equal(x, cx) and np.array_equal(y, cy)


class WorkerFacts(fl.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = fl.get_worker_info()
        return np.array([info.id, info.num_workers, info.seed % (2**31), os.getpid(),
                         np.random.randint(2**31), int(info.dataset is self)])


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_worker_info_and_distinct_numpy_seeds(method):
    batches = epoch(fl.DataLoader(WorkerFacts(), batch_size=1, num_workers=2,
                                  multiprocessing_context=method))
    rows = np.concatenate(batches)
    by_worker = {int(r[0]): r for r in rows}
    assert set(by_worker) == {0, 1}
    assert all(r[1] == 2 and r[5] == 1 for r in rows)
    assert by_worker[0][2] != by_worker[1][2]  # seeds differ
    assert by_worker[0][3] != by_worker[1][3]  # pids differ
    # numpy's global RNG is seeded per worker: no duplicated augmentations.
    assert len({int(r[4]) for r in rows}) == len(rows)


def test_generator_makes_worker_seeds_reproducible():
    def seeds(gen):
        rows = np.concatenate(epoch(fl.DataLoader(WorkerFacts(), batch_size=1,
                                                  num_workers=2, generator=gen)))
        return sorted(rows[:, 2].tolist())

    assert seeds(11) == seeds(11)
    assert seeds(11) != seeds(12)


def record_worker_id(worker_id):
    info = fl.get_worker_info()
    assert info is not None and info.id == worker_id
    os.environ["FASTLOAD_TEST_INIT"] = str(worker_id)


class InitFacts(fl.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return int(os.environ.get("FASTLOAD_TEST_INIT", "-1"))


def test_worker_init_fn_runs_in_each_worker():
    got = np.concatenate(epoch(fl.DataLoader(InitFacts(), batch_size=1, num_workers=2,
                                             worker_init_fn=record_worker_id)))
    assert sorted(set(got.tolist())) == [0, 1]


class Pids(fl.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return os.getpid()


def test_persistent_workers_survive_epochs_and_reshuffle():
    ds = Rows(40)
    loader = fl.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, persistent_workers=True)
    first = np.concatenate([b[1] for b in loader])
    t0 = time.perf_counter()
    it = iter(loader)
    next(it)
    first_batch_latency = time.perf_counter() - t0
    second = np.concatenate([next(it)[1] for _ in range(9)])
    assert sorted(first.tolist()) == list(range(40))
    assert first.tolist() != second.tolist()
    assert first_batch_latency < 0.5
    pid_loader = fl.DataLoader(Pids(), batch_size=2, num_workers=2, persistent_workers=True)
    pids1 = set(np.concatenate(epoch(pid_loader)).tolist())
    pids2 = set(np.concatenate(epoch(pid_loader)).tolist())
    assert pids1 == pids2 and len(pids1) == 2


@pytest.mark.parametrize("method", START_METHODS)
def test_persistent_workers_outgrow_their_first_slots(method):
    # 2 MiB batches outgrow the pool's first slots: the pool retires the
    # segment the workers started with, and they must unmap it (under fork
    # it once was the parent's own object, held by the inherited pool).
    x = np.arange(64 * 32768, dtype=np.float32).reshape(64, 32768)
    loader = fl.DataLoader(fl.ArrayDataset(x), batch_size=16, num_workers=2,
                           multiprocessing_context=method, persistent_workers=True)
    for _ in range(3):
        got = np.concatenate([b[0] for b in loader])
        assert got.tobytes() == x.tobytes()


@pytest.mark.parametrize("method", START_METHODS)
def test_slots_of_large_batches_are_mapped_only_where_a_batch_is_held(method):
    # NOTE [ Unmapped slots ]: workers write batches of 8 MiB through the
    # segments' files, and the main process unmaps a slot once it is free.
    # Megabytes: samples of 1 MiB made in Python, default collation.
    want = list(fl.DataLoader(Megabytes(), batch_size=8))
    loader = fl.DataLoader(Megabytes(), batch_size=8, num_workers=2,
                           multiprocessing_context=method, persistent_workers=True)
    for _ in range(2):
        batches = iter(loader)
        for got, expected in zip(batches, want, strict=True):
            assert got["x"].tobytes() == expected["x"].tobytes()
            assert got["y"].tolist() == expected["y"].tolist()
        del got
        assert loader.stats().pool_bytes >= 2 * (8 << 20)
        # Rings and the first slots are small: written through their
        # mappings, the slots alone would be 8 MiB in a worker or more.
        for pid in batches.worker_pids:
            assert mapped_shared_memory(pid) < 2 << 20
        assert mapped_shared_memory("self") < 2 << 20


def test_worker_threads_leave_slots_of_large_batches_unmapped_too():
    want = list(fl.DataLoader(Megabytes(), batch_size=8))
    loader = fl.DataLoader(Megabytes(), batch_size=8, num_workers=2, worker_method="thread",
                           persistent_workers=True)
    for _ in range(2):
        for got, expected in zip(loader, want, strict=True):
            assert got["x"].tobytes() == expected["x"].tobytes()
        del got
        # Written through their mappings, the slots would be 16 MiB or more.
        assert mapped_shared_memory("self") < 2 << 20


def test_only_pools_of_collated_batches_unmap_their_free_slots():
    # Gathered rows are written through the workers' mappings: unmapping
    # the main process's pages would only make a reading loop fault them
    # in again, and a worker thread gathering into a slot fault it in
    # (NOTE [ Unmapped slots ]).
    from fastload._fast_path import BatchWriter
    from fastload._fetch import DatasetKind

    def writes_through_files(*how):
        return BatchWriter(*how).writes_through_files

    rows = fl.ArrayDataset(np.zeros((64, 1 << 18), np.float32))
    map_style, iterable = DatasetKind.MAP, DatasetKind.ITERABLE
    assert writes_through_files(Megabytes(), map_style, True, fl.default_collate)
    assert writes_through_files(Shards(), iterable, True, fl.default_collate)
    assert not writes_through_files(rows, map_style, True, fl.default_collate)
    assert not writes_through_files(fl.Subset(rows, [3, 1]), map_style, True,
                                    fl.default_collate)
    assert not writes_through_files(Megabytes(), map_style, True, lambda b: b)
    assert not writes_through_files(Megabytes(), map_style, False, fl.default_collate)
    for worker_method, pool_of in (("multiprocessing", lambda it: it._group.pool),
                                   ("thread", lambda it: it._slots.pool)):
        for dataset, unmapped in ((rows, 0), (Megabytes(), 4 << 20)):
            batches = iter(fl.DataLoader(dataset, batch_size=8, num_workers=2,
                                         worker_method=worker_method))
            assert pool_of(batches).unmapped_slot_bytes == unmapped
            del batches


def test_a_worker_keeps_the_descriptors_of_large_segments_up_to_a_bound(monkeypatch):
    from fastload import _memory
    from fastload._worker_process import _Worker
    from fastload_c.shm import Segment

    monkeypatch.setattr(_memory, "UNMAPPED_SEGMENT_FDS", 2)
    worker = _Worker.__new__(_Worker)
    worker.segments = {}
    large = _memory.UNMAPPED_SLOT_BYTES
    for segment_id, size in enumerate([4096, large, large, large]):
        worker.add_segment(segment_id, Segment(size))
    assert [s.fd >= 0 for s in worker.segments.values()] == [False, True, True, False]
    assert all(not s.closed for s in worker.segments.values())  # all mapped


def test_the_pool_reserves_little_more_than_the_slots_in_use():
    # 4 batches in flight (2 workers, prefetch 2) and 2 held by the loop: six
    # 2 MiB slots; whole segments of four would reserve eight.
    x = np.zeros((64, 32768), dtype=np.float32)
    loader = fl.DataLoader(fl.ArrayDataset(x), batch_size=16, num_workers=2,
                           persistent_workers=True)
    for _ in range(3):
        for batch in loader:
            pass
    stats = loader.stats()
    slot = 16 * x[0].nbytes
    assert 4 * slot <= stats.pool_bytes <= 6 * slot * 1.25  # slots are rounded up


WORKER_PAGE_FAULTS = """
import numpy as np, fastload as fl

class Fresh(fl.Dataset):  # a new 48 KiB array per sample, as augmentations make
    def __len__(self):
        return 256
    def __getitem__(self, i):
        return np.full((3, 64, 64), i, np.float32) * 2

loader = fl.DataLoader(Fresh(), batch_size=64, num_workers=1, persistent_workers=True)
for batch in loader:  # the first epoch maps the slots and grows the heap
    pass
it = iter(loader)
stat = f"/proc/{it.worker_pids[0]}/stat"
before = int(open(stat).read().split()[9])
for batch in it:
    pass
print(int(open(stat).read().split()[9]) - before)
"""


@pytest.mark.timeout(60)
def test_workers_keep_their_heap_between_batches():
    # NOTE [ Worker heap ]: in a fresh interpreter, whose malloc thresholds
    # are glibc's defaults, a worker used to fault in each sample's 12 pages
    # again every batch: 3000 faults for this epoch.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    proc = subprocess.run([sys.executable, "-c", WORKER_PAGE_FAULTS], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) < 256  # under one fault per sample


class Slow(fl.Dataset):
    def __init__(self, delay):
        self.delay = delay

    def __len__(self):
        return 4

    def __getitem__(self, i):
        time.sleep(self.delay)
        return i


def test_timeout_raises_after_that_many_seconds():
    loader = fl.DataLoader(Slow(2.0), batch_size=1, num_workers=1, timeout=0.3)
    it = iter(loader)
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"timed out after 0\.3 seconds"):
        next(it)
    assert 0.29 < time.perf_counter() - t0 < 0.6


def test_pin_memory_batches_are_correct():
    want = epoch(fl.DataLoader(Rows(30), batch_size=8))
    got = epoch(fl.DataLoader(Rows(30), batch_size=8, num_workers=2, pin_memory=True))
    assert_batches_equal(got, want)


def test_len_of_multiprocess_loader():
    assert len(fl.DataLoader(Rows(103), batch_size=8, num_workers=2)) == 13
    assert len(fl.DataLoader(Rows(103), batch_size=8, num_workers=2, drop_last=True)) == 12


def test_torch_output_with_workers():
    torch = pytest.importorskip("torch", reason="the torch output option needs torch")
    x, y = next(iter(fl.DataLoader(Rows(10), batch_size=4, num_workers=2, output="torch")))
    assert isinstance(x, torch.Tensor) and x.dtype == torch.float32
    assert y.tolist() == [0, 1, 2, 3]


class Big(fl.Dataset):
    """Samples of 512 KiB: a batch of 4 outgrows the first slots."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return np.full((128, 1024), i, dtype=np.float32)


class BigStream(fl.IterableDataset):
    def __iter__(self):
        info = fl.get_worker_info()
        for i in range(info.id, 12, info.num_workers):
            yield np.full((128, 1024), i, dtype=np.float32)


@pytest.mark.parametrize("dataset", [Big(), BigStream()], ids=["map", "iterable"])
def test_batches_larger_than_a_slot_grow_the_slots(dataset):
    loader = fl.DataLoader(dataset, batch_size=4, num_workers=2)
    got = epoch(loader)
    values = sorted(int(v) for b in got for v in b[:, 0, 0])
    assert values == list(range(12))
    assert all(b.shape[1:] == (128, 1024) for b in got)
    for b in got:
        assert (b == b[:, :1, :1]).all()  # every sample filled with its own index


def test_batches_held_past_the_pool_cap_are_copied_out(monkeypatch):
    # A cap of four 1 MiB slots: holding 30 batches of 512 KiB must not stall
    # the loader nor overwrite what is held; past the cap batches are copies.
    import fastload._memory as memory

    monkeypatch.setattr(memory, "default_max_bytes", lambda: 4 << 20)
    held = epoch(fl.DataLoader(Big(), batch_size=1, num_workers=2))
    held += epoch(fl.DataLoader(Big(), batch_size=1, num_workers=2))
    assert [int(b[0, 0, 0]) for b in held] == list(range(12)) * 2
    assert all((b == b[0, 0, 0]).all() for b in held)


def test_batches_keep_their_slots_again_once_the_held_ones_are_dropped(monkeypatch):
    # A cap of 12 slots: holding 20 batches copies the later ones out of
    # their slots; once the program drops them, batches are views of their
    # slots again (every slot free), not copies for the rest of the epoch.
    import fastload._memory as memory
    from fastload_c.slab import Lease

    monkeypatch.setattr(memory, "default_max_bytes", lambda: 12 << 20)

    class Rows(fl.Dataset):
        def __len__(self):
            return 60

        def __getitem__(self, i):
            return np.full(1 << 20, i, np.uint8)

    def in_slot(batch):
        while batch is not None and not isinstance(batch, Lease):
            batch = getattr(batch, "base", None)
        return batch is not None

    held, kept = [], []
    for k, batch in enumerate(fl.DataLoader(Rows(), batch_size=1, num_workers=2, timeout=60)):
        assert (batch == k).all()
        if k < 20:
            held.append(batch)
        elif k == 20:
            held.clear()
        kept.append(in_slot(batch))
        del batch
    assert not all(kept[:20])  # past the cap, copies
    assert all(kept[30:])


def test_copy_out_lasts_while_a_kept_batch_would_keep_an_outgrown_segment(monkeypatch):
    # Rows grow through the epoch, so slots do, at a cap of 12 MiB: once
    # batches are copied out there, one kept in a slot again while the
    # pool had no room to spare would hold a segment of the outgrown size,
    # which the next bigger slot needs given back ("held by batches this
    # program still references", with none kept).
    import fastload._memory as memory

    monkeypatch.setattr(memory, "default_max_bytes", lambda: 12 << 20)

    class Growing(fl.Dataset):
        def __len__(self):
            return 36000

        def __getitem__(self, i):
            return {"x": np.full(64 + (i // 12000) * 128, i, np.float32), "y": i}

    loader = fl.DataLoader(Growing(), batch_size=4000, num_workers=1, prefetch_factor=1,
                           timeout=60)
    seen = []
    for batch in loader:
        assert (batch["x"][:, 0] == batch["y"]).all()
        seen.extend(batch["y"].tolist())
    assert seen == list(range(36000))


def test_a_ready_batch_is_returned_before_the_pool_grows_for_others():
    # 4 MiB samples outgrow the first slots. The first batch needs one new
    # segment (two slots: tasks 0 and 1); the segments that tasks 2, 3 and 4
    # need are made at the next call, not while batch 0 waits to be returned.
    # (Not an ArrayDataset: its pool starts at its batch size, see
    # _memory.batch_slot_bytes.)
    x = (np.arange(8 * 4 * 1024 * 1024) % 251).astype(np.uint8).reshape(8, -1)

    class Rows(fl.Dataset):
        def __len__(self):
            return len(x)

        def __getitem__(self, i):
            return (x[i],)

    loader = fl.DataLoader(Rows(), batch_size=1, num_workers=2, prefetch_factor=2)
    it = iter(loader)
    first = next(it)
    pool = it._group.pool
    grown = [s for s in pool.segments if s[2] == pool.slot_size]
    assert len(grown) == 1 and grown[0][3] == 2
    got = [first[0]] + [b[0] for b in it]
    assert np.array_equal(np.concatenate(got), x)


class LargeFromTwo(fl.Dataset):
    """Small samples, then 24 MB ones: a batch past the first two asks for a
    bigger slot (NEED) while it is loaded."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i >= 2:
            time.sleep(0.05)
            return np.full(24 << 20, i, np.uint8)
        return np.full(16, i, np.uint8)


@pytest.mark.timeout(120)
def test_a_new_epoch_serves_the_slot_an_abandoned_task_waits_for():
    """iter() after an epoch left early waits for every worker's answer to
    its RESET; a worker still loading an abandoned task that asked for a
    bigger slot reads that RESET only once the slot came, so the wait must
    grant it (it hung before)."""
    loader = fl.DataLoader(LargeFromTwo(), batch_size=1, num_workers=1,
                           persistent_workers=True, timeout=60)
    it = iter(loader)
    next(it), next(it)
    time.sleep(0.02)  # the worker is at the large sample now
    firsts = [int(batch[0, 0]) for batch in iter(loader)]
    assert firsts == [0, 1, 2, 3, 4, 5]


class Megabytes(fl.Dataset):
    """1 MiB samples: batches of 5 take slots past LATE_SLOT_BYTES, given
    to each task as its worker starts it (NOTE [ Late slots ])."""

    def __len__(self):
        return 23

    def __getitem__(self, i):
        time.sleep(0.002)
        return {"x": np.full((512, 512), i, np.float32), "y": i}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("in_order", [True, False])
def test_late_slots_give_every_batch_as_without_workers(in_order):
    from fastload._process_slots import LATE_SLOT_BYTES

    def summary(batches):
        return sorted((b["y"].tolist(), float(b["x"].sum())) for b in batches)

    expected = summary(epoch(fl.DataLoader(Megabytes(), batch_size=5)))
    loader = fl.DataLoader(Megabytes(), batch_size=5, num_workers=2, prefetch_factor=3,
                           persistent_workers=True, in_order=in_order)
    it = iter(loader)
    next(it)
    assert it._group.pool.slot_size >= LATE_SLOT_BYTES
    for _ in range(2):
        assert summary(epoch(loader)) == expected
    # An epoch given up early leaves late tasks behind, stale.
    it = iter(loader)
    next(it)
    assert summary(epoch(loader)) == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize("in_order", [True, False])
def test_batches_outgrowing_their_slots_near_the_cap_are_all_delivered(monkeypatch, in_order):
    # The first batches ask for bigger slots (NEED) with the pool near its
    # cap while the loop keeps every batch. A worker waiting for a slot
    # answers nothing, so the wait for a slot copies the batches waiting to
    # be delivered out of theirs (it hung before), and takes back the slots
    # of the tasks queued behind it (it raised ShmError before, naming the
    # program's batches, 2 runs of 6).
    import fastload._memory as memory

    monkeypatch.setattr(memory, "default_max_bytes", lambda: 12 << 20)
    expected = [(b["y"].tolist(), float(b["x"].sum()))
                for b in fl.DataLoader(Megabytes(), batch_size=5)]
    loader = fl.DataLoader(Megabytes(), batch_size=5, num_workers=2, in_order=in_order)
    got = [(b["y"].tolist(), float(b["x"].sum())) for b in list(loader)]
    assert (got if in_order else sorted(got)) == expected


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cap_mib, batch_size", [(3, 1), (6, 5), (8, 5)])
@pytest.mark.parametrize("keep", [False, True], ids=["dropped", "kept"])
def test_a_cap_that_holds_one_batch_per_worker_loads_every_batch(monkeypatch, cap_mib,
                                                                  batch_size, keep):
    # Room for about one batch a worker, not for the prefetch: tasks queued
    # behind one that waits for a bigger slot give theirs up (REVOKE), and
    # every batch arrives whole, kept by the loop or not (these raised
    # ShmError before, or hung with the batches kept).
    import fastload._memory as memory

    monkeypatch.setattr(memory, "default_max_bytes", lambda: cap_mib << 20)
    loader = fl.DataLoader(Megabytes(), batch_size=batch_size, num_workers=2, timeout=30)

    def whole(batch):  # each sample filled with its own label
        return all((batch["x"][k] == y).all() for k, y in enumerate(batch["y"].tolist()))

    kept, seen = [], []
    for batch in loader:
        assert whole(batch)
        seen += batch["y"].tolist()
        if keep:
            kept.append(batch)
    assert seen == list(range(len(Megabytes())))
    assert all(whole(batch) for batch in kept)


class GrowingRows(fl.Dataset):
    """Rows that grow a third of the way through: batches of 4000 need
    bigger slots then, and their indices are too large for a ring record
    (they start each task's slot, TASK_INDEX_IN_SLOT)."""

    def __len__(self):
        return 24000

    def __getitem__(self, i):
        return {"x": np.full(64 + (i // 8000) * 128, i, np.float32), "y": i}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cap_mib, num_workers", [(8, 1), (8, 2), (12, 1)])
def test_at_the_cap_slots_holding_large_indices_are_given_up_too(monkeypatch, cap_mib,
                                                                 num_workers):
    # Slots that hold their task's index are taken back like the others
    # (REVOKE, then free once the worker read it): these raised ShmError
    # before, once as if the program held the batches.
    import fastload._memory as memory

    monkeypatch.setattr(memory, "default_max_bytes", lambda: cap_mib << 20)
    loader = fl.DataLoader(GrowingRows(), batch_size=4000, num_workers=num_workers,
                           prefetch_factor=3, timeout=30)
    seen = []
    for batch in loader:
        labels = batch["y"].tolist()
        assert (batch["x"] == batch["y"][:, None]).all()
        seen += labels
    assert seen == list(range(len(GrowingRows())))


class OneSpike(fl.Dataset):
    """Batches of 4 rows of 64 KiB, but batch 10, of 4 rows of 4 MiB."""

    def __len__(self):
        return 4 * 300

    def __getitem__(self, i):
        return np.full((4 << 20 if i // 4 == 10 else 64 << 10) // 4, i, np.float32)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["multiprocessing", "thread"])
@pytest.mark.parametrize("capped", [False, True], ids=["uncapped", "capped"])
def test_after_a_spike_the_slots_shrink_and_batches_keep_them_again(monkeypatch, method,
                                                                     capped):
    # NOTE [ Slots after a spike ]: the pool's slots grow to 16 MiB for one
    # batch, and once SPIKE_WINDOW batches needed far less, shrink back, the
    # spike's segments (and their pages) dropped. Before, every later slot
    # stayed 16 MiB; at a cap that allowed a few of them, every later batch
    # was copied out of its slot.
    import fastload._memory as memory
    from fastload_c.slab import Lease

    if capped:
        monkeypatch.setattr(memory, "default_max_bytes", lambda: 48 << 20)
    loader = fl.DataLoader(OneSpike(), batch_size=4, num_workers=2, worker_method=method,
                           timeout=30)
    it = iter(loader)
    pool = it._group.pool if method == "multiprocessing" else it._slots.pool
    largest = 0
    for k, batch in enumerate(it):
        assert (batch == np.arange(4 * k, 4 * k + 4)[:, None]).all()
        largest = max(largest, pool.slot_size)
        if k == len(loader) - 1:
            assert isinstance(batch.base, Lease)  # in its slot, not a copy
    assert largest >= 16 << 20
    assert pool.slot_size < 1 << 20
    assert max(size for _, _, size, _ in pool.segments) < 1 << 20


def test_the_slot_size_watch_shrinks_after_a_quiet_window_and_backs_off_when_spikes_recur():
    from fastload._memory import MAX_SPIKE_WINDOW, SPIKE_WINDOW, SlotSizeWatch
    from fastload_c.pack import collate_into

    class Pool:
        slot_size = 64 << 20

        def shrink_to(self, nbytes):
            self.slot_size = min(self.slot_size, nbytes)

    slot = bytearray((16 << 20) + 1)
    # The layouts of batches of one row of 1 MiB, and of 16 MiB and a byte.
    mib, over_a_quarter = (collate_into([np.zeros(n, np.uint8)], slot)
                           for n in (1 << 20, (16 << 20) + 1))
    pool, watch = Pool(), SlotSizeWatch()
    # A window with a batch needing over a quarter of the slot: no shrink.
    assert not any(watch.saw(pool, over_a_quarter if k == 5 else mib)
                   for k in range(SPIKE_WINDOW))
    # A quiet window: the slots shrink to its largest batch plus an eighth.
    shrunk = [watch.saw(pool, mib) for _ in range(SPIKE_WINDOW)]
    assert shrunk == [False] * (SPIKE_WINDOW - 1) + [True]
    assert pool.slot_size == (1 << 20) + (1 << 17)
    # The spike comes back (a NEED grows the pool): the next shrink waits
    # two windows.
    pool.slot_size = 64 << 20
    shrunk = [watch.saw(pool, mib) for _ in range(2 * SPIKE_WINDOW)]
    assert shrunk.index(True) == 2 * SPIKE_WINDOW - 1
    # However often they recur, a quiet stretch of MAX_SPIKE_WINDOW batches
    # shrinks the slots.
    for _ in range(12):
        pool.slot_size = 64 << 20
        shrunk = [watch.saw(pool, mib) for _ in range(MAX_SPIKE_WINDOW)]
    assert shrunk.index(True) == MAX_SPIKE_WINDOW - 1


class Finalized:
    """Writes the pid of the process that finalizes it to ``path``."""

    def __init__(self, path):
        self.path = path

    def __del__(self):
        with open(self.path, "a") as out:
            out.write(f"{os.getpid()}\n")


def _collect_garbage(worker_id):
    gc.collect()


def test_a_forked_worker_never_finalizes_the_parents_garbage(tmp_path):
    # A cycle the parent has not collected yet when workers fork: a
    # worker's collection ran its finalizer too, once per worker (a torch
    # iterator's __del__ printed errors from fastload workers that way).
    record = tmp_path / "finalized"
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        garbage = Finalized(record)
        garbage.cycle = garbage
        del garbage
        loader = fl.DataLoader(list(range(8)), batch_size=2, num_workers=2,
                               worker_init_fn=_collect_garbage, multiprocessing_context="fork")
        assert len(list(loader)) == 4
    finally:
        if was_enabled:
            gc.enable()
    gc.collect()
    assert record.read_text().split() == [str(os.getpid())]


class _Cycle:
    pass


def test_starting_forked_workers_leaves_the_parents_young_garbage_young():
    # Freezing the parent's objects around the fork moved them, garbage
    # too, to the oldest generation, which only full collections visit:
    # iterators dropped in reference cycles piled up with their workers.
    freed = []
    was_enabled = gc.isenabled()
    gc.disable()  # no collection but those below
    try:
        gc.collect()
        garbage = _Cycle()
        garbage.cycle = garbage
        weakref.finalize(garbage, freed.append, True)
        del garbage
        loader = fl.DataLoader(list(range(8)), batch_size=2, num_workers=2,
                               multiprocessing_context="fork")
        assert len(list(loader)) == 4
        gc.collect(1)  # the young generations
        assert freed == [True]
    finally:
        if was_enabled:
            gc.enable()


def test_a_forked_worker_collects_as_its_parent_does():
    def collector(worker_id):
        return gc.isenabled(), gc.get_freeze_count() > 0

    class Collector(fl.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return collector(i)

    for parent_collects in (True, False):
        was_enabled = gc.isenabled()
        (gc.enable if parent_collects else gc.disable)()
        try:
            got = list(fl.DataLoader(Collector(), batch_size=None, num_workers=1,
                                     multiprocessing_context="fork"))
            assert gc.isenabled() is parent_collects
        finally:
            (gc.enable if was_enabled else gc.disable)()
        assert got == [[parent_collects, True]] * 2  # as lists, as torch converts them


class _Messages:
    """A worker's task ring, played by a list of messages."""

    def __init__(self, messages):
        self.messages = collections.deque(messages)

    def try_get(self):
        from fastload._protocol import dumps
        return dumps(self.messages.popleft()) if self.messages else None

    def get(self, timeout):
        data = self.try_get()
        assert data is not None, "the worker would wait for ever"
        return data


@pytest.mark.parametrize("offered", [True, False])
def test_a_worker_awaiting_its_slot_keeps_other_messages_in_order(offered):
    from fastload._protocol import NEED, RESET, RESLOT, TASK
    from fastload._worker_process import _Worker

    worker = _Worker.__new__(_Worker)
    replies = []
    worker.reply = lambda *message: replies.append(message)
    kept = (TASK, 7, [1], (0, 0, 4096))  # kept back by an earlier wait
    worker.backlog = collections.deque([kept])
    worker.tasks = _Messages([(RESET, 1, None, 2), (RESLOT, 5, (0, 4096, 4096), 0),
                              (TASK, 8, [2], (0, 0, 4096))])
    assert worker.await_reslot(5, 4096, offered) == ((0, 4096, 4096), 0)
    # A slot sent unasked is taken without asking.
    assert replies == ([] if offered else [(NEED, 5, 4096, False)])
    assert list(worker.backlog) == [kept, (RESET, 1, None, 2)]
    # One kept back is found there.
    worker.backlog.append((RESLOT, 9, (0, 0, 4096), 0))
    assert worker.await_reslot(9, 4096, offered) == ((0, 0, 4096), 0)
    assert list(worker.backlog) == [kept, (RESET, 1, None, 2)]


class RingSpins(fl.Dataset):
    """Sample i: how long the worker's own task and result rings spin
    before they sleep (read from the worker loop's frame)."""

    def __len__(self):
        return 2

    def __getitem__(self, i):
        from fastload._worker_process import _Worker
        frame = sys._getframe()
        while not isinstance(frame.f_locals.get("self"), _Worker):
            frame = frame.f_back
        worker = frame.f_locals["self"]
        return np.array([worker.tasks.spin, worker.results.spin])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("cpus, spin", [(1, 0.0), (2, 0.0), (3, 20e-6)])
def test_rings_spin_only_when_every_process_has_a_cpu(monkeypatch, method, cpus, spin):
    # 2 workers and the main process: spinning needs 3 CPUs (NOTE [ Ring
    # waiting ] in fastload_c/src/fl_ring.h); a spinner on a shared CPU
    # only delays the process it waits for.
    from fastload import _cpus
    monkeypatch.setattr(_cpus, "usable_cpu_count", lambda: cpus)
    loader = fl.DataLoader(RingSpins(), batch_size=None, num_workers=2,
                           multiprocessing_context=method)
    it = iter(loader)
    main_spins = [ring.spin for ring in (*it._group.task_rings, *it._group.result_rings)]
    assert main_spins == pytest.approx([spin] * 4)
    assert [list(worker_spins) for worker_spins in it] == [pytest.approx([spin, spin])] * 2


class HoldsALambda(fl.Dataset):
    def __init__(self):
        self.transform = lambda x: x

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return self.transform(np.array([i]))


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_dataset_that_cannot_be_pickled_raises_the_picklers_error_saying_what_to_do(method):
    # torch lets the pickler's error through; code written for it catches
    # that type. fastload's says what to do besides, and the loader is left
    # usable with another start method.
    dataset = HoldsALambda()
    try:
        pickle.dumps(dataset)
    except Exception as error:  # noqa: BLE001 - whatever the pickler raises is expected
        expected = type(error)
    with pytest.raises(expected, match="defined at module level"):
        iter(fl.DataLoader(dataset, batch_size=2, num_workers=2,
                           multiprocessing_context=method))
    loader = fl.DataLoader(dataset, batch_size=2, num_workers=2, multiprocessing_context="fork")
    assert [batch[:, 0].tolist() for batch in loader] == [[0, 1], [2, 3]]


class _RefusedIndex(int):
    """An index a sampler makes whose pickle refuses 13."""

    def __reduce__(self):
        if int(self) == 13:
            raise pickle.PicklingError("index 13 cannot be pickled")
        return (int, (int(self),))


class _RefusingBatches:
    def __iter__(self):
        for start in range(0, 24, 3):
            yield [_RefusedIndex(i) for i in range(start, start + 3)]

    def __len__(self):
        return 8


@pytest.mark.timeout(60)
@pytest.mark.parametrize("in_order", [True, False])
def test_a_batch_whose_indices_cannot_be_sent_raises_in_its_place(in_order):
    # The main process pickles a task's indices for its worker: where that
    # raises, that batch raises in its place, as a failed fetch does, and
    # every other batch arrives (the epoch lost the batches around it, or
    # stopped, before).
    loader = fl.DataLoader(list(range(24)), batch_sampler=_RefusingBatches(), num_workers=2,
                           in_order=in_order)
    it, got = iter(loader), []
    while True:
        try:
            got.append(next(it).tolist())
        except StopIteration:
            break
        except pickle.PicklingError as error:
            assert "while the main process sent the indices [12, 13, 14]" in str(error)
            got.append("failed")
    expected = [[i, i + 1, i + 2] for i in range(0, 24, 3)]
    expected[4] = "failed"
    if not in_order:
        got, expected = sorted(map(str, got)), sorted(map(str, expected))
    assert got == expected
