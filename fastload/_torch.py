"""The one place fastload reaches for PyTorch, which is optional.

Two questions are asked of torch, and they cost very different amounts:

* ``torch_if_imported()``: is torch already loaded in this process? Free. A
  torch.Tensor or torch.Generator can only exist if torch was imported, so
  type checks on the hot path (collate, generator handling) ask this and never
  pay the second-long import of torch themselves.
* ``torch_or_none()``: import torch if it is installed. Used only where the
  user asked for torch explicitly (``output='torch'``, pinning).
"""
from __future__ import annotations

import contextlib
import gc
import sys
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

_import_failed = False


def torch_or_none() -> ModuleType | None:
    """torch, imported on first call; None when it is not installed."""
    global _import_failed
    module = sys.modules.get("torch")
    if module is not None or _import_failed:
        return module
    try:
        import torch
    except ImportError:
        _import_failed = True
        return None
    return torch


def torch_if_imported() -> ModuleType | None:
    """torch if this process has already imported it, else None (no import).
    A torch that another thread is still importing counts as not imported:
    its modules are half made, and a worker thread importing one of them
    meanwhile could deadlock with that import, which Python breaks by
    handing one side a half-made module (an ImportError in the user's
    ``import torch``)."""
    torch = sys.modules.get("torch")
    if getattr(getattr(torch, "__spec__", None), "_initializing", False):
        return None
    return torch


# NOTE [ Generator states and threads ]
# torch reads and sets a generator's state holding the generator's mutex and
# the GIL. Making the state's tensor may run a garbage collection that lets
# the GIL go; another thread reading or setting a state then waits for the
# mutex with the GIL held, and neither goes on (two worker threads did this,
# each reading torch's global state). So fastload reads and sets a torch
# generator's state with garbage collection off, which keeps the GIL for the
# whole call (no other thread can then be waiting for that mutex with the
# GIL), and under one lock, which keeps the switching of collection off and
# on to one of its own calls at a time. What this cannot prevent: another
# thread's own read collecting garbage while it holds the mutex (two threads
# of a program reading torch's state deadlock so without fastload too), and
# a gc.disable() by another thread during the call, which the call's end
# undoes.
_generator_state_lock = threading.Lock()


@contextlib.contextmanager
def _holding_the_gil() -> Iterator[None]:
    """No garbage collection, so no other thread runs, inside (see NOTE above)."""
    with _generator_state_lock:
        collecting = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            if collecting:
                gc.enable()


def generator_state(generator: Any) -> Any:
    """``generator.get_state()`` of a torch.Generator (NOTE [ Generator
    states and threads ])."""
    with _holding_the_gil():
        return generator.get_state()


def set_generator_state(generator: Any, state: Any) -> None:
    """``generator.set_state(state)`` of a torch.Generator (NOTE [ Generator
    states and threads ])."""
    with _holding_the_gil():
        generator.set_state(state)


def is_tensor(obj: Any) -> bool:
    torch = torch_if_imported()
    return torch is not None and isinstance(obj, torch.Tensor)


def is_torch_generator(obj: Any) -> bool:
    torch = torch_if_imported()
    return torch is not None and isinstance(obj, torch.Generator)


def torch_data_classes(own: type | None, *names: str) -> tuple[type, ...]:
    """``own`` (if not None) and torch.utils.data's classes of those names,
    those of them that are loaded: what an exact-type check accepts."""
    kinds = (own, *(torch_data_class(name) for name in names))
    return tuple(kind for kind in kinds if kind is not None)


def torch_data_class(name: str) -> type | None:
    """torch.utils.data.<name> when torch is loaded, so torch's own Dataset and
    Sampler objects are recognised as inputs; None otherwise."""
    data = sys.modules.get("torch.utils.data")
    return getattr(data, name, None) if data is not None else None
