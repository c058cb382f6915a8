"""Issue 31's policy-gradient pieces (RLHF book ch.6, ch.15): TOPR, the adaptive KL controller, REINFORCE
baselines, reward scaling, the group advantage's std options (E7), DAPO's overlong penalty, filtering and
dynamic sampling, PPO-ptx, value-head initialization from a reward model, RL's Razor -- hand-worked numbers
first, then the loop."""

import math

import pytest
import torch

from trajtune.objectives.advantages import group_advantages, minmax_scale, moving_average_baseline, overlong_penalty
from trajtune.objectives.kl import adaptive_kl_coef, forgetting_and_forward_kl
from trajtune.objectives.policy_gradient import policy_gradient_loss


# --- TOPR (checklist 6.11) ----------------------------------------------------------------
def test_topr_weights_negative_episodes_by_their_clipped_sequence_ratio_and_leaves_positive_ones():
    # rows: A=+1 with sequence ratio e (no correction: weight 1); A=-1 with ratio 0.5 (weight 0.5);
    # A=-1 with ratio 2 (clipped to 1)
    old = torch.zeros(3, 2)
    logp = torch.tensor([[0.5, 0.5], [-math.log(2), 0.0], [math.log(2), 0.0]], requires_grad=True)
    mask = torch.ones(3, 2)
    loss, m = policy_gradient_loss(logp, torch.tensor([1.0, -1.0, -1.0]), mask, old, surrogate="topr",
                                   aggregation="sequence")
    loss.backward()
    # per-token loss -w A log pi, sequence aggregation: (1/3) sum_i (1/2) sum_t -> d/dlogp = -w A / 6
    expected = torch.tensor([[-1.0, -1.0], [0.5, 0.5], [1.0, 1.0]]) / 6
    assert torch.allclose(logp.grad, expected, atol=1e-6)
    assert m["pg/clip_frac"].item() == pytest.approx(2 / 6)  # the two tokens of row 3


def test_topr_on_policy_is_reinforce():
    logp = torch.tensor([[-0.3, -1.2]], requires_grad=True)
    a = policy_gradient_loss(logp, torch.tensor([-2.0]), torch.ones(1, 2), surrogate="topr")[0]
    b = policy_gradient_loss(logp, torch.tensor([-2.0]), torch.ones(1, 2))[0]
    assert a.item() == pytest.approx(b.item())


def test_topr_refuses_the_sequence_ratio_level():
    with pytest.raises(ValueError, match="ratio_level 'token'"):
        policy_gradient_loss(torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), torch.zeros(1, 1),
                             surrogate="topr", ratio_level="sequence")


# --- the adaptive KL controller (checklist 6.16; Ziegler et al. 2019) ----------------------
@pytest.mark.parametrize("kl, expected", [
    (0.3, 0.1 * (1 + 0.2 * 64 / 10_000)),  # KL/target - 1 = 0.5, clipped to 0.2: beta rises
    (0.21, 0.1 * (1 + 0.05 * 64 / 10_000)),  # inside the clip: e = 0.05
    (0.0, 0.1 * (1 - 0.2 * 64 / 10_000)),  # e = -1 clipped to -0.2: beta falls
    (0.2, 0.1),  # on target: unchanged
])
def test_adaptive_kl_coef_moves_beta_toward_the_target(kl, expected):
    assert adaptive_kl_coef(0.1, kl, target=0.2, horizon=10_000, n=64) == pytest.approx(expected, rel=1e-12)


def test_adaptive_kl_coef_names_bad_arguments():
    with pytest.raises(ValueError, match="target and horizon"):
        adaptive_kl_coef(0.1, 0.2, target=0.0, horizon=10, n=1)


# --- REINFORCE baselines, reward scaling, GRPO's std (E7) -----------------------------------
def test_moving_average_baseline_starts_at_the_first_batch_mean_then_decays():
    used, nxt = moving_average_baseline(None, torch.tensor([1.0, 0.0, 0.0, 1.0]), decay=0.9)
    assert (used, nxt) == (0.5, pytest.approx(0.5))
    used, nxt = moving_average_baseline(nxt, torch.tensor([1.0, 1.0]), decay=0.9)
    assert used == pytest.approx(0.5) and nxt == pytest.approx(0.9 * 0.5 + 0.1 * 1.0)
    with pytest.raises(ValueError, match="decay"):
        moving_average_baseline(None, torch.ones(2), decay=1.0)


def test_minmax_scale_maps_the_batch_to_zero_one():
    assert minmax_scale(torch.tensor([2.0, 4.0, 3.0])).tolist() == [0.0, 1.0, 0.5]
    assert minmax_scale(torch.tensor([3.0, 3.0])).tolist() == [0.0, 0.0]


def test_group_std_unbiased_and_eps_are_the_codes_by_default():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])  # mean 0.25; unbiased std sqrt(0.75/3) = 0.5, biased sqrt(0.1875)
    default = group_advantages(r, None, std_normalize=True)
    assert default[0].item() == pytest.approx(0.75 / (0.5 + 1e-4))
    biased = group_advantages(r, None, std_normalize=True, unbiased_std=False, eps=0.0)
    assert biased[0].item() == pytest.approx(0.75 / math.sqrt(0.1875))


# --- DAPO's overlong soft penalty (checklist 6.17) ------------------------------------------
def test_overlong_penalty_ramps_from_zero_to_minus_one_over_the_cache():
    # L_max 512, L_cache 128: safe = 384
    out = overlong_penalty(torch.tensor([100, 384, 448, 512, 600]), max_len=512, cache=128)
    assert out.tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]
    with pytest.raises(ValueError, match="cache"):
        overlong_penalty(torch.tensor([1]), max_len=4, cache=8)


# --- RL's Razor (checklist 15.5) -------------------------------------------------------------
def test_forgetting_and_forward_kl_on_a_constructed_case():
    # old task: pi_0 gave -1 per token to a 2-token episode, pi gives -1.5: forgetting 1.0 per episode
    # new task (samples from pi_0): log pi_0 - log pi = [0.2, 0.0] and [0.4, pad]: sequence KL 0.2, 0.4 -> 0.3
    m = forgetting_and_forward_kl(
        torch.full((1, 2), -1.0), torch.full((1, 2), -1.5), torch.ones(1, 2),
        torch.tensor([[-1.0, -2.0], [-0.5, -9.0]]), torch.tensor([[-1.2, -2.0], [-0.9, 0.0]]),
        torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
    assert m["razor/forgetting"].item() == pytest.approx(1.0)
    assert m["razor/forward_kl"].item() == pytest.approx(0.3)
