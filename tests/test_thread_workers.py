"""worker_method="thread": torch's semantics with threads of this process
(NOTE [ Thread workers ] in fastload/_thread_workers.py). That the batches
equal num_workers=0 and worker processes on generated datasets is
tests/test_worker_differential.py; here, what only threads have."""
import gc
import importlib.machinery
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time
import types

import numpy as np
import pytest

import fastload as fl
from fastload._torch import torch_if_imported
from fastload._worker_thread import JOIN_SECONDS

pytestmark = pytest.mark.usefixtures("earlier_garbage_collected")

try:
    import torch
except ImportError:
    torch = None

THREAD = dict(worker_method="thread")


def worker_threads_alive():
    return [t for t in threading.enumerate() if t.name.startswith("fastload-worker-")]


@pytest.fixture(autouse=True)
def no_threads_left():
    yield
    gc.collect()
    deadline = time.monotonic() + 5
    while worker_threads_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker_threads_alive() == []


class WhoLoads(fl.Dataset):
    """Each sample says which thread loaded it and what that thread saw."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        info = fl.get_worker_info()
        torch_id = -2
        if torch is not None:
            torch_info = torch.utils.data.get_worker_info()
            torch_id = -1 if torch_info is None else torch_info.id
        return {"index": i, "thread": threading.get_ident(), "id": info.id,
                "num_workers": info.num_workers, "method": info.worker_method,
                "torch_id": torch_id, "dataset_is_shared": info.dataset is self,
                "draw": float(info.rng.numpy_generator.random()),
                "py_draw": info.rng.random_generator.random()}


def test_worker_info_is_per_thread_and_the_main_thread_has_none():
    loader = fl.DataLoader(WhoLoads(), batch_size=None, num_workers=2, **THREAD)
    samples = list(loader)
    assert [s["index"] for s in samples] == list(range(24))
    assert {s["method"] for s in samples} == {"thread"}
    assert {s["num_workers"] for s in samples} == {2}
    assert all(s["dataset_is_shared"] for s in samples)  # map-style: shared, as in torch
    ids_of_thread = {}
    for s in samples:
        ids_of_thread.setdefault(s["thread"], set()).add(s["id"])
    assert sorted(ids_of_thread.values(), key=min) == [{0}, {1}]
    assert threading.get_ident() not in ids_of_thread
    # Round robin: sample k (one per batch) comes from worker k % 2.
    assert [s["id"] for s in samples] == [i % 2 for i in range(24)]
    if torch is not None:
        assert [s["torch_id"] for s in samples] == [s["id"] for s in samples]
        assert torch.utils.data.get_worker_info() is None
    assert fl.get_worker_info() is None


@pytest.mark.skipif(torch is None, reason="torch's get_worker_info needs torch")
def test_torchs_get_worker_info_still_pickles_after_thread_workers_ran():
    """A spawned worker receives what refers to it (a worker_init_fn, say)."""
    list(fl.DataLoader(WhoLoads(), batch_size=None, num_workers=2, **THREAD))
    restored = pickle.loads(pickle.dumps(torch.utils.data.get_worker_info))
    assert restored is torch.utils.data.get_worker_info and restored() is None
    check = "import pickle, sys; f = pickle.loads(sys.stdin.buffer.read()); print(f())"
    shipped = subprocess.run([sys.executable, "-c", check], capture_output=True, timeout=120,
                             input=pickle.dumps(torch.utils.data.get_worker_info))
    assert shipped.stdout.strip() == b"None", shipped.stderr


def test_worker_rng_is_independent_per_worker_and_reproducible():
    def draws(generator):
        loader = fl.DataLoader(WhoLoads(), batch_size=None, num_workers=2, generator=generator,
                               **THREAD)
        return [(s["id"], s["draw"], s["py_draw"]) for s in loader]

    first, again, other = draws(5), draws(5), draws(6)
    assert first == again
    assert first != other
    streams = [[d for i, d, _ in first if i == w] for w in (0, 1)]
    assert len(set(streams[0]) & set(streams[1])) == 0


def test_worker_rng_has_a_torch_generator_when_torch_is_loaded():
    from fastload._worker_info import worker_rng

    rng = worker_rng(11, 1)
    assert (torch is None) == (rng.torch_generator is None)
    if torch is not None:
        a = torch.rand(3, generator=rng.torch_generator)
        b = torch.rand(3, generator=worker_rng(11, 1).torch_generator)
        assert torch.equal(a, b)


class Augmented(fl.Dataset):
    def __len__(self):
        return 30

    def __getitem__(self, i):
        return fl.sample_rng().random(2)


def test_sample_rng_streams_do_not_depend_on_the_worker_method():
    def epoch(**kwargs):
        return [b.tobytes() for b in fl.DataLoader(Augmented(), batch_size=4, generator=9,
                                                   **kwargs)]

    expected = epoch()
    assert epoch(num_workers=2, **THREAD) == expected
    assert epoch(num_workers=3, in_order=True, **THREAD) == expected


def test_worker_init_fn_runs_once_in_each_thread():
    calls, lock = [], threading.Lock()

    def init(worker_id):
        info = fl.get_worker_info()
        with lock:
            calls.append((worker_id, info.id, threading.get_ident()))

    loader = fl.DataLoader(WhoLoads(), batch_size=4, num_workers=3, worker_init_fn=init,
                           **THREAD)
    list(loader)
    assert sorted(c[0] for c in calls) == [0, 1, 2]
    assert all(worker_id == info_id for worker_id, info_id, _ in calls)
    assert len({ident for _, _, ident in calls}) == 3
    assert threading.get_ident() not in {ident for _, _, ident in calls}


def test_a_failing_worker_init_fn_raises_its_type_and_stops_the_threads():
    def init(worker_id):
        if worker_id == 1:
            raise KeyError("no shard for this worker")

    loader = fl.DataLoader(WhoLoads(), batch_size=4, num_workers=2, worker_init_fn=init,
                           **THREAD)
    before = set(threading.enumerate())
    with pytest.raises(KeyError, match="worker_init_fn"):
        iter(loader)  # in iter(), whatever the timing, as with worker processes
    started = set(threading.enumerate()) - before
    assert not any(t.name.startswith("fastload-worker") for t in started)


class Flaky(fl.Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i in (2, 9):
            raise LookupError(f"sample {i} is broken")
        return np.full(2, i)


def test_an_exception_fails_its_batch_only_with_its_type():
    loader = fl.DataLoader(Flaky(), batch_size=2, num_workers=2, persistent_workers=True,
                           **THREAD)
    for _ in range(2):  # and persistent threads go on into the next epoch
        outcome = []
        it = iter(loader)
        while True:
            try:
                outcome.append(next(it)[:, 0].tolist())
            except StopIteration:
                break
            except LookupError as exc:
                assert "while loading index" in str(exc) and "broken" in str(exc)
                outcome.append("raised")
        assert outcome == [[0, 1], "raised", [4, 5], [6, 7], "raised", [10, 11]]


class Slow(fl.Dataset):
    def __init__(self, seconds):
        self.seconds = seconds

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 0:
            time.sleep(self.seconds)
        return i


def test_timeout_raises_and_a_stuck_thread_is_left_behind():
    it = iter(fl.DataLoader(Slow(3 * JOIN_SECONDS), batch_size=2, num_workers=2, timeout=0.2,
                            **THREAD))
    with pytest.raises(RuntimeError, match="timed out after 0.2 seconds"):
        next(it)
    threads = it.worker_threads
    del it
    gc.collect()
    # Both stop: the idle one at once, the one in its long sample after it.
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()


def test_persistent_threads_serve_every_epoch():
    dataset = fl.ArrayDataset(np.arange(40).reshape(20, 2))
    # Persistent workers draw no new base seed per epoch: the generator, and
    # so the later epochs, differ from num_workers=0, as in torch.
    kwargs = dict(batch_size=3, shuffle=True, generator=4, num_workers=2,
                  persistent_workers=True)
    processes = fl.DataLoader(dataset, **kwargs)
    expected = [[b[0].tolist() for b in processes] for _ in range(3)]
    del processes
    loader = fl.DataLoader(dataset, **kwargs, **THREAD)
    epochs, threads = [], None
    for _ in range(3):
        it = iter(loader)
        epochs.append([b[0].tolist() for b in it])
        threads = threads or it.worker_threads
        assert it.worker_threads == threads and all(t.is_alive() for t in threads)
    assert epochs == expected
    assert expected[0] != expected[1]
    del loader, it
    gc.collect()
    assert not any(t.is_alive() for t in threads)


def test_threads_end_with_their_epoch():
    it = iter(fl.DataLoader(Flaky(), batch_size=3, num_workers=2, **THREAD))
    threads = it.worker_threads
    assert all(t.is_alive() for t in threads)
    delivered = 0
    while True:  # the epoch goes on after each failed batch
        try:
            next(it)
        except StopIteration:
            break
        except LookupError:
            pass
        delivered += 1
    assert delivered == 4
    assert not any(t.is_alive() for t in threads)


def test_dropping_the_iterator_stops_its_threads():
    it = iter(fl.DataLoader(Flaky(), batch_size=1, num_workers=2, **THREAD))
    next(it)
    threads = it.worker_threads
    del it
    gc.collect()
    assert not any(t.is_alive() for t in threads)


def test_a_thread_in_a_long_getitem_does_not_hold_up_exit():
    script = textwrap.dedent("""
        import sys, time
        sys.path.insert(0, sys.argv[1])
        import fastload as fl

        class Stuck(fl.Dataset):
            def __len__(self):
                return 4
            def __getitem__(self, i):
                time.sleep(3600)

        it = iter(fl.DataLoader(Stuck(), num_workers=2, worker_method="thread"))
        time.sleep(0.2)
        print("leaving")
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", script, root], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "leaving"


