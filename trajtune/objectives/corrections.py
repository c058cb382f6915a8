"""The train-inference mismatch corrections: one detached weight per token against the sampler's log-probs.

A batch sampled by pi_sampler (weights K updates behind, vLLM's kernels, a bf16 / float8 copy) is trained as
pi_target: the proximal policy pi_old recomputed by the trainer at scoring time when the loss has it, else pi
itself (one on-policy step; its value, no gradient). Per POLICY token the mismatch is the importance ratio
rho_t = pi_target(a_t) / pi_sampler(a_t). A correction turns the ratios into a weight w [B, T-1] that
`policy_gradient.policy_gradient_loss` multiplies into the per-token surrogate loss (`PGOptions.correction`):

| correction | w_t                                                    | what it cuts              | bounds (default) |
|------------|--------------------------------------------------------|---------------------------|------------------|
| tis        | min(rho_t, C)                                          | clips tokens at C         | C = tis_cap      |
| tis_seq    | min(rho_i, C), rho_i = prod_t rho_t of the row         | clips sequences at C      | C = tis_cap      |
| mis_token  | 1[lo <= rho_t <= hi]                                   | masks tokens              | [0.5, 2]         |
| mis_seq    | 1[lo <= rho_i <= hi] on every token of row i           | masks sequences           | [0.5, 2]         |
| mis_geo    | 1[lo <= exp(mean_t log rho_t) <= hi] on row i          | masks sequences           | [0.999, 1.001]   |
| mis_veto   | 1[every token of row i has lo <= rho_t <= hi]          | masks sequences           | [1e-4, 1e4]      |
| icepop     | rho_t 1[lo <= rho_t <= hi]                             | masks tokens, both sides  | [0.5, 5]         |
| decoupled  | rho_t 1[rho_t <= C], rho_t = pi_old / pi_sampler       | masks tokens over C       | C = tis_cap, off |

TIS: RLHF book "Truncated Importance Sampling" (eqs. tis_backend, reinforce_tis, ppo_tis); tis_seq is its sequence
form (verl rollout_is "sequence", SkyRL tis_ratio_type "sequence"). The MIS masks are rejection without
reweighting (verl's rollout_rs "token" / "sequence" / "geometric" with lower bound 1/upper by default; SkyRL's
token_mask, product and geometric sequence masks); mis_veto drops a whole sequence for one outlying token (verl's
token veto, SkyRL's outlier_token mask). IcePop (Ring-1T, Ling team 2025) keeps the ratio as a weight inside
[alpha, beta] and drops the token outside it, on both sides. Decoupled PPO (AReaL, Fu et al. 2025): the PPO ratio
is taken against the proximal policy pi_old (the loss's old_logp) and the behaviour weight pi_old / pi_sampler
multiplies it; a token whose weight exceeds C is dropped (AReaL's behav_imp_weight_cap), none without C.

A masked token contributes 0 to the loss but keeps its place in the aggregation's denominator (the engine fixes a
step's normaliser from its POLICY tokens before any loss runs): masking scales the step by the kept share, as
IcePop's formula does, where verl and SkyRL also drop the masked tokens from the denominator.

Log-ratios: a token's is clamped to [-10, 10] before exp (the book's numerical safety), a sequence's sum to
[-20, 20] (verl's and SkyRL's exp(+-20) bound); the masks compare the unclamped log-ratio with log lo, log hi.
Every function: target_logp, sampler_logp, mask [B, T-1] -> (weight [B, T-1] detached, metrics {name: []}).
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch

from ..logprobs import masked_mean
from ._checks import expect_dim, expect_like

Correction = Literal["none", "tis", "tis_seq", "mis_token", "mis_seq", "mis_geo", "mis_veto", "icepop", "decoupled"]
CAPPED = ("tis", "tis_seq", "decoupled")
"""the corrections whose bound is the cap C (`tis_cap`); tis and tis_seq need it, decoupled reads it if set"""
DEFAULT_BOUNDS: dict[str, tuple[float, float]] = {
    "mis_token": (0.5, 2.0), "mis_seq": (0.5, 2.0), "mis_geo": (0.999, 1.001), "mis_veto": (1e-4, 1e4),
    "icepop": (0.5, 5.0)}
"""the band [lo, hi] of the corrections that mask (`correction_low` / `correction_high` override it)"""
TOKEN_LOG_BOUND = 10.0
SEQUENCE_LOG_BOUND = 20.0


def active_correction(correction: Correction, cap: float | None) -> Correction:
    """The correction a loss applies: `correction`, or "tis" where it is "none" and a cap is set (a tis_cap alone
    selects token TIS, the spelling from before the choice existed, so such a run computes what it did)."""
    return "tis" if correction == "none" and cap else correction


def band_of(low: float, high: float) -> tuple[float, float] | None:
    """A config's (correction_low, correction_high) as a band: None where both are 0 (the correction's default)."""
    return (low, high) if low or high else None


def check_correction(correction: str, cap: float | None, band: tuple[float, float] | None, where: str = "",
                     names: tuple[str, str] = ("tis_cap", "correction_low / correction_high"),
                     surrogate: str | None = None) -> None:
    """A ValueError starting with `where` (the config) and naming the option (`names`: how the caller spells the
    cap and the band) where they do not fit: tis / tis_seq without a cap; a cap on a correction that masks by a
    band; a band on one that has none; a band that is not 0 <= lo < hi; decoupled with `surrogate` "reinforce"
    (no ratio against pi_old)."""
    pre, (cap_name, band_name) = f"{where}: " if where else "", names
    if correction == "decoupled" and surrogate == "reinforce":
        raise ValueError(f"{pre}correction 'decoupled' is PPO against the proximal policy pi_old: it needs a "
                         "surrogate with a ratio (ppo, or cispo / sapo), not reinforce")
    if correction in ("tis", "tis_seq") and not cap:
        raise ValueError(f"{pre}correction {correction!r} truncates the importance weight at {cap_name}: set it "
                         "(e.g. 2.0)")
    if cap is not None and cap <= 0:
        raise ValueError(f"{pre}{cap_name} must be > 0, got {cap}")
    if cap and correction not in CAPPED and correction != "none":
        raise ValueError(f"{pre}{cap_name} is the cap of tis / tis_seq / decoupled; correction {correction!r} masks "
                         f"by its band ({band_name}) instead: leave {cap_name} unset")
    if band is not None:
        if correction not in DEFAULT_BOUNDS:
            raise ValueError(f"{pre}{band_name} bound the masking corrections ({', '.join(DEFAULT_BOUNDS)}); "
                             f"correction {correction!r} has no band")
        lo, hi = band
        if not 0 <= lo < hi:
            raise ValueError(f"{pre}{band_name}: need 0 <= low < high, got [{lo}, {hi}]")


def _log_ratios(target_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log pi_target - log pi_sampler [B, T-1], detached, exactly 0 off the mask (padding never becomes inf)."""
    expect_dim("target_logp", target_logp, 2)
    expect_like("sampler_logp", sampler_logp, "target_logp", target_logp)
    expect_like("mask", mask, "target_logp", target_logp)
    diff = target_logp.detach() - sampler_logp.detach()
    return torch.where(mask > 0, diff, torch.zeros_like(diff))


