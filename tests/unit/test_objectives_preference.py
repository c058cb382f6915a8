"""DPO family: DPO (REPRODUCE A6), cDPO, IPO, DPO+NLL, SimPO, ORPO, KTO."""

import math

import pytest
import torch

from trajtune.objectives.preference import dpo_loss, kto_loss, orpo_loss, simpo_loss

Z = torch.zeros(1)


def _dpo(margin: float, beta: float = 0.5, **kw):
    return dpo_loss(torch.tensor([margin]), Z, Z, Z, beta, **kw)


@pytest.mark.parametrize("margin, expected", [(0.0, 0.6931), (4.0, 0.1269), (-4.0, 2.1269)])
def test_dpo_reproduce_a6(margin, expected):
    assert _dpo(margin)[0].item() == pytest.approx(expected, abs=5e-5)


def test_dpo_metrics_and_gradient_weight():
    pc = torch.tensor([-6.0], requires_grad=True)
    pr = torch.tensor([-5.0], requires_grad=True)
    loss, m = dpo_loss(pc, pr, torch.tensor([-10.0]), torch.tensor([-5.0]), beta=0.5)
    assert loss.item() == pytest.approx(0.126928, abs=1e-6)  # h = 4
    assert m["dpo/chosen_reward"].item() == pytest.approx(2.0) and m["dpo/rejected_reward"].item() == 0.0
    assert m["dpo/margin"].item() == pytest.approx(2.0) and m["dpo/accuracy"].item() == 1.0
    assert m["dpo/chosen_logp_drift"].item() == pytest.approx(4.0) and m["dpo/rejected_logp_drift"].item() == 0.0
    loss.backward()  # book: grad = -beta sigma(r_r - r_c) (grad log pi(y_c) - grad log pi(y_r))
    w = 0.5 * torch.sigmoid(torch.tensor(-2.0)).item()
    assert pc.grad.item() == pytest.approx(-w) and pr.grad.item() == pytest.approx(w)


def test_conservative_dpo_ipo_and_dpo_nll():
    assert _dpo(4.0, label_smoothing=0.1)[0].item() == pytest.approx(0.9 * 0.126928 + 0.1 * 2.126928, abs=1e-6)
    assert _dpo(4.0, loss_type="ipo")[0].item() == pytest.approx(9.0)  # (4 - 1/(2*0.5))^2
    assert _dpo(1.0, loss_type="ipo")[0].item() == pytest.approx(0.0)
    loss, m = dpo_loss(torch.tensor([-6.0]), torch.tensor([-5.0]), torch.tensor([-10.0]), torch.tensor([-5.0]),
                       beta=0.5, nll_weight=1.0, chosen_lengths=torch.tensor([3]))
    assert loss.item() == pytest.approx(0.126928 + 2.0, abs=1e-6)  # + alpha * 6 / 3 tokens
    assert m["dpo/nll"].item() == pytest.approx(2.0)
    with pytest.raises(ValueError):
        _dpo(1.0, nll_weight=1.0)
    with pytest.raises(ValueError):
        dpo_loss(torch.zeros(2), Z, Z, Z)


def test_simpo_and_orpo_hand_values():
    loss, m = simpo_loss(torch.tensor([-1.0]), torch.tensor([-2.0]), beta=2.0, gamma_beta_ratio=0.5)
    assert loss.item() == pytest.approx(0.313262, abs=1e-6)  # -log sigma(2*1 - 1)
    assert m["simpo/margin"].item() == pytest.approx(2.0)
    loss, m = orpo_loss(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.2)]), lam=0.1)
    # NLL log 2 + 0.1 * log(1 + 0.25): log-odds 0 vs log(0.25)
    assert loss.item() == pytest.approx(math.log(2) + 0.1 * math.log(1.25), abs=1e-6)
    assert m["orpo/log_odds_ratio"].item() == pytest.approx(math.log(4), abs=1e-6)


def test_kto_hand_values_and_reference_point():
    lp, ref = torch.tensor([2.0, -1.0]), torch.zeros(2)
    desirable = torch.tensor([True, False])
    loss, m = kto_loss(lp, ref, desirable, torch.tensor([0.5, 1.5]), beta=0.1, undesirable_weight=1.33)
    d = 1 - 1 / (1 + math.exp(-0.1))  # 1 - sigma(0.1 (2 - 1))
    u = 1.33 * (1 - 1 / (1 + math.exp(-0.2)))  # 1 - sigma(0.1 (1 - (-1)))
    assert loss.item() == pytest.approx((d + u) / 2, abs=1e-6)
    assert m["kto/z0"].item() == pytest.approx(1.0)
    _, m0 = kto_loss(lp, ref, desirable, torch.tensor([-1.0, -2.0]))
    assert m0["kto/z0"].item() == 0.0  # the reference point is clamped at 0
