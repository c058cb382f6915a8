"""The policy-gradient loss family: PPO clip regions, dual clip, CISPO, GSPO, TIS, KL, entropy, value loss."""

import math

import pytest
import torch

from trajtune.objectives.corrections import truncated_is_weights
from trajtune.objectives.inputs import PGInputs, PGOptions
from trajtune.objectives.policy_gradient import (
    log_importance_ratio,
    policy_gradient_loss,
    value_loss,
)


def _grad_at_ratio(ratio: float, adv: float, **kw) -> tuple[float, dict]:
    """d loss / d log pi for a single token whose ratio pi/pi_old is `ratio`."""
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    old = torch.zeros(1, 1)
    loss, metrics = policy_gradient_loss(logp, torch.ones(1, 1), PGInputs(torch.tensor([adv]), old), PGOptions(**kw))
    loss.backward()
    return logp.grad.item(), metrics


@pytest.mark.parametrize(
    "adv, ratio, expected_grad, clipped",
    [
        # the book's six cases ("Understanding the PPO Objective"), eps = 0.2;
        # d(-A rho)/d log pi = -A rho: negative = gradient descent raises log pi
        (+1.0, 0.5, -0.5, False),  # A > 0, rho < 1-eps: normal step up
        (+1.0, 1.0, -1.0, False),  # inside the trust region
        (+1.0, 1.5, 0.0, True),  # A > 0, rho > 1+eps: flat, no update
        (-1.0, 0.5, 0.0, True),  # A < 0, rho < 1-eps: flat, no update
        (-1.0, 1.0, +1.0, False),  # inside: step down
        (-1.0, 1.5, +1.5, False),  # A < 0, rho > 1+eps: still a normal step down
    ],
)
def test_ppo_clip_zeroes_the_gradient_only_past_the_trust_region(adv, ratio, expected_grad, clipped):
    grad, m = _grad_at_ratio(ratio, adv, surrogate="ppo")
    assert grad == pytest.approx(expected_grad, abs=1e-6)
    assert m["pg/clip_frac"].item() == float(clipped)
    assert m["pg/ratio_mean"].item() == pytest.approx(ratio)


def test_ppo_asymmetric_clip_and_dual_clip():
    assert _grad_at_ratio(1.25, +1.0, surrogate="ppo", eps_high=0.28)[0] == pytest.approx(-1.25)
    assert _grad_at_ratio(1.3, +1.0, surrogate="ppo", eps_high=0.28)[0] == 0.0
    # dual clip c = 3 caps a negative-advantage token's loss at -c A = 3
    assert _grad_at_ratio(2.0, -1.0, surrogate="ppo", dual_clip=3.0)[0] == pytest.approx(2.0)
    grad, m = _grad_at_ratio(4.0, -1.0, surrogate="ppo", dual_clip=3.0)
    assert grad == 0.0 and m["pg/clip_frac"].item() == 1.0
    logp = torch.tensor([[math.log(4.0)]])
    loss, _ = policy_gradient_loss(logp, torch.ones(1, 1), PGInputs(torch.tensor([-1.0]), torch.zeros(1, 1)),
                                   PGOptions(surrogate="ppo", dual_clip=3.0))
    assert loss.item() == pytest.approx(3.0)
    with pytest.raises(ValueError):
        _grad_at_ratio(1.0, -1.0, surrogate="ppo", dual_clip=0.5)


def test_cispo_keeps_every_tokens_gradient_with_a_clipped_weight():
    # where PPO is flat, CISPO still steps with weight clip(rho) = 1.2 / 0.8
    assert _grad_at_ratio(1.5, +1.0, surrogate="cispo")[0] == pytest.approx(-1.2)
    assert _grad_at_ratio(0.5, -1.0, surrogate="cispo")[0] == pytest.approx(+0.8)
    grad, m = _grad_at_ratio(1.1, +2.0, surrogate="cispo", eps_high=0.4)
    assert grad == pytest.approx(-2.2) and m["pg/clip_frac"].item() == 0.0


