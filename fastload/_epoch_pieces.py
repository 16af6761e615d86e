"""A random sampler's epoch as pieces of indices, and the records of how far
it was drawn: the chunks a lookahead drew ahead (NOTE [ Epoch lookahead ] in
fastload._lookahead), the lazy state of one draw, and a batch of indices as
a list or as an array (NOTE [ Small gathers ] in fastload._fast_path).
``fastload.sampler`` draws with these."""
from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from typing import Any, Union

import numpy as np

# One piece of an epoch's indices: an array, or a list for non-array indices.
Chunk = Union[np.ndarray, list[Any]]
# An epoch's drawn indices become Python ints this many at a time: its first
# batches (and the epoch lookahead's guess of them, NOTE [ Epoch lookahead ]
# in fastload._lookahead) do not wait for a whole permutation's list.
LIST_ITEMS = 8192


def pieces(chunk: Chunk) -> Iterator[Chunk]:
    """A chunk in pieces of at most LIST_ITEMS (views: nothing converted)."""
    if isinstance(chunk, np.ndarray):
        for start in range(0, len(chunk), LIST_ITEMS):
            yield chunk[start:start + LIST_ITEMS]
    else:
        yield chunk


def joined(parts: list[Chunk]) -> Chunk:
    """One batch of slices of consecutive pieces: an array when they all
    are, else a list."""
    if all(isinstance(part, np.ndarray) for part in parts):
        return np.concatenate(parts)
    return list(itertools.chain.from_iterable(
        part.tolist() if isinstance(part, np.ndarray) else part for part in parts))


class DrawnAhead:
    """The chunks an epoch lookahead's copy of a sampler drew for the
    sampler's next epoch (NOTE [ Epoch lookahead ] in fastload._lookahead):
    its key (the token and what else the chunks depend on), the chunks drawn
    so far and the draw that goes on after them. A sampler and its shallow
    copies share one; a pickled or deep-copied sampler gets an empty one."""

    __slots__ = ("key", "chunks", "rest")

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.key: Any = None
        self.chunks: list[Chunk] = []
        self.rest: Iterator[Chunk] = iter(())

    def __reduce__(self) -> tuple[Any, ...]:
        return (DrawnAhead, ())


def recorded(drawn: DrawnAhead, key: Any) -> Iterator[Chunk]:
    """``drawn.rest``, each chunk kept in ``drawn.chunks`` as it is drawn."""
    for chunk in drawn.rest:
        if drawn.key == key:
            drawn.chunks.append(chunk)
        yield chunk


class LazyState(functools.partial):  # type: ignore[type-arg]
    """A sampler's state as of one draw, made into its ``state_dict()``
    when called. A DataLoader records the index sampler's state at every
    snapshot step (NOTE [ Resume contract ] in fastload._checkpoint) and
    reads few of them: for fastload's random samplers it records this,
    which costs no dicts (``lazy_state_getter``)."""


def epoch_state(generator: Any, epoch: Any, yielded: int) -> dict[str, Any]:
    """An _EpochSampler's state_dict()."""
    return {"generator": generator, "epoch": epoch, "yielded": yielded}


def batched_epoch_state(generator: Any, epoch: Any, yielded: int) -> dict[str, Any]:
    """A BatchSampler's state_dict() over an _EpochSampler."""
    return batch_state(epoch_state(generator, epoch, yielded))


def batch_state(inner: Any) -> dict[str, Any]:
    """A BatchSampler's state_dict() around its sampler's ``inner``."""
    return {"sampler": inner}


def listed(index: Any) -> Any:
    """A batch of ``_index_arrays()`` as iter() yields it (a list), for code
    that may show it to the user (a worker's fetch)."""
    return index.tolist() if isinstance(index, np.ndarray) else index


def same_indices(first: Any, second: Any) -> bool:
    """Whether two batches of one iteration (lists, or _index_arrays()'s
    arrays) hold the same indices."""
    if isinstance(first, np.ndarray) or isinstance(second, np.ndarray):
        return type(first) is type(second) and np.array_equal(first, second)
    return bool(first == second)
