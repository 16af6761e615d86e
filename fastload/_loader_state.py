"""The checkpoint's format: ``LoaderState``, what ``DataLoader.state_dict()``
returns, typed and versioned, and ``WorkerState``, one worker's replica in
it. What a state describes is NOTE [ Resume contract ] in fastload._checkpoint.

``LoaderState`` is the state's definition; ``to_dict`` gives plain Python
and numpy values: picklable, and JSON-serialisable when the samplers' and
datasets' own states are. States of earlier versions (1: before
out-of-order records; 2: before the DataPipe seed) load unchanged: every
field they lack gets the value that means what their version meant.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Any

STATE_VERSION = 3
# Fields an older state lacks, by its version, with the value that means what
# that version meant: no batch delivered out of order (version 1); no drawn
# DataPipe seed, the epoch's being derived from the base seed (versions 1, 2).
_OLDER_DEFAULTS: dict[int, dict[str, Any]] = {
    1: {"delivered_beyond": [], "datapipe_seed": None},
    2: {"datapipe_seed": None},
}


@dataclasses.dataclass(slots=True)
class WorkerState:
    """One worker's dataset replica: its state after batch ``state_step`` of
    the ``yielded`` it delivered, and whether its iterable stream ran out."""

    yielded: int = 0
    state: Any = None
    state_step: int = 0
    ended: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"yielded": self.yielded, "state": self.state,
                "state_step": self.state_step, "ended": self.ended}


@dataclasses.dataclass(slots=True)
class LoaderState:
    """What ``state_dict()`` returns, typed (NOTE [ Resume contract ])."""

    settings: dict[str, Any]
    epoch: int
    base_seed: int | None
    yielded: int
    delivered_beyond: list[list[int]]
    finished: bool
    sampler: Any
    sampler_step: int
    generator: Any
    dataset: Any
    dataset_step: int
    dataset_ended: bool
    workers: list[WorkerState] | None
    next_worker: int
    datapipe_seed: int | None

    def to_dict(self) -> dict[str, Any]:
        """Plain values (the nested sampler and dataset states are shared,
        not copied)."""
        # One attrgetter call, not a getattr per field: frameworks take a
        # state after every batch (accelerate does).
        fields = dict(zip(_STATE_FIELDS, _state_values(self)))
        if self.workers is not None:
            fields["workers"] = [worker.as_dict() for worker in self.workers]
        return {"version": STATE_VERSION, **fields}

    @classmethod
    def from_dict(cls, state: Any) -> LoaderState:
        """The typed state of a ``to_dict()`` value (any version so far); raises
        ValueError saying what is wrong with anything else."""
        if not isinstance(state, dict) or "version" not in state:
            raise ValueError(
                "not a fastload DataLoader state: expected the dict that "
                f"DataLoader.state_dict() returns, got {type(state).__name__}"
                + ("" if not isinstance(state, dict) else " without a 'version'"))
        version = state["version"]
        if version not in (*_OLDER_DEFAULTS, STATE_VERSION):
            raise ValueError(
                f"cannot load a fastload DataLoader state of version {version!r}: this "
                f"fastload reads versions 1 to {STATE_VERSION} (a newer fastload wrote it?)")
        values: dict[str, Any] = dict(_OLDER_DEFAULTS.get(version, {}))
        values.update((key, value) for key, value in state.items() if key != "version")
        missing = [name for name in _STATE_FIELDS if name not in values]
        unknown = sorted(set(values) - set(_STATE_FIELDS))
        if missing or unknown:
            raise ValueError(
                f"not a valid fastload DataLoader state of version {version}: "
                + "; ".join(part for part in (
                    f"missing {', '.join(missing)}" if missing else "",
                    f"unknown {', '.join(unknown)}" if unknown else "") if part))
        if values["workers"] is not None:
            values["workers"] = [WorkerState(**worker) for worker in values["workers"]]
        return cls(**values)


_STATE_FIELDS = tuple(field.name for field in dataclasses.fields(LoaderState))
_state_values = operator.attrgetter(*_STATE_FIELDS)
