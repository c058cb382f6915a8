"""SFT = forward KL (15.5a) and RL = reverse KL to pi_ref exp(r/beta)/Z (15.5b), by hand."""

import math

import pytest
import torch

from trajtune.objectives.kl import rl_reverse_kl, sft_forward_kl


def test_sft_forward_kl_by_hand():
    # pi* = [0.5, 0.5], pi = [0.25, 0.75]: H = ln 2; CE = (ln 4 + ln 4/3) / 2; KL = CE - H
    out = sft_forward_kl(torch.tensor([0.5, 0.5]).log(), torch.tensor([0.25, 0.75]).log())
    ce = 0.5 * (math.log(4) + math.log(4 / 3))
    assert out["fkl/target_entropy"].item() == pytest.approx(math.log(2))
    assert out["fkl/sft_loss"].item() == pytest.approx(ce)
    assert out["fkl/kl"].item() == pytest.approx(ce - math.log(2)) == pytest.approx(0.143841, abs=1e-6)
    # the KL is the direct sum_v p* log(p*/p), batched over leading axes
    target = torch.log_softmax(torch.tensor([[1.0, 0.0, -1.0], [0.0, 0.0, 3.0]]), -1)
    policy = torch.log_softmax(torch.tensor([[0.0, 2.0, 0.0], [1.0, 1.0, 1.0]]), -1)
    direct = (target.exp() * (target - policy)).sum(-1)
    assert torch.allclose(sft_forward_kl(target, policy)["fkl/kl"], direct, atol=1e-6)
    assert sft_forward_kl(target, target)["fkl/kl"].abs().max().item() < 1e-6  # SFT's floor is H(pi*)


def test_rl_reverse_kl_by_hand():
    # beta 1, ref uniform on 2 outputs, r = [ln 3, 0]: pi* = [0.75, 0.25], Z = 2
    ref = torch.tensor([0.5, 0.5]).log()
    r = torch.tensor([math.log(3.0), 0.0])
    out = rl_reverse_kl(ref, ref, r, beta=1.0)  # pi = pi_ref
    assert out["rkl/log_z"].item() == pytest.approx(math.log(2))
    assert out["rkl/kl"].item() == pytest.approx(0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25))
    assert out["rkl/objective"].item() == pytest.approx(0.5 * math.log(3)) and out["rkl/kl_to_ref"].item() == 0
    assert out["rkl/kl"].item() == pytest.approx(-out["rkl/objective"].item() + math.log(2))  # -J/beta + log Z
    best = rl_reverse_kl(torch.tensor([0.75, 0.25]).log(), ref, r, beta=1.0)  # pi = pi*: KL 0, J = beta log Z
    assert best["rkl/kl"].item() == pytest.approx(0.0, abs=1e-6)
    assert best["rkl/objective"].item() == pytest.approx(math.log(2))


def test_rl_reverse_kl_identity_on_random_distributions_and_checks():
    g = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(torch.randn(4, 5, generator=g), -1)
    ref = torch.log_softmax(torch.randn(4, 5, generator=g), -1)
    r = torch.randn(4, 5, generator=g)
    for beta in (0.1, 1.0, 3.0):
        out = rl_reverse_kl(logp, ref, r, beta)
        assert torch.allclose(out["rkl/kl"], -out["rkl/objective"] / beta + out["rkl/log_z"], atol=1e-4)
        assert (out["rkl/kl"] >= -1e-6).all()
    with pytest.raises(ValueError, match="beta"):
        rl_reverse_kl(logp, ref, r, 0.0)
    with pytest.raises(ValueError, match="rewards"):
        rl_reverse_kl(logp, ref, r[:, :3], 1.0)
