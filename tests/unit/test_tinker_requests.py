"""The Tinker JSON routes (trajtune.tinker.requests): each route parses the exact JSON the real `tinker` client sends
(its own request types dumped as it dumps them), each bad field gives a WireError naming it, each refused feature an
Unsupported, and junk bodies raise nothing but WireError."""

import copy
import random

import pytest

from trajtune.tinker import requests as rq
from trajtune.tinker.requests import parse_request, parse_tinker_path
from trajtune.tinker.wire import Unsupported, WireError

tinker = pytest.importorskip("tinker", reason="the tinker client (pip install tinker) is the protocol's reference")
from tinker import types  # noqa: E402
from tinker._compat import model_dump  # noqa: E402

STATE = "tinker://S:train:0/weights/ckpt1"
SAMPLER = "tinker://S:train:0/sampler_weights/s1"


def sent(request) -> dict:
    """The JSON body the client posts for `request` (resources/*.py: model_dump(exclude_none=True, mode="json"))."""
    return model_dump(request, exclude_unset=False, exclude_none=True, mode="json")


def sample(**fields):
    params = fields.pop("sampling_params", types.SamplingParams(max_tokens=3, stop=["\n"]))
    return sent(types.SampleRequest(num_samples=2, prompt=types.ModelInput.from_ints([5, 6]), sampling_params=params,
                                    sampling_session_id="S:sample:0", seq_id=0, **fields))


CLIENT = {
    "create_session": sent(types.CreateSessionRequest(tags=["a"], user_metadata={"k": 1}, sdk_version="0.38.0")),
    "session_heartbeat": sent(types.SessionHeartbeatRequest(session_id="S")),
    "create_model": sent(types.CreateModelRequest(session_id="S", model_seq_id=0, base_model="tiny-llama",
                                                  lora_config=types.LoraConfig(rank=32, seed=7, train_unembed=False))),
    "get_info": sent(types.GetInfoRequest(model_id="S:train:0")),
    "optim_step": sent(types.OptimStepRequest(optim_params=types.AdamParams(learning_rate=1e-3, eps=1e-8),
                                              model_id="S:train:0", seq_id=2)),
    "save_weights": sent(types.SaveWeightsRequest(model_id="S:train:0", path="ckpt1", seq_id=6, ttl_seconds=3600)),
    "save_weights_for_sampler": sent(types.SaveWeightsForSamplerRequest(model_id="S:train:0", path="s1", seq_id=7)),
    "load_weights": sent(types.LoadWeightsRequest(session_id="S", model_seq_id=1, path=STATE, optimizer=True)),
    "create_sampling_session": sent(types.CreateSamplingSessionRequest(session_id="S", sampling_session_seq_id=1,
                                                                       model_path=SAMPLER)),
    "asample": sample(),
    "retrieve_future": sent(types.FutureRetrieveRequest(request_id="r1", allow_metadata_only=True)),
}


def test_every_route_has_the_clients_body_and_it_parses():
    assert set(CLIENT) == rq.ROUTES
    assert CLIENT["optim_step"]["adam_params"]["learning_rate"] == 1e-3  # the wire key, not optim_params
    got = {route: parse_request(route, body) for route, body in CLIENT.items()}
    assert got["create_session"] == rq.CreateSession(("a",), {"k": 1}, "0.38.0", None, None)
    assert got["session_heartbeat"] == rq.SessionHeartbeat("S")
    assert got["create_model"] == rq.CreateModel("S", 0, "tiny-llama", rq.LoraConfig(32, 7, True, True, False), None)
    assert got["create_model"].model_id == "S:train:0"
    assert got["get_info"] == rq.GetInfo("S:train:0")
    assert got["optim_step"] == rq.OptimStep("S:train:0", 2, rq.AdamParams(learning_rate=1e-3, eps=1e-8))
    assert got["save_weights"] == rq.SaveWeights("S:train:0", 6, "ckpt1", False, 3600, None)
    assert got["save_weights_for_sampler"] == rq.SaveWeightsForSampler("S:train:0", 7, "s1", None, None, None)
    load = got["load_weights"]
    assert (load.checkpoint, load.optimizer, load.new_model_id, load.model_id) == (
        ("S:train:0", "weights", "ckpt1"), True, "S:train:1", None)
    assert got["create_sampling_session"] == rq.CreateSamplingSession("S", 1, SAMPLER, parse_tinker_path(SAMPLER),
                                                                      None)
    assert got["asample"] == rq.Asample("S:sample:0", 0, (5, 6), 2, rq.SamplingParams(3, 1.0, -1, 1.0, ("\n",), None),
                                        False)
    assert got["retrieve_future"] == rq.RetrieveFuture("r1", True)
    assert parse_request("/api/v1/get_info", CLIENT["get_info"]) == got["get_info"]


