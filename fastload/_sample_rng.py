"""Per-sample random generators: augmentations that do not depend on which
process loads a sample, or when.

NOTE [ Per-sample randomness ]

torch seeds each worker's global generators differently, so a random crop
depends on which worker happened to load the sample: change num_workers, or
resume from a checkpoint, and the augmentations change. ``sample_rng()``
instead returns a generator keyed on (base seed, epoch, dataset index). The
base seed is drawn in the main process from the loader's ``generator`` the
same way whatever the number of workers, the epoch is the loader's count of
``iter()`` calls, and the index is the sample being fetched, so with a fixed
``generator`` every sample gets the same random stream for num_workers = 0,
1, 2, ... and after a resume.

The fetcher records which index it is fetching just before calling
``dataset[i]``; inside ``__getitems__`` (a whole batch at once) there is no
single current index, so pass it: ``sample_rng(i)``.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np


class SampleCursor:
    """The sample the current thread is fetching (None between samples).
    A plain object: a fetcher sets it once per sample, where setting an
    attribute of a ``threading.local`` costs five times as much (on 64
    samples a batch, about 9 us)."""

    __slots__ = ("index",)

    def __init__(self) -> None:
        self.index: Any = None


class SampleContext(threading.local):
    """Where the current thread is: set by the loader and its fetchers.
    Thread-local, because thread workers fetch different samples at once
    in one process (fastload._thread_workers). ``cursor`` is this thread's
    own, which a fetcher looks up once per batch."""

    def __init__(self) -> None:
        self.base_seed: int | None = None
        self.epoch = 0
        self.cursor = SampleCursor()


context = SampleContext()


def sample_rng(index: Any = None) -> np.random.Generator:
    """A numpy Generator for the sample being loaded (or for ``index``),
    the same for that sample in every run with the same loader
    ``generator``, whatever the number of workers; a new stream every epoch.

    Raises RuntimeError outside the loading of a sample by a DataLoader.
    """
    if index is None:
        index = context.cursor.index
    if context.base_seed is None or index is None:
        raise RuntimeError(
            "sample_rng() is only available while a DataLoader fetches a sample "
            "(inside the dataset's __getitem__); inside __getitems__ pass the index: "
            "sample_rng(i)")
    return np.random.default_rng([context.base_seed, context.epoch, int(index) % 2**64])
