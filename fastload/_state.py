"""Checkpoints of a DataLoader: what ``state_dict()`` returns and how
``load_state_dict()`` checks it.

NOTE [ Resume contract ]

A state describes the position right after the last batch the user
received, never what workers prefetched. It is made of:

* the index sampler's own state, recorded when the last delivered batch's
  indices were drawn (every ``snapshot_every_n_steps`` batches), plus the
  number of batches delivered since that snapshot, to be skipped by counting
  on resume. Samplers with ``state_dict`` (fastload's random samplers,
  BatchSampler over them, DistributedSampler) resume in O(1): same
  permutation, same position, no index replayed and no sample fetched.
  Samplers without state are fast-forwarded by counting whole batches from
  the start of the epoch, as torchdata does;
* for iterable datasets, the stream's state after each delivered batch, per
  worker (recorded in the worker right after it fetched that batch), plus
  the batches to skip since, which worker is next in the round robin, and
  which workers had run dry. As in torchdata, the stream's state is that of
  the iterator ``__iter__`` returned when it has ``state_dict`` and
  ``load_state_dict``, else the dataset's; it is restored after ``iter()``,
  so a dataset that sets its cursor up in ``__iter__`` keeps the restored
  one. In the main process a state is also taken when the loader starts an
  epoch (a state before the first batch holds where the stream starts) and
  after the stream ran out (the dataset has then seen StopIteration: an
  epoch counter moved on), which load_state_dict restores at once, as the
  sampler's;
* for a map-style dataset with ``state_dict`` loaded in the main process,
  its state at each snapshot, restored before the next batch;
* with ``in_order=False`` (map-style), batches are delivered out of order:
  the delivered count is the contiguous prefix of the epoch, and the
  positions delivered past it are kept as [start, stop) runs
  (``delivered_beyond``). A resumed loader, with any number of workers,
  draws those positions from the sampler and loads none of them, so every
  batch of the epoch is delivered exactly once;
* ``snapshot_every_n_steps=0`` takes no snapshot within an epoch: a state
  then counts the delivered batches from the epoch's start. An empty state
  (``{}``) loads as "start fresh", as in torchdata;
* a sampler's state describes where its next iteration starts: once an
  epoch has run out, a new epoch (the generator as it is then). A state
  whose every batch was delivered (the StopIteration not yet seen) resumes
  as an empty remainder of that epoch, by counting against len(sampler);
* the base seed and epoch, so worker seeds and ``sample_rng()`` streams are
  the same after a resume, and the loader generator's state, so the epochs
  after it shuffle as they would have.

Everything is plain Python and numpy values: picklable, and JSON-serialisable
when the samplers' and datasets' own states are.
"""
from __future__ import annotations

from typing import Any

STATE_VERSION = 1


def sampler_state(sampler: Any) -> Any:
    """The sampler's state_dict(), or None for a sampler that keeps none."""
    getter = getattr(sampler, "state_dict", None)
    return getter() if callable(getter) else None


def dataset_state(dataset: Any) -> Any:
    getter = getattr(dataset, "state_dict", None)
    return getter() if callable(getter) else None


def describe_loader(loader: Any) -> dict[str, Any]:
    """The settings a state only fits if they are the same on resume."""
    kind = loader._dataset_kind.value
    settings: dict[str, Any] = {
        "dataset_kind": kind,
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
    }
    if kind == "map":
        settings["dataset_length"] = len(loader.dataset)
    else:
        # Each worker iterates its own replica: its state fits only the same
        # number of replicas.
        settings["num_workers"] = loader.num_workers
    return settings


def check_compatible(state: Any, loader: Any) -> None:
    """Raise ValueError naming every setting in which ``state`` and the
    loader differ; a state that does not fit must never yield wrong data."""
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ValueError(
            "not a fastload DataLoader state (expected a dict from state_dict() with "
            f"version {STATE_VERSION})")
    expected = describe_loader(loader)
    saved = state.get("settings", {})
    differences = [
        f"{key} is {expected[key]!r} here but {saved.get(key)!r} in the state"
        for key in expected if saved.get(key) != expected[key]
    ]
    if differences:
        raise ValueError("cannot load this DataLoader state: " + "; ".join(differences))
