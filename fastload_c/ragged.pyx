# distutils: sources = fastload_c/src/fl_ragged.c
# cython: freethreading_compatible=True
"""Variable-length leaves: samples of different lengths into one padded or
one packed block (the mechanism of fastload's pad_collate and pack_collate),
and lengths into bins of a token budget (of its PackedBatchSampler).

The caller sizes the output from ``leaf_lengths`` and hands the blocks in as
C-contiguous writable arrays, which may be fresh or views of a slot at an
offset; ``pad_into`` and ``pack_into`` then copy each sample's rows once,
with the GIL released.
"""
cimport numpy as cnp
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t, int64_t

import numpy as np

from fastload_c.errors import CollateError

cnp.import_array()


cdef extern from "fl_ragged.h" nogil:
    void fl_pad_rows(char *dst, size_t row_bytes, const char *const *src, const size_t *nbytes,
                     size_t n, const char *pad_item, size_t itemsize)
    void fl_concat_rows(char *dst, const char *const *src, const size_t *nbytes, size_t n)
    int fl_pack_offsets(const int64_t *lengths, size_t n, int32_t *cu_seqlens,
                        int64_t *position_ids)
    size_t fl_pack_bins(const int64_t *lengths, size_t n, int64_t capacity, int best_fit,
                        int64_t *room, int64_t *bin_of)


def leaf_lengths(samples, str who):
    """``(lengths, dtype, rest)`` of one variable-length leaf: each sample's
    first dimension as int64 ``(B,)``, and the dtype and trailing dimensions
    all samples share. Raises CollateError (positions: the disagreeing sample
    and sample 0) when a sample's dtype or trailing dimensions differ from
    sample 0's, TypeError for a sample that is not an array of at least one
    dimension; ``who`` starts the messages."""
    cdef list items = list(samples)
    cdef Py_ssize_t i, n = len(items)
    if n == 0:
        raise ValueError("{}: cannot collate an empty batch".format(who))
    cdef cnp.ndarray lengths = np.empty(n, dtype=np.int64)
    cdef int64_t *out = <int64_t *>cnp.PyArray_DATA(lengths)
    cdef cnp.ndarray first = _checked(items[0], 0, who)
    cdef cnp.ndarray sample
    for i in range(n):
        sample = _checked(items[i], i, who)
        if not _same_rows(sample, first, 1):
            raise CollateError(
                "{}: sample {} has shape {} and dtype {} but sample 0 has shape {} and dtype "
                "{}; the samples of a variable-length leaf may differ only in their first "
                "dimension".format(who, i, (<object>sample).shape, sample.dtype,
                                   (<object>first).shape, first.dtype),
                (i, 0))
        out[i] = cnp.PyArray_DIMS(sample)[0]
    return lengths, first.dtype, (<object>first).shape[1:]


cdef bint _same_rows(cnp.ndarray sample, cnp.ndarray model, int model_from):
    """Whether ``sample``'s dtype is ``model``'s and its dimensions after the
    first are ``model``'s from ``model_from`` on; C comparisons only, as this
    runs for every sample of every batch."""
    cdef int d, nd = cnp.PyArray_NDIM(sample)
    if nd - 1 != cnp.PyArray_NDIM(model) - model_from:
        return False
    for d in range(1, nd):
        if cnp.PyArray_DIMS(sample)[d] != cnp.PyArray_DIMS(model)[d - 1 + model_from]:
            return False
    return (cnp.PyArray_DESCR(sample) == cnp.PyArray_DESCR(model)
            or cnp.PyArray_EquivTypes(<cnp.dtype><object>cnp.PyArray_DESCR(sample),
                                      <cnp.dtype><object>cnp.PyArray_DESCR(model)))


