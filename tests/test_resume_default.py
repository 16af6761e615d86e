"""Resume of the default configuration (shuffle=True, no generator) in a
fresh process: the rest of the epoch and every later epoch are the ones the
uninterrupted run yields (NOTE [ Determinism contract ] in fastload._seed)."""
import json
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent("""
    import json, sys
    import numpy as np
    import fastload as fl

    mode, workers, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    loader = fl.DataLoader(fl.ArrayDataset(np.arange(40)), batch_size=4, shuffle=True,
                           num_workers=workers, persistent_workers=stop == "persistent")

    def rest(iterator):
        return [batch[0].tolist() for batch in iterator]

    if mode == "load":
        np.random.seed(99)  # another global state: nothing may come from it
        loader.load_state_dict(json.loads(sys.stdin.read()))
        batches = []
        for _ in range(3):
            batches += rest(iter(loader))
        print(json.dumps(batches))
        sys.exit()
    np.random.seed(5)
    batches = []
    if stop in ("two_epochs", "persistent"):
        for _ in range(2):
            rest(iter(loader))
    elif stop == "before_iter":
        pass
    elif stop == "right_after_iter":
        rest(iter(loader))
        iterator = iter(loader)
    elif stop == "mid_epoch":
        iterator = iter(loader)
        for _ in range(4):
            next(iterator)
    if mode == "save":
        print(json.dumps(loader.state_dict()))
        sys.exit()
    if stop in ("right_after_iter", "mid_epoch"):
        batches += rest(iterator)
    for _ in range(3 if stop not in ("right_after_iter", "mid_epoch") else 2):
        batches += rest(iter(loader))
    print(json.dumps(batches))
""")


def run(mode, workers, stop, stdin=None):
    result = subprocess.run([sys.executable, "-c", PROGRAM, mode, str(workers), stop],
                            input=stdin, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("stop", ["before_iter", "right_after_iter", "mid_epoch",
                                  "two_epochs", "persistent"])
@pytest.mark.parametrize("workers", [0, 2])
def test_default_shuffle_resumes_exactly_in_a_fresh_process(workers, stop):
    if stop == "persistent" and workers == 0:
        pytest.skip("persistent workers need num_workers > 0")
    uninterrupted = json.loads(run("full", workers, stop))
    state = run("save", workers, stop)
    assert json.loads(state)["generator"] is not None
    assert json.loads(run("load", workers, stop, stdin=state)) == uninterrupted
