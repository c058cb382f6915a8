"""Conformance: the real `tinker` client (the package's own ServiceClient, TrainingClient, SamplingClient) against
trajtune's Tinker service, in-process and over HTTP, on the built-in tiny model.

What each test shows is in its name; docs/tinker.md lists the calls that work and those refused."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request

import pytest
import torch

tinker = pytest.importorskip("tinker", reason="the tinker client is not installed (pip install -e '.[tinker]'; "
                                              "it installs from PyPI on Python >= 3.11)")
from tinker import types  # noqa: E402

from trajtune.tinker.local import service_client  # noqa: E402
from trajtune.tinker.server import TinkerServer  # noqa: E402
from trajtune.tinker.service import TinkerService  # noqa: E402

MODEL = "tiny-llama"


def sl_datum(tokens: list[int], prompt: int) -> types.Datum:
    """The cookbook's supervised datum: input tokens[:-1], targets tokens[1:], weight 0 on the prompt."""
    weights = [0.0] * (prompt - 1) + [1.0] * (len(tokens) - prompt)
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights})


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("tinker-home")


@pytest.fixture(scope="module")
def client(home):
    c = service_client(TinkerService(home / "inproc", poll_s=5.0))
    yield c
    c.holder.close() if hasattr(c, "holder") else None


def rows(n: int = 4, length: int = 12, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, 200, (n, length), generator=g).tolist()


def nll(fb, data) -> float:
    """The weighted NLL from forward_backward's per-datum log-probs, as the cookbook's sl_loop computes it."""
    total = 0.0
    for out, d in zip(fb.loss_fn_outputs, data, strict=True):
        lp = out["logprobs"].to_torch()
        total += float(-(lp * d.loss_fn_inputs["weights"].to_torch()).sum())
    return total


def test_the_client_trains_a_lora_model_and_its_loss_falls(client):
    tc = client.create_lora_training_client(base_model=MODEL, rank=8).result()
    info = tc.get_info()
    assert info.model_data.model_name == MODEL and info.is_lora and info.lora_rank == 8
    tokenizer = tc.get_tokenizer()  # a local folder: the client loads it with transformers
    assert tokenizer.decode(tokenizer.encode("hello")).strip() == "hello"
    data = [sl_datum(r, 4) for r in rows()]
    losses = []
    for _ in range(6):
        fb = tc.forward_backward(data, "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=1e-2))
        fb, opt = fb.result(), opt.result()
        losses.append(fb.metrics["loss:sum"])
        assert math.isclose(fb.metrics["loss:sum"], nll(fb, data), rel_tol=1e-4)
    assert losses[-1] < 0.8 * losses[0], losses


def test_sampled_logprobs_are_the_trainers_after_each_sampler_save(client):
    tc = client.create_lora_training_client(base_model=MODEL, rank=4).result()
    data = [sl_datum(r, 4) for r in rows(seed=1)]
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    sc = tc.save_weights_and_get_sampling_client()
    prompt = types.ModelInput.from_ints(rows(1, 5, seed=2)[0])
    out = sc.sample(prompt=prompt, num_samples=3, sampling_params=types.SamplingParams(max_tokens=6, seed=7)).result()
    assert len(out.sequences) == 3
    again = sc.sample(prompt=prompt, num_samples=3, sampling_params=types.SamplingParams(max_tokens=6, seed=7))
    assert [s.tokens for s in again.result().sequences] == [s.tokens for s in out.sequences]  # a seed repeats
    for seq in out.sequences:
        assert len(seq.tokens) == len(seq.logprobs) >= 1
        full = prompt.to_ints() + seq.tokens
        datum = types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                            loss_fn_inputs={"target_tokens": full[1:], "weights": [0.0] * (len(full) - 1)})
        learner = tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_torch()
        sampled = torch.tensor(seq.logprobs)
        assert torch.allclose(learner[-len(seq.tokens):], sampled, atol=1e-4), (learner, sampled)
    lps = sc.compute_logprobs(prompt).result()
    assert lps[0] is None and len(lps) == len(prompt.to_ints())


def test_state_saved_and_loaded_into_a_new_client_goes_on_identically(client):
    tc = client.create_lora_training_client(base_model=MODEL, rank=4).result()
    data = [sl_datum(r, 3) for r in rows(seed=3)]
    adam = types.AdamParams(learning_rate=5e-3)
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(adam).result()
    path = tc.save_state("ckpt").result().path
    assert path.startswith("tinker://") and path.endswith("/weights/ckpt")
    tc2 = client.create_training_client_from_state_with_optimizer(path).result()
    for t in (tc, tc2):
        t.forward_backward(data, "cross_entropy").result()
        t.optim_step(adam).result()
    a = tc.forward(data, "cross_entropy").result().metrics["loss:sum"]
    b = tc2.forward(data, "cross_entropy").result().metrics["loss:sum"]
    assert a == pytest.approx(b, abs=1e-6)


def test_a_refused_feature_is_the_clients_error_and_the_model_goes_on(client):
    tc = client.create_lora_training_client(base_model=MODEL, rank=4).result()
    data = [sl_datum(r, 3) for r in rows(2, seed=4)]
    with pytest.raises((tinker.BadRequestError, tinker.RequestFailedError), match="stable_reinforce"):
        tc.forward_backward(data, "stable_reinforce").result()
    bad = [types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                       loss_fn_inputs={"target_tokens": [2, 3, 10**7], "weights": [1.0, 1.0, 1.0]})]
    with pytest.raises((tinker.BadRequestError, tinker.RequestFailedError), match="target_tokens"):
        tc.forward_backward(bad, "cross_entropy").result()
    assert tc.forward_backward(data, "cross_entropy").result().metrics["loss:sum"] > 0  # still serves


