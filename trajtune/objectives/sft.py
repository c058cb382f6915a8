"""The one idea as a loss: a weighted log-likelihood over POLICY tokens.

    loss = - sum_i w_i log pi_theta(tau_i)       (DESIGN.md, "The one idea";
                                                  seed agent-rl ch.15, fig. 15.1;
                                                  iw-SFT paper §3.2-3.3, eqs. 5 and 8)

`weighted_nll` is the single place where "weight times minus log-prob" is
written; SFT (w = 1), RFT (w = 1 on kept episodes), iw-SFT (w = clipped
q/pi_ref), vanilla policy gradient (w = advantage) and CISPO (w = clipped IS
ratio x advantage) all reduce to it. Per-token losses become a scalar through
`trajtune.logprobs.aggregate` (RLHF book, "Loss Aggregation Tradeoffs").
"""

from __future__ import annotations

import torch

from ..logprobs import Aggregation, aggregate, masked_mean
from ._checks import expect_dim, expect_like, per_token


def weighted_nll(logp: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token weighted negative log-likelihood  -w * log pi.

    logp    [B, T-1]  log pi_theta of each predicted token (gradient flows through it)
    weights [B] or [B, T-1]  per-sequence or per-token weights; used as given (detach
            them yourself if they depend on the policy)
    mask    [B, T-1]  1.0 on POLICY tokens (Batch.action_mask)
    returns [B, T-1]  -w * logp, zero where mask == 0
    """
    expect_dim("logp", logp, 2)
    expect_like("mask", mask, "logp", logp)
    w = per_token("weights", weights, mask).to(logp.dtype)
    nll = -(w * logp)
    return torch.where(mask > 0, nll, torch.zeros_like(nll))


def weighted_sft_loss(
    logp: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor,
    aggregation: Aggregation = "token",
    constant: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The "one idea" loss: -sum_i w_i log pi(tau_i), aggregated over POLICY tokens.

    logp    [B, T-1]  per-token log-probs of the trajectories under the policy
    mask    [B, T-1]  1.0 on POLICY tokens
    weights [B] (per trajectory) or [B, T-1] (per token), e.g. iw-SFT weights
            (iw-SFT paper eq. 8) or a 0/1 keep indicator (RFT)
    aggregation: "token" | "sequence" | "constant" (trajtune.logprobs.aggregate)
    returns (loss [], metrics) with metrics
        sft/nll          unweighted token-mean NLL on the masked tokens
        sft/weight_mean  mean weight over sequences ([B] weights) or POLICY tokens ([B, T-1])
        sft/tokens       number of POLICY tokens
    """
    per_tok = weighted_nll(logp, weights, mask)  # [B, T-1]
    loss = aggregate(per_tok, mask, aggregation, constant)
    m = mask.to(logp.dtype)
    with torch.no_grad():
        n_tok = m.sum()
        metrics = {
            "sft/nll": weighted_nll(logp.detach(), torch.ones_like(m), mask).sum() / n_tok.clamp(min=1),
            "sft/weight_mean": (
                weights.detach().float().mean() if weights.dim() == 1 else masked_mean(weights.detach(), m)
            ),
            "sft/tokens": n_tok,
        }
    return loss, metrics


def sft_loss(
    logp: torch.Tensor,
    mask: torch.Tensor,
    aggregation: Aggregation = "token",
    constant: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Masked NLL on POLICY tokens (RLHF book ch.4 "Instruction Fine-Tuning", the SFT loss;
    checklist 4.1): `weighted_sft_loss` with every weight 1.

    logp [B, T-1], mask [B, T-1] -> (loss [], metrics as in `weighted_sft_loss`).
    """
    expect_dim("logp", logp, 2)
    ones = torch.ones(logp.shape[0], dtype=logp.dtype, device=logp.device)  # [B]
    return weighted_sft_loss(logp, mask, ones, aggregation, constant)
