"""One measurement, in the fresh process the runner starts for it.

    python -m fastload._bench.measure SPEC_JSON RESULT_PATH

SPEC_JSON names the workload, the contender, the number of workers and the
duration; the result is written as JSON to RESULT_PATH. The process builds
the workload's arrays, then times:

* the first batch of a new loader, its workers started fresh;
* every later epoch's first batch, the workers kept (persistent workers);
* the rate of everything after the first batch, across epochs, until the
  duration has passed and, when the spec asks for ``epochs``, at least
  ``NEXT_EPOCHS`` later epochs have begun;
* with ``epochs`` and workers, the first batch of ``STEPPING_EPOCHS`` more epochs while the
  loop steps as a training loop does: after each batch it sleeps (as a loop
  waiting on its accelerator) ``STEP_OVER_INTERVAL`` times the loader's own
  mean batch interval, so that the loader has time to spare. Back to back,
  a new epoch's first batch can come no sooner than any batch of a steady
  stream, one batch interval; stepping, it shows what an epoch's start
  itself costs.
"""
from __future__ import annotations

import gc
import importlib.util
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

from fastload._bench.contenders import CONTENDERS, MEMCPY, TAKE
from fastload._bench.memory import tree_memory
from fastload._bench.workloads import WORKLOADS

# Later epochs whose first batch is timed, at the least.
NEXT_EPOCHS = 2
# Epochs timed while the loop steps, and its step over the batch interval.
STEPPING_EPOCHS = 2
STEP_OVER_INTERVAL = 1.5


def _leaves(batch: Any) -> list[Any]:
    """The arrays (numpy arrays and torch tensors alike) of a batch, in order,
    through lists, tuples (Padded ones too) and dicts."""
    if isinstance(batch, dict):
        return [leaf for value in batch.values() for leaf in _leaves(value)]
    if isinstance(batch, (list, tuple)):
        return [leaf for value in batch for leaf in _leaves(value)]
    return [batch] if hasattr(batch, "nbytes") else []


def batch_samples(batch: Any) -> int:
    return len(_leaves(batch)[0])


def batch_bytes(batch: Any) -> int:
    """Bytes of a batch's arrays, padding included."""
    return sum(int(leaf.nbytes) for leaf in _leaves(batch))


def tree_memory_now(label: str = "baseline") -> dict[str, int]:
    """This process tree's memory as ``{label}_pss``/``{label}_charged``
    (empty without psutil)."""
    if importlib.util.find_spec("psutil") is None:
        return {}
    seen = tree_memory(os.getpid()) or {}
    return {f"{label}_{kind}": size for kind, size in seen.items()}


def time_loader(loader: Any, duration: float, later_epochs: bool, stepping: bool) -> dict[str, Any]:
    started = time.perf_counter()
    batches = iter(loader)
    first = next(batches)
    first_at = time.perf_counter()
    samples, epochs, count = 0, 1, 0
    next_epoch: list[float] = []
    last = first_at
    while True:
        for batch in batches:
            samples += batch_samples(batch)
            count += 1
            last = time.perf_counter()
            if last - first_at >= duration and (not later_epochs or len(next_epoch) >= NEXT_EPOCHS):
                break
        else:
            begun = time.perf_counter()
            batches = iter(loader)
            batch = next(batches)
            last = time.perf_counter()
            next_epoch.append(last - begun)
            samples += batch_samples(batch)
            count += 1
            epochs += 1
            continue
        break
    interval = (last - first_at) / count
    return {
        "first_batch_s": first_at - started,
        "next_epoch_first_batch_s": statistics.median(next_epoch) if next_epoch else None,
        "stepping_next_epoch_first_batch_s": (
            time_stepping_epochs(loader, batches, STEP_OVER_INTERVAL * interval)
            if stepping else None),
        "batch_interval_s": interval,
        "samples": samples,
        "seconds": last - first_at,
        "epochs": epochs,
        "bytes_per_sample": batch_bytes(first) / batch_samples(first),
    }


def time_stepping_epochs(loader: Any, batches: Any, step: float) -> float:
    """Finish the epoch under way and run ``STEPPING_EPOCHS`` more, sleeping
    ``step`` seconds after each batch: the median first batch of those."""
    for _ in batches:
        time.sleep(step)
    waits = []
    for _ in range(STEPPING_EPOCHS):
        begun = time.perf_counter()
        batches = iter(loader)
        next(batches)
        waits.append(time.perf_counter() - begun)
        time.sleep(step)
        for _ in batches:
            time.sleep(step)
    return statistics.median(waits)


def time_memcpy(arrays: tuple[np.ndarray, ...], size: int, duration: float) -> dict[str, Any]:
    """np.copyto of each batch's bytes from the source arrays, batch after
    batch through them: the bandwidth a loader moving those bytes could reach."""
    targets = [np.empty((size, *a.shape[1:]), a.dtype) for a in arrays]
    starts = range(0, len(arrays[0]) - size + 1, size)
    samples = 0
    began = time.perf_counter()
    while time.perf_counter() - began < duration:
        for start in starts:
            for source, target in zip(arrays, targets):
                np.copyto(target, source[start:start + size])
            samples += size
    seconds = time.perf_counter() - began
    return {"samples": samples, "seconds": seconds,
            "bytes_per_sample": sum(t.nbytes for t in targets) / size}


def time_take(arrays: tuple[np.ndarray, ...], size: int, duration: float) -> dict[str, Any]:
    """``array.take(rows, axis=0)`` of every array, for the rows of each batch
    of shuffled epochs, in this one process: what a loader gathering those
    rows (an ArrayDataset's batches) does without workers, at numpy's speed."""
    rng = np.random.default_rng(0)
    samples = 0
    began = time.perf_counter()
    while time.perf_counter() - began < duration:
        order = rng.permutation(len(arrays[0]))
        for start in range(0, len(order), size):
            rows = order[start:start + size]
            for source in arrays:
                source.take(rows, axis=0)
            samples += len(rows)
    seconds = time.perf_counter() - began
    return {"samples": samples, "seconds": seconds,
            "bytes_per_sample": sum(a[:1].nbytes for a in arrays)}


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the workload and time the contender ``spec`` names over it."""
    workload = WORKLOADS[spec["workload"]]
    contender = spec["contender"]
    batch_size = spec.get("batch_size") or workload.batch_size
    arrays = workload.make_arrays()
    if contender in (MEMCPY, TAKE):
        timer = time_memcpy if contender == MEMCPY else time_take
        result = timer(arrays, batch_size, spec["duration"])
        result.update(tree_memory_now())
    else:
        dataset = workload.dataset(contender, arrays)
        loader = CONTENDERS[contender](dataset, batch_size, spec["workers"],
                                       workload.collate_fn(contender))
        gc.collect()
        baseline = tree_memory_now()
        epochs = spec.get("epochs", True)
        result = time_loader(loader, spec["duration"], epochs, stepping=epochs and spec["workers"] > 0)
        # The loader at its fullest, untimed: the runner's sampling is sparse.
        result.update(tree_memory_now("final"))
        result.update(baseline)
        close = getattr(loader, "close", None)
        if close is not None:
            close()
    result["samples_per_s"] = result["samples"] / result["seconds"]
    result["mb_per_s"] = result["samples_per_s"] * result["bytes_per_sample"] / 1e6
    result["pid"] = os.getpid()
    return result


def main() -> None:
    spec, result_path = json.loads(sys.argv[1]), sys.argv[2]
    result = measure(spec)
    with open(result_path, "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main()
