"""SFT / weighted SFT losses, and the gradient identity of REPRODUCE A4 on a sampled batch."""

import math

import pytest
import torch

from trajtune.logprobs import token_log_probs
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.objectives.advantages import group_advantages
from trajtune.objectives.inputs import PGInputs, PGOptions
from trajtune.objectives.policy_gradient import policy_gradient_loss
from trajtune.objectives.sft import sft_loss, weighted_nll, weighted_sft_loss
from trajtune.engine.decoding import sample
from trajtune.trajectory import Owner, Trajectory, collate


def test_weighted_nll_hand_values():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.25, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    out = weighted_nll(logp, torch.tensor([2.0, -1.0]), mask)
    assert torch.allclose(out, torch.tensor([[2.0, 4.0, 0.0], [-0.5, -0.25, 0.0]]))
    per_tok_w = torch.tensor([[1.0, 0.0, 5.0], [3.0, 1.0, 1.0]])
    assert torch.allclose(weighted_nll(logp, per_tok_w, mask), torch.tensor([[1.0, 0.0, 0.0], [1.5, 0.25, 0.0]]))


def test_padding_with_minus_inf_logp_stays_finite():
    logp = torch.tensor([[-1.0, -math.inf]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0]])
    loss, _ = sft_loss(logp, mask)
    loss.backward()
    assert loss.item() == pytest.approx(1.0)
    assert torch.isfinite(logp.grad).all()


def test_sft_loss_aggregation_worked_values():
    """Checklist 6.13 worked example: losses [1,1,1,1,10] and [1 x 9, 10]."""
    B, T = 2, 10
    logp = torch.zeros(B, T)
    mask = torch.zeros(B, T)
    logp[0, :5] = -torch.tensor([1.0, 1, 1, 1, 10])
    mask[0, :5] = 1
    logp[1] = -torch.tensor([1.0] * 9 + [10.0])
    mask[1] = 1
    assert sft_loss(logp, mask, "sequence")[0].item() == pytest.approx(2.35)
    assert sft_loss(logp, mask, "token")[0].item() == pytest.approx(2.2)
    assert sft_loss(logp, mask, "constant", 10)[0].item() == pytest.approx(1.65)


def test_weighted_sft_loss_is_minus_sum_w_logp_and_reports_metrics():
    logp = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]])
    mask = torch.ones(2, 2)
    loss, m = weighted_sft_loss(logp, mask, torch.tensor([1.0, 0.5]), "token")
    # (1*(1+2) + 0.5*(3+4)) / 4 tokens
    assert loss.item() == pytest.approx((3 + 3.5) / 4)
    assert m["sft/nll"].item() == pytest.approx(10 / 4)
    assert m["sft/weight_mean"].item() == pytest.approx(0.75)
    assert m["sft/tokens"].item() == 4


def test_shapes_are_checked():
    with pytest.raises(ValueError):
        sft_loss(torch.zeros(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError):
        weighted_sft_loss(torch.zeros(2, 3), torch.ones(2, 3), torch.ones(3))


# ---------------------------------------------------------------- REPRODUCE A4

def _flat_grad(model, loss):
    model.zero_grad()
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).clone()


def _sampled_batch(seed: int = 0):
    torch.manual_seed(seed)
    model = TinyTransformer(TinyConfig(vocab_size=16, dim=32, n_layers=2, n_heads=2, max_len=32))
    g = torch.Generator().manual_seed(seed)
    prompts = [[1, 3 + p, 4 + (p * 3) % 9, 5 + p][: 2 + p % 3] for p in range(4)]
    per_prompt = 4
    flat_prompts = [p for p in prompts for _ in range(per_prompt)]
    out = sample(model, flat_prompts, max_new_tokens=7, generator=g, stop_ids=(2,), pad_id=0)
    trajs = []
    for i, (prompt, toks, lps) in enumerate(zip(flat_prompts, out.tokens, out.logprobs, strict=True)):
        t = Trajectory()
        t.append(prompt, Owner.PROMPT, 0)
        t.append(toks, Owner.POLICY, 0, lps)
        t.reward = float(sum(toks) % 2 == 0)  # an arbitrary 0/1 verifier
        t.group = i // per_prompt
        trajs.append(t)
    return model, trajs


def test_gradient_identity_01_pg_equals_scaled_sft_on_kept():
    """grad(0/1-reward PG, token mean) = (kept action tokens / all action tokens) x grad(SFT on kept)."""
    model, trajs = _sampled_batch()
    batch = collate(trajs, pad_id=0)
    kept = [t for t in trajs if t.reward == 1.0]
    assert 0 < len(kept) < len(trajs), "the seed must give both rewards"

    logits = model(batch.ids, attention_mask=batch.attention_mask)
    logp = token_log_probs(logits, batch.ids)  # [B, T-1]
    # the sampler's log-probs are the policy's: the trajectories were built right
    on = batch.action_mask > 0
    assert (batch.old_logprobs[on] - logp.detach()[on]).abs().max() < 1e-5

    pg, _ = policy_gradient_loss(logp, batch.action_mask, PGInputs(batch.rewards), PGOptions(aggregation="token"))
    g_pg = _flat_grad(model, pg)

    kb = collate(kept, pad_id=0)
    logp_k = token_log_probs(model(kb.ids, attention_mask=kb.attention_mask), kb.ids)
    sft, _ = sft_loss(logp_k, kb.action_mask, "token")
    g_sft = _flat_grad(model, sft)

    ratio = kb.action_mask.sum() / batch.action_mask.sum()
    diff = (g_pg - ratio * g_sft).abs().max().item()
    print(f"\nA4: kept {len(kept)}/{len(trajs)} episodes, token ratio {ratio.item():.4f}, "
          f"max|grad diff| {diff:.3e}, max|grad| {g_pg.abs().max().item():.3e}")
    assert diff < 1e-6

    # the mean-baseline gradient points roughly the same way (printed, not asserted tightly)
    logp = token_log_probs(model(batch.ids, attention_mask=batch.attention_mask), batch.ids)
    adv = group_advantages(batch.rewards, batch.groups)  # REINFORCE with a group-mean baseline
    base, _ = policy_gradient_loss(logp, batch.action_mask, PGInputs(adv), PGOptions(aggregation="token"))
    g_base = _flat_grad(model, base)
    adv_b = group_advantages(batch.rewards, None)  # batch-mean baseline
    logp = token_log_probs(model(batch.ids, attention_mask=batch.attention_mask), batch.ids)
    g_batch = _flat_grad(model, policy_gradient_loss(logp, batch.action_mask, PGInputs(adv_b))[0])
    cos_group = torch.nn.functional.cosine_similarity(g_base, g_sft, dim=0).item()
    cos_batch = torch.nn.functional.cosine_similarity(g_batch, g_sft, dim=0).item()
    print(f"A4: cosine(group-mean-baseline PG, SFT on kept) = {cos_group:.4f}; "
          f"cosine(batch-mean-baseline PG, SFT on kept) = {cos_batch:.4f}")
    assert cos_batch > 0
