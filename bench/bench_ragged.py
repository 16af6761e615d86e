"""Variable-size samples: padding and packing collates, bucketing and packing samplers.

    PYTHONPATH=. python bench/bench_ragged.py [--samples N] [--repeats N] [--json FILE]

A token dataset: sample i is ``{"tokens": int32[L_i]}`` (a view of one
token array), L lognormal with mean ~300, cut to [1, 4096]. Four parts:

1. collate alone, batches of 64 samples (a random batch and a bucketed one):
   ``python_pad`` (the padding collate projects write: torch.from_numpy
   per sample and torch.nn.utils.rnn.pad_sequence) against fastload's
   ``pad_collate()`` and ``pack_collate()``; median time per batch;
2. padding fraction (padded tokens / tokens in the padded batches) of one
   epoch: random batches of 64 (BatchSampler over RandomSampler) against
   BucketBatchSampler by count (64) and by max_tokens (16384);
3. token utilisation of PackedBatchSampler (max_tokens 4096 and 8192,
   buckets of 4096 and 256 samples), first_fit against best_fit;
4. end to end, tokens/s over a second epoch (persistent workers) with 0 and 2 workers: torch's
   DataLoader and fastload's, each with the Python collate, against
   fastload with pad_collate over BucketBatchSampler and with pack_collate
   over PackedBatchSampler (same batches for the Python contenders: the
   bucketed by-count ones, so the collates compare on equal batches).

Targets (issue 17): pad/pack collate >= 5x the Python collate at batch 64;
bucketed padding fraction <= 1/3 of random batching's; best_fit >= 95%
token utilisation.
"""
import argparse
import itertools
import json
import platform
import statistics
import sys
import time

import numpy as np

MEAN_LENGTH, MAX_LENGTH, SIGMA = 300, 4096, 0.8
BATCH = 64
BUCKET_TOKENS = 16384
PACK_TOKENS = (4096, 8192)
# Samples packed together: the sampler's default, and a small window in
# which the choice of bin matters more.
PACK_WINDOWS = (4096, 256)


class TokenDataset:
    """Map-style: int32 tokens of lognormal lengths, one array underneath."""

    def __init__(self, size, seed=0):
        rng = np.random.default_rng(seed)
        mu = np.log(MEAN_LENGTH) - SIGMA ** 2 / 2  # so that the mean is ~MEAN_LENGTH
        self.lengths = np.clip(rng.lognormal(mu, SIGMA, size).astype(np.int64), 1, MAX_LENGTH)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        self.tokens = rng.integers(0, 50000, int(self.offsets[-1]), dtype=np.int32)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, index):
        return {"tokens": self.tokens[self.offsets[index]:self.offsets[index + 1]]}


