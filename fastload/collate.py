"""default_collate and default_convert: torch's structure rules; numpy
leaves stay numpy and tensor leaves stay tensors.

The sample structure is walked once per batch, not once per sample: the type
of the first sample picks a handler (cached per type, so a batch of dicts of
arrays costs one dict lookup per leaf), and each leaf is stacked with a single
numpy call.
"""
from __future__ import annotations

import contextvars
import copy
import pickle
from collections.abc import Callable, Mapping, MutableMapping, MutableSequence, Sequence
from typing import Any

import numpy as np

from fastload._gathered import GatheredBatch
from fastload._torch import is_tensor, torch_if_imported, torch_or_none
from fastload.errors import CollateError
from fastload_c import pack

__all__ = ["default_collate", "default_collate_torch_rules", "default_convert",
           "default_convert_torch_rules"]

_UNSUPPORTED = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, "
    "dicts or lists; found {}"
)
# Arrays of strings and objects have no batched numeric form (torch refuses
# them too); numeric kinds pass straight through a GatheredBatch.
_REFUSED_KINDS = frozenset("SUO")
NUMERIC_KINDS = frozenset("biufc")
# Datetimes, timedeltas and structured arrays: torch's default_collate
# refuses them (TypeError), numpy's rules stack them.
_NOT_TORCH_KINDS = frozenset("mMV")

Handler = Callable[[Sequence[Any], Any], Any]


def default_collate(batch: Sequence[Any]) -> Any:
    """Merge a list of samples into a batch with a leading batch dimension.

    numpy arrays and numpy scalars -> one stacked numpy array; torch tensors
    -> one stacked tensor (torch.stack, as torch does); float -> float64,
    int -> int64, bool -> bool arrays; str and bytes -> kept as they are;
    Mapping -> same mapping type of collated values; namedtuple -> same
    namedtuple; tuple -> list; other sequences -> same type (else list).
    Samples whose arrays disagree in shape raise CollateError naming both
    sample positions and shapes.
    """
    if isinstance(batch, GatheredBatch):
        # Any other column as the samples' transposition gives it: a tuple
        # (so strings stay a tuple, as torch keeps them).
        return [
            _as_batch(column) if is_stacked_column(column) else _collate(tuple(column))
            for column in batch.columns
        ]
    return _collate(batch)


# Whether a leaf whose samples differ in dtype is promoted by torch's rules
# (default_collate_torch_rules) rather than numpy's. A context variable: each
# worker thread collates in its own context.
_torch_rules: contextvars.ContextVar[bool] = contextvars.ContextVar("torch_rules",
                                                                   default=False)


def default_collate_torch_rules(batch: Sequence[Any]) -> Any:
    """default_collate, except where the samples of a leaf differ in dtype
    or number type: such a leaf is promoted as torch's default_collate
    promotes it (an int beside a float gives torch's default float dtype,
    int64 arrays beside float32 ones float32), or raises what torch's raises;
    and arrays of datetimes, timedeltas and structured dtypes raise
    TypeError, as torch's do. The batch is still numpy's; fastload.torch
    makes tensors of it."""
    token = _torch_rules.set(True)
    try:
        return default_collate(batch)
    finally:
        _torch_rules.reset(token)


def default_convert_torch_rules(data: Any) -> Any:
    """default_convert, except that a numpy leaf torch's default_convert
    cannot make a tensor of (a datetime, a uint64 scalar, bytes) raises
    what torch's raises."""
    token = _torch_rules.set(True)
    try:
        return default_convert(data)
    finally:
        _torch_rules.reset(token)


