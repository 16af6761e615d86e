"""How a worker puts a batch into its slot: a C fast path where it provably
gives the batch the main process would compute, else the general path.

NOTE [ Fast paths ]

A worker computes what ``num_workers=0`` computes: the same fetcher
(``fastload._fetch``: the dataset's own ``__getitems__``/``__getitem__``,
the ``Subset`` and ``ConcatDataset`` rules) and the same ``collate_fn``.
The general path is exactly that: ``fetcher.fetch``'s batch, pickled into
the slot (protocol 5, large buffers out of band, so arrays still arrive as
views of the slot) by a worker process, handed over as it is by a worker
thread (``BatchWriter.plan`` is the decision both take). The writers of ``fastload_c.pack`` are optimisations,
taken only under default collation and only where they give the same
batch:

- gather: the dataset's type is exactly ``ArrayDataset`` (or the
  ``TensorArrayDataset`` it makes of tensors) or torch's ``TensorDataset``
  of CPU tensors, or exactly a ``Subset`` (fastload's or torch's, nested,
  over integer index arrays) of one, and every column is numeric
  (``dataset.gathered_columns``). A batch is then one row of each column
  per index: ``ArrayDataset.__getitems__`` gathers them and
  ``default_collate`` returns the columns as they are (of a TensorDataset's
  tuples it stacks the rows, the same bytes). A ``pack.RowGather`` of the
  columns (``gather_into`` with its per-call work done once) copies the
  same rows straight into the slot, and gives tensor columns back as
  tensors over it (their rows read through numpy views). A Subset's
  indices are turned into one array per worker, not per batch. Subclasses
  may override anything, so they take the general path.
- columns: the dataset returned a ``GatheredBatch`` or ``GatheredTensors``
  (``ConcatDataset`` of ArrayDatasets, say) whose columns are all numeric:
  copied as they are, tensors staying tensors.
- collate: any other samples go through ``collate_into``, which mirrors
  ``default_collate`` for arrays, numbers, strings and containers (and
  ``default_collate_torch_rules``, but for a leaf whose samples differ in
  dtype or whose dtype is no number's, which it leaves to the general
  path).
- in place: ``pad_collate`` and ``pack_collate`` run as they are (the same
  code as in the main process), only their output blocks are carved from
  the slot (``ragged.outputs_from``), so each sample's rows are copied once;
  ``pickle_into`` then names those blocks where they lie instead of copying.

A fast path never decides an outcome it is unsure of: when one raises
(a leaf it does not handle, such as a tensor on a device or an object array;
samples that disagree; an index out of range), the general path runs on the
same samples (the dataset is not asked twice), and its batch or its
exception is the outcome, exactly as in the main process. Only
``SlotTooSmallError`` passes through: the batch is then written again into
a bigger slot. A test compares every path with ``num_workers=0`` on
generated datasets (tests/test_worker_differential.py).
"""
from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

from fastload import ragged
from fastload._fetch import DatasetFetcher, DatasetKind
from fastload._gathered import GatheredBatch, GatheredTensors
from fastload._memory import batch_slot_bytes
from fastload._stats import WorkerStats
from fastload.collate import default_collate, default_collate_torch_rules, is_stacked_column
from fastload.dataset import ArrayDataset, TensorArrayDataset, gathered_columns, is_plain_subset
from fastload_c import pack
from fastload_c.pack import SlotTooSmallError

# (target, offset, capacity) -> layout; see fastload_c.pack.
Write = Callable[[Any, int, int], bytes]


def _gather_source(dataset: Any) -> tuple[tuple[Any, ...], np.ndarray | None] | None:
    """(columns, row map) when batches of ``dataset`` are rows of
    ``gathered_columns`` at ``row_map[index]`` (no map: at ``index``), else
    None."""
    if is_plain_subset(dataset):
        inner = _gather_source(dataset.dataset)
        if inner is None:
            return None
        rows = np.asarray(dataset.indices)
        if rows.ndim != 1 or (rows.size and rows.dtype.kind not in "iu"):
            return None
        rows = rows.astype(np.intp, copy=False)
        arrays, inner_rows = inner
        if inner_rows is not None:
            rows = inner_rows[rows]  # IndexError: the general path says so
        return arrays, rows
    columns = gathered_columns(dataset)
    return None if columns is None else (columns, None)


