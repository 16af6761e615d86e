"""pin_memory=True: every path copies each batch into torch's page-locked
memory as it delivers it, never a slot of shared memory (NOTE [ Pinning by
copy ] in fastload._pinning)."""
import collections
import collections.abc
import gc
import threading
import time

import numpy as np
import pytest

import fastload as fl
from fastload._pinning import Pinner, PinTimedOut
from fastload_c.slab import Lease

PATHS = [dict(num_workers=0), dict(num_workers=2),
         dict(num_workers=2, worker_method="thread")]


class FakePinning:
    """Stands in for torch with an accelerator: ``pin_memory()`` returns a
    copy, which it records as page-locked. ``api``: the device functions of
    torch >= 2.7 ("index"), of torch 2.6 ("idx", torch.accelerator's first
    names), or of an older torch ("cuda": torch.cuda's, no torch.accelerator)."""

    def __init__(self, fails_for=None, seconds=0.0, api="index"):
        self.pinned = []
        self.threads = set()
        self.settings = {}  # thread name -> (intra-op threads, device index)
        owner = self

        class Accelerator:
            device = 3

            @staticmethod
            def is_available():
                return True

            @staticmethod
            def current_device_index():
                return Accelerator.device

            @staticmethod
            def set_device_index(index):
                owner.settings[threading.current_thread().name] += (index,)

        current, set_device = Accelerator.current_device_index, Accelerator.set_device_index
        if api != "index":
            del Accelerator.current_device_index, Accelerator.set_device_index
        if api == "idx":
            Accelerator.current_device_idx, Accelerator.set_device_idx = current, set_device
        if api == "cuda":
            Accelerator.current_device, Accelerator.set_device = current, set_device
            self.cuda = Accelerator
        else:
            self.accelerator = Accelerator

        class Tensor:
            def __init__(self, array):
                self.array = array

            def pin_memory(self):
                owner.threads.add(threading.current_thread().name)
                time.sleep(seconds)
                if fails_for is not None and self.array.flat[0] == fails_for:
                    raise RuntimeError(f"cannot pin the batch of sample {fails_for}")
                copy = self.array.copy()
                owner.pinned.append(copy)
                return Tensor(copy)

            def numpy(self):
                return self.array

        self.Tensor = self.from_numpy = Tensor

    def set_num_threads(self, count):
        self.settings[threading.current_thread().name] = (count,)


def pinning_with(monkeypatch, **options):
    """A FakePinning that fastload pins with in this test."""
    pinning = FakePinning(**options)
    monkeypatch.setattr("fastload._pinning.torch_or_none", lambda: pinning)
    return pinning


