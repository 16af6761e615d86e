"""Collation into slab slots against np.stack, torch's default_collate and memcpy.

    PYTHONPATH=. python bench/bench_collate.py [--json FILE] [--repeats N] [--quick]

Batches of 32 and 256 samples of 256 B, 16 KiB and 1 MiB (float32 arrays,
each its own allocation). Contenders, each in a fresh process over every
batch shape:

  memcpy          the batch's bytes as one contiguous block, np.copyto into a slot
  collate_into    fastload_c.pack.collate_into(samples, slot)
  np.stack(out)   np.stack(samples, out=<view of a slot>)
  np.stack        np.stack(samples) (allocates)
  torch           torch.utils.data.default_collate(samples), when torch is installed
  gather_into     fastload_c.pack.gather_into(column, indices, slot), random indices
  rows+np.stack   np.stack([column[i] for i in indices]), the same rows from Python

Slots come from a pinned pool (fastload._memory.new_pool(pin_memory=True)),
so no contender writing into one takes page faults. Every figure is the
median over repeats of the mean time per batch over a timed loop; the peak
RSS of each contender's process is recorded.
"""
import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

BATCHES = (32, 256)
SAMPLE_BYTES = (256, 16 << 10, 1 << 20)
CONTENDERS = ("memcpy", "collate_into", "np.stack(out)", "np.stack", "torch", "gather_into",
              "rows+np.stack")


def measure(fn, repeats, min_time):
    fn()
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        if time.perf_counter() - start >= min_time or number >= 1 << 20:
            break
        number *= 2
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return statistics.median(times)


def run_contender(name, repeats, min_time, shapes):
    import numpy as np

    from fastload import _memory
    from fastload_c.pack import collate_into, gather_into

    if name == "torch":
        try:
            import torch
            from torch.utils.data import default_collate
        except ImportError:
            return {"skipped": "torch is not installed"}
    rng = np.random.default_rng(0)
    results = {}
    for batch, nbytes in shapes:
        n = nbytes // 4
        pool = _memory.new_pool(batch * nbytes + 4096, pin_memory=True, slots_per_segment=1)
        lease = pool.acquire()
        slot = np.frombuffer(lease, dtype=np.float32, count=batch * n).reshape(batch, n)
        samples = [rng.standard_normal(n, dtype=np.float32) for _ in range(batch)]
        if name == "memcpy":
            block = np.stack(samples)
            fn = lambda: np.copyto(slot, block)
        elif name == "collate_into":
            fn = lambda: collate_into(samples, lease)
        elif name == "np.stack(out)":
            fn = lambda: np.stack(samples, out=slot)
        elif name == "np.stack":
            fn = lambda: np.stack(samples)
        elif name == "torch":
            fn = lambda: default_collate(samples)
        else:
            # A column a little longer than the batch keeps 256 MiB batches in memory.
            column = rng.standard_normal((batch + 16, n), dtype=np.float32)
            indices = rng.permutation(batch + 16)[:batch].tolist()
            if name == "gather_into":
                fn = lambda: gather_into(column, indices, lease)
            else:
                fn = lambda: np.stack([column[i] for i in indices])
        results["{}x{}".format(batch, nbytes)] = measure(fn, repeats, min_time)
        fn = samples = slot = lease = pool = None  # freed before the next shape's
    out = {"seconds": results, "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if name == "torch":
        out["torch_threads"] = torch.get_num_threads()
    return out


def versions():
    import numpy

    info = {"python": platform.python_version(), "numpy": numpy.__version__,
            "machine": platform.machine(), "kernel": platform.release(), "cpus": os.cpu_count()}
    try:
        import torch
        info["torch"] = torch.__version__
    except ImportError:
        info["torch"] = None
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f
                               if line.startswith("model name"))
    except (OSError, StopIteration):
        info["cpu"] = None
    try:
        info["fastload_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except OSError:
        info["fastload_commit"] = None
    return info


def table(runs, shapes):
    def t(name, key):
        return runs[name].get("seconds", {}).get(key)

    def us(x):
        return "{:9.2f}".format(x * 1e6) if x else "        -"

    def ratio(a, b):
        return "{:7.1f}x".format(a / b) if a and b else "       -"

    lines = []
    head = "{:>12}".format("batch") + "".join("{:>15}".format(c) for c in CONTENDERS)
    lines.append("time per batch, microseconds (median)")
    lines.append(head)
    for batch, nbytes in shapes:
        key = "{}x{}".format(batch, nbytes)
        lines.append("{:>12}".format("{} x {}".format(batch, _size(nbytes)))
                     + "".join("{:>15}".format(us(t(c, key)).strip()) for c in CONTENDERS))
    lines.append("")
    lines.append("{:>12} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}".format(
        "batch", "ns/sample", "GB/s", "of memcpy", "vs stack", "vs torch", "gather vs"))
    for batch, nbytes in shapes:
        key = "{}x{}".format(batch, nbytes)
        c = t("collate_into", key)
        m = t("memcpy", key)
        lines.append("{:>12} {:>11.1f} {:>11.2f} {:>10.0f}% {:>11} {:>11} {:>11}".format(
            "{} x {}".format(batch, _size(nbytes)), c / batch * 1e9, batch * nbytes / c / 1e9,
            100 * m / c, ratio(t("np.stack", key), c).strip(), ratio(t("torch", key), c).strip(),
            ratio(t("rows+np.stack", key), t("gather_into", key)).strip()))
    return "\n".join(lines)


def _size(n):
    return "{} MiB".format(n >> 20) if n >= 1 << 20 else "{} KiB".format(n >> 10) if n >= 1024 \
        else "{} B".format(n)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.02,
                        help="seconds of one timed loop (default 0.02)")
    parser.add_argument("--quick", action="store_true", help="3 repeats of 5 ms loops")
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.min_time = 3, 0.005
    shapes = [(b, s) for s in SAMPLE_BYTES for b in BATCHES]
    if args.contender:
        json.dump(run_contender(args.contender, args.repeats, args.min_time, shapes), sys.stdout)
        return
    runs = {}
    for name in CONTENDERS:
        proc = subprocess.run([sys.executable, __file__, "--contender", name,
                               "--repeats", str(args.repeats), "--min-time", str(args.min_time)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit("contender {} failed:\n{}".format(name, proc.stderr))
        runs[name] = json.loads(proc.stdout)
    info = versions()
    print(" ".join("{}={}".format(k, v) for k, v in info.items()))
    print("repeats={} min_time={}s; torch threads={}".format(
        args.repeats, args.min_time, runs["torch"].get("torch_threads", "-")))
    print(table(runs, shapes))
    print("peak RSS MiB: " + ", ".join("{} {:.0f}".format(n, r.get("max_rss_bytes", 0) / 2**20)
                                       for n, r in runs.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"versions": info, "repeats": args.repeats, "min_time": args.min_time,
                       "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
