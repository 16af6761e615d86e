"""Resume, as a property: for generated sampler configurations, stop points,
worker counts and persistence, with and without a generator, a loader built
in a fresh process (numpy's global RNG elsewhere) that loads the state, sent
as JSON, delivers exactly what the uninterrupted run delivers next: the rest
of the epoch and the epoch after it (NOTE [ Resume contract ] in fastload._checkpoint)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _resume_configs import Rows, batches, make_loader
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastload as fl

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def fresh_process():
    """A process that never ran the uninterrupted loader: each state is
    resumed there, from JSON, as a restarted training job would."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")]))
    server = subprocess.Popen([sys.executable, str(TESTS / "_resume_configs.py")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=env)

    def resume(**request):
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        answer = server.stdout.readline()
        assert answer, f"the resuming process exited with {server.wait()}"
        return json.loads(answer)

    yield resume
    server.stdin.close()
    server.wait(timeout=30)


configs = st.fixed_dictionaries({
    "sampler": st.sampled_from(["sequential", "shuffle", "replacement", "num_samples",
                                "subset", "weighted", "distributed", "custom"]),
    "generator": st.sampled_from([None, 7]),
    "batch_size": st.integers(1, 5),
    "drop_last": st.booleans(),
    "batch_sampler": st.booleans(),
})
# Where the state is taken: before iter(); after iter() and k batches (k=0:
# right after iter()); "end": every batch taken, StopIteration not seen;
# "after": after the StopIteration; epochs before that.
stops = st.tuples(st.integers(0, 2), st.sampled_from(["before", "k", "end", "after"]),
                  st.integers(0, 3))


@pytest.mark.timeout(600)
@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(configs, stops, st.sampled_from([0, 2]), st.booleans())
def test_a_resumed_loader_goes_on_as_the_uninterrupted_run(fresh_process, config, stop,
                                                           workers, persistent):
    epochs_before, where, k = stop

    def run(loader, interrupt):
        """Up to the stop point, then (interrupt) the state, or the rest of
        that epoch and one more epoch."""
        for _ in range(epochs_before):
            batches(iter(loader))
        if where == "before":
            if interrupt:
                return loader.state_dict()
            return batches(iter(loader)) + batches(iter(loader))
        it = iter(loader)
        taken, over = 0, False
        limit = k if where == "k" else len(loader)
        while taken < limit and not over:
            over = next(it, None) is None
            taken += 1
        if where == "after":
            over = next(it, None) is None
            assert over
        if interrupt:
            return loader.state_dict()
        if over:  # the epoch is over: the next two follow
            return batches(iter(loader)) + batches(iter(loader))
        return batches(it) + batches(iter(loader))

    np.random.seed(11)
    expected = run(make_loader(config, workers, persistent), interrupt=False)
    np.random.seed(11)
    state = json.loads(json.dumps(run(make_loader(config, workers, persistent), True)))
    got = fresh_process(config=config, workers=workers, persistent=persistent, state=state,
                        global_seed=99)
    assert got == expected


@pytest.mark.parametrize("workers", [0, 2])
def test_three_save_and_load_cycles_inside_an_epoch_equal_one_run(workers):
    def make():
        return fl.DataLoader(Rows(), batch_size=2, shuffle=True, num_workers=workers)

    np.random.seed(3)
    loader = make()
    expected = batches(iter(loader)) + batches(iter(loader))
    np.random.seed(3)
    loader, got = make(), []
    for cycle in range(3):
        it = iter(loader)
        got += [next(it).tolist() for _ in range(2 + cycle)]
        state = json.loads(json.dumps(loader.state_dict()))
        np.random.seed(100 + cycle)  # as in a fresh process
        loader = make()
        loader.load_state_dict(state)
    got += batches(iter(loader)) + batches(iter(loader))
    assert got == expected