def engine_collation(collate_fn: Callable[[Any], Any],
                     output: str | None) -> tuple[Callable[[Any], Any], str | None]:
    """The collate_fn and output a loader's iterators run: torch's own
    default_collate or default_convert given as ``collate_fn`` runs as
    fastload.torch runs it, fastload's collation by torch's rules (or
    conversion) and tensors out, so that its result is the one torch makes
    in the main process at every num_workers, with batching or without
    (torch's own, in a worker, stacks into new shared memory and raises for
    what it cannot share there), and written in C where it can be; any
    other as it is."""
    torch = torch_if_imported()
    if torch is not None:
        data = torch.utils.data
        if collate_fn is data.default_collate:
            return default_collate_torch_rules, output or "torch"
        if collate_fn is data.default_convert:
            return default_convert_torch_rules, output or "torch"
    return collate_fn, output


def _promoted_as_torch(batch: Sequence[Any], make: Callable[[Any, Sequence[Any]], Any]
                       ) -> np.ndarray:
    """``make(torch, batch)``, torch's batch of a leaf whose samples differ
    in dtype, as numpy."""
    torch = torch_or_none()
    if torch is None:
        raise ImportError("default_collate_torch_rules needs PyTorch installed")
    result: np.ndarray = make(torch, batch).numpy()
    return result


def _stack_as_torch(torch: Any, batch: Sequence[Any]) -> Any:
    # Each array in native order first, as fastload's own batches are (torch
    # refuses another byte order); any other sample as torch takes it.
    return torch.stack([
        torch.as_tensor(np.array(a, dtype=a.dtype.newbyteorder("="), order="C")
                        if isinstance(a, np.ndarray) else a)
        for a in batch])


def _as_torch_makes_it(data: Any) -> np.ndarray:
    """torch.as_tensor's result for ``data``, as numpy, or its error."""
    return _promoted_as_torch(data, lambda torch, d: torch.as_tensor(d))


def _torch_refuses_scalar(elem: np.generic) -> bool:
    """Whether torch.as_tensor refuses this kind of numpy scalar, which
    numpy's rules take: datetimes, timedeltas, structured values, bytes,
    and uint64 (torch takes uint64 arrays, not scalars)."""
    return elem.dtype.kind in _NOT_TORCH_KINDS or elem.dtype.kind == "S" or elem.dtype == np.uint64


def _torch_makes_it_otherwise(batch: Sequence[Any], elem: np.ndarray) -> bool:
    """Whether torch's default_collate makes this leaf of arrays otherwise
    than numpy's rules do: a dtype torch refuses, samples of other classes
    or of other dtypes (torch's promotion, or its refusal to promote uint16
    to uint64 beside other ints)."""
    return elem.dtype.kind in _NOT_TORCH_KINDS or not pack.arrays_alike(batch)


def _as_batch(column: Any) -> Any:
    """A stacked gathered column as its batch: a tensor as it is, an array
    under its canonical dtype's name (np.longlong's as np.int64's, as the C
    gather names it), a view."""
    return column if is_tensor(column) else _canonical(column)


def is_stacked_column(column: Any) -> bool:
    """Whether a gathered column already is its batch, which default_collate
    returns as it is: torch tensors and numeric arrays in native byte order
    (strings and objects are collated per sample, as torch does; another
    byte order too, which collating the samples makes native)."""
    return is_tensor(column) or (column.dtype.kind in NUMERIC_KINDS and column.dtype.isnative)


def _collate(batch: Sequence[Any]) -> Any:
    elem = batch[0]
    handler = _handlers.get(type(elem))
    if handler is None:
        handler = _resolve_handler(elem)
    return handler(batch, elem)


def _shape_error(shapes: list[tuple[int, ...]]) -> CollateError:
    first = shapes[0]
    position = next((i for i, shape in enumerate(shapes) if shape != first), None)
    if position is None:
        return CollateError("default_collate: samples could not be stacked")
    # The positions let the dataset fetcher name the dataset indices as well.
    return CollateError(
        f"default_collate: sample {position} has shape {shapes[position]} "
        f"but sample 0 has shape {first}",
        (position, 0),
    )


# dtype -> the dtype of its batches (_canonical); bounded like _handlers.
_canonical_dtypes: dict[np.dtype[Any], np.dtype[Any]] = {}


