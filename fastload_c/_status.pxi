# The one place where a failed C call becomes a Python exception. C helpers
# return -1 with errno set; callers do `if rc != 0: raise_errno("what")`.
from libc.errno cimport errno
from libc.string cimport strerror


cdef int raise_errno(str what, type exc=OSError) except -1:
    cdef int err = errno
    raise exc(err, "{}: {}".format(what, strerror(err).decode()))
