"""Tinker's built-in losses over the engine (`trajtune.tinker.losses`): every loss's summed value and gradient equal a
direct torch computation from the model's whole logits (log_softmax gathered at target_tokens), on datums shaped like
the cookbook's (a supervised datum: weights 0 on the prompt; an RL datum: target 0, logprobs 0, advantages 0 on the
prompt positions); micro-batches, buckets and several calls before one step give the same sum; forward_only leaves
the gradients alone; every bad request is a WireError naming its field, raised before any compute."""

import copy

import numpy as np
import pytest
import torch

from trajtune.engine import TorchEngine
from trajtune.engine.optim import OptimConfig
from trajtune.models.hf import load_policy
from trajtune.models.hf_random import make_random_model
from trajtune.tinker.losses import LOSSES, forward_backward
from trajtune.tinker.wire import Datum, Unsupported, WireError

ATOL, RTOL = 1e-5, 1e-4


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return load_policy(make_random_model(tmp_path_factory.mktemp("tinker_losses") / "m", "llama", "tiny"))


@pytest.fixture
def engine(policy):
    return TorchEngine(copy.deepcopy(policy), OptimConfig(lr=1e-2, grad_clip=0.0))


def vocab(engine) -> int:
    return engine.model.model.get_output_embeddings().weight.shape[0]


def learner_logprobs(model, d: Datum) -> torch.Tensor:
    """lp_t = log p(target_tokens[t] | model_input[:t+1]) [N] from the whole logits of the datum alone (with grad)."""
    logits = model(torch.tensor([d.tokens]))[0]  # [N, V]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.as_tensor(d.inputs["target_tokens"])[:, None])[:, 0]


def sl_datum(g: np.random.Generator, V: int, prompt: int, completion: int, negative: bool = False) -> Datum:
    """The cookbook's supervised datum: the full sequence shifted by one, weights 0 on the prompt."""
    full = g.integers(1, V, prompt + completion)
    weights = np.r_[np.zeros(prompt - 1), np.ones(completion)].astype(np.float32)
    if negative:  # forward_backward_custom sends -dLoss/dlogprobs as weights
        weights[-2:] = [-0.5, 2.0]
    return Datum(full[:-1].tolist(), {"target_tokens": full[1:].astype(np.int64), "weights": weights})


def rl_datums(model, seed: int = 0, group: bool = False) -> list[Datum]:
    """The cookbook's RL datums (rl_loop.py): model_input = prompt + sampled[:-1]; target 0, logprobs 0, advantages 0
    at the prompt's positions; the sampler's log-probs near the learner's (ratios inside and outside [0.8, 1.2]).
    group: one prompt for every datum (a GRPO group: the engine runs the shared prompt once, `SharedPrefix`)."""
    g = np.random.default_rng(seed)
    V = model.model.get_output_embeddings().weight.shape[0]
    out, shared = [], g.integers(1, V, 6).tolist()
    shapes = ((6, 5, 1.5), (6, 7, -0.75), (6, 2, 0.5), (6, 4, -1.25)) if group else ((4, 5, 1.5), (3, 7, -0.75),
                                                                                      (6, 2, 0.5))
    for P, S, A in shapes:
        prompt, sampled = shared if group else g.integers(1, V, P).tolist(), g.integers(1, V, S).tolist()
        d = Datum(prompt + sampled[:-1], {"target_tokens": np.array([0] * (P - 1) + sampled, np.int64)})
        with torch.no_grad():
            lp = learner_logprobs(model, d).numpy()
        slp = lp[P - 1:] + g.normal(0.0, 0.3, S)
        d.inputs.update(logprobs=np.r_[np.zeros(P - 1), slp].astype(np.float32),
                        advantages=np.r_[np.zeros(P - 1), np.full(S, A)].astype(np.float32),
                        sequence_ratio_mask=np.r_[np.zeros(P - 1), np.ones(S)].astype(np.float32))
        out.append(d)
    return out


