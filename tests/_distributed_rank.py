"""One rank of the two-process test in test_distributed.py (run as a script).

Usage: _distributed_rank.py RANK WORLD_SIZE PORT OUT_JSON

Joins a gloo process group on 127.0.0.1:PORT, loads a small dataset through
fastload.DataLoader with a DistributedSampler that finds its rank and world
size itself, and all_gathers what every rank saw into OUT_JSON, for the
test to check. The launching test sets decoy SLURM_* variables, so a sampler
that read the environment instead of torch.distributed would show it.
"""
from __future__ import annotations

import datetime
import json
import sys

import numpy as np
import torch.distributed as dist
import torch.utils.data as td

import fastload as fl

DATASET_LEN = 23  # odd: with two ranks one index is padding
BATCH_SIZE = 4
SEED = 7
RESUME_EPOCH = 2
RESUME_AFTER_BATCHES = 2


def indices_of(batches) -> list[int]:
    return [int(i) for (values,) in batches for i in values]


def make_loader(dataset):
    sampler = fl.DistributedSampler(dataset, shuffle=True, seed=SEED)
    return sampler, fl.DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler,
                                  num_workers=2)


def run_rank(rank: int, world_size: int) -> dict:
    dataset = fl.ArrayDataset(np.arange(DATASET_LEN))
    sampler, loader = make_loader(dataset)
    report: dict = {
        "rank": rank,
        "discovered": [sampler.rank, sampler.num_replicas],
        "len_loader": len(loader),
        "batches_per_rank": fl.batches_per_rank(DATASET_LEN, world_size, BATCH_SIZE),
    }
    # torch's sampler, also left to find rank and world size itself: the
    # shape of the partition to match, and without shuffle the exact shard.
    reference = td.DistributedSampler(range(DATASET_LEN), shuffle=True, seed=SEED)
    report["torch_num_samples"] = reference.num_samples
    report["torch_total_size"] = reference.total_size
    report["torch_unshuffled"] = list(td.DistributedSampler(range(DATASET_LEN), shuffle=False))
    report["ours_unshuffled"] = list(fl.DistributedSampler(dataset, shuffle=False))

    report["epochs"] = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        batches = list(loader)
        report["epochs"].append(indices_of(batches))
        report.setdefault("batches_seen", []).append(len(batches))

    # Mid-epoch resume: a checkpoint after a few batches, restored into a new
    # sampler and loader (as after a restart), yields exactly what was left.
    sampler.set_epoch(RESUME_EPOCH)
    iterator = iter(loader)
    head = [next(iterator) for _ in range(RESUME_AFTER_BATCHES)]
    state = json.loads(json.dumps(loader.state_dict()))
    rest = indices_of(iterator)
    new_sampler, new_loader = make_loader(dataset)
    new_loader.load_state_dict(state)
    new_sampler.set_epoch(RESUME_EPOCH)
    report["resume_head"] = indices_of(head)
    report["resume_expected_rest"] = rest
    report["resume_rest"] = indices_of(new_loader)
    report["resumed_sampler_epoch"] = new_sampler.epoch
    return report


def main() -> None:
    rank, world_size, port = (int(arg) for arg in sys.argv[1:4])
    out_path = sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=60))
    try:
        report = run_rank(rank, world_size)
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, report)
        with open(out_path, "w") as out:
            json.dump(gathered, out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
