"""The C gather of random rows against np.take (NOTE [ Row gathers ] in
fastload_c/src/fl_copy.c).

    PYTHONPATH=. python bench/bench_gather.py [--repeats 5]

For each row size, a float32 array (1 M rows of 16 B and of 64 B, 512 K
rows of 256 B, 256 K rows of 1 KiB), 64 batches of 256 random row indices,
and two contenders taking them in turn:
``pack.RowGather(array).into(index, slot)``, the copy fastload's workers and
small gathers make, and ``array.take(index, axis=0)`` into a new array. Each
repeat times both, in alternating order, over ``--number`` batches; the
table gives median µs per batch and the median of the per-repeat ratios.
"""
from __future__ import annotations

import argparse
import statistics
import timeit

import numpy as np

from fastload_c import pack

# (rows, float32 per row): 16 B, 64 B, 256 B and 1 KiB rows.
SHAPES = ((1 << 20, 4), (1 << 20, 16), (1 << 19, 64), (1 << 18, 256))
BATCH = 256
INDICES = 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    print(f"random rows, batches of {BATCH}: median µs per batch over {args.repeats} repeats")
    for rows, width in SHAPES:
        array = np.random.default_rng(0).standard_normal((rows, width), dtype=np.float32)
        rng = np.random.default_rng(1)
        indices = [rng.integers(0, rows, BATCH).astype(np.intp) for _ in range(INDICES)]
        gather, slot = pack.RowGather(array), bytearray(BATCH * array[0].nbytes)
        turn = iter(range(1 << 62))

        def ours() -> None:
            gather.into(indices[next(turn) % INDICES], slot)

        def take() -> None:
            array.take(indices[next(turn) % INDICES], axis=0)

        times: dict[str, list[float]] = {"RowGather": [], "np.take": []}
        for repeat in range(args.repeats):
            pair = [("RowGather", ours), ("np.take", take)]
            for name, run in pair if repeat % 2 == 0 else pair[::-1]:
                times[name].append(timeit.timeit(run, number=args.number) / args.number * 1e6)
        ratio = statistics.median(a / b for a, b in zip(times["RowGather"], times["np.take"]))
        print(f"  rows of {array[0].nbytes:>4} B: RowGather {statistics.median(times['RowGather']):6.2f}"
              f"  np.take {statistics.median(times['np.take']):6.2f}  ratio {ratio:.2f}x")


if __name__ == "__main__":
    main()
