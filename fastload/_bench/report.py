"""Showing benchmark results: a progress bar, the table, JSON, a bar chart."""
from __future__ import annotations

import json
import sys
import time
from typing import IO, Any

from fastload._bench.contenders import BASELINES, REFERENCES, without_workers
from fastload._bench.measure import STEP_OVER_INTERVAL
from fastload._bench.runner import Outcome, summarize
from fastload._bench.workloads import WORKLOADS

BAR_WIDTH = 30


class ProgressBar:
    """A one-line progress bar on a terminal (redrawn in place); one line
    per step elsewhere, so logs stay readable."""

    def __init__(self, stream: IO[str] = sys.stderr) -> None:
        self.stream = stream
        self.in_place = stream.isatty()
        self.started = time.monotonic()

    def __call__(self, done: int, total: int, label: str) -> None:
        filled = BAR_WIDTH * done // max(total, 1)
        elapsed = time.monotonic() - self.started
        line = (f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total} "
                f"{elapsed:5.1f}s {label}")
        if self.in_place:
            end = "\n" if done == total else ""
            self.stream.write(f"\r\x1b[K{line}{end}")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _number(value: float | None, scale: float = 1.0, digits: int = 0) -> str:
    return "-" if value is None else f"{value * scale:,.{digits}f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def slower_with_workers(rows: list[dict[str, Any]]) -> list[str]:
    """A line for each configuration that loads fewer samples/s with worker
    processes or threads than the same loader without any, saying what to use."""
    alone = {(r["workload"], r["contender"]): r["samples_per_s"]
             for r in rows if r["workers"] == 0}
    lines = []
    for row in rows:
        ratio = row.get("over_0_workers")
        without = alone.get((row["workload"], without_workers(row["contender"])))
        # Slower both ways: by the paired ratio and by the medians it prints,
        # which noisy repeats can set on opposite sides of 1.
        if ratio is None or ratio >= 1 or not without or row["samples_per_s"] >= without:
            continue
        lines.append(
            f"SLOWER WITH WORKERS: {row['workload']} through {row['contender']} with "
            f"{row['workers']} workers loads {ratio:.2f}x the samples/s of 0 "
            f"workers ({row['samples_per_s']:,.0f} vs {without:,.0f}): its batches cost less to "
            "make than to hand between workers here; use num_workers=0 for data like this "
            "(workers pay off once making a batch takes longer than handing it over)")
    return lines


def table(outcome: Outcome) -> str:
    """The summary as a text table, with the versions and any notes."""
    rows = summarize(outcome)
    header = ["workload", "contender", "workers", "samples/s", "MB/s", "first batch ms",
              "next epoch ms", "stepping ms", "peak PSS MiB", "charged MiB", *(f"vs {b}" for b in BASELINES),
              "vs 0 workers", "of reference"]
    body = []
    for row in rows:
        ratios = row.get("ratios", {})
        body.append([
            row["workload"], row["contender"], str(row["workers"]),
            _number(row["samples_per_s"]), _number(row["mb_per_s"], digits=1),
            _number(row["first_batch_s"], 1e3, 2), _number(row["next_epoch_first_batch_s"], 1e3, 2),
            _number(row["stepping_next_epoch_first_batch_s"], 1e3, 2),
            _number(row["peak_pss"], 2 ** -20, 1), _number(row["peak_charged"], 2 ** -20, 1),
            *(_ratio(ratios.get(b)) for b in BASELINES), _ratio(row.get("over_0_workers")),
            "-" if row.get("reference_share") is None else f"{row['reference_share']:.0%}",
        ])
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = [" ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                      for i, (cell, w) in enumerate(zip(line, widths)))
             for line in [header, *body]]
    lines.insert(1, "-" * len(lines[0]))
    plan = outcome.plan
    notes = [
        *slower_with_workers(rows),
        " ".join(f"{k}={v}" for k, v in outcome.environment.items()),
        f"{plan.duration:g} s per measurement, median of {plan.repeats} repeat(s); "
        "ratios are of samples/s at the same number of workers; vs 0 workers: the same "
        "contender without workers; of reference: the share of the MB/s of memcpy (large, "
        "memmap) or of one process's np.take (rows) of the same bytes",
        "next epoch: a later epoch's first batch, the loop taking batches back to back; "
        f"stepping: the same while the loop sleeps {STEP_OVER_INTERVAL:g} batch intervals "
        "after each batch",
        "memory is the peak of the process tree: PSS, and charged (PSS outside shared "
        "memory plus each shared-memory object at its allocated size)",
        "cpu_capacity: CPUs' worth of work one busy process per CPU got, before and after; "
        "below the CPU count, other programs held CPUs and capped every speed-up",
    ]
    notes += [f"skipped {name}: {why}" for name, why in outcome.skipped.items()]
    notes += [f"FAILED: {failure}" for failure in outcome.failures]
    return "\n".join([*lines, "", *notes])


def as_json(outcome: Outcome) -> dict[str, Any]:
    """Everything measured: settings, versions, every measurement and the summary."""
    return {
        "environment": outcome.environment,
        "plan": vars(outcome.plan),
        "workloads": {name: {"batch_size": WORKLOADS[name].batch_size,
                             "description": WORKLOADS[name].description}
                      for name in outcome.plan.workloads},
        "skipped": outcome.skipped,
        "failures": outcome.failures,
        "summary": summarize(outcome),
        "measurements": outcome.measurements,
    }


def write_json(outcome: Outcome, path: str) -> None:
    with open(path, "w") as out:
        json.dump(as_json(outcome), out, indent=2)
        out.write("\n")


def plot(outcome: Outcome, path: str) -> None:
    """A bar chart of samples/s per (workload, workers), one bar per
    contender, on a log scale; needs matplotlib (ImportError without)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in summarize(outcome) if r["contender"] not in REFERENCES]
    groups = list(dict.fromkeys((r["workload"], r["workers"]) for r in rows))
    contenders = list(dict.fromkeys(r["contender"] for r in rows))
    rate = {(r["workload"], r["workers"], r["contender"]): r["samples_per_s"] for r in rows}
    width = 0.8 / len(contenders)
    figure, axes = plt.subplots(figsize=(max(6.0, 1.2 * len(groups)), 4.5))
    for i, contender in enumerate(contenders):
        positions = [g + i * width for g in range(len(groups))]
        heights = [rate.get((w, n, contender)) or 0 for w, n in groups]
        axes.bar(positions, heights, width, label=contender)
    axes.set_xticks([g + width * (len(contenders) - 1) / 2 for g in range(len(groups))])
    axes.set_xticklabels([f"{w}\n{n} workers" for w, n in groups])
    axes.set_yscale("log")
    axes.set_ylabel("samples/s (log scale)")
    axes.set_title("fastload benchmark: samples per second, higher is better")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
