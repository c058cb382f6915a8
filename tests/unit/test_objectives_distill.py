"""On-policy distillation as a per-token advantage (book ch.12)."""

import math

import pytest
import torch

from trajtune.objectives.distill import distill_advantages, reverse_kl_loss
from trajtune.objectives.kl import full_kl
from trajtune.objectives.inputs import PGInputs, PGOptions
from trajtune.objectives.policy_gradient import policy_gradient_loss


def test_distill_advantages_hand_values():
    student = torch.tensor([[-1.0, -2.0, 0.0]], requires_grad=True)
    teacher = torch.tensor([[-0.5, -3.0, -9.0]])
    a = distill_advantages(student, teacher, torch.tensor([[1.0, 1.0, 0.0]]))
    assert torch.equal(a, torch.tensor([[0.5, -1.0, 0.0]])) and not a.requires_grad


def test_pg_with_distill_advantages_is_the_reverse_kl_gradient():
    """E_{a~pi}[-A_a grad log pi(a)] with A = log pi_T - log pi equals grad KL(pi || pi_T)."""
    theta = torch.tensor([0.3, -1.0, 0.8, 0.0], requires_grad=True)
    teacher_logits = torch.tensor([1.0, 0.2, -0.5, 0.4])
    V = len(theta)
    logp = torch.log_softmax(theta, -1)[:, None]  # every action as a one-token episode: [V, 1]
    teacher_logp = torch.log_softmax(teacher_logits, -1)[:, None]
    adv = distill_advantages(logp, teacher_logp, torch.ones(V, 1))  # [V, 1]
    probs = logp.detach().exp()  # the exact expectation over a ~ pi
    loss, _ = policy_gradient_loss(logp, torch.ones(V, 1), PGInputs(probs * adv),
                                   PGOptions(aggregation="constant", constant=1.0))
    (V * loss).backward()
    g_pg = theta.grad.clone()
    theta.grad = None
    full_kl(theta, teacher_logits).backward()
    assert torch.allclose(g_pg, theta.grad, atol=1e-6)


def test_reverse_kl_loss_hand_value():
    student = torch.zeros(1, 1, 2, requires_grad=True)
    teacher = torch.log(torch.tensor([[[0.9, 0.1]]])).requires_grad_(True)
    loss, m = reverse_kl_loss(student, teacher, torch.ones(1, 1))
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["distill/reverse_kl"].item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    assert teacher.grad is None and student.grad is not None