def _sequence_log_ratios(diff: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log rho_i = sum_t log rho_t over the row's POLICY tokens, [B, T-1] -> [B, 1] (unclamped)."""
    return (diff * mask.to(diff.dtype)).sum(-1, keepdim=True)


def _in_band(log_ratio: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """lo <= exp(log_ratio) <= hi, compared in log space (lo = 0: no lower bound). Any shape -> bool."""
    low = -math.inf if lo == 0 else math.log(lo)
    return (log_ratio >= low) & (log_ratio <= math.log(hi))


def share_metrics(cut: torch.Tensor, mask: torch.Tensor, staleness: torch.Tensor | None = None,
                  ) -> dict[str, torch.Tensor]:
    """How much a correction cut: cut [B, T-1] bool (a token masked or clipped), mask [B, T-1], staleness [B, T-1]
    long or None (update versions between the token's sampler and the trained policy; < 0: unknown).

    pg/correction_seq_frac   share of the rows with POLICY tokens that have at least one cut token
    with staleness: pg/correction_fresh_frac, pg/correction_stale_frac  share of the POLICY tokens of staleness 0,
    and of staleness >= 1, that were cut (0 where there are none)"""
    m = mask > 0
    rows = m.any(-1)  # [B]
    seq = (cut & m).any(-1)[rows].float()
    out = {"pg/correction_seq_frac": seq.mean() if rows.any() else mask.new_zeros(())}
    if staleness is not None:
        expect_like("staleness", staleness, "mask", mask)
        for name, where in (("fresh", staleness == 0), ("stale", staleness >= 1)):
            out[f"pg/correction_{name}_frac"] = masked_mean(cut.to(mask.dtype), (m & where).to(mask.dtype))
    return out


def truncated_is_weights(
    target_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float = 2.0
) -> torch.Tensor:
    """Truncated importance-sampling weights for a stale or mismatched sampler
    (RLHF book "Truncated Importance Sampling", eq. tis_backend; checklist 6.12):
    w_t = min(pi_target(a_t) / pi_sampler(a_t), C), log-ratio clamped to [-10, 10] first.

    target_logp, sampler_logp [B, T-1] -> [B, T-1] detached. One-sided: weights below 1
    are kept as they are. C = 2 is Open Instruct's value.
    """
    expect_like("sampler_logp", sampler_logp, "target_logp", target_logp)
    log_w = (target_logp.detach() - sampler_logp.detach()).clamp(-TOKEN_LOG_BOUND, TOKEN_LOG_BOUND)
    return log_w.exp().clamp(max=cap)


def tis_token(target_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, cap: float,
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token TIS: w_t = min(rho_t, C) (`truncated_is_weights`). [B, T-1] x 3 -> (w [B, T-1], metrics:
    pg/tis_weight_mean, pg/tis_capped_frac: the share of POLICY tokens whose weight hit C)."""
    w = truncated_is_weights(target_logp, sampler_logp, cap)
    return w, {"pg/tis_weight_mean": masked_mean(w, mask), "pg/tis_capped_frac": masked_mean((w >= cap).float(), mask)}


def tis_sequence(target_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, cap: float,
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Sequence TIS: w_i = min(prod_t rho_t, C) over the row's POLICY tokens, on every token of the row (the
    unbiased sequence estimator's weight, truncated). [B, T-1] x 3 -> (w [B, T-1], metrics: pg/tis_weight_mean,
    pg/tis_capped_frac (tokens), pg/correction_seq_frac (rows capped))."""
    seq = _sequence_log_ratios(_log_ratios(target_logp, sampler_logp, mask), mask)  # [B, 1]
    w = seq.clamp(-SEQUENCE_LOG_BOUND, SEQUENCE_LOG_BOUND).exp().clamp(max=cap).expand_as(mask).contiguous()
    capped = w >= cap
    return w, {"pg/tis_weight_mean": masked_mean(w, mask), "pg/tis_capped_frac": masked_mean(capped.float(), mask),
               **share_metrics(capped, mask)}


def mis_mask(target_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, level: str,
             lo: float, hi: float) -> torch.Tensor:
    """The rejection masks [B, T-1] float (1 kept, 0 masked; 1 off the mask), no reweighting:
    "token"     rho_t outside [lo, hi] masks the token
    "sequence"  rho_i = prod_t rho_t outside [lo, hi] masks the row
    "geometric" exp(mean_t log rho_t), the geometric mean of the row's token ratios, outside [lo, hi] masks the row
    "veto"      any POLICY token with rho_t outside [lo, hi] masks the row"""
    diff = _log_ratios(target_logp, sampler_logp, mask)
    m = mask > 0
    if level == "token":
        keep = _in_band(diff, lo, hi) | ~m
    elif level == "sequence":
        keep = _in_band(_sequence_log_ratios(diff, mask), lo, hi).expand_as(diff)
    elif level == "geometric":
        n = mask.to(diff.dtype).sum(-1, keepdim=True).clamp(min=1)
        keep = _in_band(_sequence_log_ratios(diff, mask) / n, lo, hi).expand_as(diff)
    elif level == "veto":
        keep = (_in_band(diff, lo, hi) | ~m).all(-1, keepdim=True).expand_as(diff)
    else:
        raise ValueError(f"unknown MIS level {level!r}; choose 'token', 'sequence', 'geometric' or 'veto'")
    return keep.to(diff.dtype)


def icepop_weights(target_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, lo: float,
                   hi: float) -> torch.Tensor:
    """IcePop: w_t = rho_t where lo <= rho_t <= hi, else 0 (both sides). [B, T-1] x 3 -> [B, T-1] detached."""
    diff = _log_ratios(target_logp, sampler_logp, mask)
    return torch.where(_in_band(diff, lo, hi), diff.exp(), torch.zeros_like(diff))


def behaviour_weights(proximal_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                      cap: float | None) -> torch.Tensor:
    """Decoupled PPO's behaviour weight: w_t = pi_prox(a_t) / pi_sampler(a_t), 0 where it exceeds C (no cap: every
    token kept; log-ratio clamped to [-10, 10]). proximal_logp, sampler_logp, mask [B, T-1] -> [B, T-1] detached."""
    diff = _log_ratios(proximal_logp, sampler_logp, mask)
    w = diff.clamp(-TOKEN_LOG_BOUND, TOKEN_LOG_BOUND).exp()
    return w if cap is None else torch.where(_in_band(diff, 0.0, cap), w, torch.zeros_like(w))


MIS_LEVELS = {"mis_token": "token", "mis_seq": "sequence", "mis_geo": "geometric", "mis_veto": "veto"}


def correction_weights(
    correction: Correction,
    target_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    cap: float | None = None,
    band: tuple[float, float] | None = None,
    staleness: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The selected correction's weight and metrics (the one place the loss calls).

    correction    one of `Correction` ("none": weight 1, no metrics)
    target_logp   [B, T-1]  pi_target: the proximal pi_old (decoupled needs it), else the policy's own log-probs
    sampler_logp  [B, T-1]  the sampler's log-probs of the same tokens
    mask          [B, T-1]  1.0 on POLICY tokens
    cap           C of tis / tis_seq / decoupled (`check_correction`)
    band          [lo, hi] of the masking corrections (None: `DEFAULT_BOUNDS`)
    staleness     [B, T-1] long or None: per token, how many updates the sampler was behind (< 0 unknown); given,
                  the cut shares are split into fresh and stale tokens (`share_metrics`)
    returns (w [B, T-1] detached, metrics): tis, tis_seq: pg/tis_weight_mean, pg/tis_capped_frac (+ rows cut);
        the others: pg/correction_masked_frac (POLICY tokens with w = 0), pg/correction_seq_frac, and for icepop /
        decoupled pg/correction_weight_mean; with staleness pg/correction_fresh_frac, pg/correction_stale_frac
    """
    check_correction(correction, cap, band)
    if correction == "none":
        return torch.ones_like(mask), {}
    if correction == "tis":
        assert cap is not None
        w, metrics = tis_token(target_logp, sampler_logp, mask, cap)
        cut = w >= cap
    elif correction == "tis_seq":
        assert cap is not None
        w, metrics = tis_sequence(target_logp, sampler_logp, mask, cap)
        cut = w >= cap
    else:
        lo, hi = band if band is not None else DEFAULT_BOUNDS.get(correction, (0.0, math.inf))
        if correction in MIS_LEVELS:
            w = mis_mask(target_logp, sampler_logp, mask, MIS_LEVELS[correction], lo, hi)
        elif correction == "icepop":
            w = icepop_weights(target_logp, sampler_logp, mask, lo, hi)
        elif correction == "decoupled":
            w = behaviour_weights(target_logp, sampler_logp, mask, cap)
        else:
            raise ValueError(f"unknown correction {correction!r}; choose one of {', '.join(get_args(Correction))}")
        cut = (w == 0) & (mask > 0)
        metrics = {"pg/correction_masked_frac": masked_mean(cut.float(), mask), **share_metrics(cut, mask)}
        if correction in ("icepop", "decoupled"):
            metrics["pg/correction_weight_mean"] = masked_mean(w, mask)
    if staleness is not None:
        metrics.update({k: v for k, v in share_metrics(cut, mask, staleness).items() if k not in metrics})
    return w, metrics
