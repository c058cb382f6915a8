"""The Tinker protobuf wire (trajtune.tinker.wire) against the real client's own protobuf module and converters: our
schema has the client's field numbers and types; requests the client writes decode with ours to the same tokens and
arrays; what we encode the client's response converters read back to the right values; bad bodies give a WireError
naming the field, refused features an Unsupported."""

import random

import numpy as np
import pytest

from trajtune.tinker import wire
from trajtune.tinker.wire import Datum, ForwardBackwardRequest, Unsupported, WireError

tinker = pytest.importorskip("tinker", reason="the tinker client (pip install tinker) is the wire's reference")
zstandard = pytest.importorskip("zstandard", reason="zstandard comes with tinker")
from tinker import types  # noqa: E402
from tinker.proto import request_conv, response_conv  # noqa: E402
from tinker.proto import tinker_public_pb2 as theirs  # noqa: E402


def client_request(data, loss_fn="cross_entropy", config=None, seq_id=3) -> bytes:
    """The bytes the client's TrainingClient.forward_backward puts on the wire for `data` (tinker.types.Datum)."""
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=loss_fn, loss_fn_config=config),
        model_id="S:train:0", seq_id=seq_id)
    return request_conv.forward_backward_request_to_proto(request).SerializeToString()


def text_datum(tokens, **inputs):
    return types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=inputs)


@pytest.mark.parametrize("name", sorted(wire._MESSAGES))
def test_schema_matches_the_clients(name):
    ours = wire._PB[name].DESCRIPTOR
    reference = theirs.DESCRIPTOR.message_types_by_name[name]
    assert ours.full_name == reference.full_name
    for f in ours.fields:
        r = reference.fields_by_number[f.number]
        assert (f.name, f.type, f.is_repeated, f.has_presence) == (r.name, r.type, r.is_repeated,
                                                                   r.has_presence), f.full_name
        if f.message_type is not None:
            assert f.message_type.name == r.message_type.name
            if f.message_type.GetOptions().map_entry:
                assert [x.type for x in f.message_type.fields] == [x.type for x in r.message_type.fields]
        assert (f.containing_oneof and f.containing_oneof.name) == (r.containing_oneof and r.containing_oneof.name)
    left_out = {r.number for r in reference.fields} - {f.number for f in ours.fields}
    assert left_out == {"SampleResponse": {3, 5, 6}, "SampledSequence": {4}}.get(name, set())  # top-k etc: refused
    for enum in ("DType", "StopReason"):
        assert ({v.name: v.number for v in wire._PB["Tensor"].DESCRIPTOR.file.enum_types_by_name[enum].values}
                == {v.name: v.number for v in theirs.DESCRIPTOR.enum_types_by_name[enum].values})


