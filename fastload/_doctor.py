"""``python -m fastload doctor``: what decides fastload's speed and safety here.

Each check looks at one thing (CPUs, start methods, shared memory, the
kernel's memfd and futex, what handing a batch over from a worker costs,
torch and CUDA) and answers
OK, WARN or FAIL with one line of advice. FAIL means normal use is blocked;
the exit code is then non-zero.
"""
from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from fastload import _cpus, _memory
from fastload._fast_path import SMALL_GATHER_BYTES
from fastload._worker_group import INITIAL_SLOT_BYTES
from fastload.dataset import ArrayDataset
from fastload.loader import DataLoader
from fastload_c import shm
from fastload_c.ring import Ring

OK, WARN, FAIL = "OK", "WARN", "FAIL"
MiB = 1 << 20
# Below this a loader's pool of shared memory does not fit at all; below
# the second, batches of images will soon not.
SHM_FAIL_BYTES = 64 * MiB
SHM_WARN_BYTES = 1024 * MiB
# Docker's default /dev/shm is 64 MiB, too little for torch's DataLoader.
DEV_SHM_WARN_BYTES = 1024 * MiB
# How long the kernel check waits for its child before calling it stuck.
ROUND_TRIP_SECONDS = 10.0
# The workers check: batches of 64 small rows, timed for a quarter second
# each way after a first epoch that starts the workers.
HANDOFF_ROWS = 4096
HANDOFF_BATCH_SIZE = 64
HANDOFF_WORKERS = 2
HANDOFF_SECONDS = 0.25


@dataclass
class Check:
    """One finding: its status, what was seen, and what to do."""

    name: str
    status: str
    summary: str
    advice: str
    details: dict[str, Any]


def check_cpus() -> Check:
    affinity, total, quota = _cpus.usable_cpus()
    usable = _cpus.usable_cpu_count()
    details = {"affinity": affinity, "cpu_count": total, "cgroup_quota": quota}
    seen = f"{affinity} of {total} CPUs usable" + (
        f", cgroup quota {quota:g} CPUs" if quota is not None else "")
    if usable < 2:
        return Check("cpus", WARN, seen,
                     "workers cannot run beside the training loop: num_workers=0 is "
                     "likely fastest; give the process more CPUs (taskset, --cpus)", details)
    workers = max(1, int(usable) - 1)
    return Check("cpus", OK, seen,
                 f"num_workers up to {workers} leaves one CPU for the training loop", details)


def check_start_methods() -> Check:
    methods = multiprocessing.get_all_start_methods()
    default = multiprocessing.get_context().get_start_method()
    details = {"available": methods, "default": default}
    seen = f"default {default}; available {', '.join(methods)}"
    if default == "fork":
        return Check("start_method", OK, seen,
                     "workers start fast and datasets need not be picklable; use "
                     "multiprocessing_context='spawn' if the main process runs threads "
                     "or CUDA before the loader starts", details)
    advice = ("workers start slower and the dataset, collate_fn and worker_init_fn are "
              "pickled: define them at module level")
    if "fork" in methods:
        advice += "; multiprocessing_context='fork' starts faster when that is safe"
    return Check("start_method", OK, seen, advice, details)


def check_shared_memory() -> Check:
    room = shm.available()
    dev = os.statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
    dev_free = dev.f_bavail * dev.f_frsize if dev is not None else None
    details = {"available_bytes": room, "dev_shm_free_bytes": dev_free}
    seen = f"{room / MiB:,.0f} MiB for new segments (memfd)" + (
        f", /dev/shm {dev_free / MiB:,.0f} MiB free" if dev_free is not None else ", no /dev/shm")
    if room < SHM_FAIL_BYTES:
        return Check("shared_memory", FAIL, seen,
                     "too little memory for a loader's batches: free memory or raise "
                     "the container's memory limit", details)
    if room < SHM_WARN_BYTES:
        return Check("shared_memory", WARN, seen,
                     "large batches may not fit: lower batch_size or prefetch_factor, "
                     "or raise the memory limit", details)
    if dev_free is not None and dev_free < DEV_SHM_WARN_BYTES:
        return Check("shared_memory", WARN, seen,
                     "fastload does not use /dev/shm, but torch's DataLoader and "
                     "tensors shared by torch do: docker run --shm-size=2g", details)
    pool_share = _memory.default_max_bytes()
    return Check("shared_memory", OK, seen,
                 f"a loader's pool may grow to {pool_share / MiB:,.0f} MiB before "
                 "held batches are copied out", details)


def check_torch() -> Check:
    if importlib.util.find_spec("torch") is None:
        return Check("torch", OK, "torch not installed",
                     "batches are numpy arrays; output='torch' and pin_memory=True "
                     "need torch", {"torch": None, "cuda": False})
    try:
        import torch
    except Exception as exc:  # a broken install says what is wrong
        return Check("torch", WARN, f"torch is installed but does not import: {exc}",
                     "reinstall torch, or uninstall it: fastload works without it",
                     {"torch": None, "cuda": False})
    cuda = bool(torch.cuda.is_available())
    details = {"torch": torch.__version__, "cuda": cuda,
               "devices": torch.cuda.device_count() if cuda else 0}
    if not cuda:
        return Check("torch", OK, f"torch {torch.__version__}, no CUDA device",
                     "pin_memory=True has no GPU to serve: leave it off", details)
    return Check("torch", OK,
                 f"torch {torch.__version__}, {details['devices']} CUDA device(s): "
                 f"{torch.cuda.get_device_name(0)}",
                 "pin_memory=True copies each batch into page-locked memory, as torch's "
                 "DataLoader does, so tensor.to('cuda', non_blocking=True) overlaps "
                 "the copy with the GPU's work", details)