def test_two_clients_on_one_server_do_not_mix_their_models(home):
    def train(svc_client, seeds, steps=3):
        tcs = [svc_client.create_lora_training_client(base_model=MODEL, rank=4, seed=0).result() for _ in seeds]
        out = [[] for _ in seeds]
        for _ in range(steps):  # interleaved: step of model A, step of model B ...
            for i, (tc, s) in enumerate(zip(tcs, seeds, strict=True)):
                data = [sl_datum(r, 3) for r in rows(seed=s)]
                fb = tc.forward_backward(data, "cross_entropy").result()
                tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
                out[i].append(fb.metrics["loss:sum"])
        return out

    both = train(service_client(TinkerService(home / "two", poll_s=5.0)), [10, 11])
    alone = [train(service_client(TinkerService(home / f"alone{s}", poll_s=5.0)), [s])[0] for s in (10, 11)]
    assert both == alone


def test_over_http_the_same_numbers_as_in_process(home):
    data = [sl_datum(r, 3) for r in rows(seed=5)]

    def run(c):
        tc = c.create_lora_training_client(base_model=MODEL, rank=4, seed=1).result()
        fb = tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        return fb.metrics["loss:sum"], tc.forward(data, "cross_entropy").result().metrics["loss:sum"]

    with TinkerServer(TinkerService(home / "http", poll_s=5.0), port=0) as server:
        over_http = run(tinker.ServiceClient(base_url=server.url, api_key="tml-test"))
    assert over_http == run(service_client(TinkerService(home / "inproc2", poll_s=5.0)))


def post(url: str, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_malformed_requests_get_a_clear_error_and_the_server_stays_up(home):
    with TinkerServer(TinkerService(home / "junk", poll_s=1.0), port=0) as server:
        api = server.url + "/api/v1/"
        cases = [("create_session", b"{not json"), ("create_model", b'{"session_id": 3}'),
                 ("forward_backward", b"\x00\x01garbage"), ("optim_step", b'{"model_id": "nope", "seq_id": 1, '
                                                                          b'"adam_params": {}}'),
                 ("asample", b'{"prompt": 5}'), ("retrieve_future", b'{"request_id": "b0-1"}'),
                 ("no_such_route", b"{}")]
        for route, body in cases:
            ct = "application/x-protobuf" if route == "forward_backward" else "application/json"
            status, answer = post(api + route, body, ct)
            assert (400 <= status < 500) or "error" in answer, (route, status, answer)
            message = answer.get("detail") or answer.get("error")
            assert isinstance(message, str) and message and "Traceback" not in message, (route, answer)
        status, answer = post(api + "create_session", b'{"tags": [], "sdk_version": "x"}')
        assert status == 200 and answer["session_id"]


def test_a_restarted_server_goes_on_from_the_last_saved_state(tmp_path):
    home = tmp_path / "home"
    data = [sl_datum(r, 3) for r in rows(seed=6)]
    adam = types.AdamParams(learning_rate=1e-2)
    server = TinkerServer(TinkerService(home, poll_s=5.0), port=0)
    port = server.port
    client = tinker.ServiceClient(base_url=server.url, api_key="tml-test")
    tc = client.create_lora_training_client(base_model=MODEL, rank=4).result()
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(adam).result()
    path = tc.save_state("saved").result().path
    at_save = tc.forward(data, "cross_entropy").result().metrics["loss:sum"]
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(adam).result()  # after the save: lost by the restart
    server.close()
    with TinkerServer(TinkerService(home, poll_s=5.0), port=port):
        with pytest.raises(tinker.RequestFailedError, match="restarted.*saved.*1 step"):
            tc.forward(data, "cross_entropy").result()  # said once, with what was lost
        assert tc.forward(data, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(at_save, abs=1e-6)
        again = client.create_training_client_from_state_with_optimizer(path).result()
        assert again.forward(data, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(at_save, abs=1e-6)


def test_the_in_process_mode_patches_a_client_symbol_that_exists():
    """local.py patches tinker._base_client.AsyncHttpxClientWrapper: if a tinker release moves it, this fails."""
    from tinker import _base_client

    assert "base_url" in _base_client.AsyncAPIClient.__init__.__code__.co_varnames
    assert issubclass(_base_client.AsyncHttpxClientWrapper, __import__("httpx").AsyncClient)


def test_forward_backward_custom_gives_the_builtin_losss_gradient(client):
    """The client's forward_backward_custom (its loss on the client, its gradient sent back as cross_entropy
    weights): a custom loss written as the weighted NLL trains exactly as the built-in cross_entropy does."""
    data = [sl_datum(r, 3) for r in rows(2, seed=7)]

    def nll_fn(batch, logprobs_list):
        loss = sum(-(lp * d.loss_fn_inputs["weights"].to_torch()).sum() for lp, d in zip(logprobs_list, batch,
                                                                                       strict=True))
        return loss, {"custom_nll": float(loss)}

    custom, builtin = (client.create_lora_training_client(base_model=MODEL, rank=4, seed=3).result() for _ in "ab")
    out = custom.forward_backward_custom(data, nll_fn).result()
    ref = builtin.forward_backward(data, "cross_entropy").result()
    assert out.metrics["loss:sum"] == pytest.approx(ref.metrics["loss:sum"], rel=1e-5)
    for tc in (custom, builtin):
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after = [tc.forward(data, "cross_entropy").result().metrics["loss:sum"] for tc in (custom, builtin)]
    assert after[0] == pytest.approx(after[1], rel=1e-5) and after[0] < ref.metrics["loss:sum"]
