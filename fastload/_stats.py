"""Loader statistics: is data loading the bottleneck of training?

An iterator times two things per batch with ``time.perf_counter``: how long
``next()`` kept the training loop waiting, and how long the loop ran between
one batch and the next request (the user's step). Workers add how long each
batch took to fetch from the dataset and to collate into its slot. That is
a handful of clock reads per batch, cheap enough to be always on
(bench/bench_stats.py measures it).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

# The loop waiting more than this share of its time is a loader bottleneck.
BOTTLENECK_WAIT_SHARE = 0.2
# Workers cost more than they save when the loop waited this many times
# longer per batch than a worker took to make one, over at least this many
# batches (so that starting the workers, paid once, is spread thin).
WORKERS_COSTLIER_FACTOR = 2.0
WORKERS_JUDGED_AFTER_BATCHES = 50
# What handing one batch from a worker to the loop costs, about (a ring
# record, a wake-up, views over the slot: 0.05 ms on a busy two-core
# machine); in-process batches cheaper than this would only get slower.
HANDOFF_SECONDS = 1e-4


@dataclass
class WorkerStats:
    """Seconds one worker spent on its delivered batches."""

    batches: int = 0
    fetch_seconds: float = 0.0
    collate_seconds: float = 0.0

    def add(self, fetch_seconds: float, collate_seconds: float) -> None:
        self.batches += 1
        self.fetch_seconds += fetch_seconds
        self.collate_seconds += collate_seconds


@dataclass
class LoaderStats:
    """What an iterator measured so far. ``verdict`` says it in a line."""

    batches: int = 0
    wait_seconds: float = 0.0
    step_seconds: float = 0.0
    started: float = field(default_factory=time.perf_counter)
    workers: list[WorkerStats] = field(default_factory=list)
    ring_messages: int = 0
    slots_leased: int = 0
    slots_free: int = 0
    pool_bytes: int = 0

    @property
    def elapsed_seconds(self) -> float:
        return time.perf_counter() - self.started

    @property
    def batches_per_second(self) -> float:
        busy = self.wait_seconds + self.step_seconds
        return self.batches / busy if busy > 0 else 0.0

    @property
    def wait_share(self) -> float:
        """Share of the loop's time spent waiting for data (0..1)."""
        busy = self.wait_seconds + self.step_seconds
        return self.wait_seconds / busy if busy > 0 else 0.0

    @property
    def is_bottleneck(self) -> bool:
        return self.wait_share > BOTTLENECK_WAIT_SHARE

    @property
    def workers_cost_more_than_they_save(self) -> bool:
        """Whether loading in the main process would keep the loop waiting
        less. There the loop would spend a batch's work (a worker's fetch
        plus collate time) on each batch; here it waited much longer, so
        handing batches between processes costs more than spreading the
        work saves (batches that are cheap to make, or too few CPUs)."""
        work = self._work_per_batch()
        if work is None or self.batches < WORKERS_JUDGED_AFTER_BATCHES or not self.is_bottleneck:
            return False
        return self.wait_seconds / self.batches > WORKERS_COSTLIER_FACTOR * work

    def _work_per_batch(self) -> float | None:
        """Seconds a worker spent making one batch, on average (None without workers)."""
        made = sum(w.batches for w in self.workers)
        if made == 0:
            return None
        return sum(w.fetch_seconds + w.collate_seconds for w in self.workers) / made

    @property
    def verdict(self) -> str:
        if self.batches == 0:
            return "no batch delivered yet"
        share = f"{self.wait_share:.0%}"
        if self.workers_cost_more_than_they_save:
            work = self._work_per_batch() or 0.0
            return (f"data loading is the bottleneck, and worker processes make it slower: "
                    f"the training loop waited {self.wait_seconds / self.batches * 1e3:.3g} ms "
                    f"per batch, while a worker makes one in {work * 1e3:.3g} ms; use "
                    "num_workers=0 (or larger batches, whose work outweighs the handoff)")
        if self.is_bottleneck and not self.workers and (
                self.wait_seconds / self.batches < HANDOFF_SECONDS):
            return (f"data loading is the bottleneck: the training loop waited {share} "
                    f"of its time for batches, but a batch takes only "
                    f"{self.wait_seconds / self.batches * 1e3:.3g} ms to load, less than "
                    "handing it over from a worker costs: keep num_workers=0 (workers "
                    "would be slower) and use larger batches")
        if self.is_bottleneck:
            return (f"data loading is the bottleneck: the training loop waited {share} "
                    "of its time for batches (add workers, or make the dataset faster)")
        return (f"data loading is not the bottleneck: the training loop waited {share} "
                "of its time for batches")

    def as_dict(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "batches_per_second": self.batches_per_second,
            "wait_seconds": self.wait_seconds,
            "step_seconds": self.step_seconds,
            "wait_share": self.wait_share,
            "is_bottleneck": self.is_bottleneck,
            "workers_cost_more_than_they_save": self.workers_cost_more_than_they_save,
            "verdict": self.verdict,
            "workers": [vars(w).copy() for w in self.workers],
            "ring_messages": self.ring_messages,
            "slots_leased": self.slots_leased,
            "slots_free": self.slots_free,
            "pool_bytes": self.pool_bytes,
        }

    def __str__(self) -> str:
        lines = [f"{self.batches} batches, {self.batches_per_second:.1f} batches/s; "
                 f"waited {self.wait_seconds:.3f} s for data, "
                 f"{self.step_seconds:.3f} s in the loop"]
        for worker_id, worker in enumerate(self.workers):
            lines.append(f"  worker {worker_id}: {worker.batches} batches, fetch "
                         f"{worker.fetch_seconds:.3f} s, collate {worker.collate_seconds:.3f} s")
        if self.workers:
            lines.append(f"  slots leased {self.slots_leased}, free {self.slots_free}, "
                         f"pool {self.pool_bytes} bytes, {self.ring_messages} results waiting")
        lines.append(self.verdict)
        return "\n".join(lines)