def test_the_other_forms_the_client_sends():
    full = parse_request("create_model", sent(types.CreateModelRequest(
        session_id="S", model_seq_id=3, base_model="b", lora_config=types.LoraConfig(rank=0))))
    assert full.lora.rank == 0 and full.model_id == "S:train:3"
    assert parse_request("create_model", {"session_id": "S", "model_seq_id": 0, "base_model": "b"}).lora.rank == 0
    unnamed = parse_request("save_weights_for_sampler", sent(types.SaveWeightsForSamplerRequest(
        model_id="S:train:0", sampling_session_seq_id=4, seq_id=9)))
    assert (unnamed.path, unnamed.sampling_session_seq_id) == (None, 4)
    legacy = parse_request("load_weights", sent(types.LoadWeightsRequest(model_id="S:train:0", seq_id=5, path=STATE,
                                                                         optimizer=False)))
    assert (legacy.model_id, legacy.seq_id, legacy.new_model_id, legacy.optimizer) == ("S:train:0", 5, None, False)
    base = parse_request("create_sampling_session", sent(types.CreateSamplingSessionRequest(
        session_id="S", sampling_session_seq_id=0, base_model="tiny-llama")))
    assert (base.model_path, base.checkpoint, base.base_model) == (None, None, "tiny-llama")
    logprobs = parse_request("asample", sample(prompt_logprobs=True, sampling_params=types.SamplingParams(
        max_tokens=1, temperature=0.5, top_k=20, top_p=0.9, seed=3, stop=[7, 8])))  # compute_logprobs and a few more
    assert logprobs.prompt_logprobs and logprobs.params == rq.SamplingParams(1, 0.5, 20, 0.9, (7, 8), 3)
    for stop, want in [("</s>", ("</s>",)), ([], ()), (None, None)]:  # [] disables even EOS; None keeps EOS
        params = types.SamplingParams(max_tokens=2, stop=stop)
        assert parse_request("asample", sample(sampling_params=params)).params.stop == want
    assert parse_request("get_info", {**CLIENT["get_info"], "a_field_from_a_newer_client": [1]}).model_id


def bad(route, **changes):
    body = copy.deepcopy(CLIENT[route])
    for key, value in changes.items():
        *parents, last = key.split("__")
        target = body
        for parent in parents:
            target = target[parent]
        if value is DROP:
            target.pop(last, None)
        else:
            target[last] = value
    return route, body


DROP = object()


