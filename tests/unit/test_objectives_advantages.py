"""Group baselines (REINFORCE / RLOO / GRPO / Dr. GRPO), GAE, whitening."""

import pytest
import torch

from trajtune.objectives.advantages import (
    discounted_returns,
    gae,
    group_advantages,
    group_reward_range,
    place_at_last_action,
    whiten,
)


def test_grpo_worked_value_one_success_in_four():
    # mean 0.25, unbiased std 0.5 -> A = (r - 0.25) / (0.5 + 1e-4)
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    a = group_advantages(r, torch.zeros(4, dtype=torch.long), std_normalize=True)
    assert torch.allclose(a, torch.tensor([0.75, -0.25, -0.25, -0.25]) / 0.5001)
    a_biased = group_advantages(r, None, std_normalize=True, unbiased_std=False, eps=0.0)
    assert torch.allclose(a_biased, torch.tensor([0.75, -0.25, -0.25, -0.25]) / (0.1875**0.5))


def test_rloo_matches_a_loop_for_unordered_groups_of_any_size():
    g = torch.Generator().manual_seed(0)
    groups = torch.tensor([7, 3, 7, 9, 3, 7, 3, 3, 9, 7, 5])  # sizes 4, 4, 2, 1, shuffled
    r = torch.rand(len(groups), generator=g)
    a = group_advantages(r, groups, baseline="leave_one_out")
    for i in range(len(r)):
        others = [r[j].item() for j in range(len(r)) if groups[j] == groups[i] and j != i]
        expected = r[i].item() - sum(others) / len(others) if others else 0.0
        assert a[i].item() == pytest.approx(expected, abs=1e-6)


def test_rloo_worked_value_and_dr_grpo_identity():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.2, 0.9, 0.4, 0.5]])  # [P, G]
    rloo = group_advantages(r, baseline="leave_one_out")
    assert torch.allclose(rloo[0], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    dr_grpo = group_advantages(r)  # mean baseline, no std: Dr. GRPO
    G = r.shape[1]
    assert torch.allclose(G / (G - 1) * dr_grpo, rloo, atol=1e-6)  # book eq. RLOO_GRPO_EQUIV


def test_equal_reward_groups_get_exactly_zero_advantage():
    r = torch.tensor([0.1, 0.1, 0.1, 0.3, 0.3, 0.3, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    for kw in ({}, {"baseline": "leave_one_out"}, {"std_normalize": True}, {"std_normalize": True, "eps": 0.0}):
        a = group_advantages(r, groups, **kw)
        assert (a[:6] == 0).all(), kw
        assert (a[6:] != 0).all(), kw
    spread, _ = group_reward_range(r, groups)
    assert spread.tolist() == pytest.approx([0.0, 0.0, 1.0])


def test_batch_baseline_and_flat_groups_layout():
    r = torch.tensor([1.0, 2.0, 3.0, 6.0])
    assert torch.allclose(group_advantages(r), r - 3.0)
    assert torch.allclose(group_advantages(r, baseline="none"), r)
    pg = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    flat = group_advantages(pg.reshape(-1), torch.tensor([0, 0, 1, 1]), std_normalize=True)
    assert torch.allclose(group_advantages(pg, std_normalize=True).reshape(-1), flat)
    with pytest.raises(ValueError):
        group_advantages(pg, torch.tensor([0, 1]))
    with pytest.raises(ValueError):
        group_advantages(r, torch.tensor([0, 1]))


def _gae_reference(rewards, values, mask, gamma, lam):
    """Slow recursion, one episode at a time, over its POLICY tokens only."""
    B, T = rewards.shape
    adv = torch.zeros(B, T)
    for b in range(B):
        pos = [t for t in range(T) if mask[b, t] > 0]
        acc, next_v = 0.0, 0.0
        for t in reversed(pos):
            delta = rewards[b, t].item() + gamma * next_v - values[b, t].item()
            acc = delta + gamma * lam * acc
            adv[b, t] = acc
            next_v = values[b, t].item()
    return adv


def test_gae_matches_slow_reference_with_gaps_and_padding():
    g = torch.Generator().manual_seed(1)
    B, T = 5, 13
    mask = (torch.rand(B, T, generator=g) < 0.6).float()  # tool/template gaps anywhere
    mask[3] = 0.0  # an episode without actions
    rewards = torch.randn(B, T, generator=g)
    values = torch.randn(B, T, generator=g)
    for gamma, lam in [(1.0, 0.95), (0.9, 0.5), (1.0, 1.0), (0.99, 0.0)]:
        adv, ret = gae(rewards, values, mask, gamma, lam)
        ref = _gae_reference(rewards, values, mask, gamma, lam)
        assert torch.allclose(adv, ref, atol=1e-5), (gamma, lam)
        assert torch.allclose(ret, (ref + values) * mask, atol=1e-5)


def test_gae_hand_value_and_lambda_limits():
    # r = [0, 0, 1], V = [0.5, 0.6, 0.7], gamma 1, lam 0.95:
    # deltas 0.1, 0.1, 0.3 -> A = [0.1 + 0.95 * 0.385, 0.1 + 0.95 * 0.3, 0.3] = [0.46575, 0.385, 0.3]
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.7]])
    m = torch.ones(1, 3)
    adv, ret = gae(r, v, m, 1.0, 0.95)
    assert torch.allclose(adv, torch.tensor([[0.46575, 0.385, 0.3]]))
    assert torch.allclose(ret, adv + v)
    mc, _ = gae(r, v, m, 1.0, 1.0)  # lam = 1: Monte-Carlo return minus V
    assert torch.allclose(mc, discounted_returns(r, m, 1.0) - v)
    td, _ = gae(r, v, m, 1.0, 0.0)  # lam = 0: one-step TD residual
    assert torch.allclose(td, torch.tensor([[0.1, 0.1, 0.3]]))
    boot, _ = gae(r, v, m, 1.0, 0.0, bootstrap=torch.tensor([2.0]))  # truncated episode
    assert torch.allclose(boot, torch.tensor([[0.1, 0.1, 2.3]]))


def test_discounted_returns_skip_tool_tokens():
    r = torch.tensor([[1.0, 5.0, 0.0, 2.0]])
    m = torch.tensor([[1.0, 0.0, 1.0, 1.0]])  # the 5.0 sits on a tool token: ignored
    assert torch.allclose(discounted_returns(r, m, 0.5), torch.tensor([[1.5, 0.0, 1.0, 2.0]]))


def test_place_at_last_action():
    m = torch.tensor([[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    out = place_at_last_action(torch.tensor([3.0, -1.0, 7.0]), m)
    assert torch.equal(out, torch.tensor([[0.0, 0.0, 3.0, 0.0], [0.0, 0.0, 0.0, -1.0], [0.0] * 4]))


def test_whiten_uses_only_masked_entries():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w = whiten(x, m)  # mean 2, unbiased std 1 over the three real entries
    assert torch.allclose(w, torch.tensor([[-1.0, 0.0, 1.0, 0.0]]), atol=1e-6)
    assert torch.allclose(whiten(x, m, shift_mean=False), torch.tensor([[1.0, 2.0, 3.0, 0.0]]), atol=1e-6)
