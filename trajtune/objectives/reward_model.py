"""Reward-model losses: Bradley-Terry (with margin), K-wise Plackett-Luce, ORM, PRM.

Sources: RLHF book ch.5 "Reward Modeling" — "Training a Bradley-Terry Reward Model"
(BT loss, both forms), the Llama 2 margin loss (ch.15 eq. margin_loss), "Other Reward
Model Variants" (K-wise Plackett-Luce, Starling / Zhu et al. 2023), "Outcome Reward
Models" (per-token BCE, labels copied onto completion tokens, -100 elsewhere) and
"Process Reward Models" (labels only at step separators). Checklist 5.2-5.7.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ._checks import expect_dim, expect_like

IGNORE_INDEX = -100
"""Label value of positions that carry no supervision (prompt tokens, non-separators)."""


def pairwise_accuracy(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> torch.Tensor:
    """Share of pairs with r_chosen > r_rejected (ties count as wrong).

    r_chosen, r_rejected [B] -> [] detached.
    """
    expect_dim("r_chosen", r_chosen, 1)
    expect_like("r_rejected", r_rejected, "r_chosen", r_chosen)
    return (r_chosen.detach() > r_rejected.detach()).float().mean()


def bradley_terry_loss(
    r_chosen: torch.Tensor,
    r_rejected: torch.Tensor,
    margin: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Bradley-Terry reward-model loss (book ch.5 eq. for the BT loss; checklist 5.2-5.3):

        L = -log sigma(r_c - r_r - m) = softplus(r_r - r_c + m)

    r_chosen, r_rejected [B] scalar rewards (with grad); margin [B] or None (Llama 2's
    rating-difference margin m; None = 0). Mean over pairs.
    returns (loss [], metrics rm/accuracy, rm/margin (mean r_c - r_r), rm/chosen, rm/rejected).
    """
    expect_dim("r_chosen", r_chosen, 1)
    expect_like("r_rejected", r_rejected, "r_chosen", r_chosen)
    diff = r_chosen - r_rejected  # [B]
    if margin is not None:
        expect_like("margin", margin, "r_chosen", r_chosen)
        diff = diff - margin.to(diff.dtype)
    loss = F.softplus(-diff).mean()
    metrics = {
        "rm/accuracy": pairwise_accuracy(r_chosen, r_rejected),
        "rm/margin": (r_chosen - r_rejected).detach().mean(),
        "rm/chosen": r_chosen.detach().mean(),
        "rm/rejected": r_rejected.detach().mean(),
    }
    return loss, metrics