def for_loss(data: list[Datum], loss_fn: str) -> list[Datum]:
    names = ("target_tokens", *LOSSES[loss_fn].inputs)
    return [Datum(d.tokens, {k: v for k, v in d.inputs.items() if k in names}) for d in data]


def direct_loss(model, data: list[Datum], loss_fn: str, config: dict) -> torch.Tensor:
    """Tinker's formulas (its docs' code), summed over tokens and datums, from the whole logits."""
    lo, hi = config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2)
    total = torch.zeros(())
    for d in data:
        lp = learner_logprobs(model, d)
        x = {k: torch.as_tensor(v) for k, v in d.inputs.items()}
        if loss_fn == "cross_entropy":
            total = total - (lp * x["weights"]).sum()
            continue
        slp, A = x["logprobs"], x["advantages"]
        r = torch.exp(lp - slp)
        if loss_fn == "importance_sampling":
            total = total - (r * A).sum()
        elif loss_fn == "ppo":
            total = total - torch.min(r * A, r.clamp(lo, hi) * A).sum()
        elif loss_fn == "cispo":
            total = total - (r.detach().clamp(lo, hi) * lp * A).sum()
        elif loss_fn == "dro":
            total = total - (lp * A - 0.5 * config["beta"] * (lp - slp) ** 2).sum()
        elif loss_fn == "gspo":
            log_ratio = (lp.detach() - slp)[x["sequence_ratio_mask"] != 0].mean()
            ratio = torch.exp(log_ratio + lp - lp.detach())
            total = total - torch.min(ratio * A, ratio.clamp(lo, hi) * A).sum()
    return total


def grads(model) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def assert_close_lists(got, want):
    for x, y in zip(got, want, strict=True):
        assert torch.allclose(x, y, atol=ATOL, rtol=RTOL), float((x - y).abs().max())


CASES = [("cross_entropy", {}), ("importance_sampling", {}), ("ppo", {}),
         ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}), ("cispo", {}), ("dro", {"beta": 0.3}),
         ("gspo", {}), ("gspo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.4})]


@pytest.mark.parametrize("loss_fn,config", CASES)
def test_every_loss_value_and_gradient_match_a_direct_torch_sum(policy, engine, loss_fn, config):
    ref = copy.deepcopy(policy)
    if loss_fn == "cross_entropy":
        g = np.random.default_rng(1)
        data = [sl_datum(g, vocab(engine), 4, 5), sl_datum(g, vocab(engine), 3, 8, negative=True)]
    else:
        data = for_loss(rl_datums(ref), loss_fn)
    outputs, metrics = forward_backward(engine, data, loss_fn, config, False, vocab(engine))
    want = direct_loss(ref, data, loss_fn, config)
    want.backward()
    assert metrics["loss:sum"] == pytest.approx(want.item(), rel=1e-5, abs=1e-5)
    assert_close_lists(grads(engine.model), grads(ref))
    assert any(float(x.abs().max()) > 0 for x in grads(ref))  # a gradient that can differ
    with torch.no_grad():
        for out, d in zip(outputs, data, strict=True):
            assert out["logprobs"].dtype == np.float32 and out["logprobs"].shape == (len(d.tokens),)
            assert np.allclose(out["logprobs"], learner_logprobs(ref, d).numpy(), atol=ATOL)
    assert all(k.count(":") == 1 for k in metrics)
    if loss_fn == "ppo":  # the share of the advantage-carrying tokens whose clip is active
        lo, hi = config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2)
        clipped, count = 0, 0
        for out, d in zip(outputs, data, strict=True):
            r, A = np.exp(out["logprobs"] - d.inputs["logprobs"]), d.inputs["advantages"]
            clipped += int((-A * np.clip(r, lo, hi) > -A * r)[A != 0].sum())
            count += int((A != 0).sum())
        assert 0 < clipped < count and metrics["clip_frac:mean"] == pytest.approx(clipped / count)


