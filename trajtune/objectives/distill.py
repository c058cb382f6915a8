"""On-policy distillation: a teacher's per-token opinion of the student's own samples.

RLHF book ch.12 "Synthetic Data & Distillation", "From Offline to On-Policy
Distillation" (checklist 12.6-12.7): the student samples a ~ pi_theta and is pulled
towards the teacher with the per-token reverse KL

    L_OPD = E_{a ~ pi_theta} sum_t KL( pi_theta(.|s_t) || pi_T(.|s_t) ).

In the "one idea" table this is just another weighting: the per-token advantage

    A_t = log pi_T(a_t|s_t) - log pi_theta(a_t|s_t)

fed to `policy_gradient_loss(..., surrogate="reinforce")` gives, per token, the
score-function gradient of the sampled reverse KL, (log pi - log pi_T) grad log pi;
it can be added to a task advantage (reward shaping). Student and teacher must share
the tokenizer. `reverse_kl_loss` is the exact, full-vocabulary alternative on the same
student-visited states.
"""

from __future__ import annotations

import torch

from ..logprobs import Aggregation, aggregate, masked_mean
from ._checks import expect_dim, expect_like
from .kl import full_kl, masked_log_ratio


def distill_advantages(
    student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Per-token distillation advantage A_t = log pi_T(a_t) - log pi_theta(a_t) (book
    ch.12, "OPD as RL advantage"), on the student's sampled POLICY tokens.

    student_logp, teacher_logp, mask [B, T-1] -> [B, T-1] detached, 0 off the mask.
    Its masked mean is minus the k1 estimate of KL(student || teacher).
    """
    return -masked_log_ratio(student_logp.detach(), teacher_logp, mask)


def reverse_kl_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    aggregation: Aggregation = "token",
    constant: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Exact per-position reverse KL(pi_theta(.|s_t) || pi_T(.|s_t)) over the vocabulary,
    on states the student visited (book ch.12 eq. for L_OPD; GKD / MiniLLM family).

    student_logits, teacher_logits [B, T-1, V] at the positions that predict the tokens
    of the action mask (i.e. logits[:, :-1] of a [B, T, V] forward); mask [B, T-1].
    The teacher is treated as frozen (no gradient).
    returns (loss [], metrics distill/reverse_kl: token mean in nats).
    """
    expect_dim("student_logits", student_logits, 3)
    expect_like("teacher_logits", teacher_logits, "student_logits", student_logits)
    expect_like("mask", mask, "student_logits[..., 0]", student_logits[..., 0])
    kl_tok = full_kl(student_logits, teacher_logits.detach())  # [B, T-1]
    loss = aggregate(kl_tok, mask, aggregation, constant)
    return loss, {"distill/reverse_kl": masked_mean(kl_tok.detach(), mask)}
