"""Random generators: what fastload accepts as ``generator`` and how it draws.

NOTE [ Determinism contract ]

Everywhere torch takes a ``generator``, fastload takes one of:

* a ``torch.Generator``: fastload then calls exactly the torch functions that
  torch's own samplers call (``torch.randperm``, ``torch.randint``,
  ``torch.multinomial``, the int64 seed draw of the DataLoader iterator), in
  the same order, so the indices are identical to torch's for the same
  generator state;
* an int seed, turned once into ``numpy.random.default_rng(seed)``, or a
  ``numpy.random.Generator``: numpy algorithms, so the order does not depend
  on whether torch is installed;
* None: one seed is drawn from numpy's global RNG (``np.random``) the first
  time a loader or sampler needs randomness, and seeds a numpy Generator of
  its own that every later draw comes from (``own_generator``). So
  ``np.random.seed(s)`` makes a run reproducible, as ``torch.manual_seed(s)``
  does for torch, and the generator's state goes into checkpoints: a run
  resumed in a fresh process goes on exactly, later epochs included.

With numpy, a sampler draws one seed from its generator when an epoch starts
and derives the whole epoch from that seed alone. An epoch is therefore
described by one integer plus a count of indices handed out, which is what a
checkpoint needs to resume mid-epoch without replaying the epoch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Union

import numpy as np

from fastload._torch import generator_state as torch_generator_state
from fastload._torch import is_torch_generator
from fastload._torch import set_generator_state as set_torch_generator_state

if TYPE_CHECKING:
    import torch

    GeneratorArg = Union[int, np.random.Generator, torch.Generator, None]
    Rng = Union[np.random.Generator, torch.Generator, None]
else:
    GeneratorArg = Any
    Rng = Any

_INT64_MAX = np.iinfo(np.int64).max


def resolve_generator(generator: GeneratorArg) -> Rng:
    """The generator object fastload draws from for a user's ``generator``."""
    if generator is None or isinstance(generator, np.random.Generator):
        return generator
    if isinstance(generator, (int, np.integer)) and not isinstance(generator, (bool, np.bool_)):
        return np.random.default_rng(int(generator))
    if is_torch_generator(generator):
        return generator  # type: ignore[return-value]
    raise TypeError(
        "generator should be an int seed, a numpy.random.Generator or a "
        f"torch.Generator, but got {type(generator).__name__}"
    )


def draw_seed(rng: Rng) -> int:
    """A non-negative int64 seed drawn from ``rng`` (numpy's global RNG if None).

    With a torch.Generator this is the very draw torch's DataLoader iterator
    makes for its base seed, so the generator advances as it does in torch."""
    if rng is None:
        return int(np.random.randint(0, _INT64_MAX, dtype=np.int64))
    if isinstance(rng, np.random.Generator):
        return int(rng.integers(0, _INT64_MAX, dtype=np.int64))
    import torch

    return int(torch.empty((), dtype=torch.int64).random_(generator=rng).item())


def own_generator(rng: Rng) -> Rng:
    """``rng``, or for None a numpy Generator seeded with one draw from
    numpy's global RNG (NOTE [ Determinism contract ])."""
    return np.random.default_rng(draw_seed(None)) if rng is None else rng


def restored_generator(rng: Rng, state: Any) -> Rng:
    """``rng`` put in a ``generator_state()``; for None, a numpy Generator
    made in that state (a state saved by a loader without a generator)."""
    if rng is None and state is not None:
        rng = np.random.default_rng()
    set_generator_state(rng, state)
    return rng


def generator_state(rng: Rng) -> Any:
    """A snapshot of ``rng``'s state in plain values, so that a checkpoint
    holding it is JSON-serialisable (a torch.Generator's state bytes as a
    list of ints); None for numpy's global RNG, which fastload reads from
    but never rewinds."""
    if rng is None:
        return None
    if isinstance(rng, np.random.Generator):
        return rng.bit_generator.state
    return torch_generator_state(rng).tolist()


def set_generator_state(rng: Rng, state: Any) -> None:
    if rng is None or state is None:
        return
    if isinstance(rng, np.random.Generator):
        rng.bit_generator.state = state
        return
    import torch  # a torch.Generator: torch is loaded
    # A list from generator_state, or the tensor earlier states held.
    set_torch_generator_state(rng, torch.as_tensor(state, dtype=torch.uint8))


def permutation(rng: Rng, n: int) -> np.ndarray:
    """A random permutation of range(n) drawn from a numpy or torch generator."""
    if isinstance(rng, np.random.Generator):
        return rng.permutation(n)
    import torch

    return torch.randperm(n, generator=rng).numpy()


def randint(rng: Rng, high: int, size: int) -> np.ndarray:
    """``size`` integers uniform in [0, high) from a numpy or torch generator."""
    if isinstance(rng, np.random.Generator):
        return rng.integers(0, high, size, dtype=np.int64)
    import torch

    return torch.randint(high=high, size=(size,), dtype=torch.int64, generator=rng).numpy()


def multinomial(rng: Rng, weights: np.ndarray, num_samples: int, replacement: bool) -> np.ndarray:
    """``num_samples`` indices drawn with probability proportional to the
    float64 ``weights``, from a numpy or torch generator."""
    if isinstance(rng, np.random.Generator):
        return numpy_multinomial(rng, weights, num_samples, replacement)
    import torch

    return torch.multinomial(
        torch.from_numpy(weights), num_samples, replacement, generator=rng
    ).numpy()


def numpy_multinomial(
    rng: np.random.Generator, weights: np.ndarray, num_samples: int, replacement: bool
) -> np.ndarray:
    """Indices drawn with probability proportional to ``weights``.

    Raises RuntimeError for the distributions torch.multinomial rejects."""
    if weights.size == 0 or not np.all(np.isfinite(weights)) or np.any(weights < 0):
        raise RuntimeError(
            "invalid multinomial distribution: weights must be finite, "
            "non-negative and not empty"
        )
    total = weights.sum()
    if total <= 0:
        raise RuntimeError("invalid multinomial distribution (sum of weights <= 0)")
    if replacement:
        cdf = np.cumsum(weights)
        draws = rng.random(num_samples) * cdf[-1]
        picked = np.searchsorted(cdf, draws, side="right")
        # A draw rounded up to the total would land past the last category.
        last = np.flatnonzero(weights)[-1]
        return np.minimum(picked, last).astype(np.int64)
    if num_samples > weights.size:
        raise RuntimeError(
            f"cannot sample num_samples={num_samples} > {weights.size} categories "
            "without replacement"
        )
    if num_samples > np.count_nonzero(weights):
        raise RuntimeError(
            "invalid multinomial distribution (with replacement=False, "
            "not enough categories of non-zero weight to sample)"
        )
    # Efraimidis-Spirakis: the k smallest exponential keys scaled by 1/weight
    # are a weighted draw without replacement, in draw order, in O(n log n).
    with np.errstate(divide="ignore"):
        keys = rng.standard_exponential(weights.size) / weights
    return np.argsort(keys, kind="stable")[:num_samples].astype(np.int64)
