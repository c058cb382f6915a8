"""SLiC-HF hinge (8.2l), APO-zero / APO-down (8.2n, 8.2o), Plackett-Luce DPO (8.1c): hand-worked values."""

import math

import pytest
import torch

from trajtune.objectives.preference import apo_loss, dpo_loss, plackett_luce_dpo_loss, slic_hinge_loss

LN3 = math.log(3.0)


def test_slic_hinge_by_hand_and_only_pairs_inside_the_margin_get_a_gradient():
    pc = torch.tensor([-2.0, -1.0], requires_grad=True)  # margins 0.5 (inside delta 1) and 3 (outside)
    pr = torch.tensor([-2.5, -4.0], requires_grad=True)
    loss, m = slic_hinge_loss(pc, pr, delta=1.0)
    assert loss.item() == pytest.approx((0.5 + 0.0) / 2)
    assert m["slic/active"].item() == 0.5 and m["slic/margin"].item() == pytest.approx(1.75)
    loss.backward()
    assert pc.grad.tolist() == [-0.5, 0.0] and pr.grad.tolist() == [0.5, 0.0]
    loss, m = slic_hinge_loss(torch.tensor([-2.0]), torch.tensor([-2.5]), delta=1.0, nll_weight=0.1)
    assert loss.item() == pytest.approx(0.5 + 0.1 * 2.0) and m["slic/nll"].item() == 2.0
    with pytest.raises(ValueError, match="delta"):
        slic_hinge_loss(pc, pr, delta=-1.0)


def test_apo_zero_and_down_by_hand():
    z = torch.zeros(1)
    for variant in ("zero", "down"):
        assert apo_loss(z, z, z, z, 1.0, variant=variant)[0].item() == pytest.approx(0.0)
    # beta 1, lr_c = ln 3 (sigma = 0.75), lr_r = 0 (sigma = 0.5)
    lc = torch.tensor([LN3])
    assert apo_loss(lc, z, z, z, 1.0, variant="zero")[0].item() == pytest.approx(-0.25)
    assert apo_loss(lc, z, z, z, 1.0, variant="down")[0].item() == pytest.approx(0.75 - 0.75)
    # lr_r = -ln 3: zero -0.75 + 0.25 = -0.5; down 0.75 - sigma(2 ln 3) = 0.75 - 0.9
    lr = torch.tensor([-LN3])
    assert apo_loss(lc, lr, z, z, 1.0, variant="zero")[0].item() == pytest.approx(-0.5)
    assert apo_loss(lc, lr, z, z, 1.0, variant="down")[0].item() == pytest.approx(-0.15)
    # the references shift the log-ratios: policy ln 3 + 1 against ref 1 is lr ln 3
    loss, m = apo_loss(lc + 1, z, torch.ones(1), z, 1.0, variant="zero")
    assert loss.item() == pytest.approx(-0.25) and m["apo/chosen_reward"].item() == pytest.approx(LN3)


def test_apo_gradients_point_the_documented_ways():
    pc = torch.zeros(1, requires_grad=True)
    pr = torch.zeros(1, requires_grad=True)
    apo_loss(pc, pr, torch.zeros(1), torch.zeros(1), 1.0, variant="zero")[0].backward()
    assert pc.grad.item() == pytest.approx(-0.25) and pr.grad.item() == pytest.approx(0.25)  # chosen up, rejected down
    pc.grad = pr.grad = None
    apo_loss(pc, pr, torch.zeros(1), torch.zeros(1), 1.0, variant="down")[0].backward()
    # d/dlc: sigma'(0) - sigma'(0) = 0; d/dlr: +sigma'(0): the rejected goes down, the chosen holds at this point
    assert pc.grad.item() == pytest.approx(0.0) and pr.grad.item() == pytest.approx(0.25)
    with pytest.raises(ValueError, match="variant"):
        apo_loss(pc, pr, pc, pr, variant="up")


def test_plackett_luce_dpo_is_dpo_at_k2_and_hand_value_at_k3():
    pc, pr = torch.tensor([-3.0, -1.0]), torch.tensor([-5.0, -1.5])
    rc, rr = torch.tensor([-4.0, -2.0]), torch.tensor([-4.0, -1.0])
    pl, _ = plackett_luce_dpo_loss(torch.stack([pc, pr], 1), torch.stack([rc, rr], 1), beta=0.5)
    assert pl.item() == pytest.approx(dpo_loss(pc, pr, rc, rr, beta=0.5)[0].item(), abs=1e-6)
    # K = 3, beta 1, implicit rewards (best first) 2, 1, 0:
    # -log P = [log(e^2 + e^1 + e^0) - 2] + [log(e^1 + e^0) - 1] + 0
    want = math.log(math.e**2 + math.e + 1) - 2 + math.log(math.e + 1) - 1
    ref = torch.zeros(1, 3)
    loss, m = plackett_luce_dpo_loss(torch.tensor([[2.0, 1.0, 0.0]]), ref, beta=1.0)
    assert loss.item() == pytest.approx(want, abs=1e-6)
    assert m["pl_dpo/top1_accuracy"].item() == 1.0 and m["pl_dpo/reward_spread"].item() == pytest.approx(2.0)
    # the same list given in another order with its ranking
    loss, _ = plackett_luce_dpo_loss(torch.tensor([[0.0, 2.0, 1.0]]), ref, beta=1.0, ranking=torch.tensor([[1, 2, 0]]))
    assert loss.item() == pytest.approx(want, abs=1e-6)
    with pytest.raises(ValueError, match="ref_logps"):
        plackett_luce_dpo_loss(torch.zeros(1, 3), torch.zeros(1, 2))
