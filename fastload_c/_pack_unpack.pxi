# Part of pack.pyx: the main process's side, rebuilding a batch from its
# layout over a slot (NOTE [ Batch layout ]).

cdef enum:
    O_ARRAY = 1
    O_LIST
    O_NAMEDTUPLE
    O_MAPPING
    O_VALUE


cdef dict _decoded = {}


def unpack(base, layout):
    """Rebuild the batch a write into a slot returned, over ``base``.

    ``base`` is the slot's memory in this process: a slab.Lease (or any
    object with the buffer protocol whose memory stays put while it lives,
    such as a Segment). Arrays view it directly and hold ``base`` as their
    base object, so the slot lives while any of them (or anything derived
    from them) does; where the samples held tensors, the batch holds
    tensors over those arrays. Raises ValueError when the layout reaches
    outside it.
    """
    cdef Py_buffer view
    PyObject_GetBuffer(base, &view, PyBUF_SIMPLE)
    cdef char *data = <char *>view.buf
    cdef size_t length = <size_t>view.len
    cdef bint readonly = view.readonly
    PyBuffer_Release(&view)
    cdef _Out root = _decoded.get(layout)
    values = None
    if root is None:
        message = pickle.loads(layout)
        if message[0] == "pickle":
            return _unpickle(base, message[1], message[2], message[3], length)
        if message[0] == "tree+values":
            values = message[2]
        root = _tree_of(layout, message)
    return _build_out(root, base, data, length, readonly, values)


cdef _Out _tree_of(bytes layout, object message):
    """The decoded tree of ``layout``, a tree layout that unpickled to
    ``message``, remembered for the next batch of the same layout."""
    cdef _Out root
    if message[0] == "tree+values":
        root = _decoded.get(message[1])
        if root is None:
            root = _remember(message[1], pickle.loads(message[1])[1])
        return root
    return _remember(layout, message[1])


cdef object _torch():
    """torch, for a batch whose samples held tensors. A worker made them, so
    torch is installed; this process may not have imported it yet."""
    torch = sys.modules.get("torch")
    if torch is None:
        import torch
    return torch


cdef _Out _remember(bytes layout, tuple tree):
    root = _decode(tree)
    if len(_decoded) >= 64:
        _decoded.clear()
    _decoded[layout] = root
    return root


cdef _Out _decode(tuple node):
    cdef _Out out = _Out.__new__(_Out)
    tag = node[0]
    if tag == "a":
        out.kind = O_ARRAY
        out.offset = node[1]
        out.dtype = node[2]
        out.shape = node[3]
        out.tensor = node[4]
        out.nbytes = out.dtype.itemsize
        for d in out.shape:
            out.nbytes *= <size_t>d
    elif tag == "v":
        out.kind = O_VALUE
        out.index = node[1]
    elif tag == "l":
        out.kind = O_LIST
        out.children = [_decode(c) for c in node[1]]
    elif tag == "t":
        out.kind = O_NAMEDTUPLE
        out.type = node[1]
        out.children = [_decode(c) for c in node[2]]
    elif tag == "m":
        out.kind = O_MAPPING
        out.type = node[1]
        out.keys = node[2]
        out.children = [_decode(c) for c in node[3]]
        out.template = node[4]
    else:
        raise ValueError("unknown batch layout node {!r}".format(tag))
    return out


cdef object _build_out(_Out node, object base, char *data, size_t length, bint readonly,
                       list values):
    cdef _Out child
    cdef cnp.ndarray arr
    if node.kind == O_ARRAY:
        if node.offset > length or node.nbytes > length - node.offset:
            raise ValueError("batch layout reaches byte {} of a slot of {}"
                             .format(node.offset + node.nbytes, length))
        arr = _array_at(data + node.offset, node.dtype, node.shape, base, node.tensor)
        if readonly:
            cnp.PyArray_CLEARFLAGS(arr, cnp.NPY_ARRAY_WRITEABLE)
        return _torch().from_numpy(arr) if node.tensor else arr
    if node.kind == O_VALUE:
        return values[node.index]
    items = [_build_out(child, base, data, length, readonly, values) for child in node.children]
    if node.kind == O_LIST:
        return items
    if node.kind == O_NAMEDTUPLE:
        return node.type(*items)
    mapping = dict(zip(node.keys, items))
    if node.type is dict:
        return mapping
    if node.template is not None:
        out = copy.copy(node.template)
        out.update(mapping)
        return out
    try:
        return node.type(mapping)
    except TypeError:
        # A mapping type that cannot be built from a dict (defaultdict...).
        return mapping


def layout_end(layout):
    """Where the batch of ``layout`` ends in its slot: the bytes of a slot
    it needs, which may be far fewer than the slot has."""
    cdef _Out root = _decoded.get(layout)
    if root is None:
        message = pickle.loads(layout)
        if message[0] == "pickle":
            return max([message[1] + message[2]] + [off + n for off, n in message[3]])
        root = _tree_of(layout, message)
    return _end(root)


cdef size_t _end(_Out node):
    cdef _Out child
    cdef size_t end = 0
    if node.kind == O_ARRAY:
        return node.offset + node.nbytes
    if node.kind != O_VALUE:
        for child in node.children:
            end = max(end, _end(child))
    return end


cdef object _unpickle(object base, size_t offset, size_t length, tuple places, size_t size):
    view = memoryview(base)
    for off, n in places + ((offset, length),):
        if off > size or n > size - off:
            raise ValueError("batch layout reaches byte {} of a slot of {}".format(off + n, size))
    buffers = [view[off:off + n] for off, n in places]
    return pickle.loads(view[offset:offset + length], buffers=buffers)
