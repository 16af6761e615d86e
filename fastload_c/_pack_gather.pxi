# Part of pack.pyx: gather, rows of whole columns (an ArrayDataset) by index.
from cpython.list cimport PyList_CheckExact, PyList_GET_SIZE
from cpython.long cimport PyLong_AsSsize_t, PyLong_CheckExact
from cpython.number cimport PyNumber_AsSsize_t


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
    """
    cdef bint single = cnp.PyArray_Check(columns) or _is_any_tensor(columns)
    cdef tuple given_cols = (columns,) if single else tuple(columns)
    # Which results are tensors; the rows are copied from numpy views.
    cdef tuple tensors = tuple([_is_any_tensor(col_obj) for col_obj in given_cols])
    cdef tuple cols = given_cols
    if any(tensors):
        cols = tuple([_tensor_as_array(col_obj) if tensor else col_obj
                      for col_obj, tensor in zip(given_cols, tensors)])
    cdef cnp.ndarray given = _index_array(indices)
    cdef cnp.ndarray idx = given
    cdef Py_ssize_t n = cnp.PyArray_DIMS(given)[0], c, ncols = len(cols)
    cdef int i
    cdef cnp.ndarray col
    for col_obj in cols:
        if not cnp.PyArray_Check(col_obj):
            raise TypeError("gather_into: columns must be numpy arrays or tensors, got {}"
                            .format(type(col_obj)))
        if cnp.PyArray_NDIM(<cnp.ndarray>col_obj) == 0:
            raise IndexError("gather_into: cannot index a 0-dimensional array")
        if (<cnp.ndarray>col_obj).dtype.hasobject:
            raise TypeError("gather_into: cannot place {} in shared memory: it holds Python "
                            "objects".format((<cnp.ndarray>col_obj).dtype))
    cdef tuple key = (single, n, tensors) + tuple([(col_obj.dtype, col_obj.shape[1:])
                                                   for col_obj in cols])
    entry = _gather_layouts.get(key)
    if entry is None:
        entry = _gather_layout(cols, n, single, tensors)
        if len(_gather_layouts) >= 64:
            _gather_layouts.clear()
        _gather_layouts[key] = entry
    layout, offsets, nbytes = entry
    cdef _Target t = _target(target, offset, capacity)
    t.check(nbytes)
    cdef cnp.npy_intp *ix = NULL
    cdef cnp.npy_intp length = -1, bad
    cdef size_t row
    cdef int contiguous
    cdef char *dst
    cdef const char *src
    cdef cnp.npy_intp stride0, itemsize
    cdef cnp.npy_intp *dims
    cdef cnp.npy_intp *strides
    cdef int inner
    cdef bint release = nbytes >= NOGIL_MIN_BYTES
    for c in range(ncols):
        col = <cnp.ndarray>cols[c]
        if cnp.PyArray_DIMS(col)[0] != length:
            # Normalized in place: a copy per column length (usually one).
            idx = given.copy()
            ix = <cnp.npy_intp *>cnp.PyArray_DATA(idx)
            length = cnp.PyArray_DIMS(col)[0]
            if release:
                with nogil:
                    bad = fl_normalize_indices(ix, n, length)
            else:
                bad = fl_normalize_indices(ix, n, length)
            if bad >= 0:
                raise IndexError("index {} is out of bounds for axis 0 with size {}"
                                 .format(given[bad], length))
        dst = t.base + <size_t>offsets[c]
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
                fl_gather_rows(dst, src, stride0, ix, n, row, contiguous, inner, dims, strides,
                               itemsize)
        else:
            fl_gather_rows(dst, src, stride0, ix, n, row, contiguous, inner, dims, strides,
                           itemsize)
    return layout


cdef cnp.ndarray _index_array(object indices):
    """The indices as a 1-d intp array."""
    cdef cnp.ndarray out
    cdef Py_ssize_t i, n
    if cnp.PyArray_Check(indices):
        if (<cnp.ndarray>indices).dtype.kind not in "iu" or cnp.PyArray_NDIM(<cnp.ndarray>indices) != 1:
            raise TypeError("gather_into: indices must be a 1-d array of integers, got {} of "
                            "shape {}".format(indices.dtype, indices.shape))
        return np.asarray(indices, dtype=np.intp)
    seq = indices if isinstance(indices, (list, tuple)) else list(indices)
    out = int_rows(seq)
    if out is not None:
        return out
    n = len(seq)
    out = np.empty(n, dtype=np.intp)
    for i in range(n):
        # __index__ semantics, as numpy: ints and numpy integers, not floats.
        (<cnp.npy_intp *>cnp.PyArray_DATA(out))[i] = PyNumber_AsSsize_t(seq[i], IndexError)
    return out


cdef int _rows_contiguous(cnp.ndarray col) noexcept:
    """Whether each row col[i] is one C-contiguous block."""
    cdef cnp.npy_intp expect = cnp.PyArray_ITEMSIZE(col)
    cdef int i
    for i in range(cnp.PyArray_NDIM(col) - 1, 0, -1):
        if cnp.PyArray_DIMS(col)[i] != 1 and cnp.PyArray_STRIDES(col)[i] != expect:
            return 0
        expect *= cnp.PyArray_DIMS(col)[i]
    return 1


cdef tuple _gather_layout(tuple cols, Py_ssize_t n, bint single, tuple tensors):
    cdef size_t off = 0, row
    offsets = []
    nodes = []
    for col, tensor in zip(cols, tensors):
        off = fl_align_up(off, FL_ALIGN)
        offsets.append(off)
        shape = (n,) + col.shape[1:]
        nodes.append(("a", off, col.dtype, shape, tensor))
        row = col.dtype.itemsize
        for d in col.shape[1:]:
            row *= <size_t>d
        off += row * <size_t>n
    tree = nodes[0] if single else ("l", tuple(nodes))
    return _dumps(("tree", tree)), offsets, off


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
    cdef cnp.ndarray out = np.empty(n, dtype=np.intp)
    cdef cnp.npy_intp *ix = <cnp.npy_intp *>cnp.PyArray_DATA(out)
    try:
        for i in range(n):
            ix[i] = PyLong_AsSsize_t(<object>PyList_GET_ITEM(seq, i))
    except OverflowError:
        return None  # too large for intp: numpy would make an object array
    return out
