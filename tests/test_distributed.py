"""DistributedSampler across real ranks, rank discovery, the per-rank batch
count, and mid-epoch resume on every rank."""
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastload as fl
from fastload.distributed import discover_rank_and_world_size

from _launch import REPO, clean_env, finish, free_port

# --- two real ranks over torch.distributed -------------------------------------


def global_order(shares):
    """The padded epoch order the ranks' shares were cut from: rank r holds
    every len(shares)-th entry starting at r."""
    replicas = len(shares)
    return [shares[i % replicas][i // replicas] for i in range(replicas * len(shares[0]))]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """What each of two gloo ranks all_gathered (see _distributed_rank.py)."""
    torch = pytest.importorskip("torch", reason="the multi-process test runs torch.distributed")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch build has no torch.distributed with the gloo backend")
    out = tmp_path_factory.mktemp("ranks")
    port = free_port()
    ranks = [
        subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "_distributed_rank.py"), str(rank), "2",
             str(port), str(out / f"rank{rank}.json")],
            # Decoys: a sampler reading SLURM_* instead of the process group
            # would find rank 1 - rank of 5.
            env=clean_env(SLURM_PROCID=str(1 - rank), SLURM_NTASKS="5", GLOO_SOCKET_IFNAME="lo"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in range(2)]
    outputs = finish(ranks, timeout=90)
    for rank, (process, output) in enumerate(zip(ranks, outputs)):
        assert process.returncode == 0, f"rank {rank} failed:\n{output}"
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.timeout(120)
def test_ranks_gathered_the_same_view(two_ranks):
    assert two_ranks[0] == two_ranks[1]
    assert [report["rank"] for report in two_ranks[0]] == [0, 1]


@pytest.mark.timeout(120)
def test_sampler_found_rank_and_world_size_in_the_process_group(two_ranks):
    # Not the decoy SLURM_PROCID/SLURM_NTASKS: torch.distributed comes first.
    assert [report["discovered"] for report in two_ranks[0]] == [[0, 2], [1, 2]]


@pytest.mark.timeout(120)
def test_real_ranks_partition_and_pad_like_torch(two_ranks):
    reports = two_ranks[0]
    n = 23
    orders = []
    for epoch in range(2):
        shares = [report["epochs"][epoch] for report in reports]
        for report, share in zip(reports, shares):
            assert len(share) == report["torch_num_samples"] == 12
        order = global_order(shares)
        padding = len(order) - n
        assert padding == reports[0]["torch_total_size"] - n == 1
        # Disjoint and covering: the first n entries are a permutation of the
        # dataset; the padding repeats the order from its start, as torch's.
        assert sorted(order[:n]) == list(range(n))
        assert order[n:] == order[:padding]
        assert len(set(shares[0]) & set(shares[1])) == padding
        # The loader with two workers delivered exactly the sampler's order.
        for rank, share in enumerate(shares):
            sampler = fl.DistributedSampler(range(n), 2, rank, seed=7)
            sampler.set_epoch(epoch)
            assert share == list(sampler)
        orders.append(order)
    assert orders[0] != orders[1]  # set_epoch gave each epoch its own permutation
    for report in reports:
        assert report["ours_unshuffled"] == report["torch_unshuffled"]


@pytest.mark.timeout(120)
def test_real_ranks_agree_on_the_epoch_length(two_ranks):
    for report in two_ranks[0]:
        assert report["batches_seen"] == [3, 3]
        assert report["len_loader"] == report["batches_per_rank"] == 3


@pytest.mark.timeout(120)
def test_real_ranks_resume_mid_epoch(two_ranks):
    reports = two_ranks[0]
    for report in reports:
        assert report["resume_rest"] == report["resume_expected_rest"]
        assert len(report["resume_head"]) == 8 and report["resumed_sampler_epoch"] == 2
    shares = [report["resume_head"] + report["resume_rest"] for report in reports]
    assert sorted(set(global_order(shares))) == list(range(23))


# --- discovery from the environment and jax, without torch.distributed ---------

FAKE_JAX = """
import sys, types
jax = types.ModuleType("jax")
jax.distributed = types.ModuleType("jax.distributed")
{setup}
sys.modules["jax"] = jax
"""
# jax.distributed.is_initialized() and the jax before it, where only the
# distributed client's presence says so.
JAX_INITIALISED = FAKE_JAX.format(setup=(
    "jax.distributed.is_initialized = lambda: True\n"
    "jax.process_index = lambda: 3\njax.process_count = lambda: 5"))
OLD_JAX_INITIALISED = FAKE_JAX.format(setup=(
    "state = types.ModuleType('jax._src.distributed')\n"
    "state.global_state = types.SimpleNamespace(client=object())\n"
    "sys.modules['jax._src.distributed'] = state\n"
    "jax.process_index = lambda: 1\njax.process_count = lambda: 2"))
# An uninitialised jax must not even be asked for its process count, which
# would start its backends.
JAX_UNINITIALISED = FAKE_JAX.format(setup=(
    "jax.distributed.is_initialized = lambda: False\n"
    "def claimed(): raise AssertionError('asked an uninitialised jax')\n"
    "jax.process_index = jax.process_count = claimed"))

DISCOVER = """
import json
{prelude}
import fastload as fl
try:
    sampler = fl.DistributedSampler(range(12), shuffle=False)
    print(json.dumps([sampler.rank, sampler.num_replicas, list(sampler)]))
except Exception as error:
    print(json.dumps([type(error).__name__, str(error)]))
"""


def discover_in_subprocess(prelude: str = "", **variables: str):
    result = subprocess.run(
        [sys.executable, "-c", DISCOVER.format(prelude=prelude)], env=clean_env(**variables),
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("prelude, variables, expected", [
    ("", {"RANK": "1", "WORLD_SIZE": "3"}, [1, 3, [1, 4, 7, 10]]),
    ("", {"SLURM_PROCID": "2", "SLURM_NTASKS": "4"}, [2, 4, [2, 6, 10]]),
    # torchrun inside srun: RANK numbers the processes, SLURM_PROCID the nodes.
    ("", {"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "1", "SLURM_NTASKS": "4"},
     [0, 2, [0, 2, 4, 6, 8, 10]]),
    (JAX_INITIALISED, {}, [3, 5, [3, 8, 1]]),  # 12 indices padded to 15
    (OLD_JAX_INITIALISED, {}, [1, 2, [1, 3, 5, 7, 9, 11]]),
    (JAX_INITIALISED, {"SLURM_PROCID": "0", "SLURM_NTASKS": "6"}, [0, 6, [0, 6]]),
], ids=["torchrun", "slurm", "rank_over_slurm", "jax", "older_jax", "env_over_jax"])
def test_discovery_without_torch_distributed(prelude, variables, expected):
    assert discover_in_subprocess(prelude, **variables) == expected


@pytest.mark.parametrize("prelude, variables, message", [
    ("", {}, "Pass num_replicas= and rank= explicitly"),
    (JAX_UNINITIALISED, {}, "jax.distributed is not initialised"),
    ("", {"RANK": "1"}, "RANK is set in the environment but WORLD_SIZE is not"),
    ("", {"SLURM_NTASKS": "4"}, "SLURM_NTASKS is set in the environment but SLURM_PROCID"),
    ("", {"RANK": "one", "WORLD_SIZE": "2"}, "RANK='one' is not an integer"),
    ("", {"RANK": "2", "WORLD_SIZE": "2"}, "Invalid rank 2, rank should be in the interval [0, 1]"),
], ids=["nothing_set", "jax_uninitialised", "rank_alone", "slurm_ntasks_alone", "not_a_number",
        "rank_out_of_range"])
def test_discovery_failures_say_what_to_do(prelude, variables, message):
    error_type, text = discover_in_subprocess(prelude, **variables)
    assert error_type == "ValueError" and message in text


def test_discovery_with_torch_imported_but_no_process_group():
    pytest.importorskip("torch", reason="checks that an uninitialised torch.distributed is passed over")
    prelude = "import torch.distributed"
    assert discover_in_subprocess(prelude, RANK="1", WORLD_SIZE="2") == [1, 2, [1, 3, 5, 7, 9, 11]]


def test_discovery_fills_only_what_was_not_given(monkeypatch, no_distributed_env):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    assert discover_rank_and_world_size() == (3, 4)
    assert fl.DistributedSampler(range(8), num_replicas=8).rank == 3
    with pytest.raises(ValueError, match="Invalid rank 3"):
        fl.DistributedSampler(range(8), num_replicas=2)


# --- the sampler's arguments and partition, against torch ----------------------


@pytest.fixture(scope="module")
def td():
    return pytest.importorskip("torch.utils.data", reason="torch's sampler is the reference")


@pytest.mark.parametrize("kwargs", [
    {"num_replicas": 0, "rank": 0}, {"num_replicas": -2, "rank": 0},
    {"num_replicas": 2, "rank": 2}, {"num_replicas": 2, "rank": -1},
])
def test_out_of_range_arguments_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        fl.DistributedSampler(range(8), **kwargs)


# torch takes these and fails at the first iteration (TypeError, or
# RuntimeError from manual_seed for the seed), or for True runs as if given 1;
# here they are refused when the sampler is built, with TypeError.
@pytest.mark.parametrize("kwargs", [
    {"num_replicas": 2.0, "rank": 0}, {"num_replicas": True, "rank": 0},
    {"num_replicas": 2, "rank": "0"}, {"num_replicas": 2, "rank": 1.0},
    {"num_replicas": 2, "rank": 0, "seed": 1.5},
])
def test_non_integer_arguments_are_refused_up_front(kwargs):
    with pytest.raises(TypeError):
        fl.DistributedSampler(range(8), **kwargs)


def test_out_of_range_arguments_match_torchs_errors(td):
    for kwargs in ({"num_replicas": 0, "rank": 0}, {"num_replicas": 3, "rank": 3},
                   {"num_replicas": 3, "rank": -1}):
        with pytest.raises(ValueError) as theirs:
            td.DistributedSampler(range(8), **kwargs)
        with pytest.raises(ValueError) as ours:
            fl.DistributedSampler(range(8), **kwargs)
        if kwargs["num_replicas"] > 0:  # torch's message for 0 replicas names a rank
            assert str(ours.value) == str(theirs.value)


def test_set_epoch_needs_an_integer():
    with pytest.raises(TypeError):
        fl.DistributedSampler(range(8), 2, 0).set_epoch(1.5)


@given(n=st.integers(0, 40), replicas=st.integers(1, 12), drop_last=st.booleans())
def test_property_unshuffled_shards_and_lengths_equal_torchs(td, n, replicas, drop_last):
    for rank in range(replicas):
        ours = fl.DistributedSampler(range(n), replicas, rank, False, drop_last=drop_last)
        theirs = td.DistributedSampler(range(n), replicas, rank, False, drop_last=drop_last)
        assert list(ours) == list(theirs)
        assert (len(ours), ours.num_samples, ours.total_size) == (
            len(theirs), theirs.num_samples, theirs.total_size)


@pytest.mark.parametrize("n, replicas, seed", [(2, 7, 0), (3, 10, 4), (1, 4, 9), (5, 16, 2)])
def test_padding_longer_than_the_dataset_repeats_the_permutation(n, replicas, seed):
    order = global_order([list(fl.DistributedSampler(range(n), replicas, r, seed=seed))
                          for r in range(replicas)])
    assert sorted(order[:n]) == list(range(n))
    assert order == [order[i % n] for i in range(len(order))]


def test_negative_seed_wraps_like_torchs_manual_seed():
    assert list(fl.DistributedSampler(range(9), 1, 0, seed=-1)) == list(
        np.random.default_rng(2**64 - 1).permutation(9))


def test_shrunken_dataset_is_padded_and_grown_one_refused():
    data = list(range(10))
    padded = fl.DistributedSampler(data, 2, 1, shuffle=False)
    del data[7:]
    assert list(padded) == [1, 3, 5, 0, 2]  # torch's behaviour for a shrunken dataset
    data.extend(range(7, 14))
    cut = fl.DistributedSampler(list(range(10)), 2, 0, shuffle=False, drop_last=True)
    cut.dataset = data
    assert list(cut) == [0, 2, 4, 6, 8]
    with pytest.raises(RuntimeError, match="has 14 samples but had 10"):
        list(padded)
    data.clear()
    with pytest.raises(RuntimeError, match="has 0 samples but had 10"):
        list(cut)


# --- how many batches each rank yields ------------------------------------------


@given(n=st.integers(0, 60), replicas=st.integers(1, 6), batch_size=st.integers(1, 9),
       drop_last=st.booleans(), sampler_drop_last=st.booleans())
def test_property_batches_per_rank_is_what_every_rank_yields(n, replicas, batch_size, drop_last,
                                                             sampler_drop_last):
    expected = fl.batches_per_rank(n, replicas, batch_size, drop_last, sampler_drop_last)
    for rank in range(replicas):
        sampler = fl.DistributedSampler(range(n), replicas, rank, seed=1,
                                        drop_last=sampler_drop_last)
        loader = fl.DataLoader(np.arange(n), batch_size=batch_size, sampler=sampler,
                               drop_last=drop_last)
        assert len(loader) == len(list(loader)) == expected


@pytest.mark.parametrize("args, expected", [
    ((10, 4, 2), 2),        # 3 indices per rank (2 padded): batches of 2 and 1
    ((10, 4, 2, True), 1),  # the short batch dropped
    ((10, 4, 2, False, True), 1),  # 2 indices per rank (2 cut)
    ((0, 3, 8), 0),
    ((5, 8, 1, False, True), 0),  # fewer samples than ranks, tail cut: nothing
])
def test_batches_per_rank_examples(args, expected):
    assert fl.batches_per_rank(*args) == expected


@pytest.mark.parametrize("args, error", [
    ((-1, 2, 4), ValueError), ((10, 0, 4), ValueError), ((10, 2, 0), ValueError),
    ((10.0, 2, 4), TypeError), ((10, 2, None), TypeError),
])
def test_batches_per_rank_rejects_bad_arguments(args, error):
    with pytest.raises(error):
        fl.batches_per_rank(*args)


# --- resume, per rank -------------------------------------------------------------

N, REPLICAS, BATCH = 23, 3, 4  # 8 indices per rank (one padded): batches of 4 and 4


def rank_loader(rank, workers=0, drop_last=False):
    sampler = fl.DistributedSampler(np.arange(N), REPLICAS, rank, seed=5)
    return sampler, fl.DataLoader(fl.ArrayDataset(np.arange(N)), batch_size=BATCH,
                                  sampler=sampler, num_workers=workers, drop_last=drop_last)


def values(batches):
    return [b[0].tolist() for b in batches]


@pytest.mark.parametrize("rank", range(REPLICAS))
@pytest.mark.parametrize("stop", [0, 1, 2])
def test_loader_resumes_each_rank_mid_epoch(rank, stop):
    sampler, loader = rank_loader(rank)
    sampler.set_epoch(3)
    iterator = iter(loader)
    head = values(next(iterator) for _ in range(stop))
    state = json.loads(json.dumps(loader.state_dict()))
    rest = values(iterator)
    sampler.set_epoch(4)
    next_epoch = values(loader)

    new_sampler, resumed = rank_loader(rank)
    resumed.load_state_dict(state)
    new_sampler.set_epoch(3)  # the training loop's own set_epoch
    assert head + values(resumed) == head + rest
    new_sampler.set_epoch(4)
    assert values(resumed) == next_epoch


def test_loader_with_workers_resumes_each_rank():
    for rank in range(REPLICAS):
        _, loader = rank_loader(rank, workers=2)
        iterator = iter(loader)
        head = values([next(iterator)])
        state = loader.state_dict()
        rest = values(iterator)
        _, resumed = rank_loader(rank, workers=2)
        resumed.load_state_dict(state)
        assert values(resumed) == rest
        assert head + rest == [list(fl.DistributedSampler(range(N), REPLICAS, rank, seed=5))[:4],
                               list(fl.DistributedSampler(range(N), REPLICAS, rank, seed=5))[4:]]


def test_resume_fetches_only_what_is_left():
    fetched = []

    class Recording(fl.Dataset):
        def __len__(self):
            return N

        def __getitem__(self, index):
            fetched.append(index)
            return np.int64(index)

    def make():
        sampler = fl.DistributedSampler(Recording(), REPLICAS, 1, seed=5)
        return fl.DataLoader(Recording(), batch_size=2, sampler=sampler)

    loader = make()
    iterator = iter(loader)
    next(iterator), next(iterator), next(iterator)
    state = loader.state_dict()
    rest = sum((b.tolist() for b in iterator), [])
    fetched.clear()
    resumed = make()
    resumed.load_state_dict(state)
    assert sum((b.tolist() for b in resumed), []) == rest == fetched


def test_state_taken_after_an_epoch_honours_the_next_set_epoch():
    sampler, loader = rank_loader(0)
    sampler.set_epoch(0)
    list(loader)
    state = loader.state_dict()
    assert state["finished"]
    sampler.set_epoch(1)
    want = values(loader)

    new_sampler, resumed = rank_loader(0)
    resumed.load_state_dict(state)
    new_sampler.set_epoch(1)
    assert values(resumed) == want


@pytest.mark.parametrize("set_epoch", [True, False])
def test_state_taken_before_the_first_batch_of_an_epoch(set_epoch):
    sampler, loader = rank_loader(2)
    list(loader)
    if set_epoch:
        sampler.set_epoch(1)
    iterator = iter(loader)
    state = loader.state_dict()
    want = values(iterator)
    new_sampler, resumed = rank_loader(2)
    resumed.load_state_dict(state)
    assert values(resumed) == want and len(want) == 2


@pytest.mark.parametrize("taken", [0, 1])
def test_a_state_taken_after_an_epoch_was_left_early_starts_the_new_epoch(taken):
    """The batch sampler sets the distributed sampler's iteration up at
    iter(), as the sampler itself does: a state taken before the new
    epoch's first snapshot is the new iteration's, not the left one's."""
    def run(loader, interrupt):
        iterator = iter(loader)
        next(iterator), next(iterator)
        del iterator  # the epoch left early
        iterator = iter(loader)
        for _ in range(taken):
            next(iterator)
        return loader.state_dict() if interrupt else values(iterator) + values(loader)

    want = run(rank_loader(1)[1], False)
    resumed = rank_loader(1)[1]
    resumed.load_state_dict(json.loads(json.dumps(run(rank_loader(1)[1], True))))
    assert values(resumed) + values(resumed) == want
    assert len(want) == 2 * len(resumed) - taken


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_after_the_last_index_runs_the_sampler_out_on_resume(workers):
    """batch_size=None, a state after the last index but before the
    StopIteration: the resumed loader's epoch is empty, and a state taken
    after it describes a fresh epoch, whose indices all come."""
    def make():
        sampler = fl.DistributedSampler(np.arange(N), REPLICAS, 1, seed=5)
        return fl.DataLoader(fl.ArrayDataset(np.arange(N)), batch_size=None, sampler=sampler,
                             num_workers=workers)

    saved = make()
    iterator = iter(saved)
    for _ in range(len(saved)):
        next(iterator)
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(saved.state_dict())))
    assert list(resumed) == []
    again = make()
    again.load_state_dict(json.loads(json.dumps(resumed.state_dict())))
    assert len(list(again)) == len(saved)


def test_sampler_state_follows_set_epoch_and_runs_out_to_a_fresh_epoch():
    sampler = fl.DistributedSampler(range(N), REPLICAS, 0, seed=5)
    iterator = iter(sampler)
    next(iterator)
    assert sampler.state_dict()["yielded"] == 1
    list(iterator)
    # Ran out: the next iteration is epoch 0 again, from its start.
    assert sampler.state_dict()["yielded"] == 0
    iterator = iter(sampler)
    next(iterator)
    sampler.set_epoch(1)  # the position belongs to epoch 0, not to the next iteration
    state = sampler.state_dict()
    assert (state["epoch"], state["yielded"]) == (1, 0)


def test_loaded_position_waits_for_its_epoch():
    sampler = fl.DistributedSampler(range(N), REPLICAS, 1, seed=5)
    sampler.set_epoch(6)
    full = list(sampler)
    state = {**sampler.state_dict(), "yielded": 5}

    resumed = fl.DistributedSampler(range(N), REPLICAS, 1, seed=5)
    resumed.load_state_dict(state)
    assert resumed.epoch == 6 and resumed.state_dict()["yielded"] == 5
    assert list(resumed) == full[5:]

    moved_on = fl.DistributedSampler(range(N), REPLICAS, 1, seed=5)
    moved_on.load_state_dict(state)
    moved_on.set_epoch(7)  # another epoch starts from its beginning
    assert moved_on.state_dict()["yielded"] == 0 and len(list(moved_on)) == 8


def test_a_state_fits_every_rank_of_the_same_layout():
    ranks = [fl.DistributedSampler(range(N), REPLICAS, r, seed=5) for r in range(REPLICAS)]
    iterator = iter(ranks[0])
    for _ in range(3):
        next(iterator)
    state = ranks[0].state_dict()
    for rank, sampler in enumerate(ranks):
        full = list(fl.DistributedSampler(range(N), REPLICAS, rank, seed=5))
        sampler.load_state_dict(state)
        assert list(sampler) == full[3:]


@pytest.mark.parametrize("change, key", [
    ({"num_replicas": 4}, "num_replicas"), ({"seed": 6}, "seed"), ({"shuffle": False}, "shuffle"),
    ({"drop_last": True}, "drop_last"),
])
def test_state_of_another_layout_is_refused(change, key):
    arguments = {"num_replicas": REPLICAS, "rank": 0, "seed": 5} | change
    state = fl.DistributedSampler(range(N), **arguments).state_dict()
    with pytest.raises(ValueError, match=f"{key} is"):
        fl.DistributedSampler(range(N), REPLICAS, 0, seed=5).load_state_dict(state)