@pytest.mark.parametrize("route, body, words", [
    (*bad("optim_step", adam_params__learning_rate=-1),
     "optim_step: adam_params.learning_rate must be a finite number >= 0, got -1"),
    (*bad("optim_step", adam_params__beta2=1.0), "adam_params.beta2 must be a finite number in [0, 1), got 1.0"),
    (*bad("optim_step", adam_params__eps=0), "adam_params.eps must be a finite number > 0"),
    (*bad("optim_step", adam_params__weight_decay="0"), "adam_params.weight_decay must be a finite number >= 0"),
    (*bad("optim_step", adam_params__grad_clip_norm=float("nan")), "adam_params.grad_clip_norm"),
    (*bad("optim_step", adam_params=DROP), "optim_step: adam_params is required"),
    (*bad("optim_step", adam_params=[1]), "optim_step: adam_params must be a JSON object, got [1]"),
    (*bad("optim_step", model_id=DROP), "optim_step: model_id is required"),
    (*bad("optim_step", seq_id=-1), "optim_step: seq_id must be an integer >= 0, got -1"),
    (*bad("optim_step", seq_id=True), "seq_id must be an integer >= 0, got true"),
    (*bad("create_session", tags="a"), "create_session: tags must be a list of strings"),
    (*bad("create_session", user_metadata=[]), "create_session: user_metadata must be a JSON object"),
    (*bad("session_heartbeat", session_id=""), "session_heartbeat: session_id must be a non-empty string"),
    (*bad("create_model", base_model=DROP), "create_model: base_model is required"),
    (*bad("create_model", model_seq_id=1.5), "create_model: model_seq_id must be an integer >= 0, got 1.5"),
    (*bad("create_model", lora_config__rank=-2), "lora_config.rank must be an integer >= 0 (0: full fine-tuning)"),
    (*bad("create_model", lora_config__train_mlp=1), "lora_config.train_mlp must be true or false, got 1"),
    (*bad("create_model", lora_config__train_mlp=False, lora_config__train_attn=False), "nothing to train"),
    (*bad("create_model", optimizer_config={"type": 3}), "optimizer_config.type must be a string"),
    (*bad("get_info", model_id=7), "get_info: model_id must be a non-empty string, got 7"),
    (*bad("save_weights", path="a/b"), "save_weights: path must be a checkpoint name"),
    (*bad("save_weights", path=".."), "save_weights: path must be a checkpoint name"),
    (*bad("save_weights", ttl_seconds=0), "save_weights: ttl_seconds must be an integer >= 1"),
    (*bad("save_weights", user_metadata={"a": 1}), "save_weights: user_metadata must be an object of strings"),
    (*bad("save_weights", overwrite="yes"), "save_weights: overwrite must be true or false"),
    (*bad("save_weights_for_sampler", path=DROP), "give exactly one of path"),
    (*bad("save_weights_for_sampler", sampling_session_seq_id=2), "give exactly one of path"),
    (*bad("save_weights_for_sampler", kind="frozen"), "kind must be 'snapshot'"),
    (*bad("load_weights", path="/tmp/ckpt"), "load_weights: path must be a tinker://RUN/weights/NAME"),
    (*bad("load_weights", path=SAMPLER), "load_weights: path must be a save_state checkpoint"),
    (*bad("load_weights", optimizer=DROP), "load_weights: optimizer is required"),
    (*bad("load_weights", model_id="S:train:0"), "give session_id with model_seq_id"),
    (*bad("load_weights", session_id=DROP), "give session_id with model_seq_id"),
    (*bad("load_weights", model_seq_id=DROP), "load_weights: model_seq_id is required"),
    (*bad("create_sampling_session", model_path=DROP), "give model_path (a tinker:// checkpoint) or base_model"),
    (*bad("create_sampling_session", model_path="tinker://S:train:0/s1"), "model_path must be tinker://RUN/"),
    (*bad("create_sampling_session", model_path="s3://b/k"), "create_sampling_session: model_path must be a tinker"),
    (*bad("asample", sampling_params__max_tokens=DROP), "asample: sampling_params.max_tokens is required"),
    (*bad("asample", sampling_params__max_tokens=0), "sampling_params.max_tokens must be an integer >= 1"),
    (*bad("asample", sampling_params__temperature=-0.1), "sampling_params.temperature must be a finite number >= 0"),
    (*bad("asample", sampling_params__top_k=0), "sampling_params.top_k must be -1 (off) or an integer >= 1, got 0"),
    (*bad("asample", sampling_params__top_k=-2), "sampling_params.top_k must be -1 (off)"),
    (*bad("asample", sampling_params__top_p=0), "sampling_params.top_p must be a finite number in (0, 1]"),
    (*bad("asample", sampling_params__top_p=1.5), "sampling_params.top_p must be a finite number in (0, 1]"),
    (*bad("asample", sampling_params__stop=["\n", 7]), "sampling_params.stop must be a string, a list of non-empty "
                                                       "strings or a list of token ids (not mixed)"),
    (*bad("asample", sampling_params__stop=[""]), "sampling_params.stop"),
    (*bad("asample", sampling_params__seed=-1), "sampling_params.seed must be an integer in [0, 2**64)"),
    (*bad("asample", sampling_params=DROP), "asample: sampling_params is required"),
    (*bad("asample", num_samples=0), "asample: num_samples must be an integer >= 1, got 0"),
    (*bad("asample", prompt_logprobs="true"), "asample: prompt_logprobs must be true or false"),
    (*bad("asample", prompt__chunks=[]), "asample: prompt has no tokens"),
    (*bad("asample", prompt__chunks=[{"type": "encoded_text", "tokens": [1, -3]}]),
     "asample: prompt.chunks[0].tokens must be a list of token ids in [0, 2147483647]"),
    (*bad("asample", prompt__chunks=[{"type": "text", "tokens": [1]}]), "prompt.chunks[0].type must be "
                                                                        "'encoded_text'"),
    (*bad("asample", prompt__chunks={"tokens": [1]}), "asample: prompt.chunks must be a list of chunks"),
    (*bad("asample", prompt=DROP), "asample: prompt is required"),
    (*bad("asample", sampling_session_id=DROP), "asample: sampling_session_id is required"),
    (*bad("asample", topk_prompt_logprobs=-1), "asample: topk_prompt_logprobs must be an integer >= 0"),
    (*bad("retrieve_future", request_id=DROP), "retrieve_future: request_id is required"),
    (*bad("retrieve_future", allow_metadata_only=0), "retrieve_future: allow_metadata_only must be true or false"),
])
def test_a_bad_field_is_named(route, body, words):
    with pytest.raises(WireError) as info:
        parse_request(route, body)
    assert words in str(info.value) and not isinstance(info.value, Unsupported)


