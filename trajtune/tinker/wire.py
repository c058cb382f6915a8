"""The protobuf side of the Tinker protocol: the messages of `tinker_public` (the `tinker` 0.38 client's schema, field
numbers and types kept) built in code from a descriptor with the `google.protobuf` runtime -- no protoc, no import of
`tinker`. The client sends `forward_backward` as a protobuf ForwardBackwardRequest (optionally zstd) and accepts only
protobuf ForwardBackwardOutput and SampleResponse results.

    decode_forward_backward(body, content_encoding)    -> ForwardBackwardRequest (datums as token lists + arrays)
    encode_forward_backward_output(outputs, metrics, loss_fn_output_type) -> bytes
    encode_sample_response(sequences, prompt_logprobs) -> bytes
    encode_forward_backward_request / decode_forward_backward_output / decode_sample_response: the client's side,
    for tests and benchmarks

A bad request raises `WireError` (the service answers HTTP 400 {"detail": str(e)}) naming the field; a feature trajtune
refuses raises `Unsupported`. A bad *output* (a server bug) raises a plain ValueError.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

PROTO_CONTENT_TYPE = "application/x-protobuf"
MAX_BODY_BYTES = 1 << 30  # a zstd body may not inflate past this (1 GiB)
TEXT_ONLY = "trajtune trains and samples text models"  # why images and audio are refused (requests.REFUSED)
NO_STABILITY = ("trajtune keeps no sampler stability records (StableReinforce); use importance_sampling, ppo or "
                "cispo")


class WireError(ValueError):
    """A request that does not parse or has a bad field; str(e) names the field (e.g. "data[3].loss_fn_inputs
    ['weights']: shape (7,) but the datum has 8 tokens"). The service answers it with HTTP 400 {"detail": str(e)}."""


class Unsupported(WireError):
    """A feature of the protocol trajtune refuses (image chunks, stable_reinforce ...); str(e) says what and why."""


@dataclass
class Datum:
    tokens: list[int]  # model_input: the encoded_text chunks' tokens, concatenated (N)
    inputs: dict[str, np.ndarray]  # loss_fn_inputs: name -> array, int64 or float32, shape (N,) or (N, ...)


@dataclass
class ForwardBackwardRequest:
    model_id: str
    seq_id: int
    data: list[Datum]
    loss_fn: str
    loss_fn_config: dict[str, float | str] = field(default_factory=dict)
    forward_only: bool = False


# ---- the schema (tinker_public.proto, the messages the server needs) ----------------------------------------------

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES, "int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64,
            "uint32": _F.TYPE_UINT32, "double": _F.TYPE_DOUBLE, "bool": _F.TYPE_BOOL}
_ENUMS = {"DType": ["DTYPE_UNSPECIFIED", "DTYPE_FLOAT32", "DTYPE_INT64", "DTYPE_INT32", "DTYPE_BFLOAT16"],
          "StopReason": ["STOP_REASON_STOP", "STOP_REASON_LENGTH"]}