def test_the_clients_request_decodes_to_the_same_tokens_and_arrays():
    weights2d = np.arange(12, dtype=np.float32).reshape(4, 3)
    data = [
        text_datum([5, 6, 7, 8], target_tokens=[6, 7, 8, 9], weights=[0.0, 1.0, 1.0, 0.5]),  # lists, as the cookbook
        types.Datum(model_input=types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1, 2]),
                                                         types.EncodedTextChunk(tokens=[2**31 - 1, 0])]),
                    loss_fn_inputs={"target_tokens": types.TensorData(data=[2, 3, 4, 5], dtype="int64", shape=[4]),
                                    "logprobs": np.array([-1.5, -0.25, -3.0, -2.0], np.float32),
                                    "advantages": types.TensorData.from_numpy(np.full(4, -2.5, np.float32)),
                                    "dist": types.TensorData.from_numpy(weights2d)}),
    ]
    body = client_request(data, "ppo", {"clip_low_threshold": 0.75, "clip_high_threshold": 1.25, "mode": "tok"})
    for encoding, payload in [(None, body), ("zstd", zstandard.ZstdCompressor().compress(body))]:
        request = wire.decode_forward_backward(payload, encoding)
        assert (request.model_id, request.seq_id, request.loss_fn, request.forward_only) == ("S:train:0", 3, "ppo",
                                                                                            False)
        assert request.loss_fn_config == {"clip_low_threshold": 0.75, "clip_high_threshold": 1.25, "mode": "tok"}
        first, second = request.data
        assert first.tokens == [5, 6, 7, 8] and second.tokens == [1, 2, 2**31 - 1, 0]
        assert first.inputs["target_tokens"].dtype == np.int64 and first.inputs["weights"].dtype == np.float32
        np.testing.assert_array_equal(first.inputs["target_tokens"], [6, 7, 8, 9])
        np.testing.assert_array_equal(first.inputs["weights"], [0.0, 1.0, 1.0, 0.5])
        np.testing.assert_array_equal(second.inputs["logprobs"], [-1.5, -0.25, -3.0, -2.0])
        np.testing.assert_array_equal(second.inputs["advantages"], np.full(4, -2.5))
        assert second.inputs["dist"].shape == (4, 3) and second.inputs["dist"].dtype == np.float32
        np.testing.assert_array_equal(second.inputs["dist"], weights2d)
        second.inputs["dist"][0, 0] = 1.0  # writable (torch.from_numpy warns on read-only buffers)


def test_a_sparse_csr_input_decodes_dense():
    dense = np.array([[0, 7, 0], [0, 0, 0], [3, 0, 9], [0, 0, 0]], np.int64)
    sparse = types.TensorData(data=[7, 3, 9], dtype="int64", shape=[4, 3], sparse_crow_indices=[0, 1, 1, 3, 3],
                              sparse_col_indices=[1, 0, 2])
    request = wire.decode_forward_backward(client_request([text_datum([1, 2, 3, 4], target_tokens=sparse)]))
    np.testing.assert_array_equal(request.data[0].inputs["target_tokens"], dense)
    assert request.data[0].inputs["target_tokens"].dtype == np.int64


def test_forward_only_and_the_legacy_config_map():
    message = theirs.ForwardBackwardRequest(model_id="S:train:1", seq_id=9, loss_fn="cross_entropy",
                                            forward_only=True, loss_fn_config={"beta": 0.5})
    message.data.add().model_input.add().encoded_text.tokens = np.array([4], "<i4").tobytes()
    request = wire.decode_forward_backward(message.SerializeToString())
    assert request.forward_only and request.loss_fn_config == {"beta": 0.5} and request.data[0].inputs == {}


def test_our_request_parses_with_the_clients_message():
    inputs = {"target_tokens": np.array([2, 3, 4], np.int64), "weights": np.array([1.0, 0.0, 0.5], np.float32)}
    ours = ForwardBackwardRequest("S:train:2", 7, [Datum([1, 2, 3], inputs)], "importance_sampling",
                                  {"beta": 0.25, "tag": "x"}, forward_only=True)
    message = theirs.ForwardBackwardRequest.FromString(wire.encode_forward_backward_request(ours))
    assert (message.model_id, message.seq_id, message.loss_fn, message.forward_only) == ("S:train:2", 7,
                                                                                        "importance_sampling", True)
    assert dict(message.loss_fn_config) == {"beta": 0.25}
    assert message.loss_fn_config_v2["beta"].number == 0.25 and message.loss_fn_config_v2["tag"].text == "x"
    (datum,) = message.data
    assert np.frombuffer(datum.model_input[0].encoded_text.tokens, "<i4").tolist() == [1, 2, 3]
    for name, array in inputs.items():
        decoded = response_conv._tensor_data_from_proto(datum.loss_fn_inputs[name])
        assert decoded.dtype == {"int64": "int64", "float32": "float32"}[str(array.dtype)]
        assert decoded.shape == [3]
        np.testing.assert_array_equal(decoded.to_numpy(), array)
    back = wire.decode_forward_backward(message.SerializeToString())
    assert (back.model_id, back.seq_id, back.loss_fn, back.loss_fn_config, back.forward_only) == (
        ours.model_id, ours.seq_id, ours.loss_fn, ours.loss_fn_config, ours.forward_only)
    assert back.data[0].tokens == [1, 2, 3] and back.data[0].inputs.keys() == inputs.keys()
    for name, array in inputs.items():
        assert back.data[0].inputs[name].dtype == array.dtype
        np.testing.assert_array_equal(back.data[0].inputs[name], array)


