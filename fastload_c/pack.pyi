from collections.abc import Sequence
from typing import Any

from _typeshed import ReadableBuffer, WriteableBuffer
from typing_extensions import disjoint_base

from fastload_c.errors import FastloadError

class SlotTooSmallError(FastloadError, ValueError):
    needed: int
    capacity: int
    def __init__(self, needed: int, capacity: int) -> None: ...

def arrays_alike(samples: Sequence[Any]) -> bool: ...

# Each write returns the layout that unpack() reads the batch back with.
def collate_into(samples: Sequence[Any], target: WriteableBuffer, offset: int = 0,
                 capacity: int = -1, *, numpy_rules: bool = True, fd: int = -1) -> bytes: ...
def gather_into(columns: Any, indices: Any, target: WriteableBuffer, offset: int = 0,
                capacity: int = -1) -> bytes: ...
def int_rows(indices: object) -> Any: ...

@disjoint_base
class RowGather:
    def __init__(self, columns: Any) -> None: ...
    def into(self, indices: Any, target: WriteableBuffer, offset: int = 0,
             capacity: int = -1) -> bytes: ...
def pickle_into(obj: object, target: WriteableBuffer, offset: int = 0, capacity: int = -1, *,
                inband_limit: int = 1024, reserved: int = 0) -> bytes: ...
def unpack(base: ReadableBuffer, layout: bytes) -> Any: ...
