"""The policy-gradient family as ONE loss with options, plus the PPO value loss.

    per-token loss = surrogate(ratio, A) [x correction weight] + kl_coef * KL_t - entropy_coef * H_t

| method            | advantages from                       | options                                       |
|-------------------|---------------------------------------|-----------------------------------------------|
| REINFORCE / RLOO  | group_advantages(...)                 | surrogate="reinforce" (-A log pi)             |
| GRPO / Dr. GRPO   | group_advantages(..., std_normalize)  | surrogate="ppo", kl_coef>0 for GRPO's KL term |
| PPO               | gae(...) with a value head            | surrogate="ppo" (+ dual_clip), value_loss     |
| GSPO              | group_advantages(...)                 | surrogate="ppo", ratio_level="sequence"       |
| GSPO-token        | any, per token                        | surrogate="ppo", ratio_level="sequence_token" |
| CISPO             | group_advantages(...)                 | surrogate="cispo", eps_high > eps_low         |
| TOPR              | any (its sign splits the episodes)    | surrogate="topr"                              |
| + stale sampler   | any                                   | inputs.sampler_logp, correction (TIS, MIS ...)|
| distillation      | distill.distill_advantages(...)       | surrogate="reinforce"                         |

The options are a `PGOptions`, the step's tensors (advantages, old / sampler / reference log-probs) a `PGInputs`
(objectives.inputs): `policy_gradient_loss(logp, mask, inputs, options, entropy)`.

Sources: RLHF book "Policy Gradient Algorithms" (eqs. PPO_EQN_EXPANDED, GRPO_token,
GSPO_ratio / GSPO_objective, CISPO_objective / CISPO_ratio, and the TOPR paragraph after CISPO:
Le Roux et al. 2025, "Tapered Off-Policy REINFORCE"), "Implementation"
(Example: PPO / GRPO code, Truncated Importance Sampling eqs. tis_backend,
reinforce_tis, ppo_tis) and "Value Functions and PPO" (clipped value loss).
Dual clip: Ye et al. 2020 ("Mastering Complex Control in MOBA Games"), not in the book.
The train-inference mismatch corrections (TIS, MIS, IcePop, decoupled PPO) live in `corrections`.
"""

from __future__ import annotations

import torch

from ..logprobs import Aggregation, aggregate, masked_mean
from ._checks import expect_dim, expect_like, per_token
from .corrections import correction_weights
from .inputs import PGInputs, PGOptions, RatioLevel, Surrogate
from .kl import KLEstimator, kl_estimate, masked_log_ratio
from .sft import weighted_nll