@pytest.mark.parametrize("micro,buckets", [(1, 1), (2, 2), (0, 3)])
def test_micro_batches_and_buckets_accumulate_the_same_sum(policy, micro, buckets):
    ref = copy.deepcopy(policy)
    data = for_loss(rl_datums(ref, seed=3), "ppo")
    engine = TorchEngine(copy.deepcopy(policy), micro_batch_size=micro)
    outputs, metrics = forward_backward(engine, data, "ppo", None, False, vocab(engine), buckets=buckets)
    want = direct_loss(ref, data, "ppo", {})
    want.backward()
    assert metrics["loss:sum"] == pytest.approx(want.item(), rel=1e-5, abs=1e-5)
    assert_close_lists(grads(engine.model), grads(ref))
    with torch.no_grad():  # each row put back in its place
        for out, d in zip(outputs, data, strict=True):
            assert np.allclose(out["logprobs"], learner_logprobs(ref, d).numpy(), atol=ATOL)


def test_a_group_sharing_its_prompt_runs_the_prompt_once_with_the_same_sum(policy, engine):
    ref = copy.deepcopy(policy)
    data = for_loss(rl_datums(ref, seed=6, group=True), "gspo")
    assert engine._packs  # the tiny Llama (SDPA) packs rows that share a prefix: the targets must survive it
    outputs, metrics = forward_backward(engine, data, "gspo", None, False, vocab(engine))
    want = direct_loss(ref, data, "gspo", {})
    want.backward()
    assert metrics["loss:sum"] == pytest.approx(want.item(), rel=1e-5, abs=1e-5)
    assert_close_lists(grads(engine.model), grads(ref))
    with torch.no_grad():
        for out, d in zip(outputs, data, strict=True):
            assert np.allclose(out["logprobs"], learner_logprobs(ref, d).numpy(), atol=ATOL)


def test_two_calls_then_one_step_equal_one_call_with_both(policy):
    data = for_loss(rl_datums(policy, seed=4), "importance_sampling")
    one, two = (TorchEngine(copy.deepcopy(policy), OptimConfig(lr=1e-2, grad_clip=0.0)) for _ in range(2))
    V = vocab(one)
    a = forward_backward(two, data[:1], "importance_sampling", None, False, V)[1]["loss:sum"]
    b = forward_backward(two, data[1:], "importance_sampling", None, False, V)[1]["loss:sum"]
    both = forward_backward(one, data, "importance_sampling", None, False, V)[1]["loss:sum"]
    assert a + b == pytest.approx(both, rel=1e-5)
    one.optim_step()
    two.optim_step()
    before = dict(policy.named_parameters())
    for (name, p), q in zip(one.model.named_parameters(), two.model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), name
    assert any(not torch.equal(p, before[n]) for n, p in one.model.named_parameters())  # the step moved weights


def test_forward_only_computes_no_gradient_and_leaves_existing_ones(policy, engine):
    ref = copy.deepcopy(policy)
    data = for_loss(rl_datums(ref, seed=5), "cispo")
    outputs, metrics = forward_backward(engine, data, "cispo", None, True, vocab(engine))
    assert all(p.grad is None for p in engine.model.parameters())
    with torch.no_grad():
        assert metrics["loss:sum"] == pytest.approx(direct_loss(ref, data, "cispo", {}).item(), rel=1e-5)
        for out, d in zip(outputs, data, strict=True):
            assert np.allclose(out["logprobs"], learner_logprobs(ref, d).numpy(), atol=ATOL)
    forward_backward(engine, data[:1], "cispo", None, False, vocab(engine))
    saved = grads(engine.model)
    forward_backward(engine, data, "cispo", None, True, vocab(engine))
    assert all(torch.equal(x, y) for x, y in zip(grads(engine.model), saved, strict=True))


def _sl(**inputs) -> Datum:
    base = {"target_tokens": np.array([2, 3, 4], np.int64), "weights": np.ones(3, np.float32)}
    return Datum([1, 2, 3], {k: v for k, v in {**base, **inputs}.items() if v is not None})