def test_gspo_token_has_the_sequence_ratios_value_and_each_tokens_gradient():
    """GSPO-token (Zheng et al. 2025, eqs. 13-14): rho_it = sg(rho_i) pi_t / sg(pi_t). Its value is the sequence
    ratio rho_i = exp(mean over M_i of (log pi - log pi_old)); d rho_it / d log pi_t = sg(rho_i), where the token
    level's d rho_t / d log pi_t = rho_t: the gradient of the token level's times sg(rho_i) / rho_t."""
    logp = torch.tensor([[-0.2, -1.0, -0.5, -3.0], [-0.3, -0.7, -2.0, -0.1]], requires_grad=True)
    old = torch.tensor([[-0.5, -0.8, -0.4, 0.0], [-0.1, -0.9, -1.0, -0.4]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    ratio_mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 1.0]])  # M_i: not the loss's mask
    seq = ((logp - old) * ratio_mask).sum(-1) / ratio_mask.sum(-1)  # [B]: log rho_i
    lr = log_importance_ratio(logp, old, mask, "sequence_token", ratio_mask)
    assert torch.allclose(lr, torch.where(mask > 0, seq[:, None], 0.0).detach(), atol=1e-6)
    up = torch.tensor([[1.0, -2.0, 0.5, 3.0], [0.3, 1.0, -1.0, 2.0]])  # d loss / d rho per token
    g_seq_tok, = torch.autograd.grad((lr.exp() * up * mask).sum(), logp)
    tok = log_importance_ratio(logp, old, mask, "token")
    g_tok, = torch.autograd.grad((tok.exp() * up * mask).sum(), logp)
    expected = g_tok * seq.detach().exp()[:, None] / tok.detach().exp()  # the token level's x sg(rho_i) / rho_t
    assert torch.allclose(g_seq_tok, expected, atol=1e-6) and g_seq_tok[0, 3] == 0  # nothing off the mask
    # in the PPO surrogate: the loss of GSPO's value, with per-token advantages
    adv = torch.tensor([[1.0, -1.0, 2.0, 0.0], [0.5, 0.5, -1.0, 1.0]])
    loss, m = policy_gradient_loss(logp, mask, PGInputs(adv, old, ratio_mask=ratio_mask),
                                   PGOptions(surrogate="ppo", ratio_level="sequence_token", aggregation="constant",
                                             constant=1.0, eps_low=10.0, eps_high=10.0))  # a clip that never bites
    rho = seq.detach().exp()[:, None]
    assert loss.item() == pytest.approx(float(-(rho * adv * mask).sum(-1).mean()), abs=1e-6)
    assert m["pg/ratio_mean"].item() == pytest.approx(float((rho * mask).sum() / mask.sum()), abs=1e-6)


def test_gspo_uses_the_length_normalised_sequence_ratio():
    old = torch.zeros(1, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    logp = torch.tensor([[0.3, -0.1, 0.1, 5.0]], requires_grad=True)  # last entry is padding
    lr = log_importance_ratio(logp, old, mask, "sequence")
    assert torch.allclose(lr, torch.full((1, 4), 0.1))
    loss, m = policy_gradient_loss(logp, mask, PGInputs(torch.tensor([1.0]), old),
                                   PGOptions(surrogate="ppo", ratio_level="sequence", aggregation="sequence"))
    rho = math.exp(0.1)
    assert loss.item() == pytest.approx(-rho)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-rho / 3] * 3 + [0.0]]))
    # sequence ratio exp(0.3) = 1.35 > 1.2: the whole sequence is clipped
    logp2 = torch.tensor([[0.5, 0.2, 0.2, 0.0]], requires_grad=True)
    loss2, m2 = policy_gradient_loss(logp2, mask, PGInputs(torch.tensor([1.0]), old),
                                     PGOptions(surrogate="ppo", ratio_level="sequence"))
    loss2.backward()
    assert torch.equal(logp2.grad, torch.zeros(1, 4)) and m2["pg/clip_frac"].item() == 1.0


def test_reinforce_on_policy_value_and_token_mean():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss, m = policy_gradient_loss(logp, mask, PGInputs(torch.tensor([1.0, -2.0])))
    assert loss.item() == pytest.approx((1 + 2 - 1.0) / 3)  # -A logp summed / 3 tokens
    assert m["pg/ratio_mean"].item() == 1.0 and m["pg/approx_kl"].item() == 0.0