cdef cnp.ndarray _checked(object sample, Py_ssize_t position, str who):
    if not cnp.PyArray_Check(sample) or cnp.PyArray_NDIM(<cnp.ndarray>sample) == 0:
        raise TypeError("{}: sample {} of a variable-length leaf is {}, not an array with a "
                        "length".format(who, position, _describe(sample)))
    if (<cnp.ndarray>sample).dtype.hasobject:
        raise TypeError("{}: sample {} holds Python objects ({}), which have no padded form"
                        .format(who, position, (<cnp.ndarray>sample).dtype))
    return <cnp.ndarray>sample


cdef str _describe(object value):
    if cnp.PyArray_Check(value):
        return "a 0-d array"
    return "a {}".format(type(value).__name__)


cdef class _Rows:
    """Where each sample's bytes start and how many there are; holds the
    contiguous copies made of non-contiguous samples while they are read."""
    cdef const char **src
    cdef size_t *nbytes
    cdef Py_ssize_t n
    cdef list held

    def __dealloc__(self):
        PyMem_Free(self.src)
        PyMem_Free(self.nbytes)


cdef _Rows _rows(list samples, cnp.ndarray out, int trailing_from, str who):
    """The samples' rows, checked to have ``out``'s dtype and its dimensions
    from ``trailing_from`` on, so that no copy can run past ``out``."""
    cdef _Rows rows = _Rows.__new__(_Rows)
    cdef Py_ssize_t i, n = len(samples)
    cdef cnp.ndarray sample
    if not cnp.PyArray_IS_C_CONTIGUOUS(out) or not cnp.PyArray_ISWRITEABLE(out):
        raise ValueError("{}: the output must be a writable C-contiguous array".format(who))
    rows.held = []
    rows.n = n
    rows.src = <const char **>PyMem_Malloc(max(n, 1) * sizeof(char *))
    rows.nbytes = <size_t *>PyMem_Malloc(max(n, 1) * sizeof(size_t))
    if rows.src == NULL or rows.nbytes == NULL:
        raise MemoryError()
    for i in range(n):
        sample = _checked(samples[i], i, who)
        if not _same_rows(sample, out, trailing_from):
            raise ValueError("{}: sample {} ({} {}) does not fit an output of {} {}"
                             .format(who, i, sample.dtype, (<object>sample).shape, out.dtype,
                                     (<object>out).shape))
        if not cnp.PyArray_IS_C_CONTIGUOUS(sample):
            sample = np.ascontiguousarray(sample)
            rows.held.append(sample)
        rows.src[i] = cnp.PyArray_BYTES(sample)
        rows.nbytes[i] = <size_t>cnp.PyArray_NBYTES(sample)
    return rows


