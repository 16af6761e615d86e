# Part of pack.pyx: gather, rows of whole columns (an ArrayDataset) by index.
from cpython.list cimport PyList_CheckExact, PyList_GET_SIZE
from cpython.long cimport PyLong_AsSsize_t, PyLong_CheckExact
from cpython.number cimport PyNumber_AsSsize_t


# gather_into's layouts, by what they depend on.
cdef dict _gather_layouts = {}


def gather_into(columns, indices, target, Py_ssize_t offset=0, Py_ssize_t capacity=-1):
    """Copy rows ``indices`` of each column into the slot, as ``col[indices]``.

    ``columns`` is one array (the batch is one array) or a sequence of arrays
    (the batch is a list, as default_collate makes of tuple samples). Each
    result equals numpy fancy indexing, dtype included. A column may be a
    torch tensor numpy can view (CPU, no grad): its rows are read through
    that view and its result is a tensor over the slot, as ``col[indices]``
    of the tensor. Indices are 1-d ints;
    negative ones count from the end, out-of-range ones raise IndexError
    naming the index and the size. One C call per column, GIL released.
    Returns the layout for unpack; SlotTooSmallError when it does not fit.
    RowGather does the same for columns gathered batch after batch.
    """
    cdef RowGather gather = RowGather(columns)
    cdef tuple cols = gather._numpy_columns()
    cdef cnp.ndarray given = _index_array(indices)
    cdef Py_ssize_t n = cnp.PyArray_DIMS(given)[0]
    _check_columns(cols)
    cdef tuple key = ((gather._single, n, gather._tensors)
                      + tuple([(col.dtype, col.shape[1:]) for col in cols]))
    cdef _GatherLayout lo = _gather_layouts.get(key)
    if lo is None:
        lo = _new_gather_layout(cols, n, gather._single, gather._tensors)
        if len(_gather_layouts) >= 64:
            _gather_layouts.clear()
        _gather_layouts[key] = lo
    return _write(cols, given, lo, target, offset, capacity)


# Layouts a RowGather keeps, one per batch length (the last batch of an
# epoch is usually shorter); more are made again when needed.
cdef int _KEPT_LAYOUTS = 4


cdef class _GatherLayout:
    """Where each column's rows go in the slot for batches of ``n`` rows,
    and the dtypes and row shapes it was made for. Never changed once made:
    a gather holds it while the GIL is released."""
    cdef Py_ssize_t n
    cdef bytes layout
    cdef size_t nbytes
    cdef tuple descrs             # per column, the dtype object
    cdef tuple row_shapes         # per column, shape[1:]
    cdef size_t *offsets

    def __dealloc__(self):
        PyMem_Free(self.offsets)

    cdef bint fits(self, tuple cols, Py_ssize_t n):
        """Whether the columns are still of the dtypes and row shapes it was
        made for (an array's dtype and shape can be assigned in place)."""
        cdef Py_ssize_t c, d
        cdef cnp.ndarray col
        cdef tuple row_shape
        if n != self.n:
            return False
        for c in range(len(cols)):
            col = <cnp.ndarray>cols[c]
            if <object>cnp.PyArray_DESCR(col) is not self.descrs[c]:
                return False
            row_shape = <tuple>self.row_shapes[c]
            if cnp.PyArray_NDIM(col) != len(row_shape) + 1:
                return False
            for d in range(len(row_shape)):
                if cnp.PyArray_DIMS(col)[d + 1] != <cnp.npy_intp>row_shape[d]:
                    return False
        return True


cdef int _check_columns(tuple cols) except -1:
    """Raise unless each column can be gathered into shared memory."""
    for col in cols:
        if not cnp.PyArray_Check(col):
            raise TypeError("gather_into: columns must be numpy arrays or tensors, got {}"
                            .format(type(col)))
        if cnp.PyArray_NDIM(<cnp.ndarray>col) == 0:
            raise IndexError("gather_into: cannot index a 0-dimensional array")
        if (<cnp.ndarray>col).dtype.hasobject:
            raise TypeError("gather_into: cannot place {} in shared memory: it holds Python "
                            "objects".format((<cnp.ndarray>col).dtype))
    return 0


