"""Pinned batches to a GPU: fastload against torch's DataLoader, pin_memory=True.

    PYTHONPATH=. python bench/bench_pinned.py [--repeats 5] [--duration 2] [--workers 2]
                                              [--step-ms 0]

Needs torch with a CUDA device. A map-style dataset of uint8 images
(3x224x224, 147 KiB each, made at start), batches of 64 (9.2 MiB),
shuffled, persistent workers; the loop copies each batch to the GPU with
``non_blocking=True`` and converts it to float there, as a training step's
input would be; with ``--step-ms`` it then sleeps that long, standing for
a training step during which the loop waits on the GPU (the GIL free).
Every loader pins: fastload copies each batch into torch's page-locked
memory on a pinning thread as it becomes ready, as torch's pin-memory
thread does (NOTE [ Pinning by copy ] in fastload/_pinning.py).
Contenders run in rotating order within each repeat; the report gives each
one's median samples/s and its ratio to torch's, paired within a repeat.
``fastload unpinned`` is fastload's processes without pin_memory: what
pinning costs.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

import fastload as fl

WARMUP_SECONDS = 0.5
IMAGES = 2048
SHAPE = (3, 224, 224)
BATCH_SIZE = 64


class Images(fl.Dataset):
    """Samples of ``SHAPE`` uint8, each a copy of a row of one array (as a
    decoded image is new memory)."""

    def __init__(self) -> None:
        self.pixels = np.random.default_rng(0).integers(0, 256, (IMAGES, *SHAPE), dtype=np.uint8)

    def __len__(self) -> int:
        return IMAGES

    def __getitem__(self, index: int) -> np.ndarray:
        return self.pixels[index].copy()


def gpu_rate(torch: Any, loader: Any, duration: float, step: float) -> float:
    """Samples/s reaching the GPU while ``loader`` is drained for
    ``duration`` seconds after a warm-up; the last copy is waited for."""
    total, started, measuring = 0, time.perf_counter(), False
    while True:
        for batch in loader:
            tensor = batch if isinstance(batch, torch.Tensor) else torch.from_numpy(batch)
            tensor.to("cuda", non_blocking=True).float()
            if step:
                time.sleep(step)
            now = time.perf_counter()
            if not measuring and now - started >= WARMUP_SECONDS:
                torch.cuda.synchronize()
                total, started, measuring = 0, time.perf_counter(), True
            elif measuring:
                total += len(tensor)
                if now - started >= duration:
                    torch.cuda.synchronize()
                    return total / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--step-ms", type=float, default=0.0)
    args = parser.parse_args()
    try:
        import torch
        from torch.utils.data import DataLoader as TorchLoader
    except ImportError:
        raise SystemExit("bench_pinned.py compares with torch: pip install torch") from None
    if not torch.cuda.is_available():
        raise SystemExit("bench_pinned.py needs a CUDA device; torch sees none")
    dataset = Images()
    common = dict(batch_size=BATCH_SIZE, shuffle=True, num_workers=args.workers,
                  persistent_workers=True)
    contenders = {
        "fastload processes": lambda: fl.DataLoader(dataset, pin_memory=True, **common),
        "fastload threads": lambda: fl.DataLoader(dataset, pin_memory=True,
                                                  worker_method="thread", **common),
        "fastload unpinned": lambda: fl.DataLoader(dataset, **common),
        "torch": lambda: TorchLoader(dataset, pin_memory=True, **common),
    }
    loaders = {name: make() for name, make in contenders.items()}
    names = list(loaders)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(args.repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            rates[name].append(gpu_rate(torch, loaders[name], args.duration,
                                        args.step_ms / 1000))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, {args.workers} workers, "
          f"batches of {BATCH_SIZE} x {SHAPE} uint8, a step of {args.step_ms} ms, "
          f"{args.repeats} repeats of {args.duration} s")
    for name in names:
        ratios = [mine / theirs for mine, theirs in zip(rates[name], rates["torch"])]
        print(f"{name:20s} {statistics.median(rates[name]):10,.0f} samples/s   "
              f"{statistics.median(ratios):5.2f}x torch")


if __name__ == "__main__":
    main()