# message -> [(field, number, type, how)]; how: "" (singular), "repeated", "optional" (proto3 optional),
# "map:<key type>" (type is then the value type), or "oneof:<name>"
_MESSAGES: dict[str, list[tuple[str, int, str, str]]] = {
    "ForwardBackwardRequest": [("model_id", 1, "string", ""), ("seq_id", 2, "int32", ""),
                               ("data", 3, "Datum", "repeated"), ("loss_fn", 4, "string", ""),
                               ("loss_fn_config", 5, "double", "map:string"), ("forward_only", 6, "bool", ""),
                               ("loss_fn_config_v2", 7, "LossConfigValue", "map:string")],
    "LossConfigValue": [("number", 1, "double", "oneof:value"), ("text", 2, "string", "oneof:value")],
    "Datum": [("model_input", 1, "Chunk", "repeated"), ("loss_fn_inputs", 2, "Tensor", "map:string"),
              ("model_input_spans", 3, "ProvenanceSpan", "repeated"),
              ("loss_fn_input_spans", 4, "ProvenanceSpan", "repeated")],
    "ProvenanceSpan": [("prompt_tokens", 1, "PromptProvenanceSpan", "oneof:span"),
                       ("sampled_tokens", 2, "SampledProvenanceSpan", "oneof:span")],
    "PromptProvenanceSpan": [("sequence_id", 1, "string", ""), ("offset", 2, "int64", ""),
                             ("length", 3, "int64", "")],
    "SampledProvenanceSpan": [("sequence_id", 1, "string", ""), ("offset", 2, "int64", ""),
                              ("length", 3, "int64", "")],
    "Chunk": [("encoded_text", 1, "EncodedTextChunk", "oneof:chunk"), ("image", 2, "ImageChunk", "oneof:chunk"),
              ("dmel", 3, "DmelChunk", "oneof:chunk")],
    "EncodedTextChunk": [("tokens", 1, "bytes", "")],  # int32 little-endian
    "ImageChunk": [("data", 1, "bytes", ""), ("format", 2, "string", ""), ("expected_tokens", 3, "int32", "optional"),
                   ("override_dimensions", 4, "ImageDimensions", "optional")],
    "ImageDimensions": [("width", 1, "uint32", ""), ("height", 2, "uint32", "")],
    "DmelChunk": [("dmel", 1, "bytes", "")],
    "Tensor": [("dense", 1, "bytes", "oneof:encoding"), ("sparse_csr", 2, "SparseCsr", "oneof:encoding"),
               ("dtype", 3, "DType", ""), ("shape", 4, "int64", "repeated")],
    "SparseCsr": [("values", 1, "bytes", ""), ("crow_indices", 2, "bytes", ""), ("col_indices", 3, "bytes", "")],
    "ForwardBackwardOutput": [("loss_fn_output_type", 1, "string", ""),
                              ("loss_fn_outputs", 2, "ArrayRecord", "repeated"),
                              ("metrics", 3, "double", "map:string")],
    "ArrayRecord": [("type_tag", 1, "string", ""), ("fields", 2, "BatchedTensor", "map:string"),
                    ("num_datums", 3, "int64", "")],
    # data: every datum's values concatenated; offsets: int64 byte offsets into data, num_datums + 1 of them
    "BatchedTensor": [("data", 1, "bytes", ""), ("offsets", 2, "bytes", ""), ("dtype", 3, "DType", ""),
                      ("trailing_shape", 4, "int64", "repeated")],
    # left out: SampleResponse 3, 5, 6 and SampledSequence 4 (top-k / target / alternative log-probs: refused)
    "SampleResponse": [("sequences", 1, "SampledSequence", "repeated"), ("prompt_logprobs", 2, "bytes", "optional"),
                       ("prompt_cache_hit_tokens", 4, "int32", "")],
    "SampledSequence": [("stop_reason", 1, "StopReason", ""), ("tokens", 2, "bytes", ""),
                        ("logprobs", 3, "bytes", "optional")],
}


def _field(message: descriptor_pb2.DescriptorProto, name: str, number: int, kind: str, how: str) -> None:
    f = message.field.add(name=name, number=number, label=_F.LABEL_OPTIONAL)
    if kind in _SCALARS:
        f.type = _SCALARS[kind]
    else:
        f.type = _F.TYPE_ENUM if kind in _ENUMS else _F.TYPE_MESSAGE
        f.type_name = f".tinker_public.{kind}"
    if how == "repeated":
        f.label = _F.LABEL_REPEATED
    elif how.startswith("oneof:") or how == "optional":
        group = how[6:] if how.startswith("oneof:") else f"_{name}"  # proto3 optional: a synthetic oneof
        names = [o.name for o in message.oneof_decl]
        if group not in names:
            message.oneof_decl.add(name=group)
        f.oneof_index = [o.name for o in message.oneof_decl].index(group)
        f.proto3_optional = how == "optional"
    elif how.startswith("map:"):
        entry = message.nested_type.add(name="".join(p.title() for p in name.split("_")) + "Entry")
        entry.options.map_entry = True
        _field(entry, "key", 1, how[4:], "")
        _field(entry, "value", 2, kind, "")
        f.label, f.type, f.type_name = _F.LABEL_REPEATED, _F.TYPE_MESSAGE, f".tinker_public.{message.name}.{entry.name}"