def python_pad(batch):
    """The padding collate_fn written by hand in NLP projects."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    tokens = [torch.from_numpy(sample["tokens"]) for sample in batch]
    lengths = torch.tensor([len(t) for t in tokens], dtype=torch.int64)
    return {"tokens": pad_sequence(tokens, batch_first=True, padding_value=0),
            "lengths": lengths}


def loop_seconds(fn, number):
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def calibrated_number(fn, min_time=0.05):
    """Calls per timed loop so that one loop lasts at least ``min_time``."""
    fn()
    number = 1
    while loop_seconds(fn, number) * number < min_time:
        number *= 2
    return number


def collate_alone(dataset, repeats):
    """Median seconds per batch of each collate, the contenders timed in
    alternation, so that load from other processes hits all of them alike."""
    import fastload as fl

    rng = np.random.default_rng(1)
    random_batch = [dataset[int(i)] for i in rng.permutation(len(dataset))[:BATCH]]
    bucketed = next(iter(fl.BucketBatchSampler(range(len(dataset)), dataset.lengths,
                                               batch_size=BATCH, shuffle=False)))
    bucket_batch = [dataset[i] for i in bucketed]
    contenders = {"python_pad": python_pad, "pad_collate": fl.pad_collate(),
                  "pack_collate": fl.pack_collate()}
    calls = {f"{batch_name}/{name}": (lambda c=collate, b=batch: c(b))
             for batch_name, batch in (("random", random_batch), ("bucketed", bucket_batch))
             for name, collate in contenders.items()}
    numbers = {key: calibrated_number(fn) for key, fn in calls.items()}
    times = {key: [] for key in calls}
    for _ in range(repeats):
        for key, fn in calls.items():
            times[key].append(loop_seconds(fn, numbers[key]))
    return {key: statistics.median(values) for key, values in times.items()}


def padding_fraction(batches, lengths):
    real = sum(int(lengths[b].sum()) for b in batches)
    padded = sum(len(b) * int(lengths[b].max()) for b in batches)
    return 1 - real / padded


def batching(dataset):
    import fastload as fl

    n, lengths = len(dataset), dataset.lengths
    random = list(fl.BatchSampler(fl.RandomSampler(range(n), generator=0), BATCH, False))
    by_count = list(fl.BucketBatchSampler(fl.RandomSampler(range(n), generator=0), lengths,
                                          batch_size=BATCH, generator=1))
    by_tokens = list(fl.BucketBatchSampler(fl.RandomSampler(range(n), generator=0), lengths,
                                           max_tokens=BUCKET_TOKENS, generator=1))
    out = {"padding_fraction": {
        "random": padding_fraction(random, lengths),
        "bucketed_by_count": padding_fraction(by_count, lengths),
        "bucketed_by_tokens": padding_fraction(by_tokens, lengths)}, "utilisation": {}}
    for window, budget, strategy in itertools.product(
            PACK_WINDOWS, PACK_TOKENS, ("first_fit", "best_fit")):
            start = time.perf_counter()
            bins = list(fl.PackedBatchSampler(fl.RandomSampler(range(n), generator=0), lengths,
                                              max_tokens=budget, strategy=strategy,
                                              bucket_size=window))
            out["utilisation"][f"{strategy}/{budget}/bucket {window}"] = {
                "utilisation": int(lengths.sum()) / (len(bins) * budget),
                "bins": len(bins), "plan_seconds": time.perf_counter() - start}
    return out


def end_to_end(dataset, workers):
    import torch

    import fastload as fl

    n, lengths, total = len(dataset), dataset.lengths, int(dataset.lengths.sum())

    def bucketed():
        return fl.BucketBatchSampler(fl.RandomSampler(range(n), generator=0), lengths,
                                     batch_size=BATCH, generator=1)

    batches = list(bucketed())
    persistent = workers > 0
    loaders = {
        "torch+python_pad": lambda: torch.utils.data.DataLoader(
            dataset, batch_sampler=batches, collate_fn=python_pad, num_workers=workers,
            persistent_workers=persistent),
        "fastload+python_pad": lambda: fl.DataLoader(
            dataset, batch_sampler=batches, collate_fn=python_pad, num_workers=workers,
            persistent_workers=persistent),
        "fastload+pad_collate": lambda: fl.DataLoader(
            dataset, batch_sampler=bucketed(), collate_fn=fl.pad_collate(),
            num_workers=workers, persistent_workers=persistent),
        "fastload+pack_collate(best_fit 8192)": lambda: fl.DataLoader(
            dataset, batch_sampler=fl.PackedBatchSampler(
                fl.RandomSampler(range(n), generator=0), lengths, max_tokens=8192),
            collate_fn=fl.pack_collate(), num_workers=workers, persistent_workers=persistent),
    }
    out = {}
    for name, make in loaders.items():
        loader = make()
        # The second epoch is timed: worker start-up is not what is compared.
        sum(1 for _ in loader)
        start = time.perf_counter()
        count = sum(1 for _ in loader)
        seconds = time.perf_counter() - start
        out[name] = {"tokens_per_second": total / seconds, "batches": count,
                     "seconds": seconds}
        del loader
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="write every figure to this file")
    args = parser.parse_args()
    import torch

    # Worker processes are forked from this one after it ran torch ops: a
    # forked child that inherits a started intra-op thread pool can hang in
    # its first parallel op (torch's own workers set one thread for this
    # reason). One thread also makes the collate timings single-core ones.
    torch.set_num_threads(1)
    dataset = TokenDataset(args.samples)
    report = {"versions": {"python": platform.python_version(), "numpy": np.__version__,
                           "torch": torch.__version__},
              "dataset": {"samples": args.samples, "mean_length": float(dataset.lengths.mean()),
                          "max_length": int(dataset.lengths.max())},
              "collate_seconds": collate_alone(dataset, args.repeats),
              **batching(dataset),
              "end_to_end": {w: end_to_end(dataset, w) for w in (0, 2)}}
    print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


def print_report(report):
    data = report["dataset"]
    print(f"{data['samples']} samples, mean length {data['mean_length']:.0f}, "
          f"max {data['max_length']}; {report['versions']}")
    collate = report["collate_seconds"]
    print(f"\ncollate alone, batch {BATCH} (median µs per batch; speed-up over python_pad)")
    for batch in ("random", "bucketed"):
        python = collate[f"{batch}/python_pad"]
        for name in ("python_pad", "pad_collate", "pack_collate"):
            t = collate[f"{batch}/{name}"]
            print(f"  {batch:9} {name:13} {t * 1e6:9.1f} µs  {python / t:5.1f}x")
    fractions = report["padding_fraction"]
    print("\npadding fraction of one epoch")
    for name, value in fractions.items():
        print(f"  {name:19} {value:6.3f}  ({value / fractions['random']:.2f} of random)")
    print("\npacking: token utilisation")
    for name, value in report["utilisation"].items():
        print(f"  {name:26} {value['utilisation']:7.2%}  {value['bins']:5} bins  "
              f"planned in {value['plan_seconds'] * 1e3:.0f} ms")
    print("\nend to end, the second epoch (million tokens/s)")
    for workers, runs in report["end_to_end"].items():
        for name, value in runs.items():
            print(f"  workers={workers} {name:37} {value['tokens_per_second'] / 1e6:7.2f}  "
                  f"({value['batches']} batches)")


if __name__ == "__main__":
    sys.exit(main())