def _default_collation(auto_collation: bool, collate_fn: Callable[[Any], Any]) -> bool:
    return auto_collation and collate_fn in (default_collate, default_collate_torch_rules)


def writes_in_c(auto_collation: bool, collate_fn: Callable[[Any], Any]) -> bool:
    """Whether some batches of a loader may take a C writer (default
    collation): only then are slots worth having for worker threads."""
    return _default_collation(auto_collation, collate_fn) and not ragged.writes_in_place(
        collate_fn)


# NOTE [ Small gathers ]
#
# Where every batch is a C gather of rows (the gather above: an
# ArrayDataset, say) of at most SMALL_GATHER_BYTES, the main thread makes
# each batch itself as its task is sent, with a worker's row gather (the
# same rows by the same C gather, so the same bytes) and into the slot the
# task got (a slot of the worker processes' pool, pinned if the pool is; of
# the worker threads' pool), and the task is ready at once. Gathering a few
# KiB takes about 1 µs; handing the task to a worker and its batch back
# costs the main thread more than that (a ring record and a wake-up,
# reading the answer, the views), and on two cores the workers' share of
# the handoff is taken from the main process too: on batches of 64 rows of
# 72 bytes, processes and threads both made 1.4x to 1.7x the samples/s,
# and while the loop is bound by the loader, handing over paid off only
# from between 256 KiB and 1 MiB. The task keeps the worker it was sent to, so a state_dict and its
# resume are the same and the worker's statistics count the batch. No user
# code runs in a gather, so nothing can tell which thread made it; the
# workers still start (worker_init_fn runs), and a worker process's death
# is still raised: next() looks for it, since nothing waits for a worker.
# Not with worker processes and a worker_init_fn, which may change its
# worker's copy of the arrays (worker threads share the dataset).
# An index that is no plain list of rows, and a gather that raises (an
# index out of range), are sent to the worker after all, whose batch or
# error is the batch's, as for any other batch. Since no user code sees
# the indices of these batches, fastload's own random samplers draw them
# as int64 slices of the epoch's permutation (BatchSampler._index_arrays,
# chosen in WorkerIter): turning the permutation into Python ints cost
# more than the gather of 64 small rows. A batch sent to a worker after
# all gets its list, as iter() would have given it (_epoch_pieces.listed).
# Without workers a loader of an ArrayDataset draws them so too
# (reads_index_arrays): its __getitems__ reads an array as it reads a list.
SMALL_GATHER_BYTES = 256 << 10


class SmallGathers:
    """The batches the main thread gathers itself (NOTE [ Small gathers ]):
    a worker's row gather, called straight from here (every batch of the
    main loop passes here: no per-batch plan or closures)."""

    __slots__ = ("_into", "_row_map")

    def __init__(self, gather: pack.RowGather, row_map: np.ndarray | None) -> None:
        self._into = gather.into
        self._row_map = row_map

    def gather(self, index: Any, write: Callable[[Write], Any], stats: WorkerStats) -> Any:
        """The batch of ``index`` as ``write(fast)`` makes it with the
        gather's writer ``fast``, counted in ``stats`` (the statistics of
        the worker it was sent to); None where ``index`` is no plain list
        of rows or the write raised: the worker then loads it, and its
        error is the batch's, as for any other."""
        started = time.perf_counter()
        rows = _rows(index, self._row_map)
        if rows is None:
            return None
        try:
            batch = write(functools.partial(self._into, rows))
        except Exception:
            return None
        # The gather reads the rows as it writes them: its time is all
        # collation's (a clock read less per batch).
        stats.add(0.0, time.perf_counter() - started)
        return batch