def test_checklist_gradient_per_aggregation():
    """Checklist 6.13: ratio 1, A = 2, lengths 4 and 7, L_max = 7 (erratum E1: S2 = 2/11)."""
    mask = torch.zeros(2, 7)
    mask[0, :4] = 1
    mask[1] = 1
    expected = {"sequence": (0.25, 1 / 7), "constant": (1 / 7, 1 / 7), "token": (2 / 11, 2 / 11)}
    for agg, (short, long) in expected.items():
        logp = torch.zeros(2, 7, requires_grad=True)
        loss, _ = policy_gradient_loss(logp, mask, PGInputs(torch.tensor([2.0, 2.0]), torch.zeros(2, 7)),
                                       PGOptions(surrogate="ppo", aggregation=agg, constant=7))
        loss.backward()
        assert -logp.grad[0, 0].item() == pytest.approx(short, abs=1e-4), agg
        assert -logp.grad[1, 0].item() == pytest.approx(long, abs=1e-4), agg
        assert logp.grad[0, 4:].abs().sum() == 0


def test_truncated_importance_sampling_hand_values():
    logp = torch.tensor([[-1.0, -2.0]])
    sampler = torch.tensor([[-1.5, -1.0]])
    w = truncated_is_weights(logp, sampler, cap=2.0)
    assert torch.allclose(w, torch.tensor([[math.exp(0.5), math.exp(-1.0)]]))
    assert truncated_is_weights(torch.tensor([[30.0]]), torch.tensor([[0.0]]), 2.0).item() == 2.0
    loss, m = policy_gradient_loss(logp, torch.ones(1, 2), PGInputs(torch.tensor([1.0]), sampler_logp=sampler),
                                   PGOptions(tis_cap=1.5))
    assert loss.item() == pytest.approx((1.0 * 1.5 + 2.0 * math.exp(-1.0)) / 2)
    assert m["pg/tis_capped_frac"].item() == 0.5
    with pytest.raises(ValueError):
        policy_gradient_loss(logp, torch.ones(1, 2), PGInputs(torch.tensor([1.0]), sampler_logp=sampler))


def test_kl_term_and_entropy_bonus():
    logp = torch.tensor([[-1.0]], requires_grad=True)
    ref = torch.tensor([[-1.5]])
    loss, m = policy_gradient_loss(logp, torch.ones(1, 1), PGInputs(torch.tensor([0.0]), ref_logp=ref),
                                   PGOptions(kl_coef=0.1, entropy_coef=0.01), entropy=torch.tensor([[2.0]]))
    k3 = math.exp(-0.5) - 1 + 0.5  # 0.10653
    assert loss.item() == pytest.approx(0.1 * k3 - 0.02)
    assert m["kl/k3"].item() == pytest.approx(k3) and m["policy/entropy"].item() == 2.0
    loss.backward()
    assert logp.grad.item() == pytest.approx(0.1 * (1 - math.exp(-0.5)))


def test_garbage_on_padding_never_leaks():
    logp = torch.tensor([[-1.0, 50.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -50.0]])
    mask = torch.tensor([[1.0, 0.0]])
    for surrogate in ("reinforce", "ppo", "cispo"):
        loss, m = policy_gradient_loss(logp, mask, PGInputs(torch.tensor([1.0]), old, sampler_logp=old, ref_logp=old),
                                       PGOptions(surrogate=surrogate, kl_coef=0.1, tis_cap=2.0))
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(logp.grad).all() and logp.grad[0, 1] == 0
        assert all(torch.isfinite(v) for v in m.values()), surrogate
        logp.grad = None


def test_value_loss_with_clipping_hand_values():
    v = torch.tensor([[0.5, 1.0]], requires_grad=True)
    old = torch.tensor([[0.4, 1.5]])
    y = torch.tensor([[1.0, 0.0]])
    loss, m = value_loss(v, y, torch.ones(1, 2), old, clip_eps=0.2)
    # unclipped 0.125 / 0.5; clipped V = 0.5 / 1.3 -> 0.125 / 0.845; max -> mean 0.485
    assert loss.item() == pytest.approx(0.485)
    assert m["value/clip_frac"].item() == 0.5
    loss.backward()
    assert torch.allclose(v.grad, torch.tensor([[-0.25, 0.0]]))
    plain, _ = value_loss(v, y, torch.ones(1, 2))
    assert plain.item() == pytest.approx((0.125 + 0.5) / 2)