def _build() -> dict[str, type]:
    proto = descriptor_pb2.FileDescriptorProto(name="trajtune/tinker_public.proto", package="tinker_public",
                                               syntax="proto3")
    for enum, values in _ENUMS.items():
        e = proto.enum_type.add(name=enum)
        for number, value in enumerate(values):
            e.value.add(name=value, number=number)
    for name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        for spec in fields:
            _field(message, *spec)
    pool = descriptor_pool.DescriptorPool()  # our own: `tinker`'s module registers the same names in the default one
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tinker_public.{name}"))
            for name in _MESSAGES}


_PB = _build()
_DTYPES: dict[int, np.dtype] = {1: np.dtype("<f4"), 2: np.dtype("<i8")}  # FLOAT32, INT64: the public wire
_DTYPE_NAMES = dict(enumerate(_ENUMS["DType"]))


# ---- forward_backward: the request --------------------------------------------------------------------------------

def _inflate(body: bytes) -> bytes:
    try:
        import zstandard
    except ImportError:
        raise WireError("forward_backward: the body is zstd-compressed but the zstandard package is missing "
                        "(pip install zstandard)") from None
    out, total = [], 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(body) as reader:
            while piece := reader.read(1 << 20):
                total += len(piece)
                if total > MAX_BODY_BYTES:
                    raise WireError(f"forward_backward: the zstd body inflates past {MAX_BODY_BYTES} bytes")
                out.append(piece)
    except zstandard.ZstdError as e:
        raise WireError(f"forward_backward: Content-Encoding is zstd but the body is not zstd ({e})") from None
    return b"".join(out)


def _tensor(t, where: str) -> np.ndarray:
    """A proto Tensor -> a writable numpy array of its shape (a sparse CSR one densified, 0 where unlisted)."""
    dtype = _DTYPES.get(t.dtype)
    if dtype is None:
        name = _DTYPE_NAMES.get(t.dtype, str(t.dtype))
        raise WireError(f"{where}: dtype {name} is not supported (DTYPE_FLOAT32 or DTYPE_INT64)")
    shape = list(t.shape)
    if any(s < 0 for s in shape):
        raise WireError(f"{where}: shape {tuple(shape)} has a negative size")
    if t.WhichOneof("encoding") == "sparse_csr":
        return _sparse(t.sparse_csr, dtype, shape, where)
    data = t.dense
    if len(data) % dtype.itemsize:
        raise WireError(f"{where}: {len(data)} bytes is not a whole number of {dtype.itemsize}-byte values")
    n = len(data) // dtype.itemsize
    shape = shape or [n]  # no shape: a flat list (the client always sends one)
    if math.prod(shape) != n:
        raise WireError(f"{where}: shape {tuple(shape)} holds {math.prod(shape)} values but the data has {n}")
    return np.frombuffer(data, dtype).reshape(shape).astype(dtype.newbyteorder("="))


def _ints(data: bytes, dtype: str, where: str) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    if len(data) % size:
        raise WireError(f"{where}: {len(data)} bytes is not a whole number of {size}-byte integers")
    return np.frombuffer(data, dtype)