def test_map_style_resume_gives_the_rest_of_the_epoch():
    dataset = fl.ArrayDataset(np.arange(26))
    kwargs = dict(batch_size=3, shuffle=True, generator=8)
    expected = [b[0].tolist() for b in fl.DataLoader(dataset, **kwargs)]
    loader = fl.DataLoader(dataset, num_workers=2, **kwargs, **THREAD)
    it = iter(loader)
    head = [next(it)[0].tolist() for _ in range(4)]
    state = loader.state_dict()
    del it
    for method in ("thread", "multiprocessing"):
        resumed = fl.DataLoader(dataset, num_workers=2, worker_method=method, **kwargs)
        resumed.load_state_dict(state)
        assert head + [b[0].tolist() for b in resumed] == expected, method


class Counting(fl.IterableDataset):
    """A stateful stream, sharded by worker; ``start`` may be set per worker
    in worker_init_fn, torch's documented idiom."""

    def __init__(self, n):
        self.n, self.start, self.step, self.position = n, 0, 1, 0

    def __iter__(self):
        info = fl.get_worker_info()
        if info is not None and self.step == 1:
            self.start, self.step = info.id, info.num_workers
        while self.start + self.position * self.step < self.n:
            value = self.start + self.position * self.step
            self.position += 1
            yield value

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def shard_in_init(worker_id):
    info = fl.get_worker_info()
    info.dataset.start, info.dataset.step = worker_id, info.num_workers


