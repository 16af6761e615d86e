"""Resume cost: time from load_state_dict to the first batch at 10% and at 90%
of a large shuffled epoch (O(1) resume means the two are about equal), and
the cost of one state_dict() call with 2 workers, against torchdata's
StatefulDataLoader when it is installed.

    PYTHONPATH=. python bench/bench_resume.py [--samples N] [--repeats R] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

import fastload as fl


def make_fastload(data, workers):
    return fl.DataLoader(fl.ArrayDataset(data), batch_size=256, shuffle=True,
                         num_workers=workers, generator=1)


def make_torchdata(data, workers):
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader
    return StatefulDataLoader(torch.utils.data.TensorDataset(torch.from_numpy(data)),
                              batch_size=256, shuffle=True, num_workers=workers,
                              generator=torch.Generator().manual_seed(1))


def state_at(make, data, workers, fraction):
    loader = make(data, workers)
    it = iter(loader)
    for _ in range(int(len(loader) * fraction)):
        next(it)
    state = loader.state_dict()
    del it
    return state


def resume_seconds(make, data, workers, state):
    loader = make(data, workers)
    started = time.perf_counter()
    loader.load_state_dict(state)
    next(iter(loader))
    return time.perf_counter() - started


def state_dict_seconds(make, data, workers, calls=200):
    loader = make(data, workers)
    it = iter(loader)
    next(it)
    started = time.perf_counter()
    for _ in range(calls):
        loader.state_dict()
    elapsed = (time.perf_counter() - started) / calls
    del it
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    data = np.arange(args.samples, dtype=np.int64).reshape(-1, 1)
    contenders = {"fastload": make_fastload}
    try:
        import torchdata  # noqa: F401

        contenders["torchdata"] = make_torchdata
    except ImportError:
        print("torchdata is not installed: fastload only")
    results: dict[str, dict[str, float]] = {}
    for name, make in contenders.items():
        for workers in (0, 2):
            states = {f: state_at(make, data, workers, f) for f in (0.1, 0.9)}
            figures = {f: [] for f in states}
            for _ in range(args.repeats):
                for fraction, state in states.items():
                    figures[fraction].append(resume_seconds(make, data, workers, state))
            key = f"{name} workers={workers}"
            results[key] = {
                "resume_at_10%_ms": statistics.median(figures[0.1]) * 1e3,
                "resume_at_90%_ms": statistics.median(figures[0.9]) * 1e3,
            }
        results[f"{name} workers=2"]["state_dict_us"] = (
            state_dict_seconds(make, data, 2) * 1e6)
    print(f"python {platform.python_version()}, numpy {np.__version__}, "
          f"{args.samples} samples, batch 256, medians of {args.repeats}")
    print(f"{'contender':<24}{'resume@10% ms':>15}{'resume@90% ms':>15}{'state_dict µs':>15}")
    for key, row in results.items():
        sd = row.get("state_dict_us")
        print(f"{key:<24}{row['resume_at_10%_ms']:>15.2f}{row['resume_at_90%_ms']:>15.2f}"
              f"{'' if sd is None else f'{sd:.1f}':>15}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
