"""torch's samplers made resumable: ``resumable(draws)`` is what a
DataLoader draws its indices from when they are torch's ``RandomSampler``,
``SubsetRandomSampler`` or ``WeightedRandomSampler`` (exactly those types),
alone or under a ``BatchSampler`` (torch's or fastload's), and when they
are torch's ``BatchSampler`` over a sampler with a state.

Those samplers keep no state: each epoch's order is drawn from a generator
(the sampler's own, else torch's global one) when their iterator starts.
Counting batches on resume would replay another order, silently, so
``ResumableDraw`` records what the order came from (NOTE [ Resume contract ]
in fastload._checkpoint).

Any other sampler without a state of its own may keep it in its iterator,
as torchdata's samplers do: ``IterationState`` gives it that state.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from fastload._fetch import is_stateful
from fastload._torch import generator_state, set_generator_state, torch_data_classes
from fastload.sampler import BatchSampler, SequentialSampler, _InfiniteConstantSampler

# torch's random samplers, by name (their classes exist once torch is loaded).
TORCH_RANDOM_SAMPLERS = ("RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler")
# The key that marks a state taken with a subclass of those (see
# unresumable_sampler), naming it.
UNRESUMABLE_SAMPLER = "torch_stateless_sampler"


class ResumableDraw:
    """The same draws as ``draws``, plus the ``state_dict`` torch's random
    samplers lack: the generator's state when the epoch's first draw was
    made and the number of draws since; between ``iter()`` and that first
    draw, the generator's state now, which the draw will start from; before
    any iteration and once one ran out, that too for a generator of the
    sampler's own (``saves_generator``), and no generator state for the
    loader's or torch's global one (the loader's own state puts its
    generator, torch's global one for ``fastload.torch``, where the next
    epoch draws from, after the base seed it draws first). A resumed epoch
    sets the recorded state for its first draw, puts the caller's state
    back (unless it was that state already), and skips what was drawn: the
    same order, wherever it stopped."""

    def __init__(self, draws: Any, random_sampler: Any, saves_generator: bool) -> None:
        self.draws = draws  # the sampler or batch sampler to draw from
        self._random_sampler = random_sampler
        self._saves_generator = saves_generator
        self._start: Any = None  # the generator's state this epoch began from
        self._pending = False  # iter() was called, its first draw not made yet
        self._pending_resume: tuple[Any, int] | None = None  # that iter()'s resume
        self._drawn = 0
        self._resume: tuple[Any, int] | None = None

    def _generator(self) -> Any:
        import torch  # a torch sampler is here: torch is loaded

        generator = self._random_sampler.generator
        return torch.default_generator if generator is None else generator

    def __iter__(self) -> Iterator[Any]:
        self._start, self._drawn, self._pending = None, 0, True
        resume, self._resume = self._resume, None
        # Until its first draw, the epoch is the resumed one (state_dict).
        self._pending_resume = resume
        return self._draw_epoch(resume)

    def _draw_epoch(self, resume: tuple[Any, int] | None) -> Iterator[Any]:
        import torch

        generator = self._generator()
        caller = None
        if resume is not None and resume[0] is not None:
            start = torch.as_tensor(resume[0], dtype=torch.uint8)
            # torch's global generator, which other code draws from too, gets
            # the caller's state back once the sampler's first step drew from
            # it (all that draws from it: an unseeded RandomSampler seeds a
            # generator of its own there). A generator given to the sampler
            # is left where the replay leaves it: the sampler may draw from
            # it all epoch long (indices with replacement, 32 at a time; the
            # remainder's randperm at the end), as the saved run did.
            if self._random_sampler.generator is None:
                caller = generator_state(generator)
                if torch.equal(caller, start):
                    # Already there (the loader's state put torch's global
                    # generator there): the draw moves it on, as it did.
                    caller = None
            set_generator_state(generator, start)
        self._start, self._drawn, self._pending = generator_state(generator).tolist(), 0, False
        self._pending_resume = None
        draws = iter(self.draws)
        try:
            head = [next(draws)]  # where torch's samplers draw their order
        except StopIteration:
            head = []
        finally:
            if caller is not None:
                set_generator_state(generator, caller)
        for item in itertools.chain(head, draws):
            self._drawn += 1
            if resume is None or self._drawn > resume[1]:
                yield item
        self._start = None  # run out: the next iteration is a new epoch

    def __len__(self) -> int:
        return len(self.draws)

    def fresh_epoch_draws(self) -> Any:
        """What the next iteration draws when it starts a fresh epoch (the
        sampler it wraps); None while a resumed epoch is pending (for the
        epoch lookahead of fastload._lookahead)."""
        return self.draws if self._resume is None else None

    def state_dict(self) -> dict[str, Any]:
        if self._start is not None:
            return {"generator": self._start, "drawn": self._drawn}
        resume = self._pending_resume
        if self._pending and resume is not None and resume[0] is not None:
            # A resumed epoch not drawn from yet (the loader's snapshot at
            # iter()): it is that state's epoch, not one from the generator
            # as it is now.
            return {"generator": resume[0], "drawn": resume[1]}
        # Where the next draw starts from: after iter(), and for a generator
        # of the sampler's own at any time (between epochs nothing else puts
        # it back); the loader's or torch's global one between epochs is the
        # loader state's or the caller's.
        pending = (generator_state(self._generator()).tolist()
                   if self._pending or self._saves_generator else None)
        return {"generator": pending, "drawn": 0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume = (state["generator"], int(state["drawn"]))


class IterationState:
    """``sampler`` with the state its current iterator keeps: torchdata's
    protocol, in which ``iter(sampler)`` returns an iterator with
    ``state_dict`` and ``load_state_dict`` (torchdata's RandomSampler and
    BatchSampler), the sampler itself keeping none. ``state_dict()`` is the
    latest iterator's (a loaded one's until an iterator takes it), or None
    when it keeps none, or before any: the DataLoader then counts batches,
    as for any sampler without a state. A loaded state goes into the next
    iterator, which continues that iteration, as torchdata's loader
    restores one. Whether that iteration had ended is not known here: the
    DataLoader tries (NOTE [ A stream restored at its end ] in
    fastload._fetch)."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self._iterator: Any = None  # the latest iterator, if it keeps a state
        self._next: Iterator[Any] | None = None  # made by _begin_epoch_draws
        self._pending: Any = None  # a loaded state, for the next iterator

    def _begin_epoch_draws(self) -> None:
        """An epoch's draws begin (fastload.sampler.index_batches). Once
        iterators are known to keep a state, the epoch's is made now, so a
        state recorded before its first draw is its own, not the last
        epoch's (fastload's BatchSampler asks for it at its first batch,
        as torch's does; torchdata's asks at once)."""
        if self._next is None and (self._iterator is not None or self._pending is not None):
            self._next = self._new_iterator()

    def __iter__(self) -> Iterator[Any]:
        iterator, self._next = self._next, None
        return iterator if iterator is not None else self._new_iterator()

    def _new_iterator(self) -> Iterator[Any]:
        iterator = iter(self.sampler)
        stateful = is_stateful(iterator)
        pending, self._pending = self._pending, None
        if pending is not None:
            if not stateful:
                raise ValueError(
                    f"cannot resume {type(self.sampler).__name__}: the state holds its "
                    f"iterator's, but its iterator ({type(iterator).__name__}) has no "
                    "load_state_dict()")
            iterator.load_state_dict(pending)  # type: ignore[attr-defined]
        self._iterator = iterator if stateful else None
        return iterator

    def __len__(self) -> int:
        return len(self.sampler)

    def state_dict(self) -> dict[str, Any] | None:
        if self._pending is not None:
            return {"iterator": self._pending}
        iterator = self._iterator
        if iterator is None:
            return None
        try:
            return {"iterator": iterator.state_dict()}
        except Exception as exc:
            # Taken at every snapshot step, checkpoint or not: loading
            # such a state says why it cannot resume.
            return {"iterator_failed": f"{type(exc).__name__}: {exc}"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "iterator_failed" in state:
            raise ValueError(
                f"cannot resume {type(self.sampler).__name__}: when this state was taken, "
                f"its iterator's state_dict() raised {state['iterator_failed']}")
        self._pending, self._next = state["iterator"], None

    def __getstate__(self) -> dict[str, Any]:
        # A copy (a pickled loader's) starts its next iteration afresh from
        # the sampler as it is; a live iterator may not pickle at all.
        state = self.__dict__.copy()
        state["_iterator"] = state["_next"] = None
        return state


def _may_keep_state_in_iterator(sampler: Any) -> bool:
    """Whether ``sampler`` is of no kind known to keep no state, and keeps
    none itself: its iterator may (``IterationState``)."""
    known = (SequentialSampler, _InfiniteConstantSampler,
             *torch_data_classes(None, "SequentialSampler", "DistributedSampler",
                                 *TORCH_RANDOM_SAMPLERS))
    return not isinstance(sampler, known) and not is_stateful(sampler)


def is_torch_random_sampler(sampler: Any) -> bool:
    """Whether ``sampler`` is exactly one of torch's random samplers (a
    subclass may draw its order its own way)."""
    return type(sampler) in torch_data_classes(None, *TORCH_RANDOM_SAMPLERS)


def resumable(draws: Any, loader_generator: Any) -> Any:
    """``draws`` (a sampler or batch sampler), through ResumableDraw where it
    is one of torch's random samplers or a BatchSampler, torch's or
    fastload's, over one (whose generator, unless it is
    ``loader_generator``, its state saves). torch's BatchSampler (exactly)
    over a sampler with a state becomes fastload's over the same sampler:
    the same batches, and a state that holds the sampler's (torch's has
    none, and the sampler's own would be lost; torchdata swaps it
    likewise)."""
    batching = type(draws) in torch_data_classes(BatchSampler, "BatchSampler")
    inner = draws.sampler if batching else draws
    if is_torch_random_sampler(inner):
        own = inner.generator is not None and inner.generator is not loader_generator
        return ResumableDraw(draws, inner, saves_generator=own)
    if _may_keep_state_in_iterator(inner):
        inner = IterationState(inner)
        return BatchingOf(draws, inner) if batching else inner
    if (type(draws) in torch_data_classes(None, "BatchSampler")
            and callable(getattr(inner, "state_dict", None))
            and callable(getattr(inner, "load_state_dict", None))):
        return BatchingOf(draws, inner)
    return draws


class BatchingOf(BatchSampler):
    """fastload's BatchSampler over ``inner``, in place of the batch sampler
    ``batching`` (torch's or fastload's) over what ``inner`` wraps or is:
    its batch_size and drop_last as they are at each iteration, since a
    program may set them on the loader's batch_sampler, as torch honours."""

    def __init__(self, batching: Any, inner: Any) -> None:
        super().__init__(inner, batching.batch_size, batching.drop_last)
        self._batching = batching

    def _follow(self) -> None:
        self.batch_size, self.drop_last = self._batching.batch_size, self._batching.drop_last

    def __iter__(self) -> Iterator[list[int]]:
        self._follow()
        return super().__iter__()

    def __len__(self) -> int:
        self._follow()
        return super().__len__()


def unresumable_sampler(index_sampler: Any) -> str | None:
    """The class name of a torch random sampler under ``index_sampler``
    (a subclass, which ``resumable`` leaves as it is) whose order a resume
    would draw anew, or None. A state taken with one is marked, and
    ``load_state_dict`` refuses it rather than give other batches."""
    if isinstance(index_sampler, ResumableDraw):
        return None
    sampler = getattr(index_sampler, "sampler", index_sampler)
    kinds = torch_data_classes(None, *TORCH_RANDOM_SAMPLERS)
    if kinds and isinstance(sampler, kinds) and not hasattr(sampler, "state_dict"):
        return type(sampler).__name__
    return None


def refuse_unresumable(state: dict[str, Any]) -> None:
    """Raise ValueError for a state marked by ``unresumable_sampler``."""
    if UNRESUMABLE_SAMPLER in state:
        raise ValueError(
            f"load_state_dict() cannot resume torch's {state[UNRESUMABLE_SAMPLER]}: it keeps "
            "no state, so a resumed run would shuffle differently; use one of torch's own "
            "random samplers (not a subclass), fastload's, or a sampler with state_dict()")
