# distutils: sources = fastload_c/src/fl_copy.c
"""Batches written into slots (the worker's side of fastload_c.slab).

Three ways in, each given the slot as (target, offset, capacity), where target
is any writable buffer (a shm.Segment in a worker, a slab.Lease in-process):

- collate_into: samples -> the batch default_collate makes, each leaf of
  each sample copied once into its row of the slot;
- gather_into: rows of whole columns (an ArrayDataset) by index, one C call
  per column;
- pickle_into: any picklable batch (a custom collate_fn's result) by pickle
  protocol 5, its large buffers out of band in the slot.

Each returns the layout (bytes) from which unpack rebuilds the batch over
the main process's mapping of the same slot, or raises SlotTooSmallError,
before writing anything, when the batch does not fit. Copies run with the GIL
released, but for small batches (NOTE [ Copies and the GIL ]).

NOTE [ Copies and the GIL ]
The copies of gather_into and collate_into read arrays and write a slot
through raw pointers taken with the GIL held: the walk (collate_into) or
the columns tuple (gather_into, RowGather.into) holds a reference to every
source array and _Target holds the target's buffer, so nothing they point
at can be freed or resized while the GIL is released; the C they run
touches no Python object. A RowGather that threads share changes which
layout it keeps with the GIL held, and each gather holds the layout it
copies by (never changed once made). Another thread may write into the source arrays meanwhile,
which is the same race as with np.take (numpy releases the GIL there too).
A batch of fewer than NOGIL_MIN_BYTES (128 KiB) is copied with the GIL
held: such a copy takes ten microseconds or so, less than handing the GIL
over and taking it back while other threads want it (a thread that lets
it go must then wait while another runs Python); worker threads copying
small batches would convoy behind the main thread that way. Measured
with 2 thread workers on 2 cores (ArrayDataset rows, 256 to a batch),
batches of 64 KiB load 1.35x as fast held as released, of 133 KiB 1.08x,
of 197 KiB 0.93x: past about 150 KiB, letting the main thread run during
the copy wins.

NOTE [ Batch layout ]
A layout is ``pickle.dumps(message, 5)`` with message one of

    ("tree", node)                       arrays and containers only
    ("tree+values", tree_layout, values) tree_layout: the bytes of a "tree"
                                         layout; values: lists or tuples
                                         of str/bytes
    ("pickle", offset, length, buffers)  a pickle-5 stream at offset in the
                                         slot; buffers: ((offset, nbytes),...)
and node one of

    ("a", offset, dtype, shape, tensor)  C-contiguous array at slot offset;
                                         tensor: the samples (or gathered
                                         columns) held torch tensors there,
                                         so the batch holds torch.from_numpy
                                         of the view
    ("l", (node, ...))                   list
    ("t", type, (node, ...))             namedtuple: type(*items)
    ("m", type, keys, (node, ...), template)
                                         mapping: copy(template) updated with
                                         zip(keys, items), or, without a
                                         template, type(that dict), else dict
    ("v", index)                         values[index], strings kept as is

Offsets count from the slot's start and are multiples of FL_ALIGN. A "tree"
layout depends only on the structure, leaf kinds, dtypes, shapes and batch
size, so it is computed once per structure and the same bytes come back for
every batch like it; the main process caches its decoding by those bytes. Only strings
(usually file names or labels) travel per batch, in "tree+values".
"""
cimport numpy as cnp
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bool cimport PyBool_Check
from cpython.dict cimport PyDict_CheckExact
from cpython.float cimport PyFloat_AsDouble, PyFloat_Check
from cpython.list cimport PyList_GET_ITEM, PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_AsLongLong, PyLong_Check
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_Check, PyTuple_GET_ITEM
from libc.stdint cimport int64_t
from libc.string cimport memcmp, memcpy

import copy
import copyreg
import io
import pickle
import sys
from collections.abc import Mapping, MutableMapping

import numpy as np

from fastload_c.errors import CollateError, FastloadError

cnp.import_array()

include "_nogil.pxi"
include "_status.pxi"
include "_pack_common.pxi"
include "_pack_gather.pxi"
include "_pack_pickle.pxi"
include "_pack_unpack.pxi"


# Kinds of sample positions; see _kind_of for what each admits.
cdef enum:
    K_ARRAY = 1
    K_NPSCALAR
    K_INT
    K_FLOAT
    K_BOOL
    K_VALUE
    K_LIST
    K_NAMEDTUPLE
    K_MAPPING
    K_TENSOR

