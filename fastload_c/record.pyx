# cython: freethreading_compatible=True
"""Fixed-format ring records: the two messages every batch costs, written
and read without pickle (NOTE [ Worker protocol ] in fastload._protocol
says which messages these are and when they are used).

- A task whose index is a non-empty list of plain ints and whose slot is
  three ints: int64 words [TASK_RECORD, task id, segment id, offset,
  capacity, index...].
- A result without a dataset state: int64 words [DONE_RECORD, task id,
  ended], two doubles (the fetch and collate seconds), then the layout.

Each is read back as the very objects it was written from: a list of ints,
a bool, floats, the layout's bytes. The first byte tells a fixed record
from a pickle, which starts with PROTO (0x80); both ends are processes of
one machine, so the words are in its byte order.
"""
from cpython.bool cimport PyBool_Check
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
from cpython.list cimport PyList_CheckExact, PyList_GET_ITEM, PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_AsLongLong, PyLong_CheckExact
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_CheckExact, PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport int64_t
from libc.string cimport memcpy

cdef enum:
    TASK_RECORD = 1
    DONE_RECORD = 2
    TASK_WORDS = 5   # words before the index
    DONE_BYTES = 40  # bytes before the layout


cdef int _int64(object o, int64_t *out) except -1:
    """1 with *out set when o is a plain int that fits, else 0."""
    if not PyLong_CheckExact(o):
        return 0
    try:
        out[0] = PyLong_AsLongLong(o)
    except OverflowError:
        return 0
    return 1


def task_record(task_id, index, slot):
    """The fixed record of a task, or None when its index or slot is not
    what one holds (the caller pickles the task then)."""
    if not PyList_CheckExact(index) or not PyTuple_CheckExact(slot) \
            or PyTuple_GET_SIZE(slot) != 3:
        return None
    cdef Py_ssize_t i, n = PyList_GET_SIZE(index)
    if n == 0:
        return None
    cdef bytes out = PyBytes_FromStringAndSize(NULL, (TASK_WORDS + n) * 8)
    cdef int64_t word
    cdef char *dst = PyBytes_AS_STRING(out)
    word = TASK_RECORD
    memcpy(dst, &word, 8)
    if not _int64(task_id, &word):
        return None
    memcpy(dst + 8, &word, 8)
    for i in range(3):
        if not _int64(<object>PyTuple_GET_ITEM(slot, i), &word):
            return None
        memcpy(dst + 16 + 8 * i, &word, 8)
    for i in range(n):
        if not _int64(<object>PyList_GET_ITEM(index, i), &word):
            return None
        memcpy(dst + (TASK_WORDS + i) * 8, &word, 8)
    return out


def done_record(task_id, layout, fetch_seconds, collate_seconds, ended):
    """The fixed record of a result, or None when its fields are not what
    one holds (the caller pickles the message then)."""
    cdef int64_t words[3]
    if not (PyFloat_CheckExact(fetch_seconds) and PyFloat_CheckExact(collate_seconds)
            and PyBool_Check(ended) and type(layout) is bytes):
        return None
    if not _int64(task_id, &words[1]):
        return None
    words[0] = DONE_RECORD
    words[2] = ended is True
    cdef double seconds[2]
    seconds[0] = PyFloat_AS_DOUBLE(fetch_seconds)
    seconds[1] = PyFloat_AS_DOUBLE(collate_seconds)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(layout)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, DONE_BYTES + size)
    cdef char *dst = PyBytes_AS_STRING(out)
    memcpy(dst, words, 24)
    memcpy(dst + 24, seconds, 16)
    memcpy(dst + DONE_BYTES, PyBytes_AS_STRING(layout), size)
    return out


cdef int64_t _word(const char *src, Py_ssize_t i) noexcept:
    cdef int64_t word
    memcpy(&word, src + 8 * i, 8)
    return word


def read(bytes data, task_kind, done_kind):
    """The message of a fixed record: ``(task_kind, task id, index, slot)``
    or ``(done_kind, task id, layout, fetch seconds, collate seconds, False,
    None, ended)``; None when ``data`` is no fixed record (a pickle).
    ValueError when it is one whose length contradicts its kind."""
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    cdef const char *src = PyBytes_AS_STRING(data)
    cdef Py_ssize_t i, n
    cdef double seconds[2]
    cdef object item
    if size == 0 or (src[0] != TASK_RECORD and src[0] != DONE_RECORD):
        return None
    if src[0] == TASK_RECORD:
        if size < (TASK_WORDS + 1) * 8 or size % 8:
            raise ValueError("a task record of {} bytes".format(size))
        n = size // 8 - TASK_WORDS
        index = PyList_New(n)
        for i in range(n):
            item = _word(src, TASK_WORDS + i)
            Py_INCREF(item)
            PyList_SET_ITEM(index, i, item)
        return (task_kind, _word(src, 1), index, (_word(src, 2), _word(src, 3), _word(src, 4)))
    if size < DONE_BYTES:
        raise ValueError("a result record of {} bytes".format(size))
    memcpy(seconds, src + 24, 16)
    return (done_kind, _word(src, 1), data[DONE_BYTES:], seconds[0], seconds[1], False, None,
            _word(src, 2) != 0)
