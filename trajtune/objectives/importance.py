"""Importance weights of iw-SFT: SFT on filtered data, re-weighted by q(tau) / pi_ref(tau).

iw-SFT paper ("Supervised Fine Tuning on Curated Data is Reinforcement Learning (and
can be improved)"), §3.3 eq. 8:

    J_iw-SFT = E_{tau in D+} [ q(tau) / pi_ref(tau) * log p(tau; theta) ]

with q a *time-lagged* copy of the policy (§3.4, eq. 10: theta_q follows theta with a
lag), so the bound tightens as q -> p(.; theta). Only the policy's own action factors
differ between q and pi_ref (the dynamics p(s'|s,a) cancel), so the weight is a
product over POLICY tokens of per-step ratios rho_t = log pi_q(a_t|s_t) - log pi_ref(a_t|s_t).
The weights are data (no gradient); the loss is `sft.weighted_sft_loss` with them.

Two ways to keep the weights tame (§3.4; we always weight full trajectories):

* "clip" — "Clipping per step importance weights": per-step ratio clipped to
  (alpha_min, alpha_max) = (1 - 0.8, 1 + 0.8), then the trajectory weight clipped to
  (beta_min, beta_max). Our reading, where the text is ambiguous: the paper writes
  clip(pi(a_t|s_t; theta), alpha_min, alpha_max) inside q(tau); a probability clipped
  to (0.2, 1.8) has a meaningless upper bound, and its footnote says the clipping is
  g(x) = clip(x, min, max) applied to the per-step ratio in eq. 11, so we clip the
  per-step *ratio* pi_q / pi_ref to (alpha_min, alpha_max). The paper gives no
  (beta_min, beta_max) here; `traj_clip=None` applies none.
* "smooth" — "Smoothing importance weights", eq. 11: q/pi_ref = exp(sum_i g(rho_i))
  with g(x) = k x. The extracted text says k = alpha * sum_i M_i, but also that
  k = 1 / sum_i M_i gives "the averaged log importance weight" and that alpha -> 0
  removes the weighting; a k growing with length would make long trajectories'
  weights explode, so we read it as k = alpha / sum_i M_i (alpha times the mean
  per-token log-ratio), `length_normalize=True`. `length_normalize=False` gives the
  continuous-control form k = alpha.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from ..logprobs import Aggregation
from ._checks import expect_dim, expect_like
from .kl import masked_log_ratio
from .sft import weighted_sft_loss

IWVariant = Literal["clip", "smooth"]
MAX_LOG_WEIGHT = 80.0
"""Numerical guard only: log-weights are capped here so exp() stays finite in float32."""


def iw_sft_weights(
    q_logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    variant: IWVariant = "clip",
    step_clip: tuple[float, float] = (0.2, 1.8),
    traj_clip: tuple[float, float] | None = None,
    alpha: float = 1.0,
    length_normalize: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Trajectory importance weights q(tau) / pi_ref(tau) for iw-SFT (paper §3.4).

    q_logp   [B, T-1]  log pi_q of each token, q = the time-lagged policy (no grad needed)
    ref_logp [B, T-1]  log pi_ref, the policy that generated the (filtered) data
    mask     [B, T-1]  1.0 on POLICY tokens: only they enter the product
    variant  "clip":   w = clip( prod_t clip(pi_q/pi_ref, *step_clip), *traj_clip )
             "smooth": w = exp(k sum_t M_t rho_t), k = alpha / sum_t M_t (length_normalize)
                       or k = alpha; then clip(w, *traj_clip) if given
    returns (weights [B] detached, metrics iw/weight_mean, iw/weight_max,
             iw/log_weight_mean, iw/ess (effective sample size / B = (sum w)^2 / (B sum w^2)))
    """
    expect_dim("q_logp", q_logp, 2)
    expect_like("ref_logp", ref_logp, "q_logp", q_logp)
    expect_like("mask", mask, "q_logp", q_logp)
    rho = masked_log_ratio(q_logp.detach(), ref_logp, mask).float()  # [B, T-1], 0 off mask
    m = (mask > 0).float()
    if variant == "clip":
        lo, hi = step_clip
        if not 0 < lo <= 1 <= hi:
            raise ValueError(f"step_clip must satisfy 0 < min <= 1 <= max, got {step_clip}")
        log_w = (rho.clamp(math.log(lo), math.log(hi)) * m).sum(-1)  # [B]
    elif variant == "smooth":
        k = alpha / m.sum(-1).clamp(min=1) if length_normalize else torch.full_like(m[:, 0], alpha)
        log_w = k * rho.sum(-1)  # [B]
    else:
        raise ValueError(f"unknown iw-SFT variant {variant!r}; choose 'clip' or 'smooth'")
    if traj_clip is not None:
        b_lo, b_hi = traj_clip
        if not 0 < b_lo <= b_hi:
            raise ValueError(f"traj_clip must satisfy 0 < min <= max, got {traj_clip}")
        log_w = log_w.clamp(math.log(b_lo), math.log(b_hi))
    w = log_w.clamp(max=MAX_LOG_WEIGHT).exp()  # [B]
    metrics = {
        "iw/weight_mean": w.mean(),
        "iw/weight_max": w.max(),
        "iw/log_weight_mean": log_w.mean(),
        "iw/ess": w.sum().pow(2) / (len(w) * w.pow(2).sum()).clamp(min=1e-30),
    }
    return w.to(q_logp.dtype), metrics


def iw_sft_loss(
    logp: torch.Tensor,
    q_logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    variant: IWVariant = "clip",
    step_clip: tuple[float, float] = (0.2, 1.8),
    traj_clip: tuple[float, float] | None = None,
    alpha: float = 1.0,
    length_normalize: bool = True,
    aggregation: Aggregation = "token",
    constant: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """iw-SFT loss (paper eq. 8): `weighted_sft_loss` with `iw_sft_weights`.

    logp [B, T-1] policy log-probs (with grad); q_logp, ref_logp, mask [B, T-1] as in
    `iw_sft_weights`. returns (loss [], metrics of both).
    """
    w, iw_metrics = iw_sft_weights(
        q_logp, ref_logp, mask, variant=variant, step_clip=step_clip, traj_clip=traj_clip,
        alpha=alpha, length_normalize=length_normalize,
    )
    loss, metrics = weighted_sft_loss(logp, mask, w, aggregation, constant)
    return loss, {**metrics, **iw_metrics}