# Numpy numbers a Python-number position of a later sample may hold.
_REALS = (np.integer, np.floating, np.bool_)

# _visit's answer for sample 0 when the cached plan is not its plan.
cdef enum:
    STALE = 1


cdef int _kind_of(object o) except -1:
    """The kind of a sample position; TypeError for anything this module
    does not rebuild exactly as default_collate makes it, which the caller's
    general path then collates (a list or tensor subclass, whose type
    default_collate keeps; a numpy scalar that is not a number, which it
    refuses)."""
    if cnp.PyArray_Check(o):
        return K_ARRAY
    # str before numpy: np.str_ and np.bytes_ are strings, kept as is.
    if isinstance(o, (str, bytes)):
        return K_VALUE
    # numpy before float: np.float64 is a float subclass.
    if isinstance(o, (np.number, np.bool_)):
        return K_NPSCALAR
    if PyBool_Check(o):
        return K_BOOL
    if PyLong_Check(o):
        return K_INT
    if PyFloat_Check(o):
        return K_FLOAT
    if PyDict_CheckExact(o) or isinstance(o, Mapping):
        return K_MAPPING
    if PyTuple_Check(o) and hasattr(type(o), "_fields"):
        return K_NAMEDTUPLE
    if type(o) is list or type(o) is tuple:
        return K_LIST
    if _is_tensor(o):
        return K_TENSOR
    raise TypeError("default_collate: batch must contain numpy arrays, numbers, strings, "
                    "dicts or lists; found {}".format(type(o)))


cdef object _tensor_type = None


cdef bint _is_tensor(object o) except -1:
    """Whether o is a torch tensor, not of a subclass (whose type
    torch.stack keeps, so collation leaves it to the general path)."""
    return _is_any_tensor(o) and type(o) is _tensor_type


cdef bint _is_any_tensor(object o) except -1:
    """Whether o is a torch tensor of any class (a gathered column: its
    rows are read through a numpy view); torch is never imported here, only
    looked up once the program imported it (a torch still being imported,
    by another thread, is not: no tensor exists yet)."""
    global _tensor_type
    if _tensor_type is None:
        torch = sys.modules.get("torch")
        if torch is None or getattr(getattr(torch, "__spec__", None), "_initializing", False):
            return False
        _tensor_type = torch.Tensor
    return isinstance(o, _tensor_type)


cdef cnp.ndarray _tensor_as_array(object tensor):
    """The numpy view of a CPU tensor (zero copy). Raises for tensors numpy
    cannot view (on a device, needing grad, bfloat16...): the caller's
    general path then collates them as default_collate does."""
    return tensor.numpy()


cdef int _check_dtype(cnp.dtype d) except -1:
    if d.char in "SaUO":
        raise TypeError("default_collate: batch must contain numpy arrays, numbers, strings, "
                        "dicts or lists; found {}".format(d))
    if d.hasobject:
        raise TypeError("cannot collate {} into shared memory: it holds Python objects".format(d))
    return 0


cdef class _Plan:
    def __dealloc__(self):
        PyMem_Free(self.copies)


cdef _Plan _last_plan = None


cdef _Plan _make_plan(object sample0, Py_ssize_t batch, dict out_dtypes=None):
    """Plan the batch of `batch` samples shaped like sample0. out_dtypes
    overrides the batch dtype of some leaves (samples whose dtypes differ)."""
    cdef _Plan plan = _Plan.__new__(_Plan)
    plan.batch = batch
    plan.leaves = []
    plan.nvalues = 0
    plan.value_tuples = []
    plan.root = _build(plan, sample0, False)
    cdef _Node node
    cdef size_t off = 0
    cdef Py_ssize_t n = 0
    cdef _Copy *c
    for node in plan.leaves:
        if out_dtypes and node.leaf in out_dtypes:
            node.out = out_dtypes[node.leaf]
            node.by_numpy = True
            node.row_bytes = <size_t>node.out.itemsize * _prod(node)
        off = fl_align_up(off, FL_ALIGN)
        node.offset = off
        off += node.row_bytes * <size_t>batch
        if node.kind == K_ARRAY and not node.by_numpy:
            n += 1
    plan.nbytes = off
    plan.copies = <_Copy *>PyMem_Malloc(max(n, 1) * sizeof(_Copy))
    if plan.copies == NULL:
        raise MemoryError()
    plan.ncopies = 0
    for node in plan.leaves:
        if node.kind == K_ARRAY and not node.by_numpy:
            c = &plan.copies[plan.ncopies]
            c.leaf = node.leaf
            c.offset = node.offset
            c.row_bytes = node.row_bytes
            c.itemsize = node.itemsize
            c.ndim = node.ndim
            c.shape = &node.shape[0]    # the node lives as long as the plan
            plan.ncopies += 1
    plan.layout = _dumps(("tree", _tree(plan.root, batch)))
    return plan


