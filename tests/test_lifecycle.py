"""Errors per batch, set-up failures, deaths and resources of worker loading:
torch's semantics, and nothing a user does grows or breaks the loader."""
import dataclasses
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from _processes import running

import fastload as fl
from fastload.errors import CollateError, ShmError, WorkerDiedError

from test_faults import Sleepy, worker_children

pytestmark = pytest.mark.usefixtures("earlier_garbage_collected")


class FailsAt(fl.Dataset):
    """Sample ``i`` is ``[i]``; the indices in ``bad`` raise ValueError."""

    def __init__(self, n, bad):
        self.n, self.bad = n, frozenset(bad)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise ValueError(f"bad sample {i}")
        return np.array([i])


def outcome(loader, epochs=1):
    result = []
    for _ in range(epochs):
        it = iter(loader)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            except ValueError as exc:
                result.append(("ValueError", re.findall(r"bad sample \d+", str(exc))))
            else:
                result.append(batch[:, 0].tolist())
    return result


N = 12
POSITIONS = {"first": [0], "middle": [5], "last": [11], "every_batch": [0, 3, 6, 9]}


@pytest.mark.parametrize("where", sorted(POSITIONS))
@pytest.mark.parametrize("workers,persistent", [(1, False), (3, False), (1, True), (3, True)])
def test_a_failing_sample_anywhere_fails_its_batch_only(where, workers, persistent):
    dataset = FailsAt(N, POSITIONS[where])
    expected = outcome(fl.DataLoader(dataset, batch_size=3), epochs=2)
    assert ("ValueError" in str(expected)) and len(expected) == 8
    loader = fl.DataLoader(dataset, batch_size=3, num_workers=workers,
                           persistent_workers=persistent)
    assert outcome(loader, epochs=2) == expected


@pytest.mark.parametrize("where", sorted(POSITIONS))
@pytest.mark.parametrize("method,in_order", [
    ("thread", True), ("thread", False), ("multiprocessing", False)])
def test_a_failing_sample_fails_its_batch_only_with_threads_or_out_of_order(
        where, method, in_order):
    # The same batches and exceptions as num_workers=0; out of order, the
    # same ones in some order.
    dataset = FailsAt(N, POSITIONS[where])
    expected = outcome(fl.DataLoader(dataset, batch_size=3), epochs=2)
    loader = fl.DataLoader(dataset, batch_size=3, num_workers=3, worker_method=method,
                           in_order=in_order, persistent_workers=True)
    got = outcome(loader, epochs=2)
    if in_order:
        assert got == expected
    else:
        assert sorted(map(repr, got)) == sorted(map(repr, expected))


class StopsAt(FailsAt):
    """Sample 2's ``__getitem__`` raises StopIteration: that batch's exception."""

    def __getitem__(self, i):
        if i == 2:
            raise StopIteration
        return np.array([i])


def stepwise(it, steps):
    """What ``steps`` calls of next() give: each batch's values, or "stop"."""
    result = []
    for _ in range(steps):
        try:
            result.append(next(it)[:, 0].tolist())
        except StopIteration:
            result.append("stop")
    return result


@pytest.mark.parametrize("kwargs", [
    {}, {"num_workers": 2}, {"num_workers": 2, "worker_method": "thread"},
    {"num_workers": 2, "persistent_workers": True},
    {"num_workers": 2, "worker_method": "thread", "persistent_workers": True}])
def test_a_map_style_datasets_stopiteration_fails_its_batch_only(kwargs):
    # torch's rule: StopIteration ends only an iterable dataset's stream.
    # From __getitem__ it is that batch's exception: a for loop ends there,
    # as torch's does, and next() goes on with the epoch, on every path.
    # Workers used to take it for the end of their stream and drop the
    # epoch's later batches of theirs, silently.
    loader = fl.DataLoader(StopsAt(8, ()), batch_size=2, **kwargs)
    it = iter(loader)
    assert stepwise(it, 2) == [[0, 1], "stop"]
    state = loader.state_dict()
    assert state["yielded"] == 2 and not state["finished"]
    assert stepwise(it, 4) == [[4, 5], [6, 7], "stop", "stop"]
    resumed = fl.DataLoader(StopsAt(8, ()), batch_size=2, **kwargs)
    resumed.load_state_dict(state)
    assert [b[:, 0].tolist() for b in resumed] == [[4, 5], [6, 7]]
    # Each new epoch has every batch of its own again.
    assert [[b[:, 0].tolist() for b in loader] for _ in range(2)] == [[[0, 1]]] * 2
    assert stepwise(iter(loader), 5) == [[0, 1], "stop", [4, 5], [6, 7], "stop"]