cdef _GatherLayout _new_gather_layout(tuple cols, Py_ssize_t n, bint single, tuple tensors):
    """The layout of ``cols`` gathered ``n`` rows at a time; raises unless
    each column can be gathered into shared memory."""
    cdef _GatherLayout out = _GatherLayout.__new__(_GatherLayout)
    cdef size_t off = 0, row
    cdef Py_ssize_t c, ncols = len(cols)
    _check_columns(cols)
    out.offsets = <size_t *>PyMem_Malloc(max(ncols, 1) * sizeof(size_t))
    if out.offsets == NULL:
        raise MemoryError()
    nodes = []
    for c in range(ncols):
        col, tensor = cols[c], tensors[c]
        off = fl_align_up(off, FL_ALIGN)
        out.offsets[c] = off
        nodes.append(("a", off, col.dtype, (n,) + col.shape[1:], tensor))
        row = col.dtype.itemsize
        for d in col.shape[1:]:
            row *= <size_t>d
        off += row * <size_t>n
    out.n = n
    out.layout = _dumps(("tree", nodes[0] if single else ("l", tuple(nodes))))
    out.nbytes = off
    out.descrs = tuple([<object>cnp.PyArray_DESCR(<cnp.ndarray>col) for col in cols])
    out.row_shapes = tuple([col.shape[1:] for col in cols])
    return out


cdef class RowGather:
    """gather_into over columns fixed once, for a dataset's batch after
    batch: which columns are tensors, and the layout per batch length, are
    worked out once (about 3 µs a call less on small batches). The columns'
    data, lengths and strides are read at every call, as gather_into reads
    them, so a column changed in place gathers what it holds then."""
    cdef tuple _given
    cdef tuple _tensors
    cdef bint _single, _any_tensor
    cdef _GatherLayout _last
    cdef dict _layouts

    def __init__(self, columns):
        self._single = cnp.PyArray_Check(columns) or _is_any_tensor(columns)
        self._given = (columns,) if self._single else tuple(columns)
        # Which results are tensors; their rows are copied from numpy views.
        self._tensors = tuple([_is_any_tensor(col) for col in self._given])
        self._any_tensor = any(self._tensors)
        self._layouts = {}

    def into(self, indices, target, Py_ssize_t offset=0, Py_ssize_t capacity=-1):
        """gather_into(columns, indices, target, offset, capacity) of this
        gather's columns."""
        cdef tuple cols = self._numpy_columns()
        cdef cnp.ndarray given = _index_array(indices)
        cdef Py_ssize_t n = cnp.PyArray_DIMS(given)[0]
        cdef _GatherLayout lo = self._last
        if lo is None or not lo.fits(cols, n):
            lo = self._layouts.get(n)
            if lo is None or not lo.fits(cols, n):
                lo = _new_gather_layout(cols, n, self._single, self._tensors)
                if len(self._layouts) >= _KEPT_LAYOUTS:
                    self._layouts.clear()
                self._layouts[n] = lo
            self._last = lo
        return _write(cols, given, lo, target, offset, capacity)

    cdef tuple _numpy_columns(self):
        """The columns, tensors as numpy views of them, made anew at each
        call: a tensor can be resized in place."""
        if not self._any_tensor:
            return self._given
        return tuple([_tensor_as_array(col) if tensor else col
                      for col, tensor in zip(self._given, self._tensors)])


cdef bytes _write(tuple cols, cnp.ndarray given, _GatherLayout lo, object target,
                  Py_ssize_t offset, Py_ssize_t capacity):
    """The gather of rows ``given`` of ``cols`` into the slot, by ``lo``;
    its layout. SlotTooSmallError when it does not fit."""
    cdef _Target t = _target(target, offset, capacity)
    t.check(lo.nbytes)
    _gather_columns(cols, given, lo, t.base)
    return lo.layout


