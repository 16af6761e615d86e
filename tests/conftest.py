import gc
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

# Property tests share two cores with other work: few examples, no deadline
# (timing noise is not a failure). FASTLOAD_HYPOTHESIS=thorough for more.
settings.register_profile(
    "fast", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("FASTLOAD_HYPOTHESIS", "fast"))


@pytest.fixture
def xy():
    """A small ArrayDataset's arrays: 10 float32 rows of 3 features, int64 labels."""
    features = np.arange(30, dtype=np.float32).reshape(10, 3)
    labels = np.arange(10, dtype=np.int64) * 10
    return features, labels


@pytest.fixture
def no_distributed_env(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "jax", raising=False)


@pytest.fixture
def earlier_garbage_collected():
    """For tests that count worker processes, threads or descriptors: an
    earlier test's pytest.raises info keeps its iterator in a reference cycle
    (the traceback holds the test's frame, which holds the info), so that
    iterator's workers and descriptors live until the cyclic collector runs,
    which may be in the middle of a later test. Collect it first, so the
    count is this test's own."""
    gc.collect()
