cdef extern from "fl_shm.h" nogil:
    size_t fl_shm_available()
    int fl_shm_create(const char *label, size_t size, int *fd_out, void **addr_out)
    int fl_shm_attach(int fd, size_t size, void **addr_out)
    int fl_shm_unmap(void *addr, size_t size)


cdef class Segment:
    cdef int _fd
    cdef char *addr
    cdef readonly size_t size
    cdef Py_ssize_t _exports
    cdef void _release(self) noexcept
    cdef int _check_open(self) except -1