cdef size_t _prod(_Node node):
    cdef size_t n = 1
    cdef int i
    for i in range(node.ndim):
        n *= <size_t>node.shape[i]
    return n


cdef _Node _build(_Plan plan, object o, bint in_sequence):
    cdef _Node node = _Node.__new__(_Node)
    cdef int i
    node.kind = _kind_of(o)
    node.type = type(o)
    node.ndim = 0
    node.tensor = node.kind == K_TENSOR
    if node.tensor:
        # Written through its numpy view: torch.stack's bytes, as long as
        # every sample's tensor has this dtype (see _visit_array); unpack
        # gives the batch back as a tensor over the slot.
        o = _tensor_as_array(o)
        node.kind = K_ARRAY
    if node.kind == K_ARRAY or node.kind == K_NPSCALAR:
        if node.kind == K_ARRAY:
            node.src = (<cnp.ndarray>o).descr
            node.ndim = cnp.PyArray_NDIM(<cnp.ndarray>o)
            if node.ndim >= 64:
                # The batch adds a dimension; numpy holds at most 64.
                raise ValueError("maximum supported dimension for an ndarray is 64, found {}"
                                 .format(node.ndim + 1))
            for i in range(node.ndim):
                node.shape[i] = cnp.PyArray_DIMS(<cnp.ndarray>o)[i]
        else:
            node.src = cnp.PyArray_DescrFromScalar(o)
        _check_dtype(node.src)
        node.out = np.result_type(node.src)
        # Only what np.stack would not change is copied as bytes; a numpy
        # scalar's bytes are only known for numbers (not void, datetime).
        node.by_numpy = not (node.out == node.src) or (
            node.kind == K_NPSCALAR and not (cnp.PyTypeNum_ISNUMBER(node.src.type_num)
                                            or cnp.PyTypeNum_ISBOOL(node.src.type_num)))
        node.itemsize = node.src.itemsize
    elif node.kind == K_INT:
        node.out = np.dtype(np.int64)
    elif node.kind == K_FLOAT:
        node.out = np.dtype(np.float64)
    elif node.kind == K_BOOL:
        node.out = np.dtype(np.bool_)
    elif node.kind == K_VALUE:
        node.leaf = plan.nvalues
        plan.nvalues += 1
        plan.value_tuples.append(in_sequence)
        return node
    else:
        if node.kind == K_MAPPING:
            node.keys = tuple(o)
            node.children = [_build(plan, o[k], False) for k in node.keys]
            node.template = _mapping_template(o)
        else:
            node.children = [_build(plan, item, True) for item in o]
        return node
    node.row_bytes = <size_t>node.out.itemsize * _prod(node)
    node.leaf = len(plan.leaves)
    plan.leaves.append(node)
    return node


cdef object _mapping_template(object mapping):
    """An emptied copy of a mutable mapping of its own type, which the batch
    is rebuilt from (copy + update, as default_collate: a defaultdict keeps
    its factory); None for a dict, or where no picklable copy can be had."""
    if type(mapping) is dict or not isinstance(mapping, MutableMapping):
        return None
    try:
        template = copy.copy(mapping)
        template.clear()
        pickle.dumps(template, protocol=5)
    except Exception:
        return None
    return template


cdef tuple _shape(_Node node):
    cdef int i
    return tuple([node.shape[i] for i in range(node.ndim)])


cdef tuple _tree(_Node node, Py_ssize_t batch):
    if node.kind == K_VALUE:
        return ("v", node.leaf)
    if node.kind == K_LIST:
        return ("l", tuple([_tree(c, batch) for c in node.children]))
    if node.kind == K_NAMEDTUPLE:
        return ("t", node.type, tuple([_tree(c, batch) for c in node.children]))
    if node.kind == K_MAPPING:
        return ("m", node.type, node.keys, tuple([_tree(c, batch) for c in node.children]),
                node.template)
    return ("a", node.offset, node.out, (batch,) + _shape(node), node.tensor)