def small_gathers(loader: Any, writer: BatchWriter) -> SmallGathers | None:
    """The small gathers of a loader with workers whose batches ``writer``
    writes (NOTE [ Small gathers ]): where every batch is a C gather of
    rows (NOTE [ Fast paths ]) of at most SMALL_GATHER_BYTES, but not with
    worker processes and a worker_init_fn; None for any other."""
    if loader.worker_method != "thread" and loader.worker_init_fn is not None:
        return None
    batch_bytes = batch_slot_bytes(loader.dataset, loader.batch_size)
    if writer.row_gather is None or batch_bytes is None or batch_bytes > SMALL_GATHER_BYTES:
        return None
    return SmallGathers(*writer.row_gather)


def reads_index_arrays(loader: Any) -> bool:
    """Whether a loader without workers may draw its batches' indices as
    arrays (BatchSampler._index_arrays), as small gathers do: its dataset is
    exactly fastload's ArrayDataset (or the TensorArrayDataset it makes of
    tensors), whose ``__getitems__`` reads an index array as it reads a
    list, so no user code sees an index."""
    return (loader._dataset_kind is DatasetKind.MAP and loader._auto_collation
            and type(loader.dataset) in (ArrayDataset, TensorArrayDataset))


def not_gathered() -> NoReturn:
    """The general path a small gather's writer falls back on: none in the
    main thread; the batch goes to its worker (SmallGathers.gather)."""
    raise NotGatheredHere


class NotGatheredHere(Exception):
    """Internal: a small gather's write raised; its worker loads the batch."""


class BatchWriter:
    """The writes of one worker's batches (NOTE [ Fast paths ])."""

    def __init__(self, dataset: Any, kind: DatasetKind, auto_collation: bool,
                 collate_fn: Callable[[Any], Any], *, unmapped_slot_bytes: int = 0) -> None:
        self._default_collation = _default_collation(auto_collation, collate_fn)
        self._auto_collation = auto_collation
        # Slots this large are collated into through their segment's file
        # where it is open (NOTE [ Unmapped slots ] in fastload._memory).
        self._unmapped_slot_bytes = unmapped_slot_bytes
        # Under torch's rules a leaf whose samples differ in dtype, or of no
        # number's dtype, is the general path's (default_collate_torch_rules).
        self._numpy_rules = collate_fn is default_collate
        self._in_place = auto_collation and ragged.writes_in_place(collate_fn)
        self._gather: tuple[pack.RowGather, np.ndarray | None] | None = None
        if self._default_collation and kind is DatasetKind.MAP:
            try:
                source = _gather_source(dataset)
            except IndexError:
                source = None
            if source is not None:
                self._gather = (pack.RowGather(source[0]), source[1])

    @property
    def row_gather(self) -> tuple[pack.RowGather, np.ndarray | None] | None:
        """(the C gather, the row map of ``_rows``) when every batch is
        written by a gather of rows, else None."""
        return self._gather

    @property
    def writes_through_files(self) -> bool:
        """Whether its batches are written with pack.collate_into, which
        writes a large slot through its segment's file: then their pool
        unmaps large slots once free (NOTE [ Unmapped slots ] in
        fastload._memory). Not where it gathers rows, through the mappings."""
        return self._default_collation and not self._in_place and self._gather is None

    def prepare(self, fetcher: DatasetFetcher, index: Any) -> Write:
        """Fetch the data of one task; return the function that writes its
        batch into a slot. Raises what fetching raises (StopIteration when
        an iterable dataset is exhausted)."""
        if self._in_place:
            samples = fetcher.fetch_samples(index)
            return lambda t, o, c: _collated_in_place(lambda: fetcher.collate(samples, index),
                                                      t, o, c)
        fast, general = self.plan(fetcher, index)
        if fast is None:
            return _pickled(general())
        return _FastWrite(fast, general)

    def plan(self, fetcher: DatasetFetcher, index: Any) -> tuple[Write | None, Callable[[], Any]]:
        """Fetch the data of one task: (the C writer of its batch, None where
        there is none; the general path, which computes the batch itself).
        Raises what fetching raises. The in-place writers are prepare's."""
        if not self._default_collation:
            if not self._auto_collation:
                batch = fetcher.fetch(index)
                return None, lambda: batch
            # Collated by the general path, after the fetch (which may
            # take turns with other threads': FetchTurns).
            fetched = fetcher.fetch_samples(index)
            return None, lambda: fetcher.collate(fetched, index)
        if self._gather is not None:
            gather, row_map = self._gather
            rows = _rows(index, row_map)
            if rows is None:
                batch = fetcher.fetch(index)
                return None, lambda: batch
            return (lambda t, o, c: gather.into(rows, t, o, c), lambda: fetcher.fetch(index))
        samples = fetcher.fetch_samples(index)
        if (type(samples) is not list and len(samples) and isinstance(samples[0], (str, bytes))
                and type(samples) not in (GatheredBatch, GatheredTensors)):
            # default_collate gives a batch of strings back as the very
            # sequence the dataset's __getitems__ made (a tuple, say); the C
            # collation would make a list of it.
            batch = fetcher.collate(samples, index)
            return None, lambda: batch
        if type(samples) in (GatheredBatch, GatheredTensors):
            if not all(is_stacked_column(column) for column in samples.columns):
                batch = fetcher.collate(samples, index)
                return None, lambda: batch
            columns = samples.columns
            everything = np.arange(len(samples))
            return (lambda t, o, c: pack.gather_into(columns, everything, t, o, c),
                    lambda: fetcher.collate(samples, index))
        numpy_rules = self._numpy_rules
        unmapped = self._unmapped_slot_bytes
        return (lambda t, o, c: pack.collate_into(
                    samples, t, o, c, numpy_rules=numpy_rules,
                    fd=getattr(t, "fd", -1) if unmapped and c >= unmapped else -1),
                lambda: fetcher.collate(samples, index))


