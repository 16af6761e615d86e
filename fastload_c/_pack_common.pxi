# Part of pack.pyx: the slot being written, the error for a slot too small,
# and arrays over raw memory.

cdef extern from "numpy/arrayobject.h":
    # Steals the reference to descr, even when it fails.
    object PyArray_NewFromDescr(PyTypeObject *subtype, cnp.PyArray_Descr *descr, int nd,
                                cnp.npy_intp *dims, cnp.npy_intp *strides, void *data,
                                int flags, PyObject *obj)


class SlotTooSmallError(FastloadError, ValueError):
    """The batch does not fit in the slot it was given; nothing was written.

    ``needed`` is the bytes the batch takes: the main process gets a slot of
    at least that size (SlabPool.acquire(needed)) and sends the task again.
    """

    def __init__(self, needed, capacity):
        super().__init__("batch does not fit in its slot: need {} bytes, the slot holds {}"
                         .format(needed, capacity))
        self.needed = needed
        self.capacity = capacity

    def __reduce__(self):
        return (type(self), (self.needed, self.capacity))


cdef class _Target:
    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)

    cdef int check(self, size_t needed) except -1:
        if needed > self.capacity:
            raise SlotTooSmallError(needed, self.capacity)
        return 0


cdef _Target _target(object target, Py_ssize_t offset, Py_ssize_t capacity):
    """Hold target's buffer (so a Segment cannot be closed under the copy)."""
    cdef _Target t = _Target.__new__(_Target)
    PyObject_GetBuffer(target, &t.view, PyBUF_WRITABLE)
    t.held = True
    if capacity < 0:
        capacity = t.view.len - offset
    if offset < 0 or capacity < 0 or offset > t.view.len - capacity:
        raise ValueError("slot [{}, {}) lies outside the target's {} bytes"
                         .format(offset, offset + capacity, t.view.len))
    t.base = <char *>t.view.buf + offset
    t.capacity = <size_t>capacity
    return t


cdef cnp.ndarray _array_at(char *data, cnp.dtype descr, tuple shape, object base,
                          bint for_tensor=False):
    """A C-contiguous writable array over `data`; `base` keeps the memory alive.
    An empty one has numpy's strides for it, all zero, as np.empty and
    np.array give it, so that a batch's strides never tell its path; but
    under a tensor (``for_tensor``) the C strides torch gives an empty one."""
    cdef cnp.npy_intp dims[64]
    cdef cnp.npy_intp zeros[64]
    cdef cnp.npy_intp *strides = NULL
    cdef int i, nd = len(shape)
    if nd > 64:  # NPY_MAXDIMS of numpy 2, the most dims holds
        raise ValueError("maximum supported dimension for an ndarray is 64, found {}"
                         .format(nd))
    for i in range(nd):
        dims[i] = shape[i]
        zeros[i] = 0
        if dims[i] == 0 and not for_tensor:
            strides = zeros
    Py_INCREF(descr)
    cdef cnp.ndarray arr = PyArray_NewFromDescr(<PyTypeObject *>np.ndarray, <cnp.PyArray_Descr *>descr,
                                                nd, dims, strides, data,
                                                cnp.NPY_ARRAY_CARRAY, NULL)
    if base is not None:
        cnp.set_array_base(arr, base)
    return arr


cdef bytes _dumps(object message):
    return pickle.dumps(message, protocol=5)
