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


def with_distill_advantages(
    advantages: torch.Tensor, student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor, coef: float
) -> torch.Tensor:
    """A task advantage plus `coef` x the OPD advantage (book ch.12, "OPD as RL advantage": it "can be added to
    other advantages (e.g. GRPO) for reward shaping"; checklist 12.7):

        A_t = A + coef * (log pi_T(a_t) - log pi_theta(a_t))      on POLICY tokens, 0 elsewhere

    advantages [B] (a sequence-level baseline: each token of episode b gets A_b) or [B, T-1] (GAE);
    student_logp, teacher_logp, mask [B, T-1] -> [B, T-1] detached (the teacher term is a reward: no gradient
    flows through either log-prob).
    """
    expect_like("mask", mask, "student_logp", student_logp)
    if advantages.shape not in (mask.shape, mask.shape[:1]):
        raise ValueError(f"advantages: expected shape {tuple(mask.shape[:1])} or {tuple(mask.shape)}, got "
                         f"{tuple(advantages.shape)}")
    adv_B_T = advantages[:, None].expand_as(mask) if advantages.dim() == 1 else advantages
    shaped = adv_B_T.detach() + coef * distill_advantages(student_logp, teacher_logp, mask)
    return torch.where(mask > 0, shaped, torch.zeros_like(shaped))


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
    return _kl_to_teacher(student_logits, teacher_logits, mask, "reverse", aggregation, constant)


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, stably (x clamped to <= -1e-7)."""
    x = x.clamp(max=-1e-7)
    return torch.where(x > -0.6931, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def top_k_with_tail(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log-probs of token `ids` and of the rest of the vocabulary as one tail bucket (book ch.12, SDPO's
    `kl_top_k`): logits [..., V], ids [..., K] long -> [..., K + 1], each row a normalised distribution
    (the tail is log(1 - sum of the K probabilities))."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    top = logp.gather(-1, ids)  # [..., K]
    return torch.cat([top, _log1mexp(torch.logsumexp(top, dim=-1, keepdim=True))], dim=-1)


def top_k_kl(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """KL(student || teacher) between two top-K-plus-tail distributions (`top_k_with_tail`) [..., K + 1] -> [...]:
    sum_j p_s,j (log p_s,j - log p_t,j). With K the whole vocabulary (no tail mass) it is the exact reverse KL."""
    expect_like("teacher", teacher, "student", student)
    p = student.exp()
    return (p * (student - teacher)).sum(-1)


def top_k_reverse_kl_loss(
    student_logits: torch.Tensor,
    top_ids: torch.Tensor,
    teacher_top: torch.Tensor,
    mask: torch.Tensor,
    aggregation: Aggregation = "token",
    constant: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SDPO's top-K reverse KL (checklist 12.9 [CC]: `kl_top_k`, a tail bucket so both sides are normalised): the
    student's distribution over its own top-K ids (chosen without gradient) and the rest, against the teacher's.

    student_logits [B, T-1, V] (grad), top_ids [B, T-1, K] long, teacher_top [B, T-1, K+1] (the teacher's
    `top_k_with_tail` at the same ids, no grad), mask [B, T-1].
    returns (loss [], metrics distill/top_k_kl: token mean in nats, distill/top_k_mass: the student's mean
    probability on its top K)."""
    expect_dim("student_logits", student_logits, 3)
    expect_like("mask", mask, "student_logits[..., 0]", student_logits[..., 0])
    s = top_k_with_tail(student_logits, top_ids)  # [B, T-1, K+1]
    kl_tok = top_k_kl(s, teacher_top.detach())  # [B, T-1]
    loss = aggregate(kl_tok, mask, aggregation, constant)
    mass = 1 - s[..., -1].detach().exp()
    return loss, {"distill/top_k_kl": masked_mean(kl_tok.detach(), mask), "distill/top_k_mass": masked_mean(mass, mask)}


def forward_kl_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    aggregation: Aggregation = "token",
    constant: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """WORD-KD / GKD's forward KL on teacher (or static) text (book ch.12, checklist 12.2, 12.4, 12.10):
    sum_t KL(pi_T(.|s_t) || pi_theta(.|s_t)) = the cross-entropy against the teacher's soft labels minus the
    teacher's entropy (mode covering). student_logits, teacher_logits [B, T-1, V], mask [B, T-1].
    returns (loss [], metrics distill/forward_kl: token mean in nats)."""
    return _kl_to_teacher(student_logits, teacher_logits, mask, "forward", aggregation, constant)


def _kl_to_teacher(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor, direction: str,
                   aggregation: Aggregation, constant: float | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The exact per-position KL between student and (frozen) teacher, reverse KL(student || teacher) or forward
    KL(teacher || student), aggregated over `mask`. logits [B, T-1, V], mask [B, T-1]."""
    expect_dim("student_logits", student_logits, 3)
    expect_like("teacher_logits", teacher_logits, "student_logits", student_logits)
    expect_like("mask", mask, "student_logits[..., 0]", student_logits[..., 0])
    teacher = teacher_logits.detach()
    kl_tok = (full_kl(student_logits, teacher) if direction == "reverse"
              else full_kl(teacher, student_logits))  # [B, T-1]
    loss = aggregate(kl_tok, mask, aggregation, constant)
    return loss, {f"distill/{direction}_kl": masked_mean(kl_tok.detach(), mask)}


def multi_teacher_advantages(
    student_logp: torch.Tensor, teacher_logps: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """MOPD (book ch.12 eq. mopd_objective): A_t = sum_k w_k(s) (log pi_Tk(a_t) - log pi_theta(a_t)).

    student_logp [B, T-1], teacher_logps [K, B, T-1], weights [B, K] (per prompt; rows sum to 1) or [K],
    mask [B, T-1] -> [B, T-1] detached, 0 off the mask."""
    expect_dim("teacher_logps", teacher_logps, 3)
    w = weights if weights.dim() == 2 else weights[None, :].expand(student_logp.shape[0], -1)  # [B, K]
    if w.shape != (student_logp.shape[0], teacher_logps.shape[0]):
        raise ValueError(f"multi_teacher_advantages: weights {tuple(weights.shape)} for {teacher_logps.shape[0]} "
                         f"teachers and {student_logp.shape[0]} rows")
    if not torch.allclose(w.sum(-1), torch.ones(w.shape[0], dtype=w.dtype), atol=1e-5):
        raise ValueError("multi_teacher_advantages: each row's teacher weights must sum to 1")
    gaps = torch.stack([distill_advantages(student_logp, t, mask) for t in teacher_logps])  # [K, B, T-1]
    return (w.T.to(gaps.dtype)[:, :, None] * gaps).sum(0)