_INTP = np.dtype(np.intp)


def _rows(index: Any, row_map: np.ndarray | None) -> np.ndarray | None:
    """The array rows of a batch index, or None when the index is not a
    plain list or 1-d array of integers (the general path then says what
    it means)."""
    try:
        if type(index) is np.ndarray and index.dtype == _INTP and index.ndim == 1:
            rows = index  # the loader's own draw (BatchSampler._index_arrays)
        else:
            rows = pack.int_rows(index)  # the usual list of ints, without numpy's inference
        if rows is None:
            rows = np.asarray(index)
            if rows.ndim != 1 or rows.dtype.kind not in "iu":
                return None
            rows = rows.astype(np.intp, casting="safe", copy=False)
        return rows if row_map is None else row_map[rows]
    except (IndexError, TypeError, ValueError, OverflowError):
        return None


# Blocks carved from a slot start on the boundaries pack aligns arrays to.
_ALIGN = 64


def _collated_in_place(collate: Callable[[], Any], target: Any, offset: int,
                       capacity: int) -> bytes:
    """The batch of ``collate()`` with its ragged output blocks made in the
    slot, from its start; the rest pickled after them."""
    used = 0

    def empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        nonlocal used
        dtype = np.dtype(dtype)
        start = -(-used // _ALIGN) * _ALIGN
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if start + nbytes > capacity:
            # Enough for this block, the ones after it and the pickle, with
            # room to spare: the worker asks for that and writes again.
            raise SlotTooSmallError(max(2 * capacity, 2 * (start + nbytes)), capacity)
        used = start + nbytes
        block = np.frombuffer(target, np.uint8, nbytes, offset + start)
        return block.view(dtype).reshape(shape)

    with ragged.outputs_from(empty):
        batch = collate()
    return pack.pickle_into(batch, target, offset, capacity, reserved=used)


def _pickled(batch: Any) -> Write:
    return lambda t, o, c: pack.pickle_into(batch, t, o, c)


class _FastWrite:
    """A fast write that falls back, for good, to the general path's batch
    the first time it raises anything but SlotTooSmallError."""

    __slots__ = ("_fast", "_general", "_fallback")

    def __init__(self, fast: Write, general: Callable[[], Any]) -> None:
        self._fast = fast
        self._general = general
        self._fallback: Write | None = None

    def __call__(self, target: Any, offset: int, capacity: int) -> bytes:
        if self._fallback is None:
            try:
                return self._fast(target, offset, capacity)
            except SlotTooSmallError:
                raise
            except Exception:
                # The general path decides: its batch, or its exception.
                self._fallback = _pickled(self._general())
        return self._fallback(target, offset, capacity)
