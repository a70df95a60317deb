"""The protobuf messages of the Tinker wire protocol that carry tensors, encoded and decoded by hand.

The official SDK sends ``forward_backward`` as a protobuf ``ForwardBackwardRequest`` and accepts
``ForwardBackwardOutput`` and ``SampleResponse`` results only as protobuf. These few messages need only the
protobuf wire format (varints, fixed64 doubles, length-delimited fields), so they are written here against the
field numbers of the protocol's schema rather than through generated code: the server needs no protobuf runtime.

Field numbers (message: number name):

- ForwardBackwardRequest: 1 model_id, 2 seq_id, 3 data (Datum), 4 loss_fn, 5 loss_fn_config (map string->double),
  6 forward_only, 7 loss_fn_config_v2 (map string->LossConfigValue{1 number, 2 text})
- Datum: 1 model_input (Chunk), 2 loss_fn_inputs (map string->Tensor), 3 model_input_spans (ProvenanceSpan),
  4 loss_fn_input_spans (ProvenanceSpan)
- ProvenanceSpan (oneof): 1 prompt_tokens | 2 sampled_tokens, each {1 sequence_id, 2 offset int64, 3 length int64}
- Chunk (oneof): 1 encoded_text{1 tokens: int32 bytes}, 2 image{1 data, 2 format, 3 expected_tokens}, 3 dmel
- Tensor: 1 dense bytes | 2 sparse_csr{1 values, 2 crow_indices, 3 col_indices}, 3 dtype, 4 shape (int64)
- ForwardBackwardOutput: 1 loss_fn_output_type, 2 loss_fn_outputs (ArrayRecord), 3 metrics (map string->double)
- ArrayRecord: 1 type_tag, 2 fields (map string->BatchedTensor), 3 num_datums
- BatchedTensor: 1 data, 2 offsets (int64 byte offsets, one per datum plus the end), 3 dtype, 4 trailing_shape
- SampleResponse: 1 sequences (SampledSequence), 2 prompt_logprobs (float32 bytes, NaN = none),
  3 topk_prompt_logprobs (TopkLogprobs), 4 prompt_cache_hit_tokens
- SampledSequence: 1 stop_reason (0 stop, 1 length), 2 tokens (int32 bytes), 3 logprobs (float32 bytes)
- TopkLogprobs: 1 token_ids (int32 bytes, [length, k]), 2 logprobs (float32 bytes), 3 k, 4 length
- DType: 1 float32, 2 int64, 3 int32, 4 bfloat16
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from tinker_cookbook.tinker import types

DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32, DTYPE_BFLOAT16 = 1, 2, 3, 4
_NUMPY_OF = {DTYPE_FLOAT32: np.float32, DTYPE_INT64: np.int64, DTYPE_INT32: np.int32}
_STOP_REASON_CODE = {"stop": 0, "length": 1}
# What an empty top-k slot holds on the wire (token 0 with this logprob), as the protocol defines it.
TOPK_MASK_LOGPROB = -99999.0

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5


class ProtoError(ValueError):
    """The body is not a well-formed message of the expected type; the message says what is wrong."""


# -- wire format ----------------------------------------------------------------------------------------------

def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ProtoError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtoError("varint longer than 10 bytes")


def fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of each field: an int for varints and fixed ints, bytes for the rest."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if number == 0:
            raise ProtoError("field number 0")
        if wire == VARINT:
            value, pos = _read_varint(buf, pos)
        elif wire == FIXED64:
            if pos + 8 > len(buf):
                raise ProtoError("truncated fixed64 field")
            value, pos = int.from_bytes(buf[pos:pos + 8], "little"), pos + 8
        elif wire == LENGTH:
            size, pos = _read_varint(buf, pos)
            if pos + size > len(buf):
                raise ProtoError(f"field {number} claims {size} bytes past the end of the message")
            value, pos = buf[pos:pos + size], pos + size
        elif wire == FIXED32:
            if pos + 4 > len(buf):
                raise ProtoError("truncated fixed32 field")
            value, pos = int.from_bytes(buf[pos:pos + 4], "little"), pos + 4
        else:
            raise ProtoError(f"unsupported wire type {wire} (field {number})")
        yield number, wire, value


def _expect(number: int, wire: int, expected: int, message: str) -> None:
    if wire != expected:
        raise ProtoError(f"{message} field {number} has wire type {wire}, expected {expected}")


def _double(bits: int) -> float:
    return struct.unpack("<d", bits.to_bytes(8, "little"))[0]


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _packed_int64(wire: int, value: Any) -> list[int]:
    if wire == VARINT:
        return [_int64(value)]
    out, pos = [], 0
    while pos < len(value):
        item, pos = _read_varint(value, pos)
        out.append(_int64(item))
    return out


def _text(value: Any, what: str) -> str:
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        raise ProtoError(f"{what} is not valid UTF-8") from None


def _key(number: int, wire: int) -> bytes:
    return _varint((number << 3) | wire)


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _key(number, LENGTH) + _varint(len(payload)) + payload


def _varint_field(number: int, value: int) -> bytes:
    return _key(number, VARINT) + _varint(value) if value else b""


def _double_field(number: int, value: float) -> bytes:
    return _key(number, FIXED64) + struct.pack("<d", value)


def _map_entry(number: int, key: str, value: bytes) -> bytes:
    return _len_field(number, _len_field(1, key.encode()) + value)


# -- decoding the forward_backward request --------------------------------------------------------------------

def _tensor(buf: bytes) -> types.TensorData:
    dense: bytes | None = None
    csr: dict[int, bytes] = {}
    dtype = 0
    shape: list[int] = []
    for number, wire, value in fields(buf):
        if number == 1:
            dense = bytes(value)
        elif number == 2:
            csr = {n: bytes(v) for n, _, v in fields(value)}
        elif number == 3:
            dtype = value
        elif number == 4:
            shape.extend(_packed_int64(wire, value))
    if dtype == DTYPE_BFLOAT16:
        raise ProtoError("bfloat16 tensors are not accepted; send float32")
    if dtype not in _NUMPY_OF:
        raise ProtoError(f"tensor dtype {dtype} is not one of float32 (1), int64 (2), int32 (3)")
    np_dtype = _NUMPY_OF[dtype]
    public_dtype: types.TensorDtype = "float32" if dtype == DTYPE_FLOAT32 else "int64"
    if dense is not None:
        array = _frombuffer(dense, np_dtype, "tensor data")
    else:
        array = _densify(csr, np_dtype, shape)
    if shape and int(np.prod(shape)) != array.size:
        raise ProtoError(f"tensor of {array.size} values does not have shape {shape}")
    return types.TensorData(data=array.tolist(), dtype=public_dtype, shape=shape or [array.size])


def _frombuffer(data: bytes, dtype: Any, what: str) -> np.ndarray:
    if len(data) % np.dtype(dtype).itemsize:
        raise ProtoError(f"{what}: {len(data)} bytes is not a whole number of {np.dtype(dtype).name} values")
    return np.frombuffer(data, dtype=dtype)


def _densify(csr: dict[int, bytes], dtype: Any, shape: list[int]) -> np.ndarray:
    """A CSR matrix (the protocol's sparse layout) as its dense values; empty cells are 0."""
    if len(shape) != 2:
        raise ProtoError(f"a sparse tensor needs a 2-D shape, got {shape}")
    values = _frombuffer(csr.get(1, b""), dtype, "sparse values")
    crow = _frombuffer(csr.get(2, b""), np.int64, "sparse row pointers")
    cols = _frombuffer(csr.get(3, b""), np.int64, "sparse column indices")
    rows, width = shape
    if len(crow) != rows + 1 or len(cols) != len(values) or (len(cols) and (cols.min() < 0 or cols.max() >= width)):
        raise ProtoError(f"sparse tensor indices do not fit its shape {shape}")
    dense = np.zeros((rows, width), dtype=dtype)
    for row in range(rows):
        start, end = int(crow[row]), int(crow[row + 1])
        dense[row, cols[start:end]] = values[start:end]
    return dense.reshape(-1)


def _chunk(buf: bytes) -> types.ModelInputChunk:
    for number, _, value in fields(buf):
        if number == 1:
            tokens = b"".join(bytes(v) for n, _, v in fields(value) if n == 1)
            return types.EncodedTextChunk(tokens=_frombuffer(tokens, np.int32, "encoded_text tokens").tolist())
        if number == 2:
            image: dict[int, Any] = {n: v for n, _, v in fields(value)}
            return types.ImageChunk.model_validate({"data": bytes(image.get(1, b"")),
                                                    "format": _text(image.get(2, b""), "image format"),
                                                    "expected_tokens": image.get(3)})
        if number == 3:
            raise ProtoError("audio (dmel) chunks are not supported by this server; send text or image chunks")
    raise ProtoError("a model_input chunk is empty; send an encoded_text or image chunk")


def _span(buf: bytes, what: str) -> dict[str, Any]:
    """One ProvenanceSpan as the dict our ``types`` validate (which check offset, length and id)."""
    for number, wire, value in fields(buf):
        if number in (1, 2):
            _expect(number, wire, LENGTH, what)
            arm = {n: v for n, _, v in fields(value)}
            return {"type": "prompt" if number == 1 else "sampled",
                    "sequence_id": _text(arm.get(1, b""), f"{what}.sequence_id"),
                    "offset": _int64(arm.get(2, 0)), "length": _int64(arm.get(3, 0))}
    raise ProtoError(f"{what} is empty; a provenance span is prompt_tokens or sampled_tokens")


def _datum(buf: bytes) -> types.Datum:
    chunks: list[types.ModelInputChunk] = []
    inputs: dict[str, types.TensorData] = {}
    spans: dict[str, list[dict[str, Any]]] = {}
    for number, wire, value in fields(buf):
        if number == 1:
            _expect(number, wire, LENGTH, "Datum")
            chunks.append(_chunk(value))
        elif number == 2:
            entry = {n: v for n, _, v in fields(value)}
            inputs[_text(entry.get(1, b""), "loss_fn_inputs key")] = _tensor(entry.get(2, b""))
        elif number in (3, 4):
            name = "model_input_spans" if number == 3 else "loss_fn_input_spans"
            _expect(number, wire, LENGTH, "Datum")
            spans.setdefault(name, []).append(_span(value, f"{name}[{len(spans.get(name, []))}]"))
    # A datum with provenance whose runs are all empty still has provenance: an absent list means an empty one.
    if spans:
        spans = {"model_input_spans": [], "loss_fn_input_spans": [], **spans}
    return types.Datum.model_validate({"model_input": types.ModelInput(chunks=chunks), "loss_fn_inputs": inputs,
                                       **spans})


def decode_forward_backward_request(buf: bytes) -> dict[str, Any]:
    """A ``ForwardBackwardRequest`` as a dict: model_id, seq_id, data, loss_fn, loss_fn_config, forward_only.

    Raises ProtoError for a malformed message and pydantic's ValidationError for data our types reject.
    """
    out: dict[str, Any] = {"model_id": "", "seq_id": 0, "data": [], "loss_fn": "", "forward_only": False}
    legacy: dict[str, float] = {}
    config: dict[str, float] = {}
    for number, wire, value in fields(buf):
        if number == 1:
            out["model_id"] = _text(value, "model_id")
        elif number == 2:
            out["seq_id"] = _int64(value)
        elif number == 3:
            _expect(number, wire, LENGTH, "ForwardBackwardRequest")
            out["data"].append(_datum(value))
        elif number == 4:
            out["loss_fn"] = _text(value, "loss_fn")
        elif number == 5:
            entry = {n: v for n, _, v in fields(value)}
            legacy[_text(entry.get(1, b""), "loss_fn_config key")] = _double(entry.get(2, 0))
        elif number == 6:
            out["forward_only"] = bool(value)
        elif number == 7:
            entry = {n: v for n, _, v in fields(value)}
            key = _text(entry.get(1, b""), "loss_fn_config key")
            typed = {n: v for n, _, v in fields(entry.get(2, b""))}
            if 2 in typed:
                raise ProtoError(f"loss_fn_config[{key!r}] is a string; this server takes numbers only")
            config[key] = _double(typed.get(1, 0))
    # The typed map supersedes the legacy one, which senders fill with the same numbers.
    out["loss_fn_config"] = (config or legacy) or None
    return out


# -- encoding results -----------------------------------------------------------------------------------------

def _tensor_bytes(td: types.TensorData) -> tuple[int, bytes, list[int]]:
    """(proto dtype, little-endian values, shape) of a tensor."""
    if td.dtype == "float32":
        array = np.asarray(td.data, dtype="<f4")
        dtype = DTYPE_FLOAT32
    else:
        array = np.asarray(td.data, dtype="<i8")
        dtype = DTYPE_INT64
    shape = list(td.shape) if td.shape is not None else [array.size]
    return dtype, array.tobytes(), shape


def encode_forward_backward_output(output: types.ForwardBackwardOutput) -> bytes:
    """One ArrayRecord per datum, so that each datum keeps its own shapes (ragged outputs need no padding)."""
    parts = [_len_field(1, output.loss_fn_output_type.encode())]
    for datum_outputs in output.loss_fn_outputs:
        record = b""
        for name, td in datum_outputs.items():
            dtype, data, shape = _tensor_bytes(td)
            offsets = np.asarray([0, len(data)], dtype="<i8").tobytes()
            trailing = b"".join(_varint(d) for d in shape[1:])
            batched = (_len_field(1, data) + _len_field(2, offsets) + _varint_field(3, dtype)
                       + (_len_field(4, trailing) if trailing else b""))
            record += _map_entry(2, name, _len_field(2, batched))
        record += _varint_field(3, 1)
        parts.append(_len_field(2, record))
    for name, value in output.metrics.items():
        parts.append(_map_entry(3, name, _double_field(2, float(value))))
    return b"".join(parts)


def _topk(rows: list[list[tuple[int, float]] | None]) -> bytes:
    k = max((len(row) for row in rows if row), default=0)
    ids = np.zeros((len(rows), k), dtype="<i4")
    logprobs = np.full((len(rows), k), TOPK_MASK_LOGPROB, dtype="<f4")
    for i, row in enumerate(rows):
        for j, (token, logprob) in enumerate(row or []):
            ids[i, j], logprobs[i, j] = token, logprob
    return (_len_field(1, ids.tobytes()) + _len_field(2, logprobs.tobytes()) + _varint_field(3, k)
            + _varint_field(4, len(rows)))


def encode_sample_response(response: types.SampleResponse) -> bytes:
    parts = []
    for seq in response.sequences:
        body = (_varint_field(1, _STOP_REASON_CODE[seq.stop_reason])
                + _len_field(2, np.asarray(seq.tokens, dtype="<i4").tobytes()))
        if seq.logprobs is not None:
            body += _len_field(3, np.asarray(seq.logprobs, dtype="<f4").tobytes())
        parts.append(_len_field(1, body))
    if response.prompt_logprobs is not None:
        values = [np.nan if lp is None else lp for lp in response.prompt_logprobs]
        parts.append(_len_field(2, np.asarray(values, dtype="<f4").tobytes()))
    if response.topk_prompt_logprobs is not None:
        parts.append(_len_field(3, _topk(list(response.topk_prompt_logprobs))))
    return b"".join(parts)
