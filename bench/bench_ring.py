"""Two-process message passing: fastload_c.ring.Ring against multiprocessing.

    PYTHONPATH=. python bench/bench_ring.py [--quick] [--repeats N] [--json FILE]

Measures, between two processes freshly forked for every run:
  msgs/s at 64 B   producer puts bytes, consumer gets bytes (copied out)
  GB/s at 1 MiB    the same with 1 MiB messages, beside single-core memcpy
                   bandwidth (numpy.copyto of 1 MiB) measured in the same run
  round trip 64 B  ping-pong, both sides in blocking calls; median per run
Contenders alternate order between repeats; the figure reported is the
median over repeats. The consumer times from its first message to its last,
so process start is not counted. "ring spin0" is "ring" with spin=0, so
that every wait sleeps on the futex at once (no spinning).
"""
import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

import fastload_c
from fastload_c.ring import Ring

CONTENDERS = ["ring", "ring spin0", "Queue", "SimpleQueue", "Pipe"]
MIB = 1 << 20


def channel(kind, size):
    """(sender-side object, receiver-side object) of one direction."""
    if kind.startswith("ring"):
        ring = Ring(1 << 20 if size <= 4096 else 8 * MIB, spin=0 if kind == "ring spin0" else None)
        return ring, ring
    if kind == "Queue":
        q = mp.Queue(maxsize=max(2, (1 << 20) // max(size, 1)))
        return q, q
    if kind == "SimpleQueue":
        q = mp.SimpleQueue()
        return q, q
    recv_end, send_end = mp.Pipe(duplex=False)
    return send_end, recv_end


def send_fn(kind, ch):
    return ch.send_bytes if kind == "Pipe" else ch.put


def recv_fn(kind, ch):
    return ch.recv_bytes if kind == "Pipe" else ch.get


def producer(kind, ch, size, n):
    send = send_fn(kind, ch)
    msg = os.urandom(size)
    for _ in range(n + 1):
        send(msg)


def consumer(kind, ch, n, out):
    recv = recv_fn(kind, ch)
    recv()
    t0 = time.perf_counter()
    for _ in range(n):
        recv()
    elapsed = time.perf_counter() - t0
    out.send((elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))


def pinger(kind, there, back, size, n, out):
    send, recv = send_fn(kind, there), recv_fn(kind, back)
    clock = time.perf_counter_ns
    msg = os.urandom(size)
    lat = []
    for _ in range(n):
        t0 = clock()
        send(msg)
        recv()
        lat.append(clock() - t0)
    warm = lat[len(lat) // 10:]
    out.send((statistics.median(warm) / 1e3, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))


def ponger(kind, there, back, n):
    send, recv = send_fn(kind, back), recv_fn(kind, there)
    for _ in range(n):
        send(recv())


def run_pair(targets):
    """Start the processes, return what the first sends back."""
    ctx = mp.get_context("fork")
    mine, theirs = ctx.Pipe(duplex=False)
    procs = [ctx.Process(target=fn, args=args + ((theirs,) if i == 0 else ()))
             for i, (fn, args) in enumerate(targets)]
    for p in procs:
        p.start()
    result = mine.recv()
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            raise RuntimeError("{} exited with {}".format(p.name, p.exitcode))
    return result


def throughput(kind, size, n):
    tx, rx = channel(kind, size)
    elapsed, rss = run_pair([(consumer, (kind, rx, n)), (producer, (kind, tx, size, n))])
    return n / elapsed, rss


def round_trip(kind, size, n):
    there_tx, there_rx = channel(kind, size)
    back_tx, back_rx = channel(kind, size)
    return run_pair([(pinger, (kind, there_tx, back_rx, size, n)),
                     (ponger, (kind, there_rx, back_tx, n))])


def memcpy_gbps(size, n):
    src = np.frombuffer(os.urandom(size), dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    t0 = time.perf_counter()
    for _ in range(n):
        np.copyto(dst, src)
    return size * n / (time.perf_counter() - t0) / 1e9


def versions():
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        rev = "?"
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"python": sys.version.split()[0], "numpy": np.__version__,
            "fastload_c": os.path.dirname(fastload_c.__file__), "git": rev,
            "kernel": platform.release(), "cpu": cpu, "cpus": os.cpu_count(),
            "loadavg": os.getloadavg()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer messages and repeats (a few seconds)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    scale = 0.1 if args.quick else 1.0
    repeats = args.repeats or (3 if args.quick else 5)
    # Message counts per contender, sized for about a quarter second each.
    n_small = {"ring": 600_000, "ring spin0": 600_000, "Queue": 60_000, "SimpleQueue": 150_000,
               "Pipe": 150_000}
    n_big = {"ring": 2000, "ring spin0": 2000, "Queue": 300, "SimpleQueue": 300, "Pipe": 300}
    n_rtt = {"ring": 20_000, "ring spin0": 5000, "Queue": 3000, "SimpleQueue": 5000, "Pipe": 5000}

    info = versions()
    print("versions:", ", ".join("{}={}".format(k, v) for k, v in info.items()))
    samples = {(m, c): [] for m in ("msgs/s 64B", "GB/s 1MiB", "rtt us 64B") for c in CONTENDERS}
    rss = {c: 0 for c in CONTENDERS}
    memcpy = []
    for rep in range(repeats):
        order = CONTENDERS if rep % 2 == 0 else CONTENDERS[::-1]
        memcpy.append(memcpy_gbps(MIB, max(50, int(2000 * scale))))
        for kind in order:
            rate, r1 = throughput(kind, 64, max(1000, int(n_small[kind] * scale)))
            samples["msgs/s 64B", kind].append(rate)
            rate, r2 = throughput(kind, MIB, max(30, int(n_big[kind] * scale)))
            samples["GB/s 1MiB", kind].append(rate * MIB / 1e9)
            rtt, r3 = round_trip(kind, 64, max(500, int(n_rtt[kind] * scale)))
            samples["rtt us 64B", kind].append(rtt)
            rss[kind] = max(rss[kind], r1, r2, r3)
        print("repeat {}/{} done".format(rep + 1, repeats), file=sys.stderr)

    med = {k: statistics.median(v) for k, v in samples.items()}
    memcpy_med = statistics.median(memcpy)
    width = 13
    print("\n{:<14}".format("") + "".join("{:>{w}}".format(c, w=width) for c in CONTENDERS))
    for metric, fmt in (("msgs/s 64B", "{:,.0f}"), ("GB/s 1MiB", "{:.2f}"), ("rtt us 64B", "{:.2f}")):
        print("{:<14}".format(metric) + "".join(
            "{:>{w}}".format(fmt.format(med[metric, c]), w=width) for c in CONTENDERS))
    print("{:<14}".format("max RSS MiB") + "".join(
        "{:>{w}.0f}".format(rss[c] / 1024, w=width) for c in CONTENDERS))
    print("\nsingle-core memcpy (numpy.copyto 1 MiB): {:.2f} GB/s".format(memcpy_med))
    targets = {
        "64B msgs/s vs Queue (target >= 20x)": med["msgs/s 64B", "ring"] / med["msgs/s 64B", "Queue"],
        "1MiB GB/s vs memcpy (target >= 0.5)": med["GB/s 1MiB", "ring"] / memcpy_med,
        "64B rtt vs Pipe (target <= 0.33)": med["rtt us 64B", "ring"] / med["rtt us 64B", "Pipe"],
    }
    for name, value in targets.items():
        print("{:<40} {:.2f}".format(name, value))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"versions": info, "repeats": repeats, "quick": args.quick,
                       "memcpy_gbps": memcpy, "max_rss_kib": rss, "ratios": targets,
                       "median": {"{} | {}".format(*k): v for k, v in med.items()},
                       "samples": {"{} | {}".format(*k): v for k, v in samples.items()}},
                      f, indent=2)


if __name__ == "__main__":
    main()