@pytest.mark.parametrize("init", [None, shard_in_init])
def test_iterable_datasets_give_each_thread_its_own_replica(init):
    def epoch(method):
        loader = fl.DataLoader(Counting(23), batch_size=3, num_workers=2, worker_method=method,
                               worker_init_fn=init)
        return [b.tolist() for b in loader]

    threaded = epoch("thread")
    assert threaded == epoch("multiprocessing")
    assert sorted(v for b in threaded for v in b) == list(range(23))


def test_iterable_resume_with_threads_continues_each_replica():
    dataset = Counting(31)
    expected = [b.tolist() for b in fl.DataLoader(dataset, batch_size=2, num_workers=2)]
    loader = fl.DataLoader(dataset, batch_size=2, num_workers=2, snapshot_every_n_steps=3,
                           **THREAD)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(5)]
    state = loader.state_dict()
    del it
    for method in ("thread", "multiprocessing"):
        resumed = fl.DataLoader(Counting(31), batch_size=2, num_workers=2,
                                worker_method=method, snapshot_every_n_steps=3)
        resumed.load_state_dict(state)
        assert head + [b.tolist() for b in resumed] == expected, method


def test_in_order_false_delivers_every_batch_once():
    dataset = fl.ArrayDataset(np.arange(50))
    loader = fl.DataLoader(dataset, batch_size=4, num_workers=3, in_order=False, **THREAD)
    got = sorted(v for b in loader for v in b[0].tolist())
    assert got == list(range(50))