cdef class _Walk:
    def __dealloc__(self):
        PyMem_Free(self.src)
        PyMem_Free(<void *>self.strides)


cdef _Walk _new_walk(_Plan plan):
    cdef _Walk w = _Walk.__new__(_Walk)
    cdef Py_ssize_t n = len(plan.leaves) * plan.batch
    w.batch = plan.batch
    w.keep = PyList_New(n)      # slots start NULL; filled by _keep
    w.values = [PyList_New(plan.batch) for _ in range(plan.nvalues)]
    w.src = <const char **>PyMem_Malloc(max(n, 1) * sizeof(char *))
    w.strides = <const cnp.npy_intp **>PyMem_Malloc(max(n, 1) * sizeof(cnp.npy_intp *))
    w.mixed = None
    if w.src == NULL or w.strides == NULL:
        raise MemoryError()
    return w


cdef inline void _keep(list lst, Py_ssize_t i, object o):
    # The walk holds every leaf so nothing it points at can go away while
    # the copies run without the GIL.
    Py_INCREF(o)
    PyList_SET_ITEM(lst, i, o)


cdef int _walk(_Plan plan, tuple samples, _Walk w) except -1:
    cdef Py_ssize_t s
    for s in range(plan.batch):
        if _visit(plan.root, <object>PyTuple_GET_ITEM(samples, s), s, w) != 0:
            return STALE
    return 0


cdef int _visit(_Node node, object o, Py_ssize_t s, _Walk w) except -1:
    """Check sample s's object at this position against the plan and collect
    it. Returns STALE when s is 0 and differs from the plan (which then was
    made for an earlier batch); raises when a later sample disagrees with
    sample 0."""
    cdef int kind = node.kind
    if kind == K_ARRAY or kind == K_NPSCALAR:
        return _visit_array(node, o, s, w)
    if s == 0 and _kind_of(o) != kind:
        return STALE
    if kind == K_VALUE:
        if not isinstance(o, (str, bytes)):
            # default_collate keeps them all as they are, which a plain
            # pickle of the values would not (an array's byte order, say):
            # the caller's path.
            raise TypeError("collate_into: sample {} holds a {} where sample 0 holds a "
                            "string".format(s, type(o).__name__))
        _keep(<list>w.values[node.leaf], s, o)
        return 0
    # Later samples may give another kind of number: a float batch takes
    # any real; an int or bool batch then takes the dtype np.array infers
    # from all of them (as torch.tensor does), a "mixed" leaf.
    if kind == K_FLOAT:
        if not (PyFloat_Check(o) or PyLong_Check(o) or isinstance(o, _REALS)):
            raise _type_error(s, o, node)
    elif kind == K_INT or kind == K_BOOL:
        if not (PyBool_Check(o) if kind == K_BOOL else PyLong_Check(o)):
            if not (PyLong_Check(o) or PyFloat_Check(o) or isinstance(o, _REALS)):
                raise _type_error(s, o, node)
            _mark_mixed(w, node, None)
    else:
        return _visit_container(node, o, s, w)
    _keep(w.keep, node.leaf * w.batch + s, o)
    return 0


cdef int _visit_container(_Node node, object o, Py_ssize_t s, _Walk w) except -1:
    cdef Py_ssize_t i, n = len(node.children)
    cdef int rc
    if node.kind == K_MAPPING:
        if s == 0 and (type(o) is not node.type or tuple(o) != node.keys):
            return STALE
        if not (PyDict_CheckExact(o) or isinstance(o, Mapping)):
            raise _type_error(s, o, node)
        for i in range(n):
            rc = _visit(<_Node>node.children[i], o[node.keys[i]], s, w)
            if rc != 0:
                return rc
        return 0
    if s == 0 and (type(o) is not node.type or len(o) != n):
        return STALE
    if node.kind == K_NAMEDTUPLE and not PyTuple_Check(o):
        raise _type_error(s, o, node)
    if not isinstance(o, (list, tuple)):
        raise _type_error(s, o, node)
    if len(o) != n:
        raise CollateError("default_collate: sample {} has {} elements but sample 0 has {} "
                           "(each element in list of batch should be of equal size)"
                           .format(s, len(o), n), (s, 0))
    for i in range(n):
        rc = _visit(<_Node>node.children[i], o[i], s, w)
        if rc != 0:
            return rc
    return 0