def _sparse(csr, dtype: np.dtype, shape: list[int], where: str) -> np.ndarray:
    """A CSR matrix (values, crow_indices[rows+1], col_indices[nnz], both int64) -> dense (rows, cols)."""
    if len(shape) != 2:
        raise WireError(f"{where}: a sparse_csr tensor needs a 2-d shape, got {tuple(shape)}")
    rows, cols = shape
    if len(csr.values) % dtype.itemsize:
        raise WireError(f"{where}.sparse_csr.values: {len(csr.values)} bytes is not a whole number of values")
    values = np.frombuffer(csr.values, dtype)
    crow = _ints(csr.crow_indices, "<i8", f"{where}.sparse_csr.crow_indices")
    col = _ints(csr.col_indices, "<i8", f"{where}.sparse_csr.col_indices")
    if len(crow) != rows + 1 or crow[0] != 0 or np.any(np.diff(crow) < 0) or crow[-1] != len(values):
        raise WireError(f"{where}.sparse_csr.crow_indices: expected {rows + 1} non-decreasing row pointers from 0 "
                        f"to {len(values)} (the number of values), got {crow.tolist()[:8]}")
    if len(col) != len(values) or np.any(col < 0) or np.any(col >= cols):
        raise WireError(f"{where}.sparse_csr.col_indices: expected {len(values)} column indices in [0, {cols})")
    dense = np.zeros((rows, cols), dtype.newbyteorder("="))
    dense[np.repeat(np.arange(rows), np.diff(crow)), col] = values
    return dense


def _datum(d, i: int) -> Datum:
    where = f"data[{i}]"
    if len(d.model_input_spans) or len(d.loss_fn_input_spans):
        raise Unsupported(f"{where}: provenance spans (Datum.with_provenance) are not supported: {NO_STABILITY}")
    pieces = []
    for j, chunk in enumerate(d.model_input):
        kind = chunk.WhichOneof("chunk")
        if kind == "encoded_text":
            tokens = _ints(chunk.encoded_text.tokens, "<i4", f"{where}.model_input[{j}].tokens")
            if np.any(tokens < 0):
                raise WireError(f"{where}.model_input[{j}].tokens: negative token id {int(tokens.min())}")
            pieces.append(tokens)
        elif kind in ("image", "dmel"):
            what = "image chunks" if kind == "image" else "audio (dmel) chunks"
            raise Unsupported(f"{where}.model_input[{j}]: {what} are not supported: {TEXT_ONLY}")
        else:
            raise WireError(f"{where}.model_input[{j}]: an empty chunk (none of encoded_text, image, dmel)")
    tokens = np.concatenate(pieces).tolist() if pieces else []
    if not tokens:
        raise WireError(f"{where}.model_input: the datum has no tokens")
    inputs = {}
    for name, t in d.loss_fn_inputs.items():
        at = f"{where}.loss_fn_inputs[{name!r}]"
        array = _tensor(t, at)
        if array.ndim == 0 or array.shape[0] != len(tokens):
            raise WireError(f"{at}: shape {array.shape} but the datum has {len(tokens)} tokens "
                            f"(loss_fn_inputs are per token: ({len(tokens)},) or ({len(tokens)}, ...))")
        inputs[name] = array
    return Datum(tokens=tokens, inputs=inputs)


def decode_forward_backward(body: bytes, content_encoding: str | None = None) -> ForwardBackwardRequest:
    """The body of POST /api/v1/forward_backward (protobuf; zstd when `Content-Encoding: zstd`) -> the request, every
    datum checked: tokens (N,), loss_fn_inputs each (N,) or (N, ...), float32 or int64."""
    encoding = (content_encoding or "").strip().lower()
    if encoding == "zstd":
        body = _inflate(body)
    elif encoding not in ("", "identity"):
        raise WireError(f"forward_backward: Content-Encoding {content_encoding!r} is not supported (zstd or none)")
    message = _PB["ForwardBackwardRequest"]()
    try:
        message.ParseFromString(body)
    except (DecodeError, RuntimeError, TypeError) as e:
        raise WireError(f"forward_backward: the body is not a ForwardBackwardRequest protobuf ({e})") from None
    if not message.model_id:
        raise WireError("forward_backward: model_id is missing")
    if not message.loss_fn:
        raise WireError("forward_backward: loss_fn is missing")
    if not message.data:
        raise WireError("forward_backward: data is empty (no datums)")
    config: dict[str, float | str] = {}
    if message.loss_fn_config_v2:  # the client writes both; v2 carries strings too
        for key, value in message.loss_fn_config_v2.items():
            kind = value.WhichOneof("value")
            if kind is None:
                raise WireError(f"forward_backward: loss_fn_config_v2[{key!r}] has neither number nor text")
            config[key] = value.number if kind == "number" else value.text
    else:
        config = {key: float(value) for key, value in message.loss_fn_config.items()}
    data = [_datum(d, i) for i, d in enumerate(message.data)]
    return ForwardBackwardRequest(model_id=message.model_id, seq_id=message.seq_id, data=data,
                                  loss_fn=message.loss_fn, loss_fn_config=config,
                                  forward_only=message.forward_only)


