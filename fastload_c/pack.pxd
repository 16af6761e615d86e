cimport numpy as cnp


cdef extern from "fl_copy.h" nogil:
    enum: FL_ALIGN
    size_t fl_align_up(size_t n, size_t align)
    void fl_copy_strided(char *dst, const char *src, int ndim, const cnp.npy_intp *dims,
                         const cnp.npy_intp *strides, size_t itemsize)
    void fl_copy_rows(char *dst, size_t row_bytes, const char *const *src,
                      const cnp.npy_intp *const *strides, int ndim, const cnp.npy_intp *dims,
                      size_t itemsize, size_t n)
    int fl_write_rows(int fd, long long at, size_t row_bytes, const char *const *src,
                      const cnp.npy_intp *const *strides, int ndim, const cnp.npy_intp *dims,
                      size_t itemsize, size_t n)
    cnp.npy_intp fl_normalize_indices(cnp.npy_intp *idx, size_t n, cnp.npy_intp length)
    void fl_gather_rows(char *dst, const char *src, cnp.npy_intp stride0,
                        const cnp.npy_intp *idx, size_t n, size_t row_bytes, int contiguous,
                        int ndim, const cnp.npy_intp *dims, const cnp.npy_intp *strides,
                        size_t itemsize)


# A writable region (segment, offset, capacity) held for one write.
cdef class _Target:
    cdef Py_buffer view
    cdef bint held
    cdef char *base
    cdef size_t capacity
    cdef int check(self, size_t needed) except -1


# One position of the sample structure, planned from sample 0.
cdef class _Node:
    cdef int kind
    cdef Py_ssize_t leaf          # index of this leaf among the plan's leaves
    cdef list children            # of _Node (containers)
    cdef object type              # namedtuple / mapping type; exact numpy scalar type
    cdef tuple keys               # mapping keys, in sample 0's order
    cdef object template          # mapping: emptied copy of sample 0's (or None)
    cdef cnp.dtype src            # dtype of sample 0's array or numpy scalar
    cdef cnp.dtype out            # dtype of the batch leaf (np.result_type)
    cdef bint by_numpy            # the batch dtype differs from the source's
    cdef bint tensor              # the samples hold torch tensors here
    cdef int ndim
    cdef cnp.npy_intp shape[64]   # NPY_MAXDIMS
    cdef size_t itemsize          # of the source
    cdef size_t row_bytes         # one sample's bytes in the batch
    cdef size_t offset            # of this leaf's region in the slot


# The fast copies of one plan: arrays whose batch dtype is their own.
ctypedef struct _Copy:
    Py_ssize_t leaf
    size_t offset
    size_t row_bytes
    size_t itemsize
    int ndim
    const cnp.npy_intp *shape


cdef class _Plan:
    cdef _Copy *copies
    cdef Py_ssize_t ncopies
    cdef _Node root
    cdef Py_ssize_t batch
    cdef list leaves              # _Node of every leaf but strings, tree order
    cdef Py_ssize_t nvalues       # leaves kept as they are (str, bytes)
    cdef list value_tuples        # per such leaf: inside a sequence (a tuple)
    cdef size_t nbytes
    cdef bytes layout             # encoded tree; see NOTE [ Batch layout ]


# What one batch's walk over its samples collects, before anything is written.
cdef class _Walk:
    cdef Py_ssize_t batch
    cdef list keep                  # leaf * batch + sample -> that sample's object
    cdef list values                # one list per string leaf
    cdef const char **src           # fast array leaves: where each row starts
    cdef const cnp.npy_intp **strides  # NULL where the row is C-contiguous
    cdef dict mixed                 # leaves whose samples' dtypes differ


# A decoded layout node (unpack), ready to make views without parsing again.
cdef class _Out:
    cdef int kind
    cdef size_t offset
    cdef size_t nbytes
    cdef cnp.dtype dtype
    cdef tuple shape
    cdef bint tensor              # a torch tensor over the array
    cdef object type
    cdef tuple keys
    cdef object template
    cdef list children
    cdef Py_ssize_t index