cdef int _visit_array(_Node node, object o, Py_ssize_t s, _Walk w) except -1:
    cdef Py_ssize_t k = node.leaf * w.batch + s
    cdef cnp.dtype d
    cdef int nd
    cdef bint same, same_shape
    if node.tensor or _is_tensor(o):
        if not (node.tensor and _is_tensor(o)):
            if s == 0:
                return STALE
            raise TypeError("collate_into: tensors and arrays at one position")
        o = _tensor_as_array(o)
        if not (o.dtype is node.src or o.dtype == node.src):
            if s == 0:
                return STALE
            # torch promotes by its own rules: leave those to default_collate.
            raise TypeError("collate_into: tensors of different dtypes at one position")
    if cnp.PyArray_Check(o):
        d = (<cnp.ndarray>o).descr
        nd = cnp.PyArray_NDIM(<cnp.ndarray>o)
        # 0-d arrays may have no dims pointer at all: no memcmp on NULL.
        same_shape = nd == node.ndim and (nd == 0 or memcmp(
            cnp.PyArray_DIMS(<cnp.ndarray>o), node.shape, nd * sizeof(cnp.npy_intp)) == 0)
        same = node.kind == K_ARRAY and (d is node.src or d == node.src)
        if not (same and same_shape):
            if s == 0:
                return STALE
            if not same_shape:
                raise _shape_error(s, np.shape(o), node)
            _mark_mixed(w, node, d)
        w.src[k] = cnp.PyArray_BYTES(<cnp.ndarray>o)
        w.strides[k] = (NULL if cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>o)
                        else cnp.PyArray_STRIDES(<cnp.ndarray>o))
    elif type(o) is node.type:
        if node.by_numpy:
            d = cnp.PyArray_DescrFromScalar(o)
            if not (d is node.src or d == node.src):
                if s == 0:
                    return STALE
                _mark_mixed(w, node, d)
    elif isinstance(o, np.generic):
        if s == 0:
            return STALE
        if node.ndim != 0:
            raise _shape_error(s, (), node)
        _mark_mixed(w, node, cnp.PyArray_DescrFromScalar(o))
    else:
        if s == 0:
            return STALE
        raise _type_error(s, o, node)
    _keep(w.keep, k, o)
    return 0


cdef int _mark_mixed(_Walk w, _Node node, cnp.dtype d) except -1:
    if d is not None:
        _check_dtype(d)
    if w.mixed is None:
        w.mixed = {}
    w.mixed[node.leaf] = True
    return 0


cdef object _type_error(Py_ssize_t s, object o, _Node node):
    # A leaf no sample may have (None...) is a TypeError wherever it is;
    # a supported one where sample 0 has another kind is a CollateError.
    _kind_of(o)
    return CollateError("default_collate: sample {} is a {} but sample 0 is a {}"
                        .format(s, _type_name(type(o)), _type_name(node.type)), (s, 0))


cdef object _shape_error(Py_ssize_t s, tuple shape, _Node node):
    return CollateError("default_collate: sample {} has shape {} but sample 0 has shape {}"
                        .format(s, shape, _shape(node)), (s, 0))


cdef str _type_name(type t):
    if t.__module__ == "builtins":
        return t.__qualname__
    return "{}.{}".format(t.__module__, t.__qualname__)


