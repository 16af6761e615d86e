"""torchdata's keys in ``state_dict()``: a fastload state also says what a
torchdata ``StatefulDataLoader`` state would, under torchdata's names.

NOTE [ torchdata's keys ]
Code written for torchdata reads its state's layout: how many workers
``state["_snapshot"]["_worker_snapshots"]`` holds, a replica's
``["worker_0"]["fetcher_state"]["dataset_iter_state"]`` or
``["dataset_state"]``, whether its stream ``fetcher_ended``, and, without
workers, the top-level ``dataset_state`` and ``fetcher_state`` (torchdata's
own tests do, and tools that log a checkpoint's position). So a state has
those keys beside fastload's, computed from fastload's fields. With the
default ``snapshot_every_n_steps=1`` they hold what torchdata's would
(tests/test_torchdata_layout.py compares them), except where the two keep
different things:

- a replica's state is its iterator's (``dataset_iter_state``) for an
  iterable dataset and the dataset's (``dataset_state``) for a map-style
  one. fastload keeps one state per replica, the iterator's when it has
  one, else the dataset's (fastload._fetch); torchdata keeps both where
  an iterable dataset's iterator is not the dataset itself;
- the sampler's and the dataset's states are fastload's snapshots, taken
  every ``snapshot_every_n_steps`` batches: ``_snapshot_step`` is the
  step of the last one and ``_steps_since_snapshot`` the batches
  delivered since, out of order ones included, as in torchdata. Without
  workers torchdata takes those states when asked, fastload at its
  snapshot steps, so there its ``_sampler_iter_yielded`` (the sampler
  state's step) can be behind ``_num_yielded`` (the batches delivered);
- an iterable dataset has no sampler: its snapshot steps are those of the
  batches delivered, as torchdata counts them;
- a sampler whose iterator keeps the state (torchdata's ``RandomSampler``,
  fastload._torch_draws.IterationState): torchdata holds that state under
  ``_sampler_iter_state`` (its BatchSampler iterator's), fastload under
  ``_index_sampler_state``, as any sampler's;
- before the first ``iter()`` there is a snapshot per worker, as
  torchdata starts its workers to take one, each holding the dataset's
  state, which every replica starts from, and the iterator has not
  finished (fastload's ``finished`` says that no epoch is under way).

The keys are derived: loading ignores them and reads fastload's fields
alone, so they cannot disagree with what resumes (a framework that edits
``_index_sampler_state`` in place, as accelerate's dispatcher does, edits
a copy). A state torchdata wrote has only them, and is refused with an
error saying so: its sampler and seed positions are torchdata's, which
fastload cannot continue exactly.
"""
from __future__ import annotations

from typing import Any

_WITH_WORKERS = ("_snapshot", "_steps_since_snapshot", "_iterator_finished")
_WITHOUT_WORKERS = ("_index_sampler_state", "_sampler_iter_state", "_sampler_iter_yielded",
                    "_num_yielded", "_IterableDataset_len_called", "_shared_seed",
                    "fetcher_state", "dataset_state", "_iterator_finished")
TORCHDATA_KEYS = frozenset(_WITH_WORKERS + _WITHOUT_WORKERS)


def torchdata_keys(state: dict[str, Any], num_workers: int, snapshot_every: int,
                   len_called: int | None) -> dict[str, Any]:
    """torchdata's keys for ``state``, a fastload state's dict (NOTE
    [ torchdata's keys ]) of a loader with ``num_workers`` workers, its
    ``snapshot_every_n_steps`` and the dataset length ``len(loader)`` read
    (an iterable dataset's, None when it was not)."""
    iterable = state["settings"]["dataset_kind"] == "iterable"
    delivered = state["yielded"] + sum(stop - start for start, stop in state["delivered_beyond"])
    if not iterable:
        snapshot_step = state["sampler_step"]
    else:
        snapshot_step = delivered - delivered % snapshot_every if snapshot_every else 0
    sampler = state["sampler"]
    if isinstance(sampler, dict):
        sampler = dict(sampler)
    # No iterator has drawn a base seed before the first iter().
    finished = state["finished"] and state["base_seed"] is not None
    if num_workers == 0:
        return {
            "_index_sampler_state": sampler,
            "_sampler_iter_state": None,
            "_sampler_iter_yielded": snapshot_step,
            "_num_yielded": delivered,
            "_IterableDataset_len_called": len_called,
            "_shared_seed": None,
            **_replica(state["dataset"], state["dataset_ended"], iterable),
            "_iterator_finished": finished,
        }
    workers = state["workers"]
    snapshots = {}
    for worker_id in range(num_workers):
        if workers is None or worker_id >= len(workers):
            replica = _replica(state["dataset"], False, iterable)
        else:
            replica = _replica(workers[worker_id]["state"], workers[worker_id]["ended"], iterable)
        snapshots[f"worker_{worker_id}"] = {"worker_id": worker_id, **replica}
    return {
        "_snapshot": {
            "_snapshot_step": snapshot_step,
            "_last_yielded_worker_id": (state["next_worker"] - 1) % num_workers,
            "_main_snapshot": {
                "_num_workers": num_workers,
                "_sampler_iter_state": None,
                "_index_sampler_state": sampler,
                "_sampler_iter_yielded": snapshot_step,
                "_IterableDataset_len_called": len_called,
                "_shared_seed": None,
                "_base_seed": state["base_seed"],
            },
            "_worker_snapshots": snapshots,
        },
        "_steps_since_snapshot": delivered - snapshot_step,
        "_iterator_finished": finished,
    }


def _replica(replica_state: Any, ended: bool, iterable: bool) -> dict[str, Any]:
    """One replica's ``fetcher_state`` and ``dataset_state``."""
    if not iterable:
        return {"fetcher_state": None, "dataset_state": replica_state}
    return {"fetcher_state": {"dataset_iter_state": replica_state, "fetcher_ended": ended},
            "dataset_state": None}


def fastload_fields(state: Any) -> Any:
    """``state`` without torchdata's keys: what loading reads. A state
    torchdata wrote (its keys and no fastload ``version``) raises
    ValueError saying so; anything else is left to the format's checks."""
    if not isinstance(state, dict) or not TORCHDATA_KEYS.intersection(state):
        return state
    if "version" not in state:
        raise ValueError(
            "this state was written by torchdata's StatefulDataLoader (it has torchdata's "
            "keys and no fastload 'version'): fastload resumes only the states its own "
            "DataLoader.state_dict() returns, since torchdata's sampler and seed positions "
            "cannot be continued exactly; start this run fresh (load_state_dict({})) or "
            "finish it with torchdata")
    return {key: value for key, value in state.items() if key not in TORCHDATA_KEYS}