class RaisesOnce(fl.Sampler):
    """0..9 in order; its first epoch raises KeyError at index ``at``."""

    def __init__(self, at):
        self.at, self.epochs = at, 0

    def __iter__(self):
        self.epochs += 1
        for i in range(10):
            if i == self.at and self.epochs == 1:
                raise KeyError(f"no index {i}")
            yield i


@pytest.mark.parametrize("at", [0, 5, 9])
@pytest.mark.parametrize("kwargs", [
    {}, {"num_workers": 2}, {"num_workers": 2, "worker_method": "thread"},
    {"num_workers": 2, "persistent_workers": True},
    {"num_workers": 2, "worker_method": "thread", "persistent_workers": True}])
def test_a_sampler_that_raises_comes_after_every_batch_drawn_before_it(at, kwargs):
    # Workers draw ahead of what they deliver: the sampler's exception is
    # held until the batches drawn before it are delivered, then the epoch
    # ends there, as without workers (torch's workers lose a batch).
    loader = fl.DataLoader(Sleepy(n=10), batch_size=1, sampler=RaisesOnce(at), **kwargs)
    if at == 0 and kwargs:
        # Nothing drawn before it: workers raise it in iter(), as torch's
        # do (their first prefetch draws there).
        with pytest.raises(KeyError, match="no index 0"):
            iter(loader)
    else:
        it = iter(loader)
        delivered = [int(next(it)[0, 0]) for _ in range(at)]
        assert delivered == list(range(at))
        with pytest.raises(KeyError, match=f"no index {at}"):
            next(it)
        with pytest.raises(StopIteration):
            next(it)
    assert [int(batch[0, 0]) for batch in loader] == list(range(10))  # the next epoch


class Unsized(fl.Dataset):
    def __len__(self):
        raise TypeError("no length yet")

    def __getitem__(self, i):
        return i


class RaisesInEpoch(fl.Sampler):
    """0..7 in order, but epoch ``bad`` (counting from 1) raises at once."""

    def __init__(self, bad):
        self.bad, self.epochs = bad, 0

    def __iter__(self):
        self.epochs += 1
        if self.epochs == self.bad:
            raise KeyError(f"epoch {self.bad}")
        return iter(range(8))


@pytest.mark.parametrize("kwargs", [
    {"num_workers": 2}, {"num_workers": 2, "worker_method": "thread"}])