def test_pinning_without_an_accelerator_warns_and_loads_the_same():
    dataset = fl.ArrayDataset(np.arange(12, dtype=np.float32))
    loader = fl.DataLoader(dataset, batch_size=5, num_workers=2, pin_memory=True, **THREAD)
    if torch is None or not torch.accelerator.is_available():
        with pytest.warns(UserWarning, match="pin_memory"):
            got = [b[0].tolist() for b in loader]
    else:
        got = [b[0].tolist() for b in loader]
    assert got == [list(range(0, 5)), list(range(5, 10)), [10, 11]]


@pytest.mark.skipif(torch is None, reason="needs torch installed")
def test_torch_output():
    dataset = fl.ArrayDataset(np.arange(6, dtype=np.float32))
    batches = list(fl.DataLoader(dataset, batch_size=4, num_workers=2, output="torch",
                                 **THREAD))
    assert all(isinstance(b[0], torch.Tensor) for b in batches)
    assert [b[0].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5]]


def test_worker_method_is_checked():
    dataset = fl.ArrayDataset(np.arange(4))
    with pytest.raises(ValueError, match="worker_method"):
        fl.DataLoader(dataset, num_workers=2, worker_method="threads")
    with pytest.raises(ValueError, match="multiprocessing_context"):
        fl.DataLoader(dataset, num_workers=2, worker_method="thread",
                      multiprocessing_context="spawn")
    # num_workers=0 loads in the calling thread, whatever the method.
    assert [b[0].tolist() for b in fl.DataLoader(dataset, batch_size=2, **THREAD)] == [
        [0, 1], [2, 3]]