def _canonical_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """numpy's promotion of ``dtype`` alone, under the name a pickle gives
    back (see _canonical)."""
    if dtype.fields is not None:
        # Struct dtypes equal under == may promote apart (an aligned one keeps
        # its padding): not cached, where one could answer for the other.
        promoted: np.dtype[Any] = pickle.loads(pickle.dumps(np.result_type(dtype)))
        return promoted
    canonical = _canonical_dtypes.get(dtype)
    if canonical is None:
        canonical = pickle.loads(pickle.dumps(np.result_type(dtype)))
        if len(_canonical_dtypes) >= _MAX_CACHED_TYPES:
            _canonical_dtypes.clear()
        _canonical_dtypes[dtype] = canonical
    return canonical


def _canonical(out: np.ndarray) -> np.ndarray:
    """``out`` in the dtype a batch has however it was collated: numpy's
    promotion of the samples' dtypes (native byte order, packed fields), as
    np.array gives from two samples on but not for a lone one, under the
    name a pickle gives back (np.ulonglong's arrays come back as
    np.uint64's): the dtype of the C collation and of worker processes."""
    dtype = out.dtype
    canonical = _canonical_dtype(dtype)
    if canonical is dtype or (canonical.char == dtype.char and canonical == dtype):
        return out
    # Equal dtypes under two names ('Q' and 'L') share bytes: a view.
    return out.view(canonical) if canonical == dtype else out.astype(canonical)


def _collate_arrays(batch: Sequence[Any], elem: np.ndarray) -> np.ndarray:
    if elem.dtype.kind in _REFUSED_KINDS:
        raise TypeError(_UNSUPPORTED.format(elem.dtype))
    try:
        # np.array stacks equal-shaped arrays several times faster than np.stack.
        out = np.array(batch)
    except ValueError:
        raise _shape_error([np.shape(a) for a in batch]) from None
    if out.shape[1:] != elem.shape:
        raise _shape_error([np.shape(a) for a in batch])
    if out.dtype.kind in _REFUSED_KINDS:
        raise TypeError(_UNSUPPORTED.format(out.dtype))
    if _torch_rules.get() and _torch_makes_it_otherwise(batch, elem):
        return _promoted_as_torch(batch, _stack_as_torch)
    return _canonical(out)


def _collate_tensors(batch: Sequence[Any], elem: Any) -> Any:
    torch = torch_if_imported()
    assert torch is not None  # a tensor exists, so torch is loaded
    if getattr(elem, "is_nested", False):
        raise RuntimeError(  # torch's words
            "Batches of nested tensors are not currently supported by the default "
            "collate_fn; please provide a custom collate_fn to handle them appropriately.")
    if elem.layout in {torch.sparse_coo, torch.sparse_csr, torch.sparse_bsr, torch.sparse_csc,
                       torch.sparse_bsc}:
        raise RuntimeError(  # torch's words
            "Batches of sparse tensors are not currently supported by the default "
            "collate_fn; please provide a custom collate_fn to handle them appropriately.")
    try:
        return torch.stack(list(batch))
    except RuntimeError:
        shapes = [tuple(t.shape) for t in batch]
        if all(shape == shapes[0] for shape in shapes):
            raise  # not the shapes: torch's own reason (dtypes it cannot promote, say)
        raise _shape_error(shapes) from None


def _collate_numpy_scalars(batch: Sequence[Any], elem: Any) -> np.ndarray:
    if _torch_rules.get() and (len(set(map(type, batch))) > 1 or _torch_refuses_scalar(elem)):
        return _as_torch_makes_it(batch)
    return _canonical(_numbers(batch))


def _collate_floats(batch: Sequence[Any], elem: Any) -> np.ndarray:
    # Inferred first: a real kind means every sample is a number, which
    # float() reads as numpy's inference does. Forced, None would turn into
    # NaN and "2.5" into 2.5, silently.
    out = _inferred(batch)
    if out is not None and out.dtype.kind in "biuf":
        return out.astype(np.float64, copy=False)
    if _torch_rules.get():
        return _promoted_as_torch(batch, lambda torch, b: torch.tensor(b, dtype=torch.float64))
    _check_numbers(batch)
    return np.array(batch, dtype=np.float64)  # ints past 64 bits among them


