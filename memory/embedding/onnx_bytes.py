"""An ONNX model's bytes written directly: the few protobuf messages of the encoder's graph
(memory/embedding/local_model.py, encoder_graph).

Why not the `onnx` package's helpers: importing it (its protobuf messages and C extension) added
7 MB to a Celery worker that loads the model (11 MB to a process without protobuf), for a graph
built once. These functions write the bytes those helpers write for the same graph
(tests/test_recall_local_model.py checks them against the package): the messages' fields in
field-number order, as protobuf writes them, with the field numbers of onnx.proto (proto2: repeated
numbers are not packed).
"""

import struct

FLOAT, INT64 = 1, 7  # TensorProto.DataType
_DATA_TYPES = {"float32": FLOAT, "int64": INT64}
_EXTERNAL = 1  # TensorProto.DataLocation
_ATTRIBUTE_FLOAT, _ATTRIBUTE_INT, _ATTRIBUTE_INTS = 1, 2, 7  # AttributeProto.AttributeType


def _varint(n):
    n &= (1 << 64) - 1  # a negative int64 is written as its 64-bit two's complement
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _int(field, n):
    return _varint(field << 3) + _varint(int(n))


def _bytes(field, data):
    if isinstance(data, str):
        data = data.encode()
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _float(field, x):
    return _varint(field << 3 | 5) + struct.pack("<f", x)


def _attribute(name, value):
    """AttributeProto: name 1, f 2, i 3, ints 8, type 20."""
    if isinstance(value, float):
        return _bytes(1, name) + _float(2, value) + _int(20, _ATTRIBUTE_FLOAT)
    if isinstance(value, int):
        return _bytes(1, name) + _int(3, value) + _int(20, _ATTRIBUTE_INT)
    return _bytes(1, name) + b"".join(_int(8, v) for v in value) + _int(20, _ATTRIBUTE_INTS)


def node(op_type, inputs, outputs, **attributes):
    """NodeProto (input 1, output 2, op_type 4, attribute 5; no name), its attributes by name, as
    onnx.helper.make_node orders them."""
    out = b"".join(_bytes(1, i) for i in inputs) + b"".join(_bytes(2, o) for o in outputs) + _bytes(4, op_type)
    return out + b"".join(_bytes(5, _attribute(key, value)) for key, value in sorted(attributes.items()))


def tensor(name, array):
    """TensorProto of a numpy array's values (dims 1, data_type 2, name 8, raw_data 9, little-endian)."""
    dims = b"".join(_int(1, d) for d in array.shape)
    raw = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    return dims + _int(2, _DATA_TYPES[array.dtype.name]) + _bytes(8, name) + _bytes(9, raw)


def external_tensor(name, shape, location, offset, length):
    """TensorProto of float32 values at `offset` in the file `location` (external_data 13,
    data_location 14)."""
    entries = (("location", location), ("offset", offset), ("length", length))
    external = b"".join(_bytes(13, _bytes(1, key) + _bytes(2, str(value))) for key, value in entries)
    return b"".join(_int(1, d) for d in shape) + _int(2, FLOAT) + _bytes(8, name) + external + _int(14, _EXTERNAL)


def value_info(name, elem_type, shape):
    """ValueInfoProto of a tensor: each dimension a number (dim_value 1) or a name (dim_param 2)."""
    dims = b"".join(_bytes(1, _bytes(2, d) if isinstance(d, str) else _int(1, d)) for d in shape)
    return _bytes(1, name) + _bytes(2, _bytes(1, _int(1, elem_type) + _bytes(2, dims)))


def model(nodes, name, inputs, outputs, initializers, opset, ir_version):
    """ModelProto (ir_version 1, graph 7, opset_import 8) of a GraphProto (node 1, name 2,
    initializer 5, input 11, output 12), the default domain's operators at version `opset`."""
    graph = b"".join(_bytes(1, n) for n in nodes) + _bytes(2, name) + b"".join(_bytes(5, t) for t in initializers)
    graph += b"".join(_bytes(11, v) for v in inputs) + b"".join(_bytes(12, v) for v in outputs)
    return _int(1, ir_version) + _bytes(7, graph) + _bytes(8, _bytes(1, "") + _int(2, opset))
