"""States recorded and compared as values (NOTE [ Recorded states ])."""
import numpy as np
import pytest

from fastload._state_values import Recorder, same_state, snapshot


def test_a_snapshot_does_not_change_with_what_made_it():
    kept = {"order": np.arange(4), "seen": [1, 2], "nested": {"count": 3}}
    copied = snapshot(kept)
    kept["order"][0] = 9
    kept["seen"].append(3)
    kept["nested"]["count"] = 4
    assert copied["order"].tolist() == [0, 1, 2, 3]
    assert copied["seen"] == [1, 2] and copied["nested"] == {"count": 3}


def test_a_snapshot_copies_tensors_and_keeps_what_cannot_be_copied():
    torch = pytest.importorskip("torch")
    tensor = torch.zeros(3)
    copied = snapshot({"rng": tensor})
    tensor += 1
    assert copied["rng"].tolist() == [0.0, 0.0, 0.0]
    lock = __import__("threading").Lock()
    assert snapshot(lock) is lock


class Counting:
    """A state_dict() that returns the dict it counts in, or a new one."""

    def __init__(self, fresh):
        self.fresh, self.kept, self.returned = fresh, {"count": 0}, None

    def state_dict(self):
        self.returned = dict(self.kept) if self.fresh else self.kept
        return self.returned


def test_a_recorder_copies_a_state_its_maker_keeps_updating():
    source = Counting(fresh=False)
    record = Recorder(source.state_dict)
    first = record()
    source.kept["count"] = 1
    assert first == {"count": 0} and record() == {"count": 1}


def test_a_recorder_keeps_a_state_made_anew_each_time_as_returned():
    source = Counting(fresh=True)
    record = Recorder(source.state_dict)
    record()
    assert record() is source.returned  # no copy made per batch


@pytest.mark.parametrize("first,second,same", [
    ({"a": np.arange(3)}, {"a": np.arange(3)}, True),
    ({"a": np.arange(3)}, {"a": np.arange(3.0)}, False),
    (np.array([np.arange(2), np.arange(3)], dtype=object),
     np.array([np.arange(2), np.arange(3)], dtype=object), True),
    ([1, (2, "x")], [1, (2, "x")], True),
    ([1, (2, "x")], [1, [2, "x"]], False),
])
def test_states_compare_by_value(first, second, same):
    assert same_state(first, second) is same


def test_states_that_cannot_be_compared_are_not_the_same():
    torch = pytest.importorskip("torch")
    meta = torch.empty(3, device="meta")
    assert same_state({"t": torch.zeros(3)}, {"t": meta}) is False
    assert same_state({"t": torch.zeros(3)}, {"t": torch.zeros(3)}) is True
