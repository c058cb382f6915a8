"""Per-token log-probabilities, entropy and masked loss aggregation.

Conventions (RLHF book, "Implementation"; checklist 0.3): the log-prob of token
t+1 comes from `log_softmax(logits[:, t])` gathered at `ids[:, t+1]`, so every
per-token tensor here has length T-1 and lines up with `Batch.action_mask`.
"""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["token", "sequence", "constant"]
AGGREGATIONS: tuple[str, ...] = ("token", "sequence", "constant")


def token_log_probs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Log-probability of each next token.

    logits [B, T, V] (float), ids [B, T] (long) -> [B, T-1]: entry t is
    log pi(ids[:, t+1] | ids[:, :t+1]). Computed as gathered logit minus
    logsumexp (numerically stable, no [B, T, V] log-softmax kept for backward).
    """
    assert logits.dim() == 3 and ids.dim() == 2 and logits.shape[:2] == ids.shape, (
        f"token_log_probs: logits {tuple(logits.shape)} and ids {tuple(ids.shape)}"
    )
    logits = logits[:, :-1].float()  # [B, T-1, V]
    target = ids[:, 1:].unsqueeze(-1)  # [B, T-1, 1]
    picked = logits.gather(-1, target).squeeze(-1)  # [B, T-1]
    return picked - torch.logsumexp(logits, dim=-1)


def sequence_log_probs(model, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token log-probs of `ids` under `model`.

    model: callable `(ids [B,T], attention_mask [B,T] | None) -> logits [B,T,V]`.
    ids [B, T], attention_mask [B, T] (bool, True on real tokens) -> [B, T-1].
    Positions whose target is padding hold meaningless values: multiply by a mask.
    """
    logits = model(ids, attention_mask=attention_mask)
    return token_log_probs(logits, ids)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position.

    logits [..., V] -> [...] in nats: H = logsumexp(z) - sum softmax(z) * z.
    """
    logits = logits.float()
    logz = torch.logsumexp(logits, dim=-1)
    p = torch.softmax(logits, dim=-1)
    return logz - (p * logits).sum(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over positions where `mask` is 1 (any shape; 0 when the mask is empty)."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: Aggregation = "token",
    constant: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar: the three strategies of the RLHF book,
    "Loss Aggregation Tradeoffs" (checklist 6.13).

    per_token [B, T-1], mask [B, T-1] (1.0 on tokens that count) -> scalar.

    - "token"    (DAPO, S2): sum_i sum_t l_it / sum_i |a_i| -- every token weighs the same.
    - "sequence" (GRPO, S1): (1/B) sum_i (1/|a_i|) sum_t l_it -- every sequence weighs the
      same, so tokens of short sequences weigh more. Rows with an empty mask count as 0.
    - "constant" (Dr. GRPO, S3): (1/B) sum_i (1/C) sum_t l_it with a fixed C (e.g. the
      maximum generation length), independent of the batch.
    """
    assert per_token.shape == mask.shape, f"aggregate: {tuple(per_token.shape)} vs mask {tuple(mask.shape)}"
    assert per_token.dim() == 2, f"aggregate expects [B, T-1], got {tuple(per_token.shape)}"
    mask = mask.to(per_token.dtype)
    summed = (per_token * mask).sum(-1)  # [B]
    if mode == "token":
        return summed.sum() / mask.sum().clamp(min=1)
    if mode == "sequence":
        return (summed / mask.sum(-1).clamp(min=1)).mean()
    if mode == "constant":
        if constant is None or constant <= 0:
            raise ValueError("aggregate(mode='constant') needs a positive `constant`")
        return (summed / constant).mean()
    raise ValueError(f"unknown aggregation {mode!r}; choose one of {AGGREGATIONS}")


def aggregation_share(part_mask: torch.Tensor, whole_mask: torch.Tensor, mode: Aggregation = "token") -> float:
    """Weight of a sub-batch's `aggregate`d loss in the whole batch's: sum over the parts of
    share * aggregate(part) == aggregate(whole). Used to shard a batch across processes
    (trajtune.distributed) and to split it into micro-batches.

    part_mask [b, T-1] (rows of the whole batch), whole_mask [B, T-1] -> float in [0, 1].
    - "token": the part's POLICY tokens / the whole batch's (0 when the batch has none)
    - "sequence", "constant": the part's rows / the whole batch's rows
    """
    if mode == "token":
        total = float(whole_mask.sum())
        return float(part_mask.sum()) / total if total > 0 else 0.0
    if mode in ("sequence", "constant"):
        return part_mask.shape[0] / whole_mask.shape[0]
    raise ValueError(f"unknown aggregation {mode!r}; choose one of {AGGREGATIONS}")
