"""The loaders of the resume property test (test_resume_property.py), and
the fresh process that resumes them: ``python tests/_resume_configs.py``
reads one JSON request per line (a configuration, a state, the global seed
to set) and answers with the batches the resumed loader delivers."""
import json
import sys

import numpy as np

import fastload as fl

N = 23


class Rows(fl.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return i


class EveryOther(fl.Sampler):
    """A custom sampler without state: fast-forwarded by counting."""

    def __iter__(self):
        return iter(list(range(0, N, 2)) + list(range(1, N, 2)))

    def __len__(self):
        return N


def make_loader(config, workers, persistent):
    kind, generator = config["sampler"], config["generator"]
    kwargs = dict(num_workers=workers, persistent_workers=persistent and workers > 0,
                  batch_size=config["batch_size"], drop_last=config["drop_last"])
    if kind == "sequential":
        return fl.DataLoader(Rows(), **kwargs)
    if kind == "shuffle":
        return fl.DataLoader(Rows(), shuffle=True, generator=generator, **kwargs)
    if kind == "replacement":
        sampler = fl.RandomSampler(Rows(), replacement=True, num_samples=17,
                                   generator=generator)
    elif kind == "num_samples":
        sampler = fl.RandomSampler(Rows(), num_samples=31, generator=generator)
    elif kind == "subset":
        sampler = fl.SubsetRandomSampler(list(range(3, N, 2)), generator=generator)
    elif kind == "weighted":
        sampler = fl.WeightedRandomSampler(np.arange(1.0, N + 1), 19, replacement=False,
                                           generator=generator)
    elif kind == "distributed":
        sampler = fl.DistributedSampler(Rows(), num_replicas=2, rank=1, seed=4)
    else:
        sampler = EveryOther()
    if config["batch_sampler"]:
        batch_sampler = fl.BatchSampler(sampler, kwargs.pop("batch_size"),
                                        kwargs.pop("drop_last"))
        return fl.DataLoader(Rows(), batch_sampler=batch_sampler, **kwargs)
    return fl.DataLoader(Rows(), sampler=sampler, **kwargs)


def batches(iterator):
    return [batch.tolist() for batch in iterator]


def resume(request):
    """The rest of the saved epoch (or, once it was over, the next one),
    then one more, from a loader built here that loads the state."""
    np.random.seed(request["global_seed"])  # whatever this process's RNG holds
    loader = make_loader(request["config"], request["workers"], request["persistent"])
    loader.load_state_dict(request["state"])
    return batches(iter(loader)) + batches(iter(loader))


if __name__ == "__main__":
    for line in sys.stdin:
        print(json.dumps(resume(json.loads(line))), flush=True)