def _collate_ints(batch: Sequence[Any], elem: Any) -> np.ndarray:
    # Inferred rather than forced: ints give int64 (uint64 from 2**63 on),
    # bools give bool.
    if not _torch_rules.get():
        numbers = _numbers(batch)
        if numbers.dtype.kind == "f" and all(type(x) is int or type(x) is bool for x in batch):
            # Ints on both sides of 2**63, which numpy rounds to float64.
            numbers = _ints_past_int64(batch)
        return _canonical(numbers)
    out = _inferred(batch)
    if out is None or out.dtype not in (np.int64, np.bool_):
        # A float or a complex among them, an int past int64, or no number:
        # torch's batch, or torch's error.
        return _promoted_as_torch(batch, lambda torch, b: torch.tensor(b))
    return _canonical(out)


def _inferred(batch: Sequence[Any]) -> np.ndarray | None:
    """numpy's array of the samples, its dtype inferred; None where numpy
    cannot make one of them."""
    try:
        return np.array(batch)
    except (TypeError, ValueError):
        return None


def _numbers(batch: Sequence[Any]) -> np.ndarray:
    """numpy's array of samples that must all be numbers (numpy scalars of
    any kind included): CollateError naming the first that is not, and
    OverflowError for an int that fits in no 64-bit integer, where numpy
    would make an object or string array of them, silently."""
    try:
        out = np.array(batch)
    except (TypeError, ValueError):
        _check_numbers(batch)
        raise
    if out.dtype.kind in "OUS":
        _check_numbers(batch)
        position = next((i for i, x in enumerate(batch)
                         if isinstance(x, int) and not -2**63 <= x < 2**64), None)
        if position is not None:
            raise OverflowError(f"default_collate: sample {position} is an int that fits "
                                f"in no 64-bit integer ({batch[position]})")
    return out


def _ints_past_int64(batch: Sequence[Any]) -> np.ndarray:
    """uint64 for ints some of which only it holds, when none is negative;
    else OverflowError: no 64-bit integer holds them all."""
    if min(batch) >= 0:
        return np.array(batch, dtype=np.uint64)
    largest = max(batch)
    raise OverflowError("default_collate: the samples hold negative ints and ints past "
                        f"int64 (sample {batch.index(largest)} is {largest}); no 64-bit "
                        "integer holds them all")


def _check_numbers(batch: Sequence[Any]) -> None:
    """CollateError naming the first sample that is no number, if any."""
    for position, sample in enumerate(batch):
        if isinstance(sample, (str, bytes)) or not isinstance(
                sample, (int, float, complex, np.generic)):
            raise CollateError(
                f"default_collate: sample {position} is a {type(sample).__name__} but "
                f"sample 0 is a {type(batch[0]).__name__}", (position, 0))


def _keep(batch: Sequence[Any], elem: Any) -> Sequence[Any]:
    return batch


def _collate_dict(batch: Sequence[Any], elem: dict[Any, Any]) -> dict[Any, Any]:
    return {key: _collate([sample[key] for sample in batch]) for key in elem}


def rebuild_mapping(original: Mapping[Any, Any], values: dict[Any, Any]) -> Mapping[Any, Any]:
    """``values`` in a mapping of ``original``'s type, else a dict."""
    try:
        if isinstance(original, MutableMapping):
            # A copy keeps what the constructor would lose (defaultdict's factory).
            clone = copy.copy(original)
            clone.update(values)
            return clone
        return type(original)(values)  # type: ignore[call-arg]
    except TypeError:
        return values