def log_importance_ratio(
    logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, level: RatioLevel = "token",
    ratio_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """log rho, with the gradient flowing through `logp` (0 off the mask, so rho = 1 there).

    logp, old_logp, mask [B, T-1], ratio_mask [B, T-1] | None (the tokens a sequence ratio averages over, M_i;
    None: the mask) -> [B, T-1]
    "token":    log rho_t = log pi(a_t) - log pi_old(a_t)            (PPO / GRPO / CISPO)
    "sequence": log rho_i = (1/|M_i|) sum_{t in M_i} (log pi - log pi_old)   (GSPO, book eq. GSPO_ratio)
                the length-normalised sequence ratio, broadcast to every token of row i
    "sequence_token": log rho_it = sg(log rho_i) + log pi(a_t) - sg(log pi(a_t))   (GSPO-token: Zheng et al. 2025,
                "Group Sequence Policy Optimization", eq. 13-14; Tinker's "gspo") -- every token carries the
                sequence ratio's value and the gradient of its own log-prob: d rho_it / d log pi(a_t) = sg(rho_i)
    A row with an empty M_i has log rho_i = 0 (rho_i = 1).
    """
    diff = masked_log_ratio(logp, old_logp, mask)  # [B, T-1], 0 off the mask
    if level == "token":
        return diff
    if level in ("sequence", "sequence_token"):
        m = (mask if ratio_mask is None else ratio_mask).to(logp.dtype)
        d = diff if ratio_mask is None else logp - old_logp.detach()  # the mean over M_i, not the mask
        seq = (d * m).sum(-1) / m.sum(-1).clamp(min=1)  # [B]
        if level == "sequence":
            return seq[:, None].expand_as(diff)
        tok = seq.detach()[:, None] + (logp - logp.detach())  # [B, T-1]: the value of seq, the gradient of logp
        return torch.where(mask > 0, tok, torch.zeros_like(tok))
    raise ValueError(f"unknown ratio level {level!r}; choose 'token', 'sequence' or 'sequence_token'")


def _surrogate(
    logp: torch.Tensor,
    adv: torch.Tensor,
    log_ratio: torch.Tensor | None,
    mask: torch.Tensor,
    surrogate: Surrogate,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None,
    sapo_tau: tuple[float, float] = (1.0, 1.05),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token surrogate loss [B, T-1] and a per-token 'clipped' indicator [B, T-1]."""
    lo, hi = 1.0 - eps_low, 1.0 + eps_high
    if surrogate == "reinforce":
        if log_ratio is None:  # on-policy: -A log pi (book, canonical PG code)
            return weighted_nll(logp, adv, mask), torch.zeros_like(mask, dtype=torch.bool)
        return -adv * log_ratio.exp(), torch.zeros_like(mask, dtype=torch.bool)
    ratio = log_ratio.exp()  # [B, T-1]
    if surrogate == "ppo":  # book eq. PPO_EQN_EXPANDED, code: max(-A rho, -A clip(rho))
        pg1 = -adv * ratio
        pg2 = -adv * ratio.clamp(lo, hi)
        loss = torch.maximum(pg1, pg2)
        clipped = pg2 > pg1
        if dual_clip is not None:  # A < 0: the loss is capped at -c A (its gradient is 0 beyond)
            if dual_clip <= 1.0:
                raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
            capped = torch.minimum(loss, -adv * dual_clip)
            clipped = clipped | ((adv < 0) & (capped < loss))
            loss = torch.where(adv < 0, capped, loss)
        return loss, clipped
    if surrogate == "cispo":  # book eq. CISPO_objective: -sg(clip(rho)) A log pi
        weight = ratio.detach().clamp(lo, hi) * adv
        clipped = (ratio.detach() < lo) | (ratio.detach() > hi)
        return weighted_nll(logp, weight, mask), clipped
    if surrogate == "topr":
        return _topr(logp, adv, log_ratio, mask)
    if surrogate == "sapo":
        return _sapo(adv, ratio, sapo_tau)
    raise ValueError(f"unknown surrogate {surrogate!r}; choose 'reinforce', 'ppo', 'cispo', 'topr' or 'sapo'")


def _sapo(adv: torch.Tensor, ratio: torch.Tensor, tau: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor]:
    """SAPO (checklist 6.18, from the book's companion code [CC]): a smooth, temperature-controlled gate in place of
    PPO's hard clip, -gate(rho) A with gate = sigmoid(t (rho - 1)) 4 / t, t = tau_pos where A > 0 and tau_neg where
    A <= 0. At rho = 1 its gradient is the policy gradient (d gate / d rho = 1); away from 1 it fades smoothly
    instead of stopping at a clip edge. adv, ratio [B, T-1] -> (per-token loss [B, T-1], 'clipped' [B, T-1]: none,
    nothing is cut)."""
    tau_pos, tau_neg = tau
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"sapo: the temperatures must be > 0, got tau_pos {tau_pos}, tau_neg {tau_neg}")
    t = torch.where(adv > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))  # [B, T-1]
    gate = torch.sigmoid(t * (ratio - 1.0)) * 4.0 / t
    return -gate * adv, torch.zeros_like(ratio, dtype=torch.bool)


def _topr(
    logp: torch.Tensor, adv: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """TOPR (book ch.6, after CISPO; checklist 6.11): REINFORCE with a *sequence* importance weight clipped
    directly and by the sign of the advantage -- no correction where A >= 0 (weight 1), and
    sg(clip(rho_i, 0, 1)) where A < 0, rho_i = pi(y_i|x) / pi_old(y_i|x) = exp(sum_t log rho_t) the
    sequence ratio (the product of the token ratios, not GSPO's length-normalised one).

    logp, adv, log_ratio (token level), mask [B, T-1] -> (per-token loss -w A log pi [B, T-1],
    'clipped' [B, T-1]: the tokens of A < 0 episodes whose ratio exceeded 1 and was cut to 1)."""
    seq_log_ratio = (log_ratio.detach() * mask.to(log_ratio.dtype)).sum(-1, keepdim=True)  # [B, 1]
    seq_ratio = seq_log_ratio.clamp(max=0.0).exp().expand_as(adv)  # clip(rho, 0, 1): [B, T-1]
    weight = torch.where(adv < 0, seq_ratio, torch.ones_like(seq_ratio))
    clipped = (adv < 0) & (seq_log_ratio > 0).expand_as(adv)
    return weighted_nll(logp, weight * adv, mask), clipped


def policy_gradient_loss(
    logp: torch.Tensor,
    mask: torch.Tensor,
    inputs: PGInputs,
    options: PGOptions = PGOptions(),
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One policy-gradient loss for REINFORCE, RLOO, GRPO, Dr. GRPO, PPO, GSPO, CISPO, TOPR and SAPO.

    logp     [B, T-1]  log pi_theta of the sampled tokens (with grad)
    mask     [B, T-1]  1.0 on POLICY tokens (Batch.action_mask)
    inputs   the step's tensors (`PGInputs`, shapes there):
             advantages [B] or [B, T-1]; old_logp: log pi_old at sampling time, the ratio's denominator (None =
             on-policy, one step: rho = pi / sg(pi) = 1 with the PG gradient); sampler_logp with
             options.active_correction (both or neither): the correction's weight against the sampler, pi_old (or
             on-policy pi) over pi_sampler, on the PG term (`corrections`: TIS min(rho, C), the MIS masks, IcePop,
             decoupled PPO's behaviour weight; staleness [B, T-1] splits its cut shares); ref_logp: the GRPO-style
             KL(pi||pi_ref) term -- given ref_logp, the KL is logged whatever kl_coef (RLHF checklist 0.7: always
             log KL-to-reference) and enters the loss only when options.kl_coef > 0 (returns / old_values are the
             value loss's)
    options  `PGOptions`: surrogate
             "reinforce": -A log pi on-policy, -A rho with old_logp (no clipping)
             "ppo":   max(-A rho, -A clip(rho, 1-eps_low, 1+eps_high)); dual_clip=c > 1
                      also caps the loss of A < 0 tokens at -c A
             "cispo": -sg(clip(rho, 1-eps_low, 1+eps_high)) A log pi (no token is dropped)
             "topr":  -sg(w_i) A log pi, w_i = 1 where A >= 0, clip(rho_i, 0, 1) where A < 0 with
                      rho_i the sequence ratio (needs ratio_level "token"; eps_* unused)
             "sapo":  -gate(rho) A, gate = sigmoid(t (rho - 1)) 4 / t, t = sapo_tau[0] where A > 0 and
                      sapo_tau[1] where A <= 0 (a smooth gate, no hard clip; eps_* unused);
             ratio_level "token", "sequence" (GSPO's length-normalised sequence ratio, over inputs.ratio_mask when
             given) or "sequence_token" (GSPO-token: its value per token, each token's own gradient);
             kl_coef, kl_estimator; entropy_coef; aggregation, constant: how per-token losses become a scalar
             (logprobs.aggregate)
    entropy  [B, T-1] or None  the policy's entropy per token (the bonus: - entropy_coef x entropy)
    returns (loss [], metrics): pg/loss, pg/advantage_mean, pg/ratio_mean, pg/ratio_max,
        pg/approx_kl (k2 against pi_old), pg/clip_frac, [the correction's: pg/tis_weight_mean,
        pg/tis_capped_frac, pg/correction_*], [kl/<estimator>: with ref_logp], [policy/entropy]
    """
    o, old_logp, sampler_logp, correction = options, inputs.old_logp, inputs.sampler_logp, options.active_correction
    expect_dim("logp", logp, 2)
    expect_like("mask", mask, "logp", logp)
    adv = per_token("advantages", inputs.advantages, mask).detach().to(logp.dtype)  # [B, T-1]
    if o.surrogate == "topr" and o.ratio_level != "token":
        raise ValueError("surrogate 'topr' builds its own sequence ratio from the token ratios: "
                         "use ratio_level 'token'")
    log_ratio = None
    if old_logp is not None:
        expect_like("old_logp", old_logp, "logp", logp)
        log_ratio = log_importance_ratio(logp, old_logp, mask, o.ratio_level, inputs.ratio_mask)
    elif o.surrogate != "reinforce":  # pi_old = pi: ratio 1, same gradient as REINFORCE
        log_ratio = log_importance_ratio(logp, logp.detach(), mask, o.ratio_level, inputs.ratio_mask)
    per_tok, clipped = _surrogate(logp, adv, log_ratio, mask, o.surrogate, o.eps_low, o.eps_high, o.dual_clip,
                                  o.sapo_tau)
    metrics: dict[str, torch.Tensor] = {}
    if sampler_logp is not None or correction != "none":
        per_tok = per_tok * _correction(correction, logp, mask, inputs, o, metrics)  # [B, T-1]
    metrics["pg/loss"] = aggregate(per_tok.detach(), mask, o.aggregation, o.constant)
    per_tok = _add_regularizers(per_tok, logp, mask, inputs.ref_logp, o.kl_coef, o.kl_estimator, entropy,
                                o.entropy_coef, metrics)
    loss = aggregate(per_tok, mask, o.aggregation, o.constant)
    metrics.update(_ratio_metrics(log_ratio, clipped, adv, mask))
    return loss, metrics


def _correction(correction: str, logp: torch.Tensor, mask: torch.Tensor, inputs: PGInputs, o: PGOptions,
                metrics: dict[str, torch.Tensor]) -> torch.Tensor:
    """The selected correction's weight [B, T-1] against inputs.sampler_logp (`corrections.correction_weights`);
    its target: the proximal pi_old (inputs.old_logp) when given, else the policy's own log-probs, detached (one
    on-policy step). Logs its metrics into `metrics`."""
    if inputs.sampler_logp is None or correction == "none":
        raise ValueError("a mismatch correction needs both sampler_logp and a correction (PGOptions.correction, or "
                         f"tis_cap for truncated IS); got {'no ' if inputs.sampler_logp is None else ''}sampler_logp "
                         f"and correction {correction!r}")
    if correction == "decoupled" and inputs.old_logp is None:
        raise ValueError("correction 'decoupled' clips against the proximal policy: it needs old_logp (pi_old "
                         "recomputed at scoring time), and a surrogate with a ratio")
    target = inputs.old_logp if inputs.old_logp is not None else logp
    w, m = correction_weights(correction, target, inputs.sampler_logp, mask, o.tis_cap, o.correction_band,
                              inputs.staleness)
    metrics.update(m)
    return w


def _add_regularizers(
    per_tok: torch.Tensor,
    logp: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None,
    kl_coef: float,
    kl_estimator: KLEstimator,
    entropy: torch.Tensor | None,
    entropy_coef: float,
    metrics: dict[str, torch.Tensor],
) -> torch.Tensor:
    """per_tok + kl_coef * KL_t - entropy_coef * H_t (all [B, T-1]); logs into `metrics`: the KL whenever
    ref_logp is given (kl/<estimator> per POLICY token),
    added to the loss only when kl_coef > 0 (with kl_coef 0 it is computed without gradient)."""
    if kl_coef and ref_logp is None:
        raise ValueError("kl_coef > 0 needs ref_logp")
    if ref_logp is not None:
        kl_tok = kl_estimate(masked_log_ratio(logp if kl_coef else logp.detach(), ref_logp, mask), kl_estimator)
        if kl_coef:  # [B, T-1]
            per_tok = per_tok + kl_coef * kl_tok
        metrics[f"kl/{kl_estimator}"] = masked_mean(kl_tok.detach(), mask)
    if entropy is not None:
        expect_like("entropy", entropy, "logp", logp)
        per_tok = per_tok - entropy_coef * entropy
        metrics["policy/entropy"] = masked_mean(entropy.detach(), mask)
    return per_tok


def _ratio_metrics(
    log_ratio: torch.Tensor | None, clipped: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Logged statistics of the importance ratio (book "Example: PPO" metrics)."""
    with torch.no_grad():
        m = mask > 0
        lr = torch.zeros_like(adv) if log_ratio is None else log_ratio.detach()
        ratio = lr.exp()
        return {
            "pg/advantage_mean": masked_mean(adv, mask),
            "pg/ratio_mean": masked_mean(ratio, mask),
            "pg/ratio_max": ratio[m].max() if m.any() else ratio.new_tensor(1.0),
            "pg/approx_kl": masked_mean(0.5 * lr.pow(2), mask),
            "pg/clip_frac": masked_mean(clipped.float(), mask),
        }


def value_loss(
    values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    old_values: torch.Tensor | None = None,
    clip_eps: float | None = None,
    aggregation: Aggregation = "token",
    constant: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO critic loss (RLHF book "Value Functions and PPO", code "Basic PPO critic targets
    & loss"; checklist 6.5): 0.5 (V - y)^2, with optional value clipping

        V_clip = V_old + clamp(V - V_old, -eps_v, eps_v),  loss_t = max(0.5(V-y)^2, 0.5(V_clip-y)^2)

    values [B, T-1] (with grad), returns [B, T-1] targets (e.g. from `gae`), mask [B, T-1],
    old_values [B, T-1] critic predictions at rollout time (needed for clip_eps).
    returns (loss [], metrics: value/loss, value/clip_frac, value/explained_variance).
    Total PPO loss = policy_gradient_loss + vf_coef * value_loss.
    """
    expect_dim("values", values, 2)
    expect_like("returns", returns, "values", values)
    expect_like("mask", mask, "values", values)
    y = returns.detach()
    vf = 0.5 * (values - y).pow(2)  # [B, T-1]
    clipped = torch.zeros_like(vf, dtype=torch.bool)
    if clip_eps is not None:
        if old_values is None:
            raise ValueError("value clipping needs old_values")
        expect_like("old_values", old_values, "values", values)
        v_old = old_values.detach()
        v_clip = v_old + (values - v_old).clamp(-clip_eps, clip_eps)
        vf_clip = 0.5 * (v_clip - y).pow(2)
        clipped = vf_clip > vf
        vf = torch.maximum(vf, vf_clip)
    loss = aggregate(vf, mask, aggregation, constant)
    with torch.no_grad():
        resid = y - values.detach()
        var_y = masked_mean((y - masked_mean(y, mask)).pow(2), mask)
        var_r = masked_mean((resid - masked_mean(resid, mask)).pow(2), mask)
        metrics = {
            "value/loss": loss.detach(),
            "value/clip_frac": masked_mean(clipped.float(), mask),
            "value/explained_variance": 1.0 - var_r / var_y.clamp(min=1e-8),
        }
    return loss, metrics