class Exits(fl.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            raise SystemExit(3)  # ends the thread, not the program
        return i


def test_a_thread_that_ends_without_a_result_ends_the_epoch():
    loader = fl.DataLoader(Exits(), batch_size=2, num_workers=2, persistent_workers=True,
                           **THREAD)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    with pytest.raises(fl.WorkerDiedError, match="worker thread 1 ended while loading") as info:
        next(it)
    assert info.value.worker_id == 1 and info.value.indices == [2, 3]
    assert list(it) == []
    assert not any(t.is_alive() for t in it.worker_threads)
    # A persistent loader starts fresh threads at its next iter().
    again = iter(loader)
    assert again is not it and next(again).tolist() == [0, 1]
    del again, it, loader


def test_stats_count_each_threads_batches():
    loader = fl.DataLoader(fl.ArrayDataset(np.arange(40)), batch_size=4, num_workers=2,
                           **THREAD)
    assert len(list(loader)) == 10
    stats = loader.stats()
    assert stats.batches == 10
    assert [w.batches for w in stats.workers] == [5, 5]


class GlobalDraws(fl.Dataset):
    """Draws from one of the process-wide generators (the torch idiom)."""

    def __init__(self, which):
        self.which = which

    def __len__(self):
        return 16

    def __getitem__(self, i):
        if self.which == "numpy":
            return np.random.random()
        if self.which == "random":
            import random
            return random.random()
        return float(torch.rand(()))


GLOBALS = ["numpy", "random"] + (["torch"] if torch is not None else [])


@pytest.mark.parametrize("which", GLOBALS)
def test_drawing_from_a_global_generator_in_a_thread_warns_once(which, recwarn):
    list(fl.DataLoader(GlobalDraws(which), batch_size=2, num_workers=2, **THREAD))
    said = [w for w in recwarn if "global random, numpy or torch generator" in str(w.message)]
    assert len(said) == 1
    assert said[0].filename == __file__  # at the user's line


def test_datasets_that_leave_the_global_generators_alone_do_not_warn(recwarn):
    list(fl.DataLoader(Augmented(), batch_size=2, num_workers=2, generator=1, **THREAD))
    list(fl.DataLoader(fl.ArrayDataset(np.arange(10)), batch_size=2, shuffle=True,
                       num_workers=2, **THREAD))
    list(fl.DataLoader(WhoLoads(), batch_size=2, num_workers=2, **THREAD))
    assert not [w for w in recwarn if "global random" in str(w.message)]


def _base_lease(array):
    while isinstance(array, np.ndarray) and array.base is not None:
        array = array.base
    return array


def test_gathered_batches_view_reused_slots_that_live_as_long_as_their_views():
    from fastload_c.slab import Lease

    rows = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
    loader = fl.DataLoader(fl.ArrayDataset(rows, np.arange(64)), batch_size=8,
                           num_workers=2, **THREAD)
    kept = []
    seen = set()
    for features, labels in loader:
        lease = _base_lease(features)
        assert isinstance(lease, Lease) and _base_lease(labels) is lease
        seen.add((lease.segment_id, lease.slot))
        kept.append((features, labels))
    # Every batch kept: each has a slot of its own, with its own rows.
    assert len(seen) == len(kept) == 8
    for position, (features, labels) in enumerate(kept):
        np.testing.assert_array_equal(features, rows[position * 8:(position + 1) * 8])
        np.testing.assert_array_equal(labels, np.arange(position * 8, (position + 1) * 8))
    kept.clear()
    # Batches dropped at once: the same few slots come back.
    reused = {(_base_lease(f).segment_id, _base_lease(f).slot) for f, _ in loader}
    assert len(reused) < 8


def test_a_batch_larger_than_its_slot_is_delivered_and_later_slots_hold_it():
    from fastload._worker_thread import INITIAL_SLOT_BYTES
    from fastload_c.slab import Lease

    row_bytes = 4096
    rows = np.random.default_rng(0).integers(0, 255, (64, row_bytes), dtype=np.uint8)
    batch = 2 * INITIAL_SLOT_BYTES // row_bytes
    loader = fl.DataLoader(fl.ArrayDataset(rows), batch_size=batch, num_workers=1,
                           prefetch_factor=1, **THREAD)
    batches = list(loader)
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), rows)
    # The first batch went to private memory, a later one to a grown slot.
    assert not isinstance(_base_lease(batches[0][0]), Lease)
    assert isinstance(_base_lease(batches[-1][0]), Lease)


@pytest.mark.skipif(torch is None, reason="the deadlock is in torch's generator state")
def test_worker_threads_reading_torchs_generator_state_never_deadlock():
    """Each worker thread reads torch's global generator state around its
    first batch; two such reads at once deadlocked in torch when a garbage
    collection ran inside one (NOTE [ Generator states and threads ] in
    fastload/_torch.py). Run in a subprocess: a deadlock holds the GIL."""
    script = textwrap.dedent("""
        import gc, sys, time, warnings
        sys.path.insert(0, sys.argv[1])
        warnings.simplefilter("ignore")
        import numpy as np, torch
        import fastload as fl

        gc.set_threshold(1, 1, 1)  # a collection at nearly every allocation

        class Cycles(fl.Dataset):
            def __len__(self):
                return 32
            def __getitem__(self, i):
                garbage = [torch.zeros(1)]
                garbage.append(garbage)
                return np.full(2, i)

        loader = fl.DataLoader(Cycles(), batch_size=2, num_workers=16, worker_method="thread")
        stop, epochs = time.monotonic() + 4, 0
        while time.monotonic() < stop:
            assert sum(len(batch) for batch in loader) == 32
            epochs += 1
        print("epochs", epochs)
    """)
    assert _output_unless_it_hangs(script, "worker threads deadlocked reading torch's "
                                           "generator state").startswith("epochs")


