import pytest
import torch

from trajtune.logprobs import TokenHead, aggregate, entropy_from_logits, sequence_log_probs, token_log_probs


def test_token_log_probs_match_log_softmax_and_are_stable():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=g) * 50  # large logits: naive softmax would overflow in exp
    ids = torch.randint(0, 7, (2, 5), generator=g)
    lp = token_log_probs(logits, ids)
    ref = torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert lp.shape == (2, 4)
    assert torch.allclose(lp.double(), ref, atol=1e-4)
    assert torch.isfinite(lp).all()


def test_sequence_log_probs_uses_model(tiny_model):
    ids = torch.randint(0, 40, (3, 9), generator=torch.Generator().manual_seed(1))
    lp = sequence_log_probs(tiny_model, ids)
    assert lp.shape == (3, 8) and (lp <= 0).all()


def test_entropy_uniform_and_peaked():
    assert entropy_from_logits(torch.zeros(4, 8)).allclose(torch.full((4,), torch.log(torch.tensor(8.0))))
    assert entropy_from_logits(torch.tensor([[100.0, 0, 0]])).item() == pytest.approx(0.0, abs=1e-6)


# RLHF book, "Loss Aggregation Tradeoffs": losses [1,1,1,1,10] and [1]*9+[10]
LOSSES = torch.tensor([[1, 1, 1, 1, 10, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1, 1, 10]], dtype=torch.float)
MASK = torch.tensor([[1] * 5 + [0] * 5, [1] * 10], dtype=torch.float)


def test_aggregation_worked_example():
    assert aggregate(LOSSES, MASK, "sequence").item() == pytest.approx(2.35)  # (2.8 + 1.9) / 2
    assert aggregate(LOSSES, MASK, "token").item() == pytest.approx(33 / 15)  # 2.2
    assert aggregate(LOSSES, MASK, "constant", constant=10).item() == pytest.approx((1.4 + 1.9) / 2)


def test_aggregation_gradient_example_weights_short_and_long():
    # book: ratio = 1, advantage 2, generations of 4 and 7 tokens, L_max = 7.
    # S1 0.25 vs 0.1429 and S3 0.1429 are the book's printed gradients. For S2 the book
    # prints 0.0909 = 1/11, but its code drops the advantage (checklist errata); with
    # the advantage the per-token gradient is 2/11.
    mask = torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1] * 7], dtype=torch.float)
    expected = {"sequence": (0.25, 2 / 14), "constant": (2 / 14, 2 / 14), "token": (2 / 11, 2 / 11)}
    for mode, (short, long) in expected.items():
        ratio = torch.ones(2, 7, requires_grad=True)
        aggregate(ratio * 2.0, mask, mode, constant=7).backward()
        assert ratio.grad[0, 0].item() == pytest.approx(short, rel=1e-5), mode
        assert ratio.grad[1, 0].item() == pytest.approx(long, rel=1e-5), mode
        assert (ratio.grad[0, 4:] == 0).all()


def test_aggregation_rejects_bad_arguments():
    with pytest.raises(ValueError, match="constant"):
        aggregate(LOSSES, MASK, "constant")
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(LOSSES, MASK, "mean")
    assert aggregate(LOSSES, torch.zeros_like(MASK), "token").item() == 0.0


# --- TokenHead.targets: position t's log-prob of any token (a Tinker datum's target_tokens) -------------------------
def _head_inputs(seed=0, B=3, T=7, D=16, V=50):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, T, D, generator=g, requires_grad=True)  # [B, T, D]
    w = torch.randn(V, D, generator=g).requires_grad_()  # [V, D]
    b = torch.randn(V, generator=g).requires_grad_()  # [V]
    ids = torch.randint(0, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T - 1), generator=g)
    targets[:, :2] = 0  # a prompt's positions target token 0, as the Tinker cookbook's RL datums do
    keep = torch.rand(B, T - 1, generator=g) > 0.4
    return h, w, b, ids, targets, keep


@pytest.mark.parametrize("chunk", [0, 4])
@pytest.mark.parametrize("with_keep", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_head_targets_equal_to_the_next_ids_give_the_same_floats(chunk, with_keep, temperature):
    h, w, b, ids, _, keep = _head_inputs()
    kw = dict(entropy=True, keep=keep if with_keep else None, temperature=temperature)
    plain = TokenHead(ids, chunk, **kw)(h, w, b, lambda x: x @ w.T + b)
    given = TokenHead(ids, chunk, targets=ids[:, 1:].clone(), **kw)(h, w, b, lambda x: x @ w.T + b)
    assert torch.equal(plain.logprobs, given.logprobs) and torch.equal(plain.entropy, given.entropy)
    logits = h @ w.T + b
    assert torch.equal(TokenHead(ids, **kw).of_logits(logits).logprobs,
                       TokenHead(ids, targets=ids[:, 1:].clone(), **kw).of_logits(logits).logprobs)
    assert torch.equal(token_log_probs(logits, ids), token_log_probs(logits, ids, ids[:, 1:].clone()))


@pytest.mark.parametrize("chunk", [0, 1, 4])
@pytest.mark.parametrize("with_keep", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_head_targets_gather_full_log_softmax_with_gradients(chunk, with_keep, temperature):
    h, w, b, ids, targets, keep = _head_inputs(seed=1)
    up = torch.randn(targets.shape, generator=torch.Generator().manual_seed(2))  # an upstream gradient [B, T-1]
    where = keep if with_keep else torch.ones_like(keep)
    head = TokenHead(ids, chunk, keep=keep if with_keep else None, temperature=temperature, targets=targets)
    out = head(h, w, b, lambda x: x @ w.T + b)
    got = torch.autograd.grad((out.logprobs * up).sum(), (h, w, b))
    full = torch.log_softmax((h @ w.T + b)[:, :-1] / temperature, -1)  # [B, T-1, V]
    want = torch.where(where, full.gather(-1, targets[..., None]).squeeze(-1), 0.0)  # [B, T-1]
    assert torch.allclose(out.logprobs, want, atol=1e-5) and (out.logprobs[~where] == 0).all()
    for x, y in zip(got, torch.autograd.grad((want * up).sum(), (h, w, b)), strict=True):
        assert torch.allclose(x, y, atol=1e-5), float((x - y).abs().max())
    whole = TokenHead(ids, keep=keep if with_keep else None, temperature=temperature, targets=targets)
    assert torch.allclose(whole.of_logits(h @ w.T + b).logprobs, want, atol=1e-5)


def test_token_head_refuses_targets_of_the_wrong_shape_or_dtype():
    ids = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="targets must be long"):
        TokenHead(ids, targets=torch.zeros(2, 5, dtype=torch.long))  # [B, T], not [B, T-1]
    with pytest.raises(ValueError, match="targets must be long"):
        TokenHead(ids, targets=torch.zeros(2, 4))  # float