def test_our_forward_backward_output_reads_back_with_the_clients_converter():
    outputs = [{"logprobs": np.array([-1.0, -2.0, -0.5], np.float32), "elementwise_loss": np.array([1.0, 2, 3]),
                "ids": np.array([[1, 2], [3, 4], [5, 6]])},
               {"logprobs": np.array([-0.125], np.float32), "elementwise_loss": np.array([7.0]),
                "ids": np.array([[7, 8]])},
               {"logprobs": np.array([-3.0, -4.0], np.float32), "elementwise_loss": np.array([0.0, 1.0]),
                "ids": np.array([[1, 2, 3], [4, 5, 6]])}]  # another trailing shape: a second ArrayRecord
    metrics = {"loss:sum": 4.5, "tokens:sum": 6.0}
    body = wire.encode_forward_backward_output(outputs, metrics, "CrossEntropyLossReturn")
    result = response_conv.deserialize_forward_backward_output(body)
    assert isinstance(result, types.ForwardBackwardOutput)
    assert result.loss_fn_output_type == "CrossEntropyLossReturn" and result.metrics == metrics
    assert len(result.loss_fn_outputs) == 3 and len(theirs.ForwardBackwardOutput.FromString(body).loss_fn_outputs) == 2
    for got, want in zip(result.loss_fn_outputs, outputs, strict=True):
        assert set(got) == set(want)
        for name, array in want.items():
            assert got[name].shape == list(array.shape)
            assert got[name].dtype == ("float32" if array.dtype.kind == "f" else "int64")
            np.testing.assert_array_equal(got[name].to_numpy().reshape(array.shape), array)
    ours, our_metrics = wire.decode_forward_backward_output(body)
    assert our_metrics == metrics
    for got, want in zip(ours, outputs, strict=True):
        for name, array in want.items():
            np.testing.assert_array_equal(got[name], array)
    empty = response_conv.deserialize_forward_backward_output(wire.encode_forward_backward_output([], {}, "X"))
    assert empty.loss_fn_outputs == [] and empty.metrics == {}


def test_output_refuses_metric_keys_without_a_reduction_and_mismatched_fields():
    with pytest.raises(ValueError, match="'loss'.*loss:sum"):
        wire.encode_forward_backward_output([{"logprobs": np.zeros(2)}], {"loss": 1.0}, "X")
    with pytest.raises(ValueError, match="output 1 has fields"):
        wire.encode_forward_backward_output([{"logprobs": np.zeros(2)}, {"lp": np.zeros(2)}], {}, "X")
    with pytest.raises(ValueError, match="0-d"):
        wire.encode_forward_backward_output([{"logprobs": np.float32(1.0)}], {}, "X")


