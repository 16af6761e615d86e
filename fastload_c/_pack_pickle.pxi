# Part of pack.pyx: the pickle-5 transport, for batches of any shape (a
# custom collate_fn's result).


def pickle_into(obj, target, Py_ssize_t offset=0, Py_ssize_t capacity=-1, *,
                Py_ssize_t inband_limit=1024, Py_ssize_t reserved=0):
    """Pickle ``obj`` (protocol 5) into the slot, buffers of ``inband_limit``
    bytes or more out of band, so unpack rebuilds arrays viewing the slot.
    The stream itself is written in the slot too: the layout stays a few
    bytes per buffer. SlotTooSmallError when it does not fit.

    ``reserved``: the slot's first bytes already hold some of obj's arrays
    (made there by the caller); a buffer lying inside them is named where it
    is, not copied, and everything else goes after them."""
    buffers = []

    def out_of_band(pb):
        raw = pb.raw()
        if raw.nbytes < inband_limit:
            return True
        buffers.append(raw)
        return False

    stream = _dumps_with_tensor_bytes(obj, out_of_band)
    cdef _Target t = _target(target, offset, capacity)
    if reserved < 0 or <size_t>reserved > t.capacity:
        raise ValueError("reserved={} lies outside the slot of {} bytes"
                         .format(reserved, t.capacity))
    cdef size_t off = <size_t>reserved, at
    places = []
    copies = []
    copy_places = []
    for raw in buffers:
        at = _address(raw) - <size_t>t.base
        if _address(raw) >= <size_t>t.base and at + <size_t>raw.nbytes <= <size_t>reserved:
            places.append((at, raw.nbytes))
            continue
        off = fl_align_up(off, FL_ALIGN)
        places.append((off, raw.nbytes))
        copies.append(raw)
        copy_places.append((off, raw.nbytes))
        off += raw.nbytes
    cdef size_t stream_off = fl_align_up(off, FL_ALIGN)
    t.check(stream_off + len(stream))
    layout = _dumps(("pickle", stream_off, len(stream), tuple(places)))
    copies.append(stream)
    copy_places.append((stream_off, len(stream)))
    _copy_buffers(t.base, copies, copy_places)
    return layout


cdef size_t _address(object buffer) except? 0:
    """Where a buffer's memory starts (the caller keeps it alive)."""
    cdef Py_buffer view
    PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE)
    cdef size_t address = <size_t>view.buf
    PyBuffer_Release(&view)
    return address


cdef int _copy_buffers(char *base, list buffers, list places) except -1:
    cdef Py_ssize_t i, n = len(buffers), held = 0
    cdef Py_buffer *views = <Py_buffer *>PyMem_Malloc(max(n, 1) * sizeof(Py_buffer))
    cdef size_t *offs = <size_t *>PyMem_Malloc(max(n, 1) * sizeof(size_t))
    if views == NULL or offs == NULL:
        PyMem_Free(views)
        PyMem_Free(offs)
        raise MemoryError()
    try:
        for i in range(n):
            PyObject_GetBuffer(buffers[i], &views[i], PyBUF_SIMPLE)
            held += 1
            offs[i] = places[i][0]
        with nogil:
            for i in range(n):
                memcpy(base + offs[i], views[i].buf, <size_t>views[i].len)
    finally:
        for i in range(held):
            PyBuffer_Release(&views[i])
        PyMem_Free(views)
        PyMem_Free(offs)
    return 0


def _dumps_with_tensor_bytes(obj, buffer_callback):
    """pickle.dumps(obj, protocol 5), with two changes that keep what
    numpy's and torch's own reductions would change.

    - torch tensors (exactly torch.Tensor, plain CPU ones) are pickled as
      their storage's bytes, a numpy array that goes out of band like any
      other, so unpack rebuilds them as views of the slot: no copy in the
      pickle stream, any dtype torch can view bytes as (uint16 to uint64
      and bfloat16 too, which torch's own pickle of a storage cannot load),
      and tensors that shared a storage share one again (the bytes are one
      array, pickled once).
    - numpy arrays (exactly np.ndarray) keep their dtype as it is: numpy
      gives a strided array of another byte order back in native order,
      and np.longlong's and np.ulonglong's arrays back as np.int64's and
      np.uint64's (see _reduce_array); np.longlong and np.ulonglong scalars
      keep their type too (numpy's pickle names them by dtype)."""
    torch = sys.modules.get("torch")
    storages = {}

    def reduce_tensor(tensor):
        if (tensor.device.type != "cpu" or tensor.layout is not torch.strided
                or tensor.is_nested or tensor.requires_grad or tensor.is_conj()
                or tensor.is_neg() or tensor.is_quantized
                or any(getattr(tensor, "names", ()))):
            return tensor.__reduce_ex__(5)  # torch's own, as it would be
        storage = tensor.untyped_storage()
        data = storages.get(storage.data_ptr())
        if data is None:
            data = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
            storages[storage.data_ptr()] = data
        return (_tensor_from_bytes, (data, str(tensor.dtype).rpartition(".")[2],
                                     tuple(tensor.shape), tuple(tensor.stride()),
                                     tensor.storage_offset()))

    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=5, buffer_callback=buffer_callback)
    pickler.dispatch_table = _dispatch_table
    if torch is not None:
        pickler.dispatch_table = _dispatch_table.copy()
        pickler.dispatch_table[torch.Tensor] = reduce_tensor
    pickler.dump(obj)
    return out.getvalue()


def _reduce_array(array):
    """numpy's reduction of ``array``, unless it would not give its dtype
    back (another byte order: numpy returns native strided arrays and
    datetimes; np.longlong's and np.ulonglong's name): then its bytes, its
    dtype and the dtype's name."""
    dtype = array.dtype
    if dtype.hasobject or (dtype.isnative and dtype.char not in "qQ"):
        return array.__reduce_ex__(5)
    data = array.copy(order="C").reshape(-1).view(np.uint8)
    return (_array_from_bytes, (data, dtype, dtype.char, array.shape))


def _array_from_bytes(data, dtype, type_char, shape):
    """An array _reduce_array pickled."""
    if type_char in "qQ":  # a pickled dtype comes back as np.int64's, np.uint64's
        dtype = np.dtype(type_char).newbyteorder(dtype.byteorder)
    return data.view(dtype).reshape(shape)


def _reduce_named_scalar(scalar):
    """An np.longlong or np.ulonglong scalar, which numpy's pickle gives back
    as np.int64's or np.uint64's: its type's char and its value."""
    return (_scalar_from_char, (scalar.dtype.char, int(scalar)))


def _scalar_from_char(type_char, value):
    """A scalar _reduce_named_scalar pickled."""
    return np.dtype(type_char).type(value)


_dispatch_table = copyreg.dispatch_table.copy()
_dispatch_table[np.ndarray] = _reduce_array
for _named in (np.longlong, np.ulonglong):
    if _named not in (np.int64, np.uint64):  # distinct types where C long is 64 bits
        _dispatch_table[_named] = _reduce_named_scalar


def _tensor_from_bytes(data, dtype, shape, stride, offset):
    """A tensor _dumps_with_tensor_bytes pickled: ``data``'s bytes viewed."""
    import torch
    return torch.from_numpy(data).view(getattr(torch, dtype)).as_strided(shape, stride, offset)