def _set_tensor(t, array: np.ndarray) -> None:
    kind = np.asarray(array).dtype.kind
    dtype, code = (np.dtype("<f4"), 1) if kind == "f" else (np.dtype("<i8"), 2)
    t.dtype = code
    t.shape.extend(np.shape(array))
    t.dense = np.ascontiguousarray(array, dtype).tobytes()


def encode_forward_backward_request(request: ForwardBackwardRequest) -> bytes:
    """The client's side: a request -> protobuf bytes as `tinker` writes them (numbers in both config maps)."""
    message = _PB["ForwardBackwardRequest"](model_id=request.model_id, seq_id=request.seq_id,
                                            loss_fn=request.loss_fn, forward_only=request.forward_only)
    for key, value in request.loss_fn_config.items():
        if isinstance(value, str):
            message.loss_fn_config_v2[key].text = value
        else:
            message.loss_fn_config[key] = float(value)
            message.loss_fn_config_v2[key].number = float(value)
    for datum in request.data:
        d = message.data.add()
        d.model_input.add().encoded_text.tokens = np.asarray(datum.tokens, "<i4").tobytes()
        for name, array in datum.inputs.items():
            _set_tensor(d.loss_fn_inputs[name], array)
    return message.SerializeToString()


# ---- forward_backward: the result ---------------------------------------------------------------------------------

def _output_array(array: np.ndarray, where: str) -> np.ndarray:
    array = np.asarray(array)
    if array.ndim == 0:
        raise ValueError(f"{where}: a 0-d output; per-datum outputs are (N,) or (N, ...)")
    if array.dtype.kind == "f":
        return np.ascontiguousarray(array, "<f4")
    if array.dtype.kind in "iu":
        return np.ascontiguousarray(array, "<i8")
    raise ValueError(f"{where}: dtype {array.dtype} is neither float nor integer")


def encode_forward_backward_output(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float],
                                   loss_fn_output_type: str) -> bytes:
    """A forward_backward's result -> ForwardBackwardOutput bytes. outputs[i][name]: datum i's array, (N_i,) or
    (N_i, ...), float (sent float32) or integer (sent int64); every datum has the same names. Consecutive datums whose
    arrays share dtype and trailing shape go in one ArrayRecord (one BatchedTensor per name). metrics: keys
    `name:reduction` (e.g. "loss:sum"): the client merges chunks by the reduction and fails on a key without one."""
    for key in metrics:
        if ":" not in key:
            raise ValueError(f"forward_backward metric {key!r} has no ':reduction' suffix (e.g. 'loss:sum')")
    message = _PB["ForwardBackwardOutput"](loss_fn_output_type=loss_fn_output_type)
    for key, value in metrics.items():
        message.metrics[key] = float(value)
    names = sorted(outputs[0]) if outputs else []
    groups: list[tuple[tuple, list[dict[str, np.ndarray]]]] = []
    for i, output in enumerate(outputs):
        if sorted(output) != names:
            raise ValueError(f"forward_backward output {i} has fields {sorted(output)}, datum 0 has {names}")
        arrays = {name: _output_array(output[name], f"outputs[{i}][{name!r}]") for name in names}
        signature = tuple((name, a.dtype.str, a.shape[1:]) for name, a in arrays.items())
        if groups and groups[-1][0] == signature:
            groups[-1][1].append(arrays)
        else:
            groups.append((signature, [arrays]))
    for signature, datums in groups:
        record = message.loss_fn_outputs.add(type_tag=loss_fn_output_type, num_datums=len(datums))
        for name, dtype, trailing in signature:
            bt = record.fields[name]
            bt.dtype = 1 if dtype == "<f4" else 2
            bt.trailing_shape.extend(trailing)
            bt.data = b"".join(d[name].tobytes() for d in datums)
            bt.offsets = np.cumsum([0] + [d[name].nbytes for d in datums], dtype="<i8").tobytes()
    return message.SerializeToString()