def test_our_sample_response_reads_back_with_the_clients_converter():
    sequences = [([11, 12, 13], [-0.5, -1.25, -0.0625], True), ([4, 2**31 - 1], [-2.0, -3.5], False)]
    body = wire.encode_sample_response(sequences, [None, -1.5, -0.75])
    result = response_conv.deserialize_sample_response(body)
    assert isinstance(result, types.SampleResponse)
    assert [s.stop_reason for s in result.sequences] == ["stop", "length"]
    assert [s.tokens for s in result.sequences] == [[11, 12, 13], [4, 2**31 - 1]]
    assert [s.logprobs for s in result.sequences] == [[-0.5, -1.25, -0.0625], [-2.0, -3.5]]
    assert result.prompt_logprobs == [None, -1.5, -0.75]
    assert wire.decode_sample_response(body) == (sequences, [None, -1.5, -0.75])
    plain = response_conv.deserialize_sample_response(wire.encode_sample_response(sequences[:1], None))
    assert plain.prompt_logprobs is None and plain.sequences[0].logprobs == [-0.5, -1.25, -0.0625]
    with pytest.raises(ValueError, match="3 tokens but 2 log-probs"):
        wire.encode_sample_response([([1, 2, 3], [0.0, 0.0], True)], None)


def raw(tokens=(1, 2), **inputs) -> theirs.ForwardBackwardRequest:
    """A request built with the client's message classes, for the malformed cases the client's types forbid."""
    message = theirs.ForwardBackwardRequest(model_id="S:train:0", seq_id=1, loss_fn="cross_entropy")
    datum = message.data.add()
    datum.model_input.add().encoded_text.tokens = np.array(tokens, "<i4").tobytes()
    for name, (dtype, shape, data) in inputs.items():
        datum.loss_fn_inputs[name].CopyFrom(theirs.Tensor(dtype=dtype, shape=shape, dense=data))
    return message


F32, I64 = theirs.DTYPE_FLOAT32, theirs.DTYPE_INT64


@pytest.mark.parametrize("message, words", [
    (raw(weights=(theirs.DTYPE_INT32, [2], b"\0" * 8)), "data[0].loss_fn_inputs['weights']: dtype DTYPE_INT32"),
    (raw(weights=(theirs.DTYPE_UNSPECIFIED, [2], b"\0" * 8)), "dtype DTYPE_UNSPECIFIED is not supported"),
    (raw(weights=(F32, [3], b"\0" * 8)), "data[0].loss_fn_inputs['weights']: shape (3,) holds 3 values but the data "
                                         "has 2"),
    (raw(weights=(F32, [2], b"\0" * 7)), "7 bytes is not a whole number of 4-byte values"),
    (raw(target_tokens=(I64, [3], b"\0" * 24)), "data[0].loss_fn_inputs['target_tokens']: shape (3,) but the datum "
                                                "has 2 tokens"),
    (raw(weights=(F32, [], b"")), "shape (0,) but the datum has 2 tokens"),
    (raw(tokens=()), "data[0].model_input: the datum has no tokens"),
    (raw(tokens=(3, -1)), "data[0].model_input[0].tokens: negative token id -1"),
    (theirs.ForwardBackwardRequest(model_id="m", loss_fn="cross_entropy"), "data is empty"),
    (theirs.ForwardBackwardRequest(loss_fn="cross_entropy"), "model_id is missing"),
    (theirs.ForwardBackwardRequest(model_id="m"), "loss_fn is missing"),
])
def test_bad_requests_name_the_field(message, words):
    with pytest.raises(WireError) as info:
        wire.decode_forward_backward(message.SerializeToString())
    assert words in str(info.value) and not isinstance(info.value, Unsupported)


def test_odd_token_bytes_empty_chunk_and_bad_config_value():
    message = raw()
    message.data[0].model_input[0].encoded_text.tokens = b"\1\0\0"
    with pytest.raises(WireError, match=r"data\[0\].model_input\[0\].tokens: 3 bytes"):
        wire.decode_forward_backward(message.SerializeToString())
    message = raw()
    message.data[0].model_input.add()
    with pytest.raises(WireError, match=r"data\[0\].model_input\[1\]: an empty chunk"):
        wire.decode_forward_backward(message.SerializeToString())
    message = raw()
    message.loss_fn_config_v2["beta"].SetInParent()
    with pytest.raises(WireError, match=r"loss_fn_config_v2\['beta'\] has neither number nor text"):
        wire.decode_forward_backward(message.SerializeToString())