def test_a_first_draw_that_raises_raises_where_torchs_does(kwargs):
    # torch's BatchSampler reads the dataset's length at the first batch:
    # without workers next() raises, with workers iter() (the prefetch).
    it = iter(fl.DataLoader(Unsized(), batch_size=2))
    with pytest.raises(TypeError, match="no length yet"):
        next(it)
    with pytest.raises(TypeError, match="no length yet"):
        iter(fl.DataLoader(Unsized(), batch_size=2, **kwargs))
    # A persistent loader's later epoch too; its workers wait for the next.
    sampler = RaisesInEpoch(bad=2)
    loader = fl.DataLoader(Sleepy(n=8), batch_size=2, sampler=sampler,
                           persistent_workers=True, **kwargs)
    assert len(list(loader)) == 4
    workers = loader._iterator._workers
    with pytest.raises(KeyError, match="epoch 2"):
        iter(loader)
    assert [batch[:, 0].tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert loader._iterator._workers is workers


def test_persistent_loader_starts_fresh_workers_after_a_death():
    loader = fl.DataLoader(Sleepy(n=16, delay=0.01), batch_size=2, num_workers=2,
                           persistent_workers=True)
    it = iter(loader)
    next(it)
    os.kill(it.worker_pids[1], signal.SIGKILL)
    with pytest.raises(WorkerDiedError) as info:
        for _ in it:
            pass
    assert info.value.worker_id == 1
    assert info.value.batch is None or 0 < info.value.batch < 8
    # The epoch ended there; the next one gets a full, correct epoch.
    with pytest.raises(StopIteration):
        next(it)
    epoch = [batch[:, 0].tolist() for batch in loader]
    assert epoch == [[i, i + 1] for i in range(0, 16, 2)]
    del it, loader
    assert not worker_children()


def test_worker_died_error_names_the_batch_position_and_indices():
    class DiesAt(fl.Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            if i == 7:
                os._exit(3)
            return i

    loader = fl.DataLoader(DiesAt(), batch_size=2, num_workers=2)
    with pytest.raises(WorkerDiedError) as info:
        list(loader)
    error = info.value
    assert error.batch == 3 and error.indices == [6, 7] and error.exitcode == 3
    assert "batch 3 of the epoch" in str(error) and "[6, 7]" in str(error)


def kill_worker_one(worker_id):
    if worker_id == 1:
        os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("when", ["setting up", "idle between epochs"])
def test_a_worker_that_dies_before_it_is_ready_is_blamed_for_no_batch(when):
    # Tasks are queued to a worker before it says STARTED: it was loading
    # none of them (torch says only that it exited).
    init = kill_worker_one if when == "setting up" else None
    loader = fl.DataLoader(Sleepy(n=8), batch_size=2, num_workers=2, worker_init_fn=init,
                           persistent_workers=True)
    if when == "idle between epochs":
        it = iter(loader)
        list(it)
        os.kill(it.worker_pids[1], signal.SIGKILL)
        del it
    with pytest.raises(WorkerDiedError, match="before it was ready") as info:
        list(loader)
    assert info.value.worker_id == 1
    assert info.value.batch is None and info.value.indices is None
    assert "while loading batch" not in str(info.value)


def exceptions():
    return [
        WorkerDiedError("worker 1 died", worker_id=1, pid=123, exitcode=-9, batch=4,
                        indices=[8, 9]),
        CollateError("samples disagree", (3, 0)),
        ShmError(12, "no memory"),
        fl.InvalidArgumentError("bad"),
        fl.RingClosedError("closed"),
    ]


@pytest.mark.parametrize("exc", exceptions(), ids=lambda e: type(e).__name__)
def test_every_fastload_exception_pickles_to_an_equal_one(exc):
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is type(exc) and str(copy) == str(exc)
    assert vars(copy) == vars(exc)


def test_worker_info_is_frozen_with_torch_fields():
    info = fl.WorkerInfo(id=0, num_workers=2, seed=5, dataset=None)
    assert (info.rng, info.worker_method) == (None, "multiprocessing")
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.id = 1


class ShardedByTorch:
    """The sharding recipe of torch's IterableDataset documentation, written
    against torch.utils.data only."""

    def __init__(self, start, end):
        self.start, self.end = start, end

    def __iter__(self):
        import torch.utils.data as tud

        info = tud.get_worker_info()
        if info is None:
            return iter(range(self.start, self.end))
        per_worker = -(-(self.end - self.start) // info.num_workers)
        first = self.start + info.id * per_worker
        assert info.worker_method == "multiprocessing" and info.dataset is self
        return iter(range(first, min(first + per_worker, self.end)))


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_torch_get_worker_info_shards_a_torch_style_dataset(workers):
    torch = pytest.importorskip("torch", reason="needs torch installed")

    class Stream(ShardedByTorch, torch.utils.data.IterableDataset):
        pass

    loader = fl.DataLoader(Stream(3, 40), batch_size=4, num_workers=workers)
    seen = sorted(int(v) for batch in loader for v in batch)
    assert seen == list(range(3, 40))


def test_workers_use_one_torch_thread():
    torch = pytest.importorskip("torch", reason="needs torch installed")

    class Threads(fl.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.get_num_threads()

    assert [int(v) for b in fl.DataLoader(Threads(), batch_size=2, num_workers=2)
            for v in b] == [1] * 4


def test_prefetch_factor_zero_with_workers_is_refused():
    with pytest.raises(ValueError, match="prefetch_factor"):
        fl.DataLoader(range(8), num_workers=2, prefetch_factor=0)


class InitFails:
    def __call__(self, worker_id):
        if worker_id == 2:
            raise ValueError("worker_init_fn refused worker 2")


def test_worker_init_fn_error_is_raised_with_more_workers_than_cores():
    for _ in range(3):
        loader = fl.DataLoader(Sleepy(n=32), batch_size=2, num_workers=4,
                               worker_init_fn=InitFails())
        with pytest.raises(ValueError, match="refused worker 2") as info:
            list(loader)
        assert "in worker_init_fn" in str(info.value)
        del info
        assert not worker_children()


def test_iter_without_next_keeps_resources_bounded():
    loader = fl.DataLoader(fl.ArrayDataset(np.arange(4096.0)), batch_size=64, num_workers=2,
                           persistent_workers=True)
    it = iter(loader)
    fds, pool = len(os.listdir("/proc/self/fd")), it._group.pool.nbytes
    for _ in range(200):
        it = iter(loader)
    assert len(os.listdir("/proc/self/fd")) <= fds + 4
    assert it._group.pool.nbytes <= 2 * pool
    assert sum(1 for _ in it) == 64


class Counting(fl.IterableDataset):
    """Each worker yields its share of range(n), as torch's docs shard."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = fl.get_worker_info()
        return iter(range(info.id, self.n, info.num_workers))


@pytest.mark.parametrize("stop", ["break", "exhausted", "iterable"])
def test_an_iterators_workers_can_be_joined_as_torchs_after_it_is_gone(stop):
    # torch's iterator keeps its processes in _workers; code written against
    # it (torch's own test_partial_workers, say) joins them once the
    # iterator is deleted, and expects each to have ended cleanly.
    dataset = Counting(40) if stop == "iterable" else Sleepy(n=64)
    it = iter(fl.DataLoader(dataset, batch_size=2, num_workers=2))
    workers = it._workers
    assert [w.pid for w in workers] == it.worker_pids
    for i, _ in enumerate(it):
        if stop == "break" and i == 10:
            break
    del it
    for worker in workers:
        worker.join(10)
        assert not worker.is_alive()
        assert worker.exitcode == 0


SCRIPT_HEADER = """
import os, signal, sys
import numpy as np
import fastload as fl
"""


def run_script(body, timeout=60):
    code = SCRIPT_HEADER + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)


def test_a_child_forked_by_user_code_leaves_the_loader_alone():
    result = run_script("""
        ds = fl.ArrayDataset(np.arange(4096, dtype=np.float32).reshape(-1, 4))
        loader = fl.DataLoader(ds, batch_size=64, num_workers=2, persistent_workers=True)
        count = 0
        for epoch in range(2):
            for i, batch in enumerate(loader):
                count += 1
                if i == 3:
                    pid = os.fork()
                    if pid == 0:
                        sys.exit(0)  # runs the child's exit handlers
                    os.waitpid(pid, 0)
        print("batches", count)
    """)
    assert result.returncode == 0, result.stderr
    assert "batches 32" in result.stdout


def test_sigchld_ignored_is_refused_with_a_clear_error():
    result = run_script("""
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        ds = fl.ArrayDataset(np.arange(64))
        for attempt in range(2):
            try:
                list(fl.DataLoader(ds, batch_size=8, num_workers=2))
            except RuntimeError as exc:
                print("refused:", exc)
        print("in-process", len(list(fl.DataLoader(ds, batch_size=8))))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("refused:") == 2 and "SIG_IGN" in result.stdout
    assert "in-process 8" in result.stdout


@pytest.mark.parametrize("context", ["fork", "forkserver"])
@pytest.mark.parametrize("in_thread", [False, True])
def test_workers_die_within_a_second_of_their_parent(context, in_thread, tmp_path):
    # The parent is SIGKILLed while its workers sit in a long __getitem__.
    # The dataset is in a module of its own: forkserver workers import it.
    (tmp_path / "slow_dataset.py").write_text(textwrap.dedent("""
        import time
        import fastload as fl
        class Slow(fl.Dataset):
            def __len__(self):
                return 8
            def __getitem__(self, i):
                time.sleep(60)
                return i
    """))
    script = f"""
        import threading, time
        from slow_dataset import Slow
        def run():
            it = iter(fl.DataLoader(Slow(), batch_size=1, num_workers=2,
                                    multiprocessing_context={context!r}))
            print(" ".join(map(str, it.worker_pids)), flush=True)
            next(it)
        if {in_thread}:
            threading.Thread(target=run, daemon=True).start()
            time.sleep(60)
        else:
            run()
    """
    parent = subprocess.Popen([sys.executable, "-c", SCRIPT_HEADER + textwrap.dedent(script)],
                              stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2
        time.sleep(0.3)  # the workers are inside __getitem__
        # Killed and not reaped yet (a zombie, as while its own parent is
        # busy): it is dead to its workers all the same.
        os.kill(parent.pid, signal.SIGKILL)
        killed = time.monotonic()
        alive = pids
        while alive and time.monotonic() - killed < 5:
            alive = [p for p in pids if running(p)]
            time.sleep(0.05)
        # One second is the promise; 5 s bounds the test on a busy machine.
        assert not alive, f"workers {alive} outlived their parent"
    finally:
        parent.kill()
        parent.wait()
        for pid in pids if "pids" in locals() else []:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class OneSlowSample(fl.Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        if i == 0:
            time.sleep(2.0)
        return i


def test_in_order_false_routes_work_away_from_a_stalled_worker():
    loader = fl.DataLoader(OneSlowSample(), batch_size=1, num_workers=2, in_order=False)
    delivered = [int(batch[0]) for batch in loader]
    assert sorted(delivered) == list(range(24))
    # Only the batch queued behind the slow one before it stalled may wait
    # for it (as in torch); everything else goes to the idle worker.
    assert len(delivered) - 1 - delivered.index(0) <= 1, delivered


class SlowSecondShard(fl.IterableDataset):
    """Worker 0 yields 0..4; worker 1 yields 5..9, stalling before 5."""

    def __iter__(self):
        info = fl.get_worker_info()
        start = 5 * info.id
        for i in range(start, start + 5):
            if i == 5:
                time.sleep(1.0)
            yield i


@pytest.mark.parametrize("method", ["multiprocessing", "thread"])
def test_in_order_false_lets_an_iterable_datasets_other_workers_go_on(method):
    """As torch (torchdata's test_out_of_order_iterable_ds): the idle
    worker's stream is not held behind tasks queued on the stalled one."""
    loader = fl.DataLoader(SlowSecondShard(), batch_size=1, num_workers=2, in_order=False,
                           worker_method=method)
    assert [int(batch[0]) for batch in loader] == list(range(10))


class Recorder:
    """A resource whose release is recorded; ``fail`` makes a call raise."""

    def __init__(self, log, name, fail=None):
        self.log, self.name, self.fail = log, name, fail
        self.exitcode = 0

    def _call(self, what, exc=KeyboardInterrupt):
        self.log.append(f"{self.name}.{what}")
        if self.fail == what:
            raise exc(f"{self.name}.{what} interrupted")

    def close(self):
        self._call("close")

    def join(self, timeout=None):
        self._call("join")


STEPS = ["task.close", "result.close", "worker.join", "socket.close"]


@pytest.mark.parametrize("interrupted", STEPS)
def test_an_interrupted_shutdown_step_keeps_the_others(interrupted):
    from fastload._worker_group import _shutdown

    log = []
    name, what = interrupted.split(".")
    make = lambda n: Recorder(log, n, what if n == name else None)  # noqa: E731
    with pytest.raises(KeyboardInterrupt, match=interrupted):
        _shutdown([make("worker")], [make("task")], [make("result")], [make("socket")],
                  doorbell=None, sigchld=False)
    assert set(STEPS) <= set(log)  # every release ran, the interrupted one too


def test_kept_batches_cost_no_descriptor_under_a_low_rlimit_nofile():
    result = run_script("""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        class Dicts(fl.Dataset):
            def __len__(self):
                return 200
            def __getitem__(self, i):
                return {f"k{j}": np.full(64, i, np.float32) for j in range(32)}
        kept = list(fl.DataLoader(Dicts(), batch_size=2, num_workers=4))
        assert [int(b["k0"][0, 0]) for b in kept] == list(range(0, 200, 2))
        print("kept", len(kept), "fds", len(os.listdir("/proc/self/fd")))
    """, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "kept 100" in result.stdout


class InitAlwaysFails:
    def __call__(self, worker_id):
        raise ValueError("no worker may start")


@pytest.mark.timing
def test_a_set_up_failure_is_raised_within_a_second_and_leaves_nothing_running():
    def attempt():
        loader = fl.DataLoader(Sleepy(n=8), batch_size=2, num_workers=2,
                               worker_init_fn=InitAlwaysFails())
        started = time.monotonic()
        with pytest.raises(ValueError, match="no worker may start"):
            next(iter(loader))
        return time.monotonic() - started

    assert min(attempt() for _ in range(3)) < 1.0  # best of three: a busy machine stalls one
    assert not worker_children()


@pytest.mark.parametrize("method", ["multiprocessing", "thread"])
def test_a_forked_child_makes_workers_of_its_own_and_leaves_the_parents_alone(method):
    # A child forked mid-epoch inherits the loader and its iterator, whose
    # workers serve the parent (processes) or did not survive the fork
    # (threads). The inherited iterator says so; the loader's next iter()
    # starts the child's own workers; the parent's epoch goes on untouched
    # (a child that took the parent's results left the parent waiting).
    loader = fl.DataLoader(list(range(24)), batch_size=2, num_workers=2,
                           persistent_workers=True, worker_method=method, timeout=30)
    it = iter(loader)
    got = [next(it).tolist() for _ in range(3)]
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery past this point
        code = 1
        try:
            try:
                next(it)
            except RuntimeError as exc:
                if "forked this one" in str(exc):
                    code = 2
            if code == 2 and [b.tolist() for b in loader] == [[i, i + 1] for i in range(0, 24, 2)]:
                code = 0
        finally:
            os._exit(code)
    got += [b.tolist() for b in it]
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert got == [[i, i + 1] for i in range(0, 24, 2)]
    assert [b.tolist() for b in loader] == got  # the parent's workers, once more
