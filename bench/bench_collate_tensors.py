"""Tensors made by a custom collate_fn, from worker processes: fastload against torch.

    PYTHONPATH=. python bench/bench_collate_tensors.py [--repeats 5] [--duration 2] [--workers 2]

A custom collate_fn is the general path: its result is pickled in the
worker and rebuilt in the main process. This workload's collate_fn returns
a dict of tensors (an 8 MiB float32 batch and its labels), as a tokenising
or augmenting collate_fn would. fastload writes each tensor's storage bytes
into the batch's slot and rebuilds tensors viewing them; torch's workers
move each tensor through a shared-memory file of its own. Contenders:
fastload and torch's DataLoader, each with ``--workers`` worker processes
and with none, each repeat in rotating order; medians over the repeats,
ratios paired within a repeat. Needs torch.
"""
from __future__ import annotations

import statistics
from typing import Any

import torch
from bench_threads import measured_rate, method_arguments  # one definition of each
from torch.utils import data as td

import fastload as fl

BATCH_SIZE = 8


class Indices(td.Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> int:
        return i


def collate_tensors(indices: list[int]) -> dict[str, torch.Tensor]:
    """8 MiB of float32 for a batch of 8, and the labels."""
    return {"x": torch.full((len(indices), 1024, 256), float(indices[0])),
            "y": torch.tensor(indices)}


def batch_rate(make: Any, duration: float, workers: int) -> float:
    """Batches/s over ``duration`` seconds after a warm-up."""
    loader = make(Indices(), batch_size=BATCH_SIZE, collate_fn=collate_tensors,
                  num_workers=workers, persistent_workers=workers > 0)
    return measured_rate(loader, duration, lambda batch: 1)


def main() -> None:
    args = method_arguments(__doc__)
    contenders = {f"fastload, {args.workers} workers": (fl.DataLoader, args.workers),
                  f"torch, {args.workers} workers": (td.DataLoader, args.workers),
                  "fastload, 0 workers": (fl.DataLoader, 0),
                  "torch, 0 workers": (td.DataLoader, 0)}
    names = list(contenders)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(args.repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            make, workers = contenders[name]
            rates[name].append(batch_rate(make, args.duration, workers))
    print(f"custom collate_fn returning tensors (8 MiB batches), {args.repeats} repeats "
          f"of {args.duration:g} s: median batches/s")
    for name in names:
        print(f"  {name:<22} {statistics.median(rates[name]):8.0f}")
    ours, theirs = names[0], names[1]
    ratio = statistics.median(a / b for a, b in zip(rates[ours], rates[theirs]))
    print(f"  {ours} / {theirs}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
