"""End-to-end loading: fastload against torch's DataLoader and a Pool baseline
(issues 5 and 16).

    PYTHONPATH=. python bench/bench_loader.py [--repeats 3] [--duration 2] [--json FILE]
    PYTHONPATH=. python bench/bench_loader.py --real-data --workers 0,2  # jpeg, torchvision, hf, memmap, rows

The matrix of ``python -m fastload bench`` (the same runner, in
fastload/_bench): by default every workload whose packages are installed;
contenders fastload, fastload-thread (with workers only), torch and
python-mp with 0, 1 and 2 workers, plus memcpy beside the bandwidth-bound
workloads and np.take beside the small rows; every measurement in a fresh
process, the contenders of one cell in rotating order, peak PSS sampled.
Then checks the targets of issues 5, 16 and 18 on ratios paired within
each repeat.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fastload._bench import report, runner
from fastload._bench.contenders import CONTENDERS, MEMCPY, TAKE
from fastload._bench.workloads import WORKLOADS

# Issue 5: against torch with this many workers, in the same run.
WORKERS = 2
SPEED_TARGETS = {"rows": 20.0, "images": 10.0, "augment": 2.0}
AUGMENT_OVER_SINGLE_PROCESS = 1.5
MEMCPY_SHARE = 0.5
NEXT_EPOCH_SECONDS = 0.002
# Issue 16, on two cores: decoding JPEGs with 2 workers against fastload's
# own 0 workers and against torch; issue 18: small rows with 2 worker
# threads against one process's np.take of the same bytes, and JPEGs with
# 2 worker threads against 2 worker processes (rate, and lower peak PSS).
JPEG_OVER_SINGLE_PROCESS = 1.9
JPEG_OVER_TORCH = 1.0
ROWS_THREADS_TAKE_SHARE = 0.5
JPEG_THREADS_OVER_PROCESSES = 0.9
REAL_DATA = ["jpeg", "torchvision", "hf", "memmap", "rows"]


def _target(name: str, value: float | None, goal: float, unit: str = "x",
            at_most: bool = False, note: str = "") -> dict[str, Any]:
    met = None if value is None else (value <= goal if at_most else value >= goal)
    return {"target": name, "value": value, "goal": goal, "unit": unit,
            "at_most": at_most, "met": met, "note": note}


def targets(outcome: runner.Outcome) -> list[dict[str, Any]]:
    """Issues 5, 16 and 18's targets, each with the measured value (None: not
    measured)."""
    m = outcome.measurements

    def ratio(numerator: tuple[str, str, int], denominator: tuple[str, str, int],
              metric: str = "samples_per_s") -> float | None:
        return runner.paired_ratio(m, numerator, denominator, metric)

    found = []
    for workload, goal in SPEED_TARGETS.items():
        found.append(_target(f"{workload}: samples/s of fastload / torch, {WORKERS} workers",
                             ratio((workload, "fastload", WORKERS), (workload, "torch", WORKERS)),
                             goal))
    found.append(_target(f"augment: fastload {WORKERS} workers / fastload 0 workers",
                         ratio(("augment", "fastload", WORKERS), ("augment", "fastload", 0)),
                         AUGMENT_OVER_SINGLE_PROCESS))
    found.append(_target(f"large: MB/s of fastload {WORKERS} workers / memcpy of the same bytes",
                         ratio(("large", "fastload", WORKERS), ("large", MEMCPY, 0), "mb_per_s"),
                         MEMCPY_SHARE))
    found.append(_target(f"jpeg: fastload {WORKERS} workers / fastload 0 workers",
                         ratio(("jpeg", "fastload", WORKERS), ("jpeg", "fastload", 0)),
                         JPEG_OVER_SINGLE_PROCESS))
    found.append(_target(f"jpeg: samples/s of fastload / torch, {WORKERS} workers",
                         ratio(("jpeg", "fastload", WORKERS), ("jpeg", "torch", WORKERS)),
                         JPEG_OVER_TORCH))
    found.append(_target(f"rows: MB/s of fastload-thread {WORKERS} workers / np.take of the same rows",
                         ratio(("rows", "fastload-thread", WORKERS), ("rows", TAKE, 0), "mb_per_s"),
                         ROWS_THREADS_TAKE_SHARE))
    threads, processes = ("jpeg", "fastload-thread", WORKERS), ("jpeg", "fastload", WORKERS)
    found.append(_target(f"jpeg: samples/s of fastload-thread / fastload, {WORKERS} workers",
                         ratio(threads, processes), JPEG_THREADS_OVER_PROCESSES))
    found.append(_target(f"jpeg, {WORKERS} workers: peak PSS of the tree, fastload / "
                         "fastload-thread", ratio(processes, threads, "peak_pss"), 1.0))
    summary = runner.summarize(outcome)
    for workload in outcome.plan.workloads:
        for workers in outcome.plan.workers:
            cell = (workload, "fastload", workers), (workload, "torch", workers)
            found.append(_target(
                f"{workload}, {workers} workers: first batch, torch / fastload (fresh workers)",
                ratio(cell[1], cell[0], "first_batch_s"), 1.0))
            for metric, what in (("peak_pss", "PSS"), ("peak_charged", "charged memory")):
                found.append(_target(
                    f"{workload}, {workers} workers: peak {what} of the tree, torch / fastload",
                    ratio(cell[1], cell[0], metric), 1.0))
            if workers:
                row = next(r for r in summary
                           if (r["workload"], r["contender"], r["workers"]) == cell[0])
                interval = row["batch_interval_s"]
                found.append(_target(
                    f"{workload}, {workers} workers: first batch of a later epoch, "
                    "persistent workers, the loop stepping (s)",
                    row["stepping_next_epoch_first_batch_s"], NEXT_EPOCH_SECONDS, "s",
                    at_most=True))
                found.append(_target(
                    f"{workload}, {workers} workers: the same, the loop taking batches "
                    "back to back (s)", row["next_epoch_first_batch_s"], NEXT_EPOCH_SECONDS,
                    "s", at_most=True,
                    note=f"any batch of the stream: {interval * 1e3:.2f} ms" if interval else ""))
    return found


def describe(target: dict[str, Any]) -> str:
    verdict = {True: "MET   ", False: "MISSED", None: "n/a   "}[target["met"]]
    if target["value"] is None:
        value = "not measured"
    elif target["unit"] == "s":
        value = f"{target['value'] * 1e3:.2f} ms"
    else:
        value = f"{target['value']:.2f}x"
    goal = (f"<= {target['goal'] * 1e3:g} ms" if target["unit"] == "s"
            else f">= {target['goal']:g}x")
    note = f"; {target['note']}" if target.get("note") else ""
    return f"{verdict} {target['target']}: {value} (target {goal}{note})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--real-data", action="store_true",
                        help=f"the real-data workloads only: {','.join(REAL_DATA)}, without "
                             "the later epochs' timings (an epoch of the memmap is 2048 batches)")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--workers", default="0,1,2")
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default="bench_loader.json", help="where to write the results")
    args = parser.parse_args()
    plan = runner.Plan(workloads=REAL_DATA if args.real_data else args.workloads.split(","),
                       contenders=args.contenders.split(","),
                       workers=[int(w) for w in args.workers.split(",")],
                       duration=args.duration, repeats=args.repeats, epochs=not args.real_data)
    outcome = runner.run(plan, progress=report.ProgressBar())
    print(report.table(outcome))
    found = targets(outcome)
    print("\nissue 5, 16 and 18 targets (ratios are medians of ratios paired within a repeat):")
    for target in found:
        print("  " + describe(target))
    data = report.as_json(outcome)
    data["targets"] = found
    with open(args.json, "w") as out:
        json.dump(data, out, indent=2)
    print(f"\nwrote {args.json}")
    return 1 if outcome.failures else 0


if __name__ == "__main__":
    sys.exit(main())
