"""KL(pi || pi_ref) estimators k1/k2/k3, the reward penalty and the loss term."""

import math

import pytest
import torch

from trajtune.objectives.kl import (
    full_kl,
    kl_estimate,
    kl_loss,
    kl_penalized_rewards,
    masked_log_ratio,
    sequence_kl,
)

P = torch.tensor([0.40, 0.25, 0.15, 0.12, 0.08])  # the policy pi
Q = torch.tensor([0.30, 0.30, 0.20, 0.10, 0.10])  # the reference pi_ref


def test_k1_k3_unbiased_exactly_and_k2_biased():
    kl = (P * (P / Q).log()).sum()
    log_ratio = (P / Q).log()  # at every outcome x
    for kind in ("k1", "k3"):
        assert (P * kl_estimate(log_ratio, kind)).sum().item() == pytest.approx(kl.item(), rel=1e-5), kind
    assert full_kl(P.log(), Q.log()).item() == pytest.approx(kl.item(), rel=1e-5)
    k2_mean = (P * kl_estimate(log_ratio, "k2")).sum()
    assert abs(k2_mean.item() - kl.item()) > 1e-4  # biased (slightly, for close distributions)


def test_k1_k3_unbiased_and_k3_lower_variance_on_samples():
    g = torch.Generator().manual_seed(0)
    n = 200_000
    x = torch.multinomial(P, n, replacement=True, generator=g)  # x ~ pi
    log_ratio = (P.log() - Q.log())[x]  # [N]
    kl = (P * (P / Q).log()).sum().item()
    stats = {}
    for kind in ("k1", "k2", "k3"):
        k = kl_estimate(log_ratio, kind).double()
        stats[kind] = (k.mean().item(), k.var().item())
    print(f"\nKL exact {kl:.5f}; " + "; ".join(f"{k}: mean {m:.5f} var {v:.5f}" for k, (m, v) in stats.items()))
    for kind in ("k1", "k3"):
        mean, var = stats[kind]
        assert abs(mean - kl) < 4 * math.sqrt(var / n), kind
    assert stats["k3"][1] < 0.5 * stats["k1"][1]
    assert (kl_estimate(log_ratio, "k3") >= 0).all() and (kl_estimate(log_ratio, "k1") < 0).any()


def test_masked_log_ratio_and_sequence_kl():
    logp = torch.tensor([[-1.0, -2.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, -math.inf]])  # padding may hold anything
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert torch.equal(masked_log_ratio(logp, ref, mask), torch.tensor([[0.5, -1.0, 0.0]]))
    k3 = [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0]
    assert sequence_kl(logp, ref, mask, "k3").item() == pytest.approx(sum(k3))
    assert sequence_kl(logp, ref, mask, "k1", reduce="mean").item() == pytest.approx(-0.25)


def test_kl_penalized_rewards_put_the_outcome_on_the_last_action():
    logp = torch.tensor([[0.0, -1.0, -2.0, 0.0]])
    ref = torch.tensor([[0.0, -1.5, -1.0, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    r = kl_penalized_rewards(torch.tensor([1.0]), logp, ref, mask, beta=0.1, kind="k1")
    assert torch.allclose(r, torch.tensor([[0.0, -0.05, 1.0 + 0.1, 0.0]]))
    assert not r.requires_grad


def test_kl_loss_value_and_gradient():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]])
    loss, m = kl_loss(logp, ref, torch.ones(1, 2), "k3")
    expected = ((math.exp(-0.5) - 0.5) + (math.exp(1.0) - 2.0)) / 2
    assert loss.item() == pytest.approx(expected) and m["kl/k3"].item() == pytest.approx(expected)
    loss.backward()  # d k3 / d log pi = 1 - exp(-log_ratio)
    assert torch.allclose(logp.grad, torch.tensor([[(1 - math.exp(-0.5)) / 2, (1 - math.exp(1.0)) / 2]]))
    with pytest.raises(ValueError):
        kl_estimate(torch.zeros(1), "k4")
