"""How many CPUs this process can keep busy: what the doctor reports and
what decides whether a loader's waits spin (``ring_spin``)."""
from __future__ import annotations

import os


def usable_cpus() -> tuple[int, int, float | None]:
    """(CPUs this process may run on, CPUs of the machine, the cgroup's CPU
    quota in CPUs or None when it has none)."""
    affinity = len(os.sched_getaffinity(0))
    quota = None
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            limit, period = f.read().split()
        if limit != "max":
            quota = int(limit) / int(period)
    except (OSError, ValueError):
        pass
    return affinity, os.cpu_count() or affinity, quota


def usable_cpu_count() -> float:
    """CPUs this process can keep busy: its affinity, capped by any quota."""
    affinity, _, quota = usable_cpus()
    return affinity if quota is None else min(affinity, quota)


def ring_spin(num_workers: int) -> float | None:
    """How long the rings of a loader with ``num_workers`` worker processes
    spin before they sleep: the rings' default (None) when the workers and
    the main process each have a CPU, else 0. A spinning waiter then only
    takes the CPU from the process it waits for (NOTE [ Ring waiting ] in
    fastload_c/src/fl_ring.h)."""
    return None if num_workers + 1 <= usable_cpu_count() else 0.0