@pytest.mark.parametrize("crow, col, shape, words", [
    ([0, 1, 1], [0], [3, 2], "crow_indices: expected 4 non-decreasing row pointers"),
    ([0, 2, 1, 2], [0, 1], [3, 2], "crow_indices"),
    ([0, 1, 1, 2], [0, 2], [3, 2], "col_indices: expected 2 column indices in [0, 2)"),
    ([0, 2], [0, 1], [4], "needs a 2-d shape"),
])
def test_bad_sparse_csr_names_the_part(crow, col, shape, words):
    message = raw(tokens=(1, 2, 3) if shape[0] == 3 else (1, 2, 3, 4))
    csr = theirs.SparseCsr(values=np.ones(2, "<f4").tobytes(), crow_indices=np.array(crow, "<i8").tobytes(),
                           col_indices=np.array(col, "<i8").tobytes())
    message.data[0].loss_fn_inputs["weights"].CopyFrom(theirs.Tensor(dtype=F32, shape=shape, sparse_csr=csr))
    with pytest.raises(WireError) as info:
        wire.decode_forward_backward(message.SerializeToString())
    assert "data[0].loss_fn_inputs['weights']" in str(info.value) and words in str(info.value)


def test_images_audio_and_provenance_spans_are_refused():
    image = types.Datum(model_input=types.ModelInput(chunks=[
        types.EncodedTextChunk(tokens=[1]), types.ImageChunk(data=b"\x89PNG", format="png", expected_tokens=4)]))
    with pytest.raises(Unsupported, match=r"data\[0\].model_input\[1\]: image chunks are not supported"):
        wire.decode_forward_backward(client_request([image]))
    audio = types.Datum(model_input=types.ModelInput(chunks=[types.DmelChunk(dmel=b"\0\1")]))
    with pytest.raises(Unsupported, match=r"model_input\[0\]: audio \(dmel\) chunks"):
        wire.decode_forward_backward(client_request([audio]))
    spans = text_datum([1, 2], target_tokens=[2, 3]).with_provenance(
        model_input=[types.PromptProvenanceSpan(sequence_id="p", length=2)],
        loss_fn_inputs=[types.SampledProvenanceSpan(sequence_id="s", length=2)])
    with pytest.raises(Unsupported, match=r"data\[0\]: provenance spans"):
        wire.decode_forward_backward(client_request([spans], "stable_reinforce"))


def test_bodies_that_do_not_parse():
    body = client_request([text_datum([1, 2], target_tokens=[2, 3])])
    with pytest.raises(WireError, match="not a ForwardBackwardRequest protobuf"):
        wire.decode_forward_backward(b"\xff\xff\xff\xff")
    with pytest.raises(WireError, match="Content-Encoding is zstd but the body is not zstd"):
        wire.decode_forward_backward(body, "zstd")
    with pytest.raises(WireError, match="Content-Encoding 'gzip' is not supported"):
        wire.decode_forward_backward(body, "gzip")
    assert wire.decode_forward_backward(body, "identity").data[0].tokens == [1, 2]


def test_random_bodies_raise_only_wire_errors():
    good = client_request([text_datum([5, 6, 7], target_tokens=[6, 7, 8], weights=[1.0, 1.0, 0.0])],
                          "ppo", {"clip_low_threshold": 0.5})
    rng = random.Random(0)
    for _ in range(400):
        body = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        if rng.random() < 0.3:
            body = body[:rng.randrange(len(body))]
        for payload, encoding in [(bytes(body), None), (zstandard.ZstdCompressor().compress(bytes(body)), "zstd")]:
            try:
                wire.decode_forward_backward(payload, encoding)
            except WireError:
                pass
    for junk in [b"", b"\0", bytes(range(256)), b"\x1a\x02\x0a\x00" * 3]:
        with pytest.raises(WireError):
            wire.decode_forward_backward(junk)