cdef int _gather_columns(tuple cols, cnp.ndarray given, _GatherLayout lo, char *base) except -1:
    """The copies of RowGather.into: the rows ``given`` (normalized per
    column length, in a copy) of each column, at the layout's offsets."""
    cdef Py_ssize_t n = cnp.PyArray_DIMS(given)[0], c
    cdef cnp.npy_intp on_stack[256]
    cdef cnp.npy_intp *ix = on_stack
    cdef cnp.npy_intp length = -1, bad
    cdef cnp.ndarray col
    cdef char *dst
    cdef const char *src
    cdef size_t row
    cdef int i, contiguous, inner
    cdef cnp.npy_intp stride0, itemsize
    cdef cnp.npy_intp *dims
    cdef cnp.npy_intp *strides
    cdef bint release = lo.nbytes >= NOGIL_MIN_BYTES
    if n > 256:
        ix = <cnp.npy_intp *>PyMem_Malloc(n * sizeof(cnp.npy_intp))
        if ix == NULL:
            raise MemoryError()
    try:
        for c in range(len(cols)):
            col = <cnp.ndarray>cols[c]
            if cnp.PyArray_DIMS(col)[0] != length:
                # Normalized in the copy: once per column length (usually once).
                memcpy(ix, cnp.PyArray_DATA(given), n * sizeof(cnp.npy_intp))
                length = cnp.PyArray_DIMS(col)[0]
                if release:
                    with nogil:
                        bad = fl_normalize_indices(ix, n, length)
                else:
                    bad = fl_normalize_indices(ix, n, length)
                if bad >= 0:
                    raise IndexError("index {} is out of bounds for axis 0 with size {}"
                                     .format(given[bad], length))
            dst = base + lo.offsets[c]
            row = cnp.PyArray_ITEMSIZE(col)
            for i in range(1, cnp.PyArray_NDIM(col)):
                row *= <size_t>cnp.PyArray_DIMS(col)[i]
            contiguous = _rows_contiguous(col)
            src = cnp.PyArray_BYTES(col)
            stride0 = cnp.PyArray_STRIDES(col)[0]
            inner = cnp.PyArray_NDIM(col) - 1
            dims = cnp.PyArray_DIMS(col) + 1
            strides = cnp.PyArray_STRIDES(col) + 1
            itemsize = cnp.PyArray_ITEMSIZE(col)
            if release:
                with nogil:
                    fl_gather_rows(dst, src, stride0, ix, n, row, contiguous, inner, dims,
                                   strides, itemsize)
            else:
                fl_gather_rows(dst, src, stride0, ix, n, row, contiguous, inner, dims, strides,
                               itemsize)
    finally:
        if ix != on_stack:
            PyMem_Free(ix)
    return 0


cdef cnp.ndarray _index_array(object indices):
    """The indices as a 1-d C-contiguous intp array."""
    cdef cnp.ndarray out
    cdef Py_ssize_t i, n
    if cnp.PyArray_Check(indices):
        out = <cnp.ndarray>indices
        if (cnp.PyArray_TYPE(out) == cnp.NPY_INTP and cnp.PyArray_NDIM(out) == 1
                and cnp.PyArray_IS_C_CONTIGUOUS(out) and cnp.PyArray_ISNOTSWAPPED(out)):
            return out
        if out.dtype.kind not in "iu" or cnp.PyArray_NDIM(out) != 1:
            raise TypeError("gather_into: indices must be a 1-d array of integers, got {} of "
                            "shape {}".format(indices.dtype, indices.shape))
        return np.ascontiguousarray(indices, dtype=np.intp)
    seq = indices if isinstance(indices, (list, tuple)) else list(indices)
    out = int_rows(seq)
    if out is not None:
        return out
    n = len(seq)
    out = _intp_array(n)
    for i in range(n):
        # __index__ semantics, as numpy: ints and numpy integers, not floats.
        (<cnp.npy_intp *>cnp.PyArray_DATA(out))[i] = PyNumber_AsSsize_t(seq[i], IndexError)
    return out


cdef inline cnp.ndarray _intp_array(Py_ssize_t n):
    """An uninitialized 1-d intp array (np.empty's work without its call)."""
    cdef cnp.npy_intp dims[1]
    dims[0] = n
    return cnp.PyArray_EMPTY(1, dims, cnp.NPY_INTP, 0)


cdef int _rows_contiguous(cnp.ndarray col) noexcept:
    """Whether each row col[i] is one C-contiguous block."""
    cdef cnp.npy_intp expect = cnp.PyArray_ITEMSIZE(col)
    cdef int i
    for i in range(cnp.PyArray_NDIM(col) - 1, 0, -1):
        if cnp.PyArray_DIMS(col)[i] != 1 and cnp.PyArray_STRIDES(col)[i] != expect:
            return 0
        expect *= cnp.PyArray_DIMS(col)[i]
    return 1


def int_rows(indices):
    """``indices`` as a 1-d intp array when it is a non-empty list of plain
    ints (not bools) that fit one, else None: the common batch index, read
    without numpy's type inference (what ``np.asarray`` would give it, as
    intp)."""
    if not PyList_CheckExact(indices):
        return None
    cdef list seq = <list>indices
    cdef Py_ssize_t i, n = PyList_GET_SIZE(seq)
    if n == 0:
        return None
    for i in range(n):
        if not PyLong_CheckExact(<object>PyList_GET_ITEM(seq, i)):
            return None
    cdef cnp.ndarray out = _intp_array(n)
    cdef cnp.npy_intp *ix = <cnp.npy_intp *>cnp.PyArray_DATA(out)
    try:
        for i in range(n):
            ix[i] = PyLong_AsSsize_t(<object>PyList_GET_ITEM(seq, i))
    except OverflowError:
        return None  # too large for intp: numpy would make an object array
    return out