@pytest.mark.skipif(torch is None, reason="the deadlock is in torch's generator state")
def test_fastloads_generator_state_reads_never_deadlock_with_the_users_own():
    """A user's thread setting torch's global state (it takes the mutex with
    the GIL held) beside fastload's reads: these keep the GIL throughout."""
    script = textwrap.dedent("""
        import gc, sys, threading, time
        sys.path.insert(0, sys.argv[1])
        import torch
        from fastload._torch import generator_state

        gc.set_threshold(1, 1, 1)
        saved = torch.random.get_rng_state()
        stop = time.monotonic() + 3

        def garbage():
            cycle = [torch.zeros(1)]
            cycle.append(cycle)

        def fastloads():
            while time.monotonic() < stop:
                garbage()
                generator_state(torch.default_generator)

        def users():
            while time.monotonic() < stop:
                garbage()
                torch.random.set_rng_state(saved)

        threads = [threading.Thread(target=fastloads), threading.Thread(target=users)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print("done")
    """)
    assert _output_unless_it_hangs(script, "fastload's read of torch's generator state "
                                           "deadlocked with the user's").strip() == "done"


def _output_unless_it_hangs(script, hang):
    """The output of ``script`` run in a subprocess with the repository's root
    as its argument; a failure saying ``hang`` when it runs past a minute (a
    deadlock holds the GIL: pytest-timeout could not stop it in-process)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        done = subprocess.run([sys.executable, "-c", script, root], capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(hang)
    assert done.returncode == 0, done.stderr
    return done.stdout


class Gated(fl.Dataset):
    """Samples of 64 KiB that wait for ``gate``: threads blocked in a
    fetch, their tasks queued behind."""

    def __init__(self, gate):
        self.gate = gate

    def __len__(self):
        return 32

    def __getitem__(self, i):
        assert self.gate.wait(30)
        return np.full(16384, i, np.float32)


@pytest.mark.timeout(60)
def test_worker_threads_take_their_slots_as_they_write():
    # NOTE [ Thread workers ]: a task queued, or one whose samples are still
    # being fetched, holds no slot; prefetch_factor 4 keeps 8 in flight.
    gate = threading.Event()
    loader = fl.DataLoader(Gated(gate), batch_size=4, num_workers=2, prefetch_factor=4,
                           worker_method="thread")
    it = iter(loader)
    pool = it._workers[0].slots.pool
    time.sleep(0.1)  # both threads wait in a fetch
    assert pool.leased == 0
    gate.set()
    got = [next(it)] + list(it)
    assert np.array_equal(np.concatenate(got)[:, 0], np.arange(32, dtype=np.float32))
    del got
    assert pool.leased == 0


@pytest.mark.parametrize("method", ["thread", "multiprocessing"])
def test_a_torch_another_thread_is_still_importing_is_left_alone(monkeypatch, method):
    # A half-imported torch (the main thread in `import torch` while worker
    # threads start or end): a worker importing torch's modules then could
    # deadlock with that import, which Python breaks by handing one side a
    # half-made module. Workers treat it as torch not imported.
    half = types.ModuleType("torch")
    half.__spec__ = importlib.machinery.ModuleSpec("torch", None)
    half.__spec__._initializing = True
    monkeypatch.setitem(sys.modules, "torch", half)
    assert torch_if_imported() is None
    loader = fl.DataLoader(fl.ArrayDataset(np.arange(8)), batch_size=2, num_workers=2,
                           worker_method=method)
    assert [batch[0].tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]


class SharedEpoch(fl.IterableDataset):
    """Keeps its epoch in a shared-memory tensor that set_epoch updates in
    place, as Hugging Face's IterableDataset does for persistent workers."""

    def __init__(self, torch):
        self.epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    def set_epoch(self, epoch):
        self.epoch.fill_(epoch)

    def __iter__(self):
        return iter([int(self.epoch) * 100 + fl.get_worker_info().id])


@pytest.mark.parametrize("method", ["thread", "multiprocessing"])
def test_persistent_workers_see_an_epoch_kept_in_shared_memory(method):
    # A thread's replica shares what a forked worker shares: torch tensors in
    # shared memory. Deep-copied, each thread kept epoch 0 for good.
    torch = pytest.importorskip("torch", reason="shared-memory torch tensors")
    dataset = SharedEpoch(torch)
    loader = fl.DataLoader(dataset, batch_size=None, num_workers=2, worker_method=method,
                           persistent_workers=True)
    seen = []
    for epoch in range(3):
        dataset.set_epoch(epoch)
        seen.append(sorted(int(x) for x in loader))
    assert seen == [[0, 1], [100, 101], [200, 201]]