REFUSALS = [
    ("create_model", sent(types.CreateModelRequest(session_id="S", model_seq_id=0, base_model="b",
                                                   optimizer_config=types.DimuonOptimizerConfig())), rq.DIMUON),
    ("load_weights", sent(types.LoadWeightsRequest(session_id="S", model_seq_id=1, path=STATE, optimizer=False,
                                                   optimizer_config=types.DimuonOptimizerConfig())), rq.DIMUON),
    ("optim_step", sent(types.OptimStepRequest(optim_params=types.DimuonParams(learning_rate=0.1), model_id="m",
                                               seq_id=2)), rq.DIMUON),
    ("optim_step", {"model_id": "m", "optim_params": {"type": "lion", "learning_rate": 1}}, rq.DIMUON),
    ("save_weights_for_sampler", sent(types.SaveWeightsForSamplerRequest(
        model_id="S:train:0", sampling_session_seq_id=0, seq_id=3, kind="inflight")), rq.INFLIGHT),
    ("asample", sample(topk_prompt_logprobs=5), rq.TOPK),
    ("asample", sample(topk_sample_logprobs=2), rq.TOPK),
    ("asample", sample(prompt_alt_tokens_k=4), rq.ALT_TOKENS),
    ("asample", sample(target_prompt_logprobs={"data": [1, 2], "dtype": "int64", "shape": [1, 2]}), rq.TARGET),
    ("asample", sample(prompt_logprobs=True, prompt_logprobs_last_n=1), rq.LAST_N),
    ("asample", sample(record_stability_info=True), rq.STABILITY),
    ("asample", sent(types.SampleRequest(prompt=types.ModelInput(chunks=[types.ImageChunk(data=b"\x89", format="png")]),
                                         sampling_params=types.SamplingParams(max_tokens=2),
                                         sampling_session_id="x")), rq.IMAGES),
    ("asample", sent(types.SampleRequest(prompt=types.ModelInput(chunks=[types.DmelChunk(dmel=b"\0")]),
                                         sampling_params=types.SamplingParams(max_tokens=2),
                                         sampling_session_id="x")), rq.AUDIO),
]


@pytest.mark.parametrize("route, body, feature", REFUSALS)
def test_a_refused_feature_says_why(route, body, feature):
    with pytest.raises(Unsupported) as info:
        parse_request(route, body)
    assert str(info.value).startswith(f"{route}: ") and str(info.value).endswith(dict(rq.REFUSED)[feature])


def test_refused_is_one_list_that_every_refusal_uses():
    assert len(rq.REFUSED) == len(dict(rq.REFUSED))
    used = {feature for _, _, feature in REFUSALS} | {rq.SPANS}  # spans: refused by wire (test_tinker_wire.py)
    used |= {f"forward_backward(loss_fn={name!r})" for name in rq.REFUSED_LOSSES}  # by losses (test_tinker_losses.py)
    assert used == set(dict(rq.REFUSED))


@pytest.mark.parametrize("path, want", [
    ("tinker://S:train:0/weights/ckpt1", ("S:train:0", "weights", "ckpt1")),
    ("tinker://run/sampler_weights/000020", ("run", "sampler_weights", "000020")),
])
def test_tinker_paths(path, want):
    assert parse_tinker_path(path) == want and parse_tinker_path(path).name == want[2]


@pytest.mark.parametrize("path", ["tinker://S/weights", "tinker://S/weights/a/b", "tinker:///weights/a",
                                  "tinker://S/checkpoints/a", "tinker://S/weights/", "tinker://S/weights/.x",
                                  "http://S/weights/a", None, 3])
def test_bad_tinker_paths(path):
    with pytest.raises(WireError, match="path must be"):
        parse_tinker_path(path)


def test_an_unknown_route_is_a_server_bug():
    with pytest.raises(ValueError, match="no JSON parser") as info:
        parse_request("forward_backward", {})
    assert not isinstance(info.value, WireError)


JUNK = [None, 0, -1, 2**70, 1.5, float("nan"), True, "", "x", [], [1], {}, {"a": None}, [{}], {"chunks": None},
        {"tokens": ["a"]}, {"type": "image"}]


def mutations(body, rng):
    """`body` with one value somewhere replaced by junk, or one key dropped."""
    body = copy.deepcopy(body)
    target = body
    while True:
        keys = list(target) if isinstance(target, dict) else list(range(len(target)))
        if not keys:
            return body
        key = rng.choice(keys)
        if isinstance(target[key], (dict, list)) and target[key] and rng.random() < 0.5:
            target = target[key]
            continue
        if isinstance(target, dict) and rng.random() < 0.2:
            del target[key]
        else:
            target[key] = copy.deepcopy(rng.choice(JUNK))
        return body


def test_junk_bodies_raise_only_wire_errors():
    rng = random.Random(0)
    for route, body in CLIENT.items():
        for junk in JUNK:
            with pytest.raises(WireError):
                parse_request(route, junk)
        for _ in range(150):
            try:
                parse_request(route, mutations(mutations(body, rng), rng))
            except WireError:
                pass
