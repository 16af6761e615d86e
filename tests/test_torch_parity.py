"""Behaviours torch's own DataLoader tests check, where fastload's answer
must read as torch's: messages, constructors, typing."""
import pickle
import warnings
from typing import List

import numpy as np
import pytest

import fastload as fl
from fastload._torch import torch_or_none

torch = torch_or_none()
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")


def test_worker_died_error_is_built_from_a_message_alone():
    # torch's ExceptionWrapper and user code rebuild an exception as type(e)(msg).
    error = fl.WorkerDiedError("DataLoader worker (pid 1) is killed by signal: Killed.")
    assert str(error).startswith("DataLoader worker (pid 1)")
    assert error.worker_id is None and error.pid is None and error.batch is None
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is fl.WorkerDiedError and str(again) == str(error)


class Longer(fl.IterableDataset):
    def __len__(self):
        return 3

    def __iter__(self):
        return iter(range(5))


def test_the_length_warning_of_an_iterable_dataset_says_what_torch_says():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = fl.DataLoader(Longer(), batch_size=None)
        len(loader)
        list(loader)
    messages = [str(w.message) for w in caught]
    assert any("not properly configuring the IterableDataset replica at each worker"
               in m for m in messages), messages


def test_worker_pids_stay_readable_after_the_epoch():
    loader = fl.DataLoader(fl.ArrayDataset(np.arange(8)), batch_size=2, num_workers=2)
    it = iter(loader)
    pids = it.worker_pids
    list(it)  # the workers are shut down at the end of a non-persistent epoch
    assert it.worker_pids == pids and len(set(pids)) == 2


def test_stack_dataset_refuses_both_kinds_in_torchs_words():
    dataset = fl.ArrayDataset(np.arange(4))
    with pytest.raises(ValueError, match="Supported either ``tuple``- \\(via ``args``\\) or"
                                         "``dict``- \\(via ``kwargs``\\) like input/output, "
                                         "but both types are given"):
        fl.StackDataset(dataset, a=dataset)


@needs_torch
def test_the_torch_facing_loader_is_generic():
    import fastload.torch as ft
    alias = ft.DataLoader[List[torch.Tensor]]
    assert alias.__origin__ is ft.DataLoader


@needs_torch
@pytest.mark.parametrize("workers", [0, 2])
def test_nested_tensors_are_refused_by_the_default_collate_in_torchs_words(workers):
    class Nested(fl.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.nested.nested_tensor([torch.ones(i + 1), torch.ones(2)])

    loader = fl.DataLoader(Nested(), batch_size=2, num_workers=workers)
    with pytest.raises(RuntimeError, match="Batches of nested tensors are not currently "
                                           "supported by the default collate_fn"):
        next(iter(loader))