def _echo(requests: Ring, replies: Ring, segment: shm.Segment) -> None:
    """The kernel check's child: wait for a message (asleep on the futex),
    write it into the shared segment, answer on the other ring."""
    message = requests.get(ROUND_TRIP_SECONDS)
    memoryview(segment)[:len(message)] = message
    replies.put(b"echo:" + message, ROUND_TRIP_SECONDS)


def check_kernel() -> Check:
    """memfd segments and futex waits, tried: a round trip to a child."""
    context = multiprocessing.get_context()
    message = b"fastload doctor %d" % os.getpid()
    child = None
    try:
        segment = shm.Segment(INITIAL_SLOT_BYTES)
        requests, replies = Ring(1 << 12), Ring(1 << 12)
        child = context.Process(target=_echo, args=(requests, replies, segment), daemon=True)
        child.start()
        started = time.perf_counter()
        requests.put(message)
        reply = replies.get(ROUND_TRIP_SECONDS)
        took = time.perf_counter() - started
        child.join(ROUND_TRIP_SECONDS)
        if reply != b"echo:" + message or bytes(memoryview(segment)[:len(message)]) != message:
            raise RuntimeError("the child's answer or its write to shared memory came back wrong")
        if child.exitcode != 0:
            raise RuntimeError(f"the child exited with code {child.exitcode}")
    except Exception as exc:
        return Check("kernel", FAIL, f"shared memory or futex waits do not work: {exc}",
                     "num_workers > 0 cannot work here (needs Linux memfd_create and "
                     "futex, e.g. not under a restrictive seccomp profile); use "
                     "num_workers=0", {"error": str(exc)})
    finally:
        if child is not None and child.is_alive():
            child.kill()
            child.join()
    return Check("kernel", OK,
                 f"memfd segment, ring and futex wake work across a {context.get_start_method()} "
                 f"child (round trip {took * 1e3:.1f} ms, process start included)",
                 "nothing to do", {"round_trip_s": took})


class _HandedOver(ArrayDataset):
    """Arrays in memory whose batches workers make: the main process gathers
    only an ArrayDataset's own (NOTE [ Small gathers ] in
    fastload._fast_path), not a subclass's."""


def batches_per_second(num_workers: int) -> float:
    """Batches/s of a loader over arrays in memory, whose batches cost next
    to nothing to make: with workers, what handing batches over costs. The
    first epoch, which starts the workers, is not timed."""
    dataset = _HandedOver(np.zeros((HANDOFF_ROWS, 16), np.float32))
    loader = DataLoader(dataset, batch_size=HANDOFF_BATCH_SIZE, num_workers=num_workers,
                        persistent_workers=num_workers > 0)
    for _ in loader:
        pass
    batches, started = 0, time.perf_counter()
    while time.perf_counter() - started < HANDOFF_SECONDS:
        for _ in loader:
            batches += 1
    return batches / (time.perf_counter() - started)


def check_workers() -> Check:
    alone, with_workers = batches_per_second(0), batches_per_second(HANDOFF_WORKERS)
    handoff_ms = 1e3 / with_workers
    details = {"batches_per_s_0_workers": alone,
               f"batches_per_s_{HANDOFF_WORKERS}_workers": with_workers,
               "handoff_ms": handoff_ms}
    faster = "faster" if with_workers > alone else "slower"
    seen = (f"batches of arrays in memory: {with_workers:,.0f}/s with {HANDOFF_WORKERS} "
            f"workers, {alone:,.0f}/s with none ({faster} with workers); a batch handed "
            f"over from a worker costs about {handoff_ms:.3g} ms")
    return Check("workers", OK, seen,
                 f"use num_workers=0 where a batch takes less than about {handoff_ms:.2g} ms "
                 "to make (arrays in memory; the main process gathers an ArrayDataset's "
                 f"batches of up to {SMALL_GATHER_BYTES >> 10} KiB itself whatever "
                 "num_workers is, unless worker processes have a worker_init_fn); workers "
                 "pay off where it takes longer (decoding, augmenting); loader.stats().verdict "
                 "says which a loader is",
                 details)


# The kernel check runs before torch is imported: forking after torch has
# started its threads is what start_method's advice warns against.
CHECKS: tuple[Callable[[], Check], ...] = (
    check_cpus, check_start_methods, check_shared_memory, check_kernel,
    check_workers, check_torch,
)


def run_checks() -> list[Check]:
    return [check() for check in CHECKS]


def main(as_json: bool = False) -> int:
    """Print every check (as JSON when ``as_json``); 1 when any FAILed."""
    checks = run_checks()
    failed = any(c.status == FAIL for c in checks)
    if as_json:
        json.dump({"checks": [asdict(c) for c in checks], "ok": not failed}, sys.stdout,
                  indent=2)
        sys.stdout.write("\n")
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            print(f"{c.status:<4}  {c.name:<{width}}  {c.summary}")
            print(f"      {'':<{width}}  -> {c.advice}")
    return 1 if failed else 0