def collate_into(samples, target, Py_ssize_t offset=0, Py_ssize_t capacity=-1, *,
                 bint numpy_rules=True, int fd=-1):
    """Collate ``samples`` into the slot ``target[offset:offset + capacity]``.

    The batch equals fastload's default_collate of the same samples (same
    structure, dtypes, shapes, values): arrays stacked to (B, *shape) with
    np.stack's dtype (tensors to a tensor, as torch.stack), numbers to
    int64 / float64 / bool arrays, strings kept (a tuple inside a sequence,
    as torch), tuples to lists, mappings and namedtuples to their own type.
    Returns the layout for unpack. Raises CollateError naming both
    samples when shapes or structures disagree, TypeError for unsupported
    leaves, SlotTooSmallError (nothing written) when the slot is too small.
    ``capacity`` -1 means to the end of target. A leaf whose samples differ
    in dtype (or in number type) gets numpy's promotion of them, and arrays
    of datetimes, timedeltas and structured dtypes are stacked as numpy
    stacks them. With ``numpy_rules`` False both raise TypeError instead,
    and so do uint64 scalars: the caller's rules for them are others
    (torch's default_collate promotes by torch's rules and refuses those
    dtypes and scalars).
    ``fd``, when not -1, is a file whose bytes from its start are target's
    (a Segment's memfd): the arrays' rows are written to it with pwritev
    instead of through target, so this process maps none of their pages
    (NOTE [ Unmapped slots ] in fastload/_memory.py); OSError when that
    write fails.
    """
    global _last_plan
    # Our own tuple: the walk borrows its items, and a user's __getitem__ or
    # __instancecheck__ on the way cannot change it.
    cdef tuple batch = tuple(samples)
    cdef Py_ssize_t n = len(batch)
    if n == 0:
        raise ValueError("default_collate: cannot collate an empty batch")
    cdef _Target t = _target(target, offset, capacity)
    cdef _Plan plan = _last_plan
    if plan is None or plan.batch != n:
        plan = _make_plan(batch[0], n)
    cdef _Walk w = _new_walk(plan)
    if _walk(plan, batch, w) == STALE:
        plan = _make_plan(batch[0], n)
        w = _new_walk(plan)
        if _walk(plan, batch, w) == STALE:
            raise RuntimeError("collate_into: sample 0 changed while it was collated")
    _last_plan = plan
    if not numpy_rules:
        _refuse_what_numpy_rules_decide(plan, w)
    if w.mixed is not None:
        plan = _make_plan(batch[0], n, _promoted(plan, w))
    t.check(plan.nbytes)
    _write_scalars(plan, w, t.base)
    _copy_arrays(plan, w, t.base, fd, offset)
    _write_by_numpy(plan, w, t)
    if plan.nvalues == 0:
        return plan.layout
    # Strings come back as torch gives them: a tuple where they were items
    # of a sequence (collation transposes those with zip), else a list.
    values = [tuple(v) if as_tuple else v for v, as_tuple in zip(w.values, plan.value_tuples)]
    return _dumps(("tree+values", plan.layout, values))


def arrays_alike(samples):
    """Whether every sample is a numpy array of the first one's class and of
    an equivalent dtype (as numpy's == of dtypes): a loop in C, for a
    collation that must tell mixed leaves apart."""
    cdef tuple items = tuple(samples)
    cdef Py_ssize_t i, n = len(items)
    if n == 0:
        return True
    first = items[0]
    if not cnp.PyArray_Check(first):
        return False
    cdef type cls = type(first)
    cdef cnp.dtype d = (<cnp.ndarray>first).descr, other
    for i in range(1, n):
        o = items[i]
        if type(o) is not cls:
            return False
        other = (<cnp.ndarray>o).descr
        if other is not d and not cnp.PyArray_EquivTypes(other, d):
            return False
    return True


cdef int _refuse_what_numpy_rules_decide(_Plan plan, _Walk w) except -1:
    """collate_into with numpy_rules False: TypeError for a leaf whose
    samples differ in dtype, whose dtype is no number's, or of uint64
    scalars (torch makes tensors of uint64 arrays, not of such scalars)."""
    cdef _Node node
    if w.mixed is not None:
        raise TypeError("collate_into: the samples of a leaf differ in dtype, which "
                        "numpy_rules=False leaves to the caller")
    for node in plan.leaves:
        if (node.kind == K_ARRAY or node.kind == K_NPSCALAR) and node.src.kind in "mMV":
            raise TypeError("collate_into: {} is not a number's dtype, which "
                            "numpy_rules=False leaves to the caller".format(node.src))
        if node.kind == K_NPSCALAR and node.src.kind == "u" and node.src.itemsize == 8:
            raise TypeError("collate_into: uint64 scalars are left to the caller "
                            "with numpy_rules=False")
    return 0