def _rl(**inputs) -> Datum:
    base = {"target_tokens": np.array([0, 3, 4], np.int64), "logprobs": np.array([0, -1, -2], np.float32),
            "advantages": np.array([0, 1, 1], np.float32)}
    return Datum([1, 2, 3], {k: v for k, v in {**base, **inputs}.items() if v is not None})


BAD = [  # (data, loss_fn, config, error, message)
    ([_sl(), _sl(weights=None)], "cross_entropy", None, WireError, r"data\[1\]\.loss_fn_inputs\['weights'\]: missing"),
    ([_rl(advantages=np.ones(2, np.float32))], "ppo", None, WireError,
     r"data\[0\]\.loss_fn_inputs\['advantages'\]: shape \(2,\) but the datum has 3 tokens"),
    ([_sl(target_tokens=np.array([2.0, 3.0, 4.0]))], "cross_entropy", None, WireError,
     r"\['target_tokens'\]: dtype float64; target tokens must be integer"),
    ([_rl(logprobs=np.array([0, np.nan, -1], np.float32))], "importance_sampling", None, WireError,
     r"data\[0\]\.loss_fn_inputs\['logprobs'\]: value nan at position 1 is not finite"),
    ([_rl(advantages=np.array([0, 1e39, 1]))], "importance_sampling", None, WireError, r"\['advantages'\]: value inf"),
    ([_sl(target_tokens=np.array([2, 3, 10**6]))], "cross_entropy", None, WireError,
     r"\['target_tokens'\]: token id 1000000 at position 2 is outside the model's vocabulary"),
    ([Datum([1, -1, 3], _sl().inputs)], "cross_entropy", None, WireError, r"data\[0\]\.model_input: token id -1"),
    ([Datum([], {})], "cross_entropy", None, WireError, r"data\[0\]\.model_input: 0 tokens"),
    ([_rl(mask=np.ones(3, np.float32))], "importance_sampling", None, WireError,
     r"\['mask'\]: not an input of importance_sampling"),
    ([_rl()], "gspo", None, WireError, r"\['sequence_ratio_mask'\]: missing"),
    ([_sl(target_tokens=np.zeros((3, 2), np.int64), weights=np.ones((3, 2), np.float32))], "cross_entropy", None,
     Unsupported, r"top-K cross_entropy"),
    ([], "cross_entropy", None, WireError, r"^data: no datums"),
    ([_rl()], "dro", None, WireError, r"loss_fn_config\['beta'\]: missing"),
    ([_rl()], "dro", {"beta": "0.1"}, WireError, r"loss_fn_config\['beta'\]: '0.1' is not a finite number"),
    ([_sl()], "cross_entropy", {"beta": 0.1}, WireError, r"loss_fn_config\['beta'\]: not a setting of cross_entropy"),
    ([_rl()], "ppo", {"clip_low_threshold": 1.5}, WireError, r"clip_low_threshold'\]: 1.5 must be >= 0 and at most"),
    ([_rl()], "stable_reinforce", None, Unsupported, r"loss_fn: 'stable_reinforce' is not supported: .*stability"),
    ([_rl()], "custom", None, Unsupported, r"loss_fn: 'custom' is not supported"),
    ([_rl()], "grpo", None, WireError, r"loss_fn: unknown loss 'grpo'; trajtune supports cross_entropy, "),
]


@pytest.mark.parametrize("data,loss_fn,config,error,message", BAD)
def test_a_bad_request_is_a_wire_error_naming_its_field_before_any_compute(engine, data, loss_fn, config, error,
                                                                            message):
    with pytest.raises(error, match=message):
        forward_backward(engine, data, loss_fn, config, False, vocab(engine), context=64)
    assert all(p.grad is None for p in engine.model.parameters())


def test_a_datum_longer_than_the_context_is_refused(engine):
    with pytest.raises(WireError, match=r"data\[0\]\.model_input: 3 tokens; the model's context is 3 positions"):
        forward_backward(engine, [_sl()], "cross_entropy", None, False, vocab(engine), context=3)
