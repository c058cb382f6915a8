"""iw-SFT trajectory weights (paper §3.4): per-step clipping + overall clip, and smoothing."""

import math

import pytest
import torch

from trajtune.objectives.importance import MAX_LOG_WEIGHT, iw_sft_loss, iw_sft_weights
from trajtune.objectives.sft import weighted_sft_loss

# per-step ratios q/ref: row 0 = [2.0, 0.5, 1.0]; row 1 = [0.1, 1.5, (padding: 100)]
REF = torch.log(torch.tensor([[0.25, 0.4, 0.3], [0.5, 0.2, 0.001]]))
Q = REF + torch.log(torch.tensor([[2.0, 0.5, 1.0], [0.1, 1.5, 100.0]]))
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_clip_variant_clips_each_step_then_the_trajectory():
    w, m = iw_sft_weights(Q, REF, MASK, variant="clip")  # steps clipped to (0.2, 1.8)
    assert torch.allclose(w, torch.tensor([1.8 * 0.5 * 1.0, 0.2 * 1.5]))
    assert m["iw/ess"].item() == pytest.approx(1.2**2 / (2 * (0.81 + 0.09)))
    w2, _ = iw_sft_weights(Q, REF, MASK, variant="clip", traj_clip=(0.5, 2.0))
    assert torch.allclose(w2, torch.tensor([0.9, 0.5]))
    with pytest.raises(ValueError):
        iw_sft_weights(Q, REF, MASK, step_clip=(1.2, 1.8))


def test_smooth_variant_is_exp_of_k_times_summed_log_ratio():
    w, _ = iw_sft_weights(Q, REF, MASK, variant="smooth", alpha=0.5)  # k = alpha / n_tokens
    assert torch.allclose(w, torch.tensor([1.0, 0.15**0.25]), atol=1e-6)
    w_raw, _ = iw_sft_weights(Q, REF, MASK, variant="smooth", alpha=0.5, length_normalize=False)  # k = alpha
    assert torch.allclose(w_raw, torch.tensor([1.0, 0.15**0.5]), atol=1e-6)
    w0, _ = iw_sft_weights(Q, REF, MASK, variant="smooth", alpha=0.0)  # alpha -> 0: plain SFT
    assert torch.equal(w0, torch.ones(2))


def test_long_trajectories_stay_finite():
    n = 1000
    q = torch.full((1, n), math.log(0.9))
    ref = torch.full((1, n), math.log(0.3))  # every step ratio 3 -> clipped 1.8
    w, m = iw_sft_weights(q, ref, torch.ones(1, n))
    assert torch.isfinite(w).all() and w.item() == pytest.approx(math.exp(MAX_LOG_WEIGHT), rel=1e-4)
    assert m["iw/log_weight_mean"].item() == pytest.approx(n * math.log(1.8), rel=1e-5)


def test_iw_sft_loss_is_weighted_sft_with_weights_as_data():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, -7.0]], requires_grad=True)
    q = Q.clone().requires_grad_(True)
    loss, m = iw_sft_loss(logp, q, REF, MASK)
    expected, _ = weighted_sft_loss(logp, MASK, torch.tensor([0.9, 0.3]))
    assert loss.item() == pytest.approx(expected.item())
    assert loss.item() == pytest.approx((0.9 * 3.5 + 0.3 * 3.1) / 5)
    loss.backward()
    assert q.grad is None  # q is a lagged copy: no gradient flows into it
    assert "iw/weight_mean" in m and "sft/nll" in m
