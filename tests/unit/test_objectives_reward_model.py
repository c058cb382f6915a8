"""Reward-model losses: Bradley-Terry, margin, Plackett-Luce, ORM, PRM."""

import math

import pytest
import torch
import torch.nn.functional as F

from trajtune.objectives.reward_model import (
    IGNORE_INDEX,
    bradley_terry_loss,
    orm_labels,
    orm_loss,
    pairwise_accuracy,
    plackett_luce_loss,
    prm_loss,
)


def test_bradley_terry_hand_values_and_both_forms():
    rc, rr = torch.tensor([2.0, 0.0]), torch.tensor([0.0, 1.0])
    loss, m = bradley_terry_loss(rc, rr)
    assert loss.item() == pytest.approx((0.126928 + 1.313262) / 2, abs=1e-6)
    assert loss.item() == pytest.approx(-F.logsigmoid(rc - rr).mean().item(), abs=1e-6)  # checklist 5.2
    assert m["rm/accuracy"].item() == 0.5 and m["rm/margin"].item() == pytest.approx(0.5)
    with_margin, _ = bradley_terry_loss(rc, rr, margin=torch.tensor([1.0, 0.0]))
    assert with_margin.item() == pytest.approx((0.313262 + 1.313262) / 2, abs=1e-6)


def test_pairwise_accuracy_counts_ties_as_wrong():
    assert (pairwise_accuracy(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.0, 2.0, 4.0])).item()
            == pytest.approx(1 / 3))


def test_plackett_luce_reduces_to_bt_at_k2_and_hand_value_at_k3():
    r = torch.tensor([[2.0, 0.5], [-1.0, 1.0]])  # best first
    pl, _ = plackett_luce_loss(r)
    bt, _ = bradley_terry_loss(r[:, 0], r[:, 1])
    assert pl.item() == pytest.approx(bt.item(), abs=1e-6)
    # ordered [3, 1, 2]: (lse(3,1,2) - 3) + (lse(1,2) - 1) = 0.407606 + 1.313262
    loss, m = plackett_luce_loss(torch.tensor([[3.0, 1.0, 2.0]]))
    assert loss.item() == pytest.approx(1.720868, abs=1e-5)
    unordered, _ = plackett_luce_loss(torch.tensor([[1.0, 2.0, 3.0]]), ranking=torch.tensor([[2, 0, 1]]))
    assert unordered.item() == pytest.approx(1.720868, abs=1e-5)
    assert m["rm/top1_accuracy"].item() == 1.0


def test_orm_per_token_bce_ignores_unlabelled_tokens():
    mask = torch.tensor([[0, 1, 1], [0, 0, 1]])
    labels = orm_labels(torch.tensor([1, 0]), mask)
    assert labels.tolist() == [[IGNORE_INDEX, 1, 1], [IGNORE_INDEX, IGNORE_INDEX, 0]]
    logits = torch.tensor([[9.0, 2.0, -1.0], [-9.0, 5.0, 0.0]])
    loss, m = orm_loss(logits, labels)
    # BCE(2, 1) = 0.126928, BCE(-1, 1) = 1.313262, BCE(0, 0) = log 2
    assert loss.item() == pytest.approx((0.126928 + 1.313262 + math.log(2)) / 3, abs=1e-6)
    assert m["orm/tokens"].item() == 3
    none = orm_loss(logits.requires_grad_(), torch.full((2, 3), IGNORE_INDEX))[0]
    none.backward()
    assert none.item() == 0.0 and logits.grad is not None


def test_prm_loss_only_at_step_separators():
    logits = torch.zeros(1, 4, 3)
    logits[0, 3, 0] = 2.0
    labels = torch.tensor([[IGNORE_INDEX, 2, IGNORE_INDEX, 0]])
    loss, m = prm_loss(logits, labels)
    assert loss.item() == pytest.approx((math.log(3) + math.log(1 + 2 * math.exp(-2))) / 2, abs=1e-6)
    assert m["prm/steps"].item() == 2
    moved = logits.clone()
    moved[0, 0] = torch.tensor([5.0, -3.0, 1.0])  # a non-separator position: no effect
    moved[0, 2] = torch.tensor([-5.0, 3.0, 1.0])
    assert prm_loss(moved, labels)[0].item() == pytest.approx(loss.item())
    binary, _ = prm_loss(torch.tensor([[0.0, 2.0]]), torch.tensor([[IGNORE_INDEX, 1]]))
    assert binary.item() == pytest.approx(0.126928, abs=1e-6)
