"""The real-data workloads of ``python -m fastload bench`` (issue 16): data
made at start, the same samples under every contender, the modules a
workload needs named when they are missing."""
import importlib.util
import os

import numpy as np
import pytest

import fastload as fl
from fastload._bench import runner, workloads


def test_a_workload_whose_modules_are_missing_is_skipped_with_how_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "datasets" else real_find_spec(name, *a))
    monkeypatch.setattr(runner, "cpu_capacity", lambda: 2.0)
    monkeypatch.setattr(runner, "run_one", lambda spec, memory: pytest.fail("measured"))
    plan = runner.Plan(workloads=["hf"], contenders=["fastload"], workers=[0], memory=False)
    outcome = runner.run(plan)
    assert outcome.skipped["hf"] == "not installed: datasets (pip install 'fastload[frameworks]')"
    assert outcome.measurements == [] and plan.workloads == []


def test_the_hf_workload_leaves_out_the_pool_baseline():
    plan = runner.Plan(workloads=["hf"], contenders=["fastload", "python-mp"], workers=[0, 2],
                       repeats=1)
    assert {s["contender"] for s in runner.schedule(plan, plan.contenders)} == {"fastload"}


def test_np_take_reference_times_the_rows_of_shuffled_batches():
    from fastload._bench import measure

    arrays = (np.zeros((1000, 8), np.float32), np.zeros(1000, np.int64))
    result = measure.time_take(arrays, 100, 0.01)
    assert result["samples"] >= 1000 and result["samples"] % 100 == 0
    assert result["bytes_per_sample"] == 8 * 4 + 8


@pytest.fixture
def jpeg_files(monkeypatch, tmp_path):
    pytest.importorskip("PIL", reason="the jpeg workload decodes with Pillow")
    monkeypatch.setattr(workloads, "JPEG_FILES", 6)
    monkeypatch.setattr(workloads.tempfile, "gettempdir", lambda: str(tmp_path))
    return tmp_path


def test_the_jpeg_workload_writes_real_jpeg_files_once(jpeg_files):
    from PIL import Image

    paths, labels = workloads.WORKLOADS["jpeg"].make_arrays()
    assert len(paths) == len(labels) == 6
    folder = workloads.jpeg_folder()
    assert os.listdir(jpeg_files) == [os.path.basename(folder)]
    written = [os.stat(p).st_mtime_ns for p in paths]
    again, _ = workloads.WORKLOADS["jpeg"].make_arrays()
    assert again.tolist() == paths.tolist() and [os.stat(p).st_mtime_ns for p in again] == written
    for path in paths:
        with Image.open(path) as image:
            assert image.format == "JPEG"
            assert all(workloads.JPEG_SIDES[0] <= side <= workloads.JPEG_SIDES[1]
                       for side in image.size)


def test_jpeg_samples_are_the_same_whatever_the_workers(jpeg_files):
    arrays = workloads.WORKLOADS["jpeg"].make_arrays()
    dataset = workloads.WORKLOADS["jpeg"].dataset("fastload", arrays)
    batches = [list(fl.DataLoader(dataset, batch_size=3, generator=1, num_workers=n))
               for n in (0, 2)]
    for (x0, y0), (x2, y2) in zip(*batches):
        assert x0.shape == (3, 3, workloads.JPEG_CROP, workloads.JPEG_CROP)
        assert x0.dtype == np.float32 and np.array_equal(x0, x2) and np.array_equal(y0, y2)
    # Normalised: about zero-mean, a spread of order one.
    assert abs(float(batches[0][0][0].mean())) < 3 and 0.1 < float(batches[0][0][0].std()) < 5


def test_the_pool_of_an_array_dataset_starts_with_slots_of_one_batch():
    from fastload import _memory

    rows = fl.ArrayDataset(np.zeros((100, 3), np.float32), np.arange(100))
    # 10 rows of 12 bytes, then the labels from the next 64-byte boundary.
    assert _memory.batch_slot_bytes(rows, 10) == 128 + 80
    assert _memory.batch_slot_bytes(fl.Subset(rows, [1, 2]), 10) == 208
    assert _memory.batch_slot_bytes(rows, None) is None
    assert _memory.batch_slot_bytes(fl.ArrayDataset(np.array(["a"] * 4)), 2) is None
    large = fl.ArrayDataset(np.zeros((8, 1 << 18), np.float32))
    it = iter(fl.DataLoader(large, batch_size=4, num_workers=2))
    assert next(it)[0].shape == (4, 1 << 18)
    pool = it._group.pool
    assert pool.slot_size == 4 << 20  # exactly one batch: never grown, no headroom
    assert all(size == pool.slot_size for _, _, size, _ in pool.segments)


def test_torchvision_samples_come_out_as_torchs_batches(jpeg_files):
    pytest.importorskip("torchvision", reason="the torchvision workload needs torchvision")
    import torch
    from torch.utils import data as td

    workload = workloads.WORKLOADS["torchvision"]
    arrays = workload.make_arrays()
    shape = (3, 3, workloads.JPEG_CROP, workloads.JPEG_CROP)
    # The crops are drawn from torch's generator, seeded per worker: the
    # leaves' types, shapes, dtypes and labels are what every loader agrees on.
    theirs = list(td.DataLoader(workload.dataset("torch", arrays), batch_size=3))
    for workers, method in ((0, "multiprocessing"), (2, "multiprocessing"), (2, "thread")):
        ours = list(fl.DataLoader(workload.dataset("fastload", arrays), batch_size=3,
                                  num_workers=workers, worker_method=method))
        assert len(ours) == len(theirs) == 2
        for (x, y), (tx, ty) in zip(ours, theirs):
            assert type(x) is torch.Tensor and x.dtype == tx.dtype == torch.float32
            assert x.shape == tx.shape == shape
            assert type(y) is np.ndarray and y.tolist() == ty.tolist()