def decode_forward_backward_output(body: bytes) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
    """The client's side: ForwardBackwardOutput bytes -> (per-datum {name: array (N_i, *trailing_shape)}, metrics)."""
    message = _PB["ForwardBackwardOutput"]()
    message.ParseFromString(body)
    outputs: list[dict[str, np.ndarray]] = []
    for record in message.loss_fn_outputs:
        datums: list[dict[str, np.ndarray]] = [{} for _ in range(record.num_datums)]
        for name, bt in record.fields.items():
            dtype = _DTYPES[bt.dtype]
            offsets = np.frombuffer(bt.offsets, "<i8")
            values = np.frombuffer(bt.data, dtype)
            for i, datum in enumerate(datums):
                flat = values[offsets[i] // dtype.itemsize: offsets[i + 1] // dtype.itemsize]
                datum[name] = flat.reshape(-1, *bt.trailing_shape).astype(dtype.newbyteorder("="))
        outputs.extend(datums)
    return outputs, dict(message.metrics)


# ---- sample -------------------------------------------------------------------------------------------------------

def encode_sample_response(sequences: list[tuple[list[int], list[float], bool]],
                           prompt_logprobs: list[float | None] | None) -> bytes:
    """An asample result -> SampleResponse bytes. sequences[i] = (tokens (T_i,), their log-probs (T_i,), stopped):
    stopped True is stop reason STOP (a stop string/token or EOS), False is LENGTH (max_tokens reached).
    prompt_logprobs: one per prompt token (None -> NaN, e.g. the first), or None when not asked for."""
    message = _PB["SampleResponse"]()
    for i, (tokens, logprobs, stopped) in enumerate(sequences):
        if len(tokens) != len(logprobs):
            raise ValueError(f"sequence {i}: {len(tokens)} tokens but {len(logprobs)} log-probs")
        message.sequences.add(stop_reason=0 if stopped else 1, tokens=np.asarray(tokens, "<i4").tobytes(),
                              logprobs=np.asarray(logprobs, "<f4").tobytes())
    if prompt_logprobs is not None:
        values = [math.nan if v is None else v for v in prompt_logprobs]
        message.prompt_logprobs = np.asarray(values, "<f4").tobytes()
    return message.SerializeToString()


def decode_sample_response(body: bytes) -> tuple[list[tuple[list[int], list[float], bool]],
                                                  list[float | None] | None]:
    """The client's side: SampleResponse bytes -> (sequences as (tokens, logprobs, stopped), prompt log-probs with
    None for NaN, or None when absent)."""
    message = _PB["SampleResponse"]()
    message.ParseFromString(body)
    sequences = [(np.frombuffer(s.tokens, "<i4").tolist(), np.frombuffer(s.logprobs, "<f4").tolist(),
                  s.stop_reason == 0) for s in message.sequences]
    prompt: list[float | None] | None = None
    if message.HasField("prompt_logprobs"):
        prompt = [None if math.isnan(v) else v for v in np.frombuffer(message.prompt_logprobs, "<f4").tolist()]
    return sequences, prompt