cdef dict _promoted(_Plan plan, _Walk w):
    """Batch dtypes of leaves whose samples' dtypes differ: as np.stack for
    arrays, as np.array infers for an int or bool leaf's numbers. TypeError
    (the caller's rules decide) where that is no number's dtype (an int
    past 64 bits makes an object array), and where numpy makes floats of
    ints and bools alone: ints on both sides of 2**63 are no float batch
    (fastload.collate makes uint64 of them, or raises)."""
    cdef dict out = {}
    cdef Py_ssize_t b = plan.batch
    cdef _Node node
    for leaf in w.mixed:
        node = plan.leaves[leaf]
        objs = w.keep[leaf * b:(leaf + 1) * b]
        if node.kind == K_ARRAY or node.kind == K_NPSCALAR:
            dtype = np.result_type(*[np.asarray(o).dtype for o in objs])
        else:
            dtype = np.array(objs).dtype
            if dtype.kind not in "biufc" or (dtype.kind in "fc" and all(
                    type(o) is int or type(o) is bool for o in objs)):
                raise TypeError("collate_into: the numbers of a leaf make a {} batch, "
                                "which it leaves to the caller".format(dtype))
        if dtype.kind not in "biufcmM":
            raise TypeError("collate_into: the samples of a leaf make a {} batch, "
                            "which it leaves to the caller".format(dtype))
        out[leaf] = dtype
    return out


cdef int _write_scalars(_Plan plan, _Walk w, char *base) except -1:
    cdef _Node node
    cdef Py_ssize_t s, b = plan.batch, k
    cdef char *dst
    for node in plan.leaves:
        if node.by_numpy or node.kind == K_ARRAY:
            continue
        dst = base + node.offset
        k = node.leaf * b
        if node.kind == K_FLOAT:
            for s in range(b):
                (<double *>dst)[s] = PyFloat_AsDouble(<object>PyList_GET_ITEM(w.keep, k + s))
        elif node.kind == K_INT:
            for s in range(b):
                (<int64_t *>dst)[s] = PyLong_AsLongLong(<object>PyList_GET_ITEM(w.keep, k + s))
        elif node.kind == K_BOOL:
            for s in range(b):
                (<cnp.npy_bool *>dst)[s] = bool(<object>PyList_GET_ITEM(w.keep, k + s))
        else:
            for s in range(b):
                cnp.PyArray_ScalarAsCtype(<object>PyList_GET_ITEM(w.keep, k + s),
                                          dst + s * node.row_bytes)
    return 0


cdef int _copy_arrays(_Plan plan, _Walk w, char *base, int fd, long long at) except -1:
    cdef int rc = 0
    if fd >= 0:
        with nogil:
            rc = _write_plan_arrays(plan.copies, plan.ncopies, plan.batch, w.src, w.strides,
                                    fd, at)
        if rc != 0:
            raise_errno("collate_into: cannot write the batch to its slot's file")
    elif plan.nbytes >= NOGIL_MIN_BYTES:
        with nogil:
            _copy_plan_arrays(plan.copies, plan.ncopies, plan.batch, w.src, w.strides, base)
    else:
        _copy_plan_arrays(plan.copies, plan.ncopies, plan.batch, w.src, w.strides, base)
    return 0


cdef int _write_plan_arrays(const _Copy *copies, Py_ssize_t ncopies, Py_ssize_t b,
                            const char **src, const cnp.npy_intp **strides,
                            int fd, long long at) noexcept nogil:
    cdef Py_ssize_t i
    cdef const _Copy *c
    for i in range(ncopies):
        c = &copies[i]
        if fl_write_rows(fd, at + c.offset, c.row_bytes, src + c.leaf * b, strides + c.leaf * b,
                         c.ndim, c.shape, c.itemsize, b) != 0:
            return -1
    return 0


cdef void _copy_plan_arrays(const _Copy *copies, Py_ssize_t ncopies, Py_ssize_t b,
                            const char **src, const cnp.npy_intp **strides,
                            char *base) noexcept nogil:
    cdef Py_ssize_t i
    cdef const _Copy *c
    for i in range(ncopies):
        c = &copies[i]
        fl_copy_rows(base + c.offset, c.row_bytes, src + c.leaf * b, strides + c.leaf * b,
                     c.ndim, c.shape, c.itemsize, b)


cdef int _write_by_numpy(_Plan plan, _Walk w, _Target t) except -1:
    # Byte order, padding or promotion change the bytes: numpy casts, as in
    # np.stack (which itself releases the GIL for the cast loops).
    cdef _Node node
    cdef Py_ssize_t b = plan.batch
    for node in plan.leaves:
        if node.by_numpy:
            out = _array_at(t.base + node.offset, node.out, (b,) + _shape(node), None)
            objs = w.keep[node.leaf * b:(node.leaf + 1) * b]
            if node.kind == K_ARRAY or node.kind == K_NPSCALAR:
                np.stack(objs, out=out)
            else:
                out[...] = np.array(objs)
    return 0