def pad_into(samples, cnp.ndarray out, padding_value):
    """Sample ``i`` into ``out[i, :len(sample)]`` and ``padding_value`` (cast
    to ``out``'s dtype) into the rest of row ``i``. ``out`` is a writable
    C-contiguous array of shape ``(len(samples), L, *rest)`` with the
    samples' dtype and trailing dimensions, and L at least every sample's
    length (ValueError otherwise, before anything is written)."""
    cdef str who = "pad_into"
    cdef list items = list(samples)
    if cnp.PyArray_NDIM(out) < 2 or cnp.PyArray_DIMS(out)[0] != len(items):
        raise ValueError("{}: the output has shape {} but there are {} samples; it needs "
                         "(samples, length, ...)".format(who, (<object>out).shape, len(items)))
    cdef _Rows rows = _rows(items, out, 2, who)
    cdef size_t row_bytes = <size_t>(cnp.PyArray_NBYTES(out) // max((<object>out).shape[0], 1))
    cdef Py_ssize_t i
    for i in range(rows.n):
        if rows.nbytes[i] > row_bytes:
            raise ValueError("{}: sample {} has length {}, longer than the output's {}"
                             .format(who, i, np.shape(items[i])[0], (<object>out).shape[1]))
    cdef cnp.ndarray pad = np.array(padding_value, dtype=out.dtype)
    cdef const char *pad_item = cnp.PyArray_BYTES(pad)
    cdef size_t itemsize = <size_t>cnp.PyArray_ITEMSIZE(out)
    cdef char *dst = cnp.PyArray_BYTES(out)
    if itemsize == 0:
        return
    with nogil:
        fl_pad_rows(dst, row_bytes, rows.src, rows.nbytes, rows.n, pad_item, itemsize)


def pack_into(samples, cnp.ndarray values, cnp.ndarray cu_seqlens, cnp.ndarray position_ids):
    """The samples back to back into ``values`` (shape ``(sum of lengths,
    *rest)``), their offsets into ``cu_seqlens`` (int32, ``(B + 1,)``) and
    each row's position within its sample into ``position_ids`` (int64,
    ``(sum of lengths,)``). ValueError, before anything is written, when an
    output has another size or type, or the total length exceeds int32."""
    cdef str who = "pack_into"
    cdef list items = list(samples)
    cdef Py_ssize_t n = len(items)
    if cnp.PyArray_NDIM(values) < 1:
        raise ValueError("{}: values must have a first dimension".format(who))
    cdef _Rows rows = _rows(items, values, 1, who)
    cdef cnp.ndarray lengths = np.empty(n, dtype=np.int64)
    cdef int64_t *length = <int64_t *>cnp.PyArray_DATA(lengths)
    cdef int64_t total = 0
    cdef Py_ssize_t i
    for i in range(n):
        length[i] = cnp.PyArray_DIMS(<cnp.ndarray>items[i])[0]
        total += length[i]
    if cnp.PyArray_DIMS(values)[0] != total:
        raise ValueError("{}: values has shape {} but the samples hold {} rows"
                         .format(who, (<object>values).shape, total))
    for name, array, dtype, size in (("cu_seqlens", cu_seqlens, np.int32, n + 1),
                                     ("position_ids", position_ids, np.int64, total)):
        if (array.dtype != dtype or array.shape != (size,) or not array.flags.c_contiguous
                or not array.flags.writeable):
            raise ValueError("{}: {} must be a writable contiguous {} array of shape ({},), "
                             "got {} {}".format(who, name, np.dtype(dtype), size, array.dtype,
                                                array.shape))
    if total > 2147483647:
        raise ValueError("{}: the samples hold {} rows, more than int32 cu_seqlens can count"
                         .format(who, total))
    cdef char *dst = cnp.PyArray_BYTES(values)
    cdef int32_t *cu = <int32_t *>cnp.PyArray_DATA(cu_seqlens)
    cdef int64_t *pos = <int64_t *>cnp.PyArray_DATA(position_ids)
    with nogil:
        fl_concat_rows(dst, rows.src, rows.nbytes, rows.n)
        fl_pack_offsets(length, rows.n, cu, pos)


def pack_bins(lengths, Py_ssize_t capacity, bint best_fit):
    """``(bin_of, bins)``: lengths (1-d int64, each in [0, capacity]) packed
    in order into bins of ``capacity``, first fit or best fit (see
    fl_pack_bins); ``bin_of[i]`` is item i's bin, numbered as bins open.
    ValueError for a length outside [0, capacity]."""
    cdef cnp.ndarray items = np.ascontiguousarray(lengths, dtype=np.int64)
    cdef Py_ssize_t n = items.shape[0]
    if n and (items.min() < 0 or items.max() > capacity):
        raise ValueError("pack_bins: every length must lie in [0, {}]".format(capacity))
    cdef cnp.ndarray room = np.empty(max(n, 1), dtype=np.int64)
    cdef cnp.ndarray bin_of = np.empty(n, dtype=np.int64)
    cdef size_t bins
    with nogil:
        bins = fl_pack_bins(<const int64_t *>cnp.PyArray_DATA(items), n, capacity, best_fit,
                            <int64_t *>cnp.PyArray_DATA(room), <int64_t *>cnp.PyArray_DATA(bin_of))
    return bin_of, bins