class Records(fl.Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return {"x": np.full((3, 5), i, np.float32), "label": i, "name": f"r{i}"}


def numeric_leaves(batch):
    return [batch["x"], batch["label"]]


def owners(array):
    """The objects an array's memory belongs to, innermost last."""
    chain = []
    while array is not None:
        chain.append(array)
        array = getattr(array, "base", None)
    return chain


def pin_threads():
    return [t for t in threading.enumerate() if t.name == "fastload-pin-memory"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", PATHS[1:], ids=["processes", "threads"])
def test_a_stopped_loader_leaves_no_copy_running_and_pins_nothing_more(monkeypatch, path):
    pinning = pinning_with(monkeypatch, seconds=0.1)
    loader = fl.DataLoader(Records(), batch_size=4, pin_memory=True, **path)
    it = iter(loader)
    next(it)
    del it  # batches still queued for pinning: given up; the thread waited for
    gc.collect()
    assert pin_threads() == []
    pinned = len(pinning.pinned)
    time.sleep(0.3)
    assert len(pinning.pinned) == pinned
    # The loader goes on, and its epoch's end stops its thread too.
    assert len(list(loader)) == 6
    assert pin_threads() == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", PATHS[1:], ids=["processes", "threads"])
def test_timeout_bounds_the_wait_for_a_pin_and_loses_no_batch(monkeypatch, path):
    pinning_with(monkeypatch, seconds=0.3)
    loader = fl.DataLoader(Records(), batch_size=6, pin_memory=True, timeout=0.1, **path)
    it = iter(loader)
    got, states = [], []
    while len(got) < 4:
        try:
            got.append(next(it))
        except RuntimeError as error:
            assert "DataLoader timed out after 0.1 seconds" in str(error)
            states.append((len(got), loader.state_dict()))
    with pytest.raises(StopIteration):
        next(it)
    assert states
    labels = [list(range(i, i + 6)) for i in range(0, 24, 6)]
    assert [batch["label"].tolist() for batch in got] == labels
    # A state taken at the timeout resumes at the batch still being pinned.
    for delivered, state in {states[0][0]: states[0], states[-1][0]: states[-1]}.values():
        resumed = fl.DataLoader(Records(), batch_size=6, **path)
        resumed.load_state_dict(state)
        assert [batch["label"].tolist() for batch in resumed] == labels[delivered:]


class SlowFirst(Records):
    def __getitem__(self, i):
        if i == 0:
            time.sleep(0.3)
        return super().__getitem__(i)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", PATHS[1:], ids=["processes", "threads"])
def test_timeout_bounds_a_whole_next_the_wait_for_the_worker_included(monkeypatch, path):
    """As torch's loop waits for its pin-memory thread once: 0.3 s for the
    worker and 0.3 s for the pin (two leaves) do not fit in a timeout of 0.4 s."""
    pinning_with(monkeypatch, seconds=0.15)
    # Two batches, one per worker: the second is pinned while the first loads.
    it = iter(fl.DataLoader(SlowFirst(), batch_size=12, pin_memory=True, timeout=0.4,
                            prefetch_factor=1, **path))
    with pytest.raises(RuntimeError, match="timed out after 0.4 seconds"):
        next(it)
    for _ in range(50):  # the next call's, once pinned
        try:
            batch = next(it)
            break
        except RuntimeError:
            pass
    assert batch["label"].tolist() == list(range(12))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", PATHS, ids=["0 workers", "processes", "threads"])
def test_every_path_delivers_copies_in_pinned_memory(monkeypatch, path):
    pinning = pinning_with(monkeypatch)
    expected = list(fl.DataLoader(Records(), batch_size=5))
    got = list(fl.DataLoader(Records(), batch_size=5, pin_memory=True, **path))
    assert len(got) == len(expected) == 5
    for batch, plain in zip(got, expected):
        assert batch["name"] == plain["name"]
        for leaf, plain_leaf in zip(numeric_leaves(batch), numeric_leaves(plain)):
            np.testing.assert_array_equal(leaf, plain_leaf)
            # The pinned copy itself, not a slot a worker writes again once
            # the batch is dropped (a GPU copy may still be reading it then).
            assert any(leaf is copy for copy in pinning.pinned)
            assert not any(isinstance(owner, Lease) for owner in owners(leaf))
    assert len(pinning.pinned) == 2 * len(got)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("api", ["index", "idx", "cuda"])
@pytest.mark.parametrize("path", PATHS[1:], ids=["processes", "threads"])
def test_workers_batches_are_pinned_on_a_thread_ahead_of_the_loop(monkeypatch, path, api):
    pinning = pinning_with(monkeypatch, api=api)
    it = iter(fl.DataLoader(Records(), batch_size=4, pin_memory=True, **path))
    next(it)
    deadline = time.monotonic() + 30
    while len(pinning.pinned) < 2 * 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # the next batch is pinned while the loop holds this one
    assert len(pinning.pinned) >= 2 * 2
    assert pinning.threads == {"fastload-pin-memory"}
    # For the device current where the loop is, not the thread's first one.
    assert pinning.settings == {"fastload-pin-memory": (1, 3)}
    assert len(list(it)) == 5


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", PATHS[1:], ids=["processes", "threads"])
def test_a_pinning_thread_that_cannot_set_its_device_fails_each_batch_not_hangs(
        monkeypatch, path):
    pinning = pinning_with(monkeypatch)

    def no_device():
        raise RuntimeError("the accelerator is gone")

    pinning.accelerator.current_device_index = no_device
    it = iter(fl.DataLoader(Records(), batch_size=5, pin_memory=True, **path))
    for _ in range(5):
        with pytest.raises(RuntimeError, match="cannot pin batches .*the accelerator is gone"):
            next(it)
    with pytest.raises(StopIteration):
        next(it)
    assert pinning.pinned == []


@pytest.mark.timeout(30)
def test_a_pinner_stopped_gives_up_what_waits_and_pins_what_comes_after_inline():
    pinning = FakePinning(seconds=0.1)
    pinner = Pinner(pinning)
    before = [pinner.submit(np.full(3, i)) for i in range(4)]
    time.sleep(0.05)  # the first is being pinned
    pinner.stop()
    assert pin_threads() == []  # waited for, its copy finished
    assert before[0].result(timeout=0).tolist() == [0, 0, 0]
    assert all(p.cancelled() for p in before[1:])
    after = pinner.submit(np.full(2, 9))
    assert after.done() and after.result().tolist() == [9, 9]  # in this thread
    assert pinning.threads == {"fastload-pin-memory", threading.current_thread().name}


@pytest.mark.timeout(30)
def test_the_wait_for_a_pin_at_the_pools_cap_is_bounded():
    # At the cap the loader waits for the oldest batch being pinned to free
    # its slot: within what is left of ``timeout`` (it waited for ever
    # before), the batch staying pending for the next wait.
    pinner = Pinner(FakePinning(seconds=0.5))
    pinned = pinner.submit(np.full(3, 7))
    with pytest.raises(PinTimedOut):
        pinner.wait_for_one(0.01)
    assert not pinned.done()
    assert pinner.wait_for_one(None)
    assert pinned.result(timeout=0).tolist() == [7, 7, 7]
    assert not pinner.wait_for_one(0.01)  # nothing left to wait for
    pinner.stop()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", PATHS, ids=["0 workers", "processes", "threads"])
def test_a_batch_that_cannot_be_pinned_raises_in_its_place(monkeypatch, path):
    pinning_with(monkeypatch, fails_for=8)  # the third batch of four samples
    it = iter(fl.DataLoader(Records(), batch_size=4, pin_memory=True, **path))
    firsts = [int(next(it)["x"][0, 0, 0]) for _ in range(2)]
    with pytest.raises(RuntimeError, match="cannot pin the batch of sample 8"):
        next(it)
    firsts += [int(batch["x"][0, 0, 0]) for batch in it]
    assert firsts == [0, 4, 12, 16, 20]


class Big(fl.Dataset):
    """Samples of 512 KiB, each filled with its index."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return np.full((128, 1024), i, np.float32)


@pytest.mark.timeout(120)
def test_at_the_pools_cap_batches_waiting_to_be_pinned_arrive_whole(monkeypatch):
    # Four slots of 1 MiB under the cap and a slow pinning thread: ready
    # batches hold their slots until pinned, later tasks get those slots
    # once they are free, and no batch is overwritten or lost.
    import fastload._memory as memory

    monkeypatch.setattr(memory, "default_max_bytes", lambda: 4 << 20)
    pinning_with(monkeypatch, seconds=0.05)
    held = list(fl.DataLoader(Big(), batch_size=1, num_workers=2, pin_memory=True))
    assert [int(batch[0, 0, 0]) for batch in held] == list(range(12))
    assert all((batch == batch[0, 0, 0]).all() for batch in held)


@pytest.mark.timeout(120)
def test_a_new_epoch_at_the_pools_cap_does_not_wait_on_batches_it_gave_up(monkeypatch):
    # Rows gathered by the main process into a 16 KiB pool, pinned slowly:
    # iter() again gives up the ready batches still to be pinned, whose
    # slots the new epoch needs at once, with no task in flight.
    import fastload._memory as memory

    monkeypatch.setattr(memory, "default_max_bytes", lambda: 16 << 10)
    pinning_with(monkeypatch, seconds=0.05)
    rows = np.arange(64 * 256, dtype=np.float32).reshape(64, 256)
    loader = fl.DataLoader(fl.ArrayDataset(rows), batch_size=4, num_workers=2,
                           pin_memory=True, persistent_workers=True)
    for _ in range(3):
        batch = next(iter(loader))
        np.testing.assert_array_equal(batch[0], rows[:4])
    assert len(list(loader)) == 16


@pytest.mark.timeout(120)
def test_iter_again_and_again_does_not_grow_the_pool_for_batches_given_up(monkeypatch):
    pinning_with(monkeypatch, seconds=0.2)
    loader = fl.DataLoader(Big(), batch_size=1, num_workers=2, pin_memory=True,
                           persistent_workers=True)
    it = iter(loader)
    next(it)
    for _ in range(15):
        it = iter(loader)
        time.sleep(0.05)
    pool = it._group.pool
    # Unpinned, the same run ends with 6 slots: 2 per worker in flight and
    # what the stale tasks of the last epoch still hold.
    assert pool.nbytes // pool.slot_size <= 8
    assert [int(batch[0, 0, 0]) for batch in it] == list(range(12))


@pytest.mark.timeout(60)
def test_a_batch_that_failed_to_pin_holds_no_slot(monkeypatch):
    pinning = pinning_with(monkeypatch, fails_for=0)
    it = iter(fl.DataLoader(Big(), batch_size=1, num_workers=2, pin_memory=True))
    deadline = time.monotonic() + 30
    while len(pinning.pinned) < 3 and time.monotonic() < deadline:
        it._dispatcher._drain()  # the answers of the 4 tasks sent, as next() would
        time.sleep(0.01)
    time.sleep(0.2)  # the last pin's slot is free just after it is recorded
    # The failure's traceback keeps its lines, not the batch's views.
    assert it.stats().slots_leased == 0
    with pytest.raises(RuntimeError, match="cannot pin the batch of sample 0"):
        next(it)
    assert [int(batch[0, 0, 0]) for batch in it] == list(range(1, 12))


class Encoding(collections.UserDict):
    """A mapping with an attribute of its own (as transformers' BatchEncoding)."""

    def __init__(self, data=None, note=""):
        super().__init__(data)
        self.note = note


class Tokens(list):
    """A list with an attribute of its own."""

    note = ""


class Pair(collections.abc.Sequence):
    """A sequence that cannot be copied item by item nor rebuilt from one."""

    def __init__(self, first, second):
        self.items = (first, second)

    def __len__(self):
        return 2

    def __getitem__(self, index):
        return self.items[index]


class Fields(collections.abc.Mapping):
    """A mapping that cannot be rebuilt from a dict."""

    def __init__(self, *, mask):
        self.fields = {"mask": mask}

    def __len__(self):
        return 1

    def __iter__(self):
        return iter(self.fields)

    def __getitem__(self, key):
        return self.fields[key]


def structured(samples):
    tokens = Tokens([np.arange(3)])
    tokens.note = "kept"
    return {
        "encoding": Encoding({"ids": np.arange(4), "text": "a b"}, note="kept"),
        "tokens": tokens,
        "frozen": Pair(np.ones(2), "b"),
        "mapping": Fields(mask=np.zeros(2, bool)),
        "pair": (np.ones(1), b"raw"),
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", PATHS, ids=["0 workers", "processes", "threads"])
def test_pinning_keeps_the_batchs_structure_as_torch_does(monkeypatch, path):
    pinning = pinning_with(monkeypatch)
    batch = next(iter(fl.DataLoader(Records(), batch_size=2, pin_memory=True,
                                    collate_fn=structured, **path)))
    # Mutable containers are shallow copies: their own attributes stay.
    assert type(batch["encoding"]) is Encoding and batch["encoding"].note == "kept"
    assert type(batch["tokens"]) is Tokens and batch["tokens"].note == "kept"
    assert batch["encoding"]["text"] == "a b" and batch["pair"][1] == b"raw"
    # What cannot be rebuilt becomes a list or a dict, as in torch.
    assert type(batch["frozen"]) is list and type(batch["mapping"]) is dict
    pinned = [batch["encoding"]["ids"], batch["tokens"][0], batch["frozen"][0],
              batch["mapping"]["mask"], batch["pair"][0]]
    assert all(any(leaf is copy for copy in pinning.pinned) for leaf in pinned)


def cuda_available():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


class Filled(fl.Dataset):
    """Sample i: 1 MiB of float32 i."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return np.full(1 << 18, i, np.float32)


@pytest.mark.skipif(not cuda_available(),
                    reason="needs torch with CUDA and an NVIDIA GPU; this machine has neither")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", PATHS, ids=["0 workers", "processes", "threads"])
def test_non_blocking_copies_to_the_gpu_read_the_batch_they_were_given(path):
    import torch

    batch_size = 4
    loader = fl.DataLoader(Filled(), batch_size=batch_size, pin_memory=True, **path)
    on_device = []
    for batch in loader:
        tensor = torch.from_numpy(batch)
        assert tensor.is_pinned()
        # Queued behind 20 ms of GPU work: the copy reads the batch after
        # the loop has dropped it and later batches were made.
        torch.cuda._sleep(40_000_000)
        on_device.append(tensor.to("cuda", non_blocking=True))
        del batch, tensor
    torch.cuda.synchronize()
    for i, got in enumerate(on_device):
        first = i * batch_size
        expected = torch.arange(first, first + batch_size, dtype=torch.float32, device="cuda")
        assert torch.equal(got, expected[:, None].expand_as(got)), f"batch {i} was overwritten"