def rebuild_sequence(original: Sequence[Any], values: list[Any]) -> Sequence[Any]:
    """``values`` in a sequence of ``original``'s type, else a list."""
    try:
        if isinstance(original, MutableSequence):
            clone = copy.copy(original)
            for i, value in enumerate(values):
                clone[i] = value
            return clone
        return type(original)(values)  # type: ignore[call-arg]
    except TypeError:
        return values


def _collate_mapping(batch: Sequence[Any], elem: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return rebuild_mapping(elem, _collate_dict(batch, elem))  # type: ignore[arg-type]


def _collate_namedtuple(batch: Sequence[Any], elem: Any) -> Any:
    return type(elem)(*(_collate(field) for field in zip(*batch)))


def _transpose(batch: Sequence[Any], elem: Sequence[Any]) -> list[Any]:
    size = len(elem)
    if any(len(sample) != size for sample in batch):
        raise RuntimeError("each element in list of batch should be of equal size")
    return [_collate(field) for field in zip(*batch)]


def _collate_sequence(batch: Sequence[Any], elem: Sequence[Any]) -> Any:
    return rebuild_sequence(elem, _transpose(batch, elem))


def _unsupported(batch: Sequence[Any], elem: Any) -> Any:
    raise TypeError(_UNSUPPORTED.format(type(elem)))


_handlers: dict[type, Handler] = {
    np.ndarray: _collate_arrays,
    float: _collate_floats,
    int: _collate_ints,
    bool: _collate_ints,
    str: _keep,
    bytes: _keep,
    dict: _collate_dict,
    tuple: _transpose,  # tuples collate to lists, as in torch
    list: _transpose,
}
_BUILTIN_TYPES = len(_handlers)
_MAX_CACHED_TYPES = 512


def _resolve_handler(elem: Any) -> Handler:
    """The handler for ``type(elem)``, in torch's order of precedence."""
    handler: Handler
    if is_tensor(elem):
        handler = _collate_tensors
    elif isinstance(elem, np.ndarray):
        handler = _collate_arrays
    elif isinstance(elem, (np.bool_, np.number, np.object_)):
        handler = _collate_numpy_scalars
    elif isinstance(elem, float):
        handler = _collate_floats
    elif isinstance(elem, int):
        handler = _collate_ints
    elif isinstance(elem, (str, bytes)):
        handler = _keep
    elif isinstance(elem, Mapping):
        handler = _collate_mapping
    elif isinstance(elem, tuple) and hasattr(elem, "_fields"):
        handler = _collate_namedtuple
    elif isinstance(elem, tuple):
        handler = _transpose
    elif isinstance(elem, Sequence):
        handler = _collate_sequence
    else:
        handler = _unsupported
    if len(_handlers) >= _BUILTIN_TYPES + _MAX_CACHED_TYPES:
        # Types made on the fly (a namedtuple per sample) must not grow this forever.
        for cached in list(_handlers)[_BUILTIN_TYPES:]:
            _handlers.pop(cached, None)  # another thread may be clearing too
    _handlers[type(elem)] = handler
    return handler


def default_convert(data: Any) -> Any:
    """Convert one sample (no batch dimension added), as the DataLoader does
    when automatic batching is off: numpy scalars -> 0-d arrays, arrays and
    torch tensors unchanged, containers converted element
    by element with the structure rules of default_collate; anything else is
    returned unchanged."""
    if isinstance(data, np.ndarray):
        if _torch_rules.get() and data.dtype.kind in _NOT_TORCH_KINDS:
            return _as_torch_makes_it(data)
        return data
    if is_tensor(data):
        return data
    if isinstance(data, np.generic) and not isinstance(data, np.str_):
        if _torch_rules.get() and _torch_refuses_scalar(data):
            return _as_torch_makes_it(data)
        if not isinstance(data, np.bytes_):
            return np.asarray(data)
    if isinstance(data, GatheredBatch):
        return [default_convert(sample) for sample in data]
    if isinstance(data, Mapping):
        return rebuild_mapping(data, {key: default_convert(data[key]) for key in data})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        return rebuild_sequence(data, [default_convert(d) for d in data])
    return data