def plackett_luce_loss(
    rewards: torch.Tensor, ranking: torch.Tensor | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """K-wise Plackett-Luce loss (book ch.5 "K-wise loss function"; checklist 5.5):

        P(sigma) = prod_k exp(r_sigma(k)) / sum_{j >= k} exp(r_sigma(j)),   L = -log P

    rewards [B, K] scores of K completions per prompt; ranking [B, K] long or None:
    ranking[b, k] is the index of the k-th best completion (None: already best-first).
    At K = 2 this is the Bradley-Terry loss. Mean over prompts.
    returns (loss [], metrics rm/top1_accuracy: share of prompts whose best completion
    has the highest reward).
    """
    expect_dim("rewards", rewards, 2)
    ordered = rewards if ranking is None else rewards.gather(1, ranking)  # [B, K] best first
    if ranking is not None:
        expect_like("ranking", ranking, "rewards", rewards)
    # log sum_{j >= k} exp(r_j): a reverse logcumsumexp
    tail = torch.logcumsumexp(ordered.flip(-1), dim=-1).flip(-1)  # [B, K]
    loss = (tail - ordered).sum(-1).mean()
    top1 = (ordered.detach().argmax(-1) == 0).float().mean()
    return loss, {"rm/top1_accuracy": top1}


def orm_labels(correct: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Outcome labels copied onto every completion token (book "Outcome Reward Models").

    correct [B] (0/1 or bool), mask [B, T] (1 on supervised tokens) -> labels [B, T] long,
    the outcome on masked tokens and IGNORE_INDEX (-100) elsewhere.
    """
    expect_dim("mask", mask, 2)
    expect_dim("correct", correct, 1)
    lab = correct.long()[:, None].expand_as(mask)
    return torch.where(mask > 0, lab, torch.full_like(lab, IGNORE_INDEX))


def orm_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Outcome reward model: per-token binary cross-entropy (Lightman et al.; book
    "Outcome Reward Models", code `binary_cross_entropy_with_logits(logits[mask], ...)`).

    logits [B, T] one logit per token; labels [B, T] long: 0/1 on supervised tokens,
    -100 elsewhere. Mean over supervised tokens; with none, 0 that keeps the graph.
    returns (loss [], metrics orm/accuracy (token-level, threshold 0), orm/tokens).
    """
    expect_dim("logits", logits, 2)
    expect_like("labels", labels, "logits", logits)
    sup = labels != IGNORE_INDEX
    if not sup.any():
        zero = logits.sum() * 0
        return zero, {"orm/accuracy": zero.detach(), "orm/tokens": zero.detach()}
    y = labels[sup].to(logits.dtype)
    loss = F.binary_cross_entropy_with_logits(logits[sup], y)
    acc = ((logits[sup].detach() > 0).to(y.dtype) == y).float().mean()
    return loss, {"orm/accuracy": acc, "orm/tokens": sup.sum().float()}


def orm_sequence_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Outcome reward model, the sequence-level variant (Lyu et al.; checklist 5.6): the probability of a correct
    outcome is the sigmoid of the *mean logit* over the supervised tokens (not the mean of per-token
    probabilities), p_bar = sigma((1/T) sum_t w(s_t)), with BCE(p_bar, r) per sequence, mean over sequences.

    logits [B, T] one logit per token; labels [B, T] long: the sequence's 0/1 outcome on supervised tokens, -100
    elsewhere (`orm_labels`). A row with no supervised token is left out; none at all: 0 that keeps the graph.
    returns (loss [], metrics orm/accuracy (sequence-level, threshold 0 on the mean logit), orm/sequences)."""
    expect_dim("logits", logits, 2)
    expect_like("labels", labels, "logits", logits)
    sup = labels != IGNORE_INDEX  # [B, T]
    n = sup.sum(-1)  # [B]
    rows = n > 0
    if not rows.any():
        zero = logits.sum() * 0
        return zero, {"orm/accuracy": zero.detach(), "orm/sequences": zero.detach()}
    mean_logit = (logits * sup).sum(-1)[rows] / n[rows]  # [B']
    y = labels.clamp(min=0).amax(-1)[rows].to(logits.dtype)  # [B'] the outcome copied on its tokens
    loss = F.binary_cross_entropy_with_logits(mean_logit, y)
    acc = ((mean_logit.detach() > 0).to(y.dtype) == y).float().mean()
    return loss, {"orm/accuracy": acc, "orm/sequences": rows.sum().float()}


def prm_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Process reward model: a step label only at step separators (book "Process Reward
    Models"; checklist 5.7: labels sit on the last token of each step, -100 elsewhere).

    logits [B, T, C] (C classes, e.g. 3 for {-1, 0, +1} -> {0, 1, 2}) with labels [B, T]
    class ids; or logits [B, T] (binary correct / incorrect) with labels [B, T] in {0, 1}.
    Cross-entropy (or BCE) averaged over labelled positions; 0 with the graph when none.
    returns (loss [], metrics prm/accuracy, prm/steps).
    """
    if logits.dim() == 2:
        loss, m = orm_loss(logits, labels)
        return loss, {"prm/accuracy": m["orm/accuracy"], "prm/steps": m["orm/tokens"]}
    expect_dim("logits", logits, 3)
    expect_like("labels", labels, "logits[..., 0]", logits[..., 0])
    sup = labels != IGNORE_INDEX
    if not sup.any():
        zero = logits.sum() * 0
        return zero, {"prm/accuracy": zero.detach(), "prm/steps": zero.detach()}
    loss = F.cross_entropy(logits[sup].float(), labels[sup])
    acc = (logits[sup].detach().argmax(-1) == labels[sup]).float().mean()
    return loss, {"prm/accuracy": acc, "prm/steps": sup.sum().float()}


def step_ends(owners: Sequence[int], turns: Sequence[int], policy: int,
              marked: Sequence[int] | None = None) -> list[int]:
    """Positions of the last token of each step of one episode (where a PRM's labels sit, TRL's packaging):
    `marked` where the data put them (steps inside one message), else the last token owned by `policy` in each
    turn (an agent's actions). owners, turns: [T] per token."""
    if marked is not None:
        return list(marked)
    last: dict[int, int] = {}
    for i, (o, turn) in enumerate(zip(owners, turns, strict=True)):
        if o == policy:
            last[turn] = i
    return [last[t] for t in sorted(last)]


def last_token_values(values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """values [B, T], attention_mask [B, T] -> [B]: the value at each row's last real token (a reward model's
    score of the episode)."""
    last = attention_mask.long().sum(-1) - 1  # [B]
    return values.gather(1, last[:, None]).squeeze(1)


def all_pairs_loss(rewards: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Bradley-Terry over every pair of one prompt's ranked completions (InstructGPT; book ch.5 "Other Reward
    Model Variants", checklist 5.4): all C(K,2) pairs in one batch, averaged, so each prompt is one grouped term

        L = (1 / C(K,2)) * sum_{i < j} softplus(r_j - r_i)      (i ranked above j)

    rewards [K] (K >= 2) scores of one prompt's completions, best first.
    returns (loss [], metrics rm/accuracy: share of the C(K,2) pairs ordered right (ties wrong),
    rm/margin: mean r_i - r_j over them).
    """
    expect_dim("rewards", rewards, 1)
    K = rewards.shape[0]
    if K < 2:
        raise ValueError(f"all_pairs_loss: a ranked list needs K >= 2 completions, got {K}")
    i, j = torch.triu_indices(K, K, offset=1)  # [C(K,2)] each: i above j
    diff = rewards[i] - rewards[j]  # [C(K,2)]
    return F.softplus(-diff).mean(), {"rm/accuracy": (diff.detach() > 0).float().mean(),
                                      "rm/margin": diff.detach().mean()}


AGGREGATES = ("mean", "min", "product", "last")
"""how per-token (ORM) or per-step (PRM) probabilities become one score (`aggregate_scores`)"""
MORE_AGGREGATES = ("last_m", "flag", "weighted")
"""`aggregate_scores`'s further forms (checklist 5.6e, 5.7d): mean of the last m, the any-p_t-below-tau flag, the
weighted sum favouring later steps"""


def aggregate_scores(logits: torch.Tensor, mask: torch.Tensor, how: str = "mean", *, m: int = 4,
                     tau: float = 0.5) -> torch.Tensor:
    """One score per sequence from a per-position head (book "Outcome Reward Models" / "Process Reward Models",
    checklist 5.6-5.7 inference aggregation). p_t = sigma(logit_t) at the positions `mask` marks (an ORM: the
    completion's tokens; a PRM: the last token of each step):

        mean     mean_t p_t                          (the expected correctness)
        min      min_t p_t                           (fail-fast: the weakest token or step)
        product  sum_t log p_t  = log prod_t p_t     (the chance every token / step is right, as a log)
        last     p at the last marked position       (the verdict once everything is read)
        last_m   mean p over the last m marked positions (ORM: the end of the completion)
        flag     1.0 if any p_t < tau, else 0.0      (an alarm, not a score: 1 = something looks wrong)
        weighted sum_k w_k p_k, w_k = k / sum_j j over the marked positions k = 1..K (later steps count more)

    The last three are `MORE_AGGREGATES` (functions only: `RewardKind` and `trajtune rm --aggregate` take
    `AGGREGATES`).

    logits [B, T], mask [B, T] (nonzero: scored) -> [B] (no gradient needed, but kept). A row with no marked
    position scores NaN: there is nothing to aggregate.
    """
    expect_dim("logits", logits, 2)
    expect_like("mask", mask, "logits", logits)
    if how not in AGGREGATES + MORE_AGGREGATES:
        raise ValueError(f"aggregate_scores: how must be one of {AGGREGATES + MORE_AGGREGATES}, got {how!r}")
    if how == "last_m" and m < 1:
        raise ValueError(f"aggregate_scores: m must be >= 1, got {m}")
    on = mask > 0  # [B, T]
    n = on.sum(-1)  # [B]
    nan = torch.full_like(logits[:, 0], float("nan"))
    if how == "mean":
        out = (torch.sigmoid(logits) * on).sum(-1) / n.clamp(min=1)
    elif how == "min":
        out = torch.sigmoid(logits).masked_fill(~on, float("inf")).amin(-1)
    elif how == "product":
        out = (F.logsigmoid(logits) * on).sum(-1)
    elif how in ("last_m", "weighted"):
        k = on.long().cumsum(-1)  # [B, T] the ordinal 1..K of each marked position
        if how == "last_m":
            keep = on & (k > (n[:, None] - m))  # [B, T] the last min(m, K) marked positions
            out = (torch.sigmoid(logits) * keep).sum(-1) / keep.sum(-1).clamp(min=1)
        else:
            w = (k * on).to(logits.dtype)  # [B, T]
            out = (torch.sigmoid(logits) * w).sum(-1) / w.sum(-1).clamp(min=1)
    elif how == "flag":
        out = ((torch.sigmoid(logits) < tau) & on).any(-1).to(logits.dtype)
    else:
        position = torch.arange(logits.shape[1], device=logits.device).expand_as(on)
        last = (position * on).amax(-1)  # [B] the last marked position
        out = torch.sigmoid(logits.gather(1, last[:, None]).squeeze(1))
    return torch.where(n > 0, out, nan)
