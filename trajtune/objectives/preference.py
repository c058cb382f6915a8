"""Direct alignment losses on (chosen, rejected) pairs: DPO and its family.

All take per-sequence log-probabilities [B] that the caller reduced over POLICY tokens
(`(token_logp * action_mask).sum(-1)`), so they work unchanged on masked multi-turn
agent episodes. With h = (log pi(y_c) - log ref(y_c)) - (log pi(y_r) - log ref(y_r)):

| loss                | formula                                                      | source                  |
|---------------------|--------------------------------------------------------------|-------------------------|
| DPO                 | -log sigma(beta h)                                           | book ch.8 eq. (DPO)     |
| conservative DPO    | (1-e)(-log sigma(beta h)) + e(-log sigma(-beta h))           | checklist 8.2 [EXT/CC]  |
| IPO                 | (h - 1/(2 beta))^2                                           | checklist 8.2 [EXT/CC]  |
| DPO + NLL (RPO)     | DPO - alpha log pi(y_c) / |y_c|                               | book ch.15 eq. dpo_nll  |
| SimPO               | -log sigma(beta (avg_c - avg_r) - gamma)                     | checklist 8.2 [EXT/CC]  |
| ORPO                | -avg_c - lambda log sigma(log_odds(avg_c) - log_odds(avg_r)) | checklist 8.2 [EXT/CC]  |
| KTO (unpaired)      | lambda_y (1 - sigma(+-beta (log pi/ref - z0)))               | checklist 8.2 [EXT/CC]  |
| dpo_norm            | DPO on per-token average log-probs (length-normalised)      | checklist 8.2 [CC]      |
| ODPO                | -log sigma(beta h - Delta), Delta = alpha f(s_c - s_r)       | checklist 8.2 [EXT]     |
| REBEL               | (h / eta - (r_c - r_r))^2                                    | checklist 8.2 [EXT]     |

In the "one idea" table the DPO gradient is a weighted log-likelihood: chosen gets
weight +beta sigma(-beta h), rejected -beta sigma(-beta h) (book eq. for grad L_DPO).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from ._checks import expect_dim, expect_like

DPOLoss = Literal["sigmoid", "ipo"]


def _pairs(*named: tuple[str, torch.Tensor]) -> None:
    """Check that every tensor is [B] with the same B."""
    first_name, first = named[0]
    expect_dim(first_name, first, 1)
    for name, t in named[1:]:
        expect_like(name, t, first_name, first)


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    *,
    loss_type: DPOLoss = "sigmoid",
    label_smoothing: float = 0.0,
    nll_weight: float = 0.0,
    chosen_lengths: torch.Tensor | None = None,
    offset: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPO and its pairwise variants (RLHF book ch.8 "Direct Alignment Algorithms",
    eq. for L_DPO and the "Implementation Details" code; checklist 8.1-8.2).

    policy_chosen_logps, policy_rejected_logps  [B]  summed log pi over POLICY tokens (grad)
    ref_chosen_logps, ref_rejected_logps        [B]  same under the frozen reference
    beta             KL strength (typical 0.1-0.5)
    loss_type        "sigmoid" (DPO; with label_smoothing=e > 0: conservative DPO / cDPO)
                     "ipo"     (h - 1/(2 beta))^2, a regression to a target margin
    nll_weight       alpha of DPO+NLL (Pang et al. "Iterative RPO", book eq. dpo_nll):
                     adds -alpha log pi(y_c) / |y_c|; needs chosen_lengths [B] (token counts)
    offset           [B] or None: ODPO's Delta (Amini et al. 2024; `odpo_offset`), -log sigma(beta h - Delta):
                     the margin must exceed an offset that grows with how much better the chosen one is
                     (sigmoid only). Length-normalised DPO (dpo_norm) is this loss on average log-probs.
    returns (loss [] mean over pairs, metrics):
        dpo/chosen_reward, dpo/rejected_reward  beta (log pi - log ref), batch means
        dpo/margin (chosen - rejected reward), dpo/accuracy (share with margin > 0),
        dpo/chosen_logp_drift, dpo/rejected_logp_drift  log pi - log ref in nats (A7's
        d_chosen / d_rejected), dpo/nll when nll_weight > 0
    Worked values (REPRODUCE A6): beta 0.5, h = 0 / +4 / -4 -> 0.6931 / 0.1269 / 2.1269.
    """
    _pairs(
        ("policy_chosen_logps", policy_chosen_logps),
        ("policy_rejected_logps", policy_rejected_logps),
        ("ref_chosen_logps", ref_chosen_logps),
        ("ref_rejected_logps", ref_rejected_logps),
    )
    d_chosen = policy_chosen_logps - ref_chosen_logps.detach()  # [B]
    d_rejected = policy_rejected_logps - ref_rejected_logps.detach()  # [B]
    h = d_chosen - d_rejected  # [B]
    if offset is not None and loss_type != "sigmoid":
        raise ValueError(f"dpo_loss: an ODPO offset needs loss_type 'sigmoid', got {loss_type!r}")
    if loss_type == "sigmoid":
        z = beta * h if offset is None else beta * h - offset.to(h.dtype)
        if offset is not None:
            expect_like("offset", offset, "policy_chosen_logps", policy_chosen_logps)
        losses = -(1.0 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    elif loss_type == "ipo":
        losses = (h - 1.0 / (2.0 * beta)).pow(2)
    else:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; choose 'sigmoid' or 'ipo'")
    metrics = _reward_metrics("dpo", beta * d_chosen, beta * d_rejected)
    metrics["dpo/chosen_logp_drift"] = d_chosen.detach().mean()
    metrics["dpo/rejected_logp_drift"] = d_rejected.detach().mean()
    if nll_weight:
        if chosen_lengths is None:
            raise ValueError("dpo_loss: nll_weight > 0 needs chosen_lengths [B] (POLICY tokens of y_c)")
        expect_like("chosen_lengths", chosen_lengths, "policy_chosen_logps", policy_chosen_logps)
        nll = -policy_chosen_logps / chosen_lengths.to(policy_chosen_logps.dtype).clamp(min=1)  # [B]
        losses = losses + nll_weight * nll
        metrics["dpo/nll"] = nll.detach().mean()
    return losses.mean(), metrics


def odpo_offset(score_chosen: torch.Tensor, score_rejected: torch.Tensor, alpha: float = 1.0,
                scale: Literal["log", "identity"] = "log") -> torch.Tensor:
    """ODPO's offset Delta = alpha * f(s_c - s_r) [B] from the pair's scores (ratings, reward-model scores) [B]:
    f = log (Amini et al.'s log-scaled difference; a difference <= 0 gets offset 0: no pair is pushed the other
    way) or the identity."""
    _pairs(("score_chosen", score_chosen), ("score_rejected", score_rejected))
    diff = score_chosen - score_rejected  # [B]
    if scale == "identity":
        return alpha * diff
    if scale != "log":
        raise ValueError(f"odpo_offset: scale must be 'log' or 'identity', got {scale!r}")
    return torch.where(diff > 0, alpha * torch.log(diff.clamp(min=1e-12)), torch.zeros_like(diff))


def rebel_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    reward_diff: torch.Tensor,
    eta: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """REBEL (Gao et al. 2024; checklist 8.2 [EXT]): regress the policy's log-ratio margin onto the reward margin,

        L = ( (1/eta) [log pi(y)/pi_t(y) - log pi(y')/pi_t(y')] - (r(y) - r(y')) )^2

    logps [B] summed over POLICY tokens (the *_ref ones under pi_t, the policy at the iteration's start);
    reward_diff [B] = r(y) - r(y'); eta > 0. returns (loss [] mean over pairs, metrics rebel/margin (h / eta),
    rebel/target (reward_diff), rebel/accuracy (margin has the reward's sign))."""
    _pairs(("policy_chosen_logps", policy_chosen_logps), ("policy_rejected_logps", policy_rejected_logps),
           ("ref_chosen_logps", ref_chosen_logps), ("ref_rejected_logps", ref_rejected_logps),
           ("reward_diff", reward_diff))
    if not eta > 0:
        raise ValueError(f"rebel_loss: eta must be > 0, got {eta}")
    h = (policy_chosen_logps - ref_chosen_logps.detach()) - (policy_rejected_logps - ref_rejected_logps.detach())
    margin = h / eta  # [B]
    target = reward_diff.to(margin.dtype)
    loss = (margin - target).pow(2).mean()
    return loss, {"rebel/margin": margin.detach().mean(), "rebel/target": target.detach().mean(),
                  "rebel/accuracy": (torch.sign(margin.detach()) == torch.sign(target)).float().mean()}


def _reward_metrics(prefix: str, chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, torch.Tensor]:
    """Implicit-reward statistics of a batch of pairs ([B] each), detached."""
    chosen, rejected = chosen.detach(), rejected.detach()
    return {
        f"{prefix}/chosen_reward": chosen.mean(),
        f"{prefix}/rejected_reward": rejected.mean(),
        f"{prefix}/margin": (chosen - rejected).mean(),
        f"{prefix}/accuracy": (chosen > rejected).float().mean(),
    }


def simpo_loss(
    chosen_avg_logps: torch.Tensor,
    rejected_avg_logps: torch.Tensor,
    beta: float = 2.0,
    gamma_beta_ratio: float = 0.5,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SimPO (Meng et al. 2024; book ch.8 names it, form from checklist 8.2 [EXT/CC]):
    reference-free, length-normalised,

        L = -log sigma( beta (avg_c - avg_r) - gamma ),   gamma = beta * gamma_beta_ratio

    chosen_avg_logps, rejected_avg_logps [B]: mean log pi per POLICY token (sum / count).
    returns (loss [], metrics simpo/{chosen,rejected}_reward = beta * avg, margin, accuracy).
    """
    _pairs(("chosen_avg_logps", chosen_avg_logps), ("rejected_avg_logps", rejected_avg_logps))
    logits = beta * (chosen_avg_logps - rejected_avg_logps) - beta * gamma_beta_ratio  # [B]
    loss = -F.logsigmoid(logits).mean()
    return loss, _reward_metrics("simpo", beta * chosen_avg_logps, beta * rejected_avg_logps)


def _log_odds(avg_logp: torch.Tensor) -> torch.Tensor:
    """log(p / (1 - p)) from log p, with log p clamped <= -1e-6 (checklist 8.2, ORPO)."""
    lp = avg_logp.clamp(max=-1e-6)
    return lp - torch.log(-torch.expm1(lp))


def orpo_loss(
    chosen_avg_logps: torch.Tensor,
    rejected_avg_logps: torch.Tensor,
    lam: float = 0.1,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """ORPO (Hong et al. 2024; form from checklist 8.2 [EXT/CC]): SFT on the chosen reply
    plus an odds-ratio penalty, no reference model,

        L = -avg_c - lam * log sigma( log_odds(avg_c) - log_odds(avg_r) ),
        log_odds(lp) = lp - log(1 - exp(lp))

    chosen_avg_logps, rejected_avg_logps [B]: mean log pi per POLICY token.
    returns (loss [], metrics orpo/nll, orpo/log_odds_ratio, orpo/accuracy).
    """
    _pairs(("chosen_avg_logps", chosen_avg_logps), ("rejected_avg_logps", rejected_avg_logps))
    log_odds_ratio = _log_odds(chosen_avg_logps) - _log_odds(rejected_avg_logps)  # [B]
    nll = -chosen_avg_logps  # [B]
    loss = (nll - lam * F.logsigmoid(log_odds_ratio)).mean()
    metrics = {
        "orpo/nll": nll.detach().mean(),
        "orpo/log_odds_ratio": log_odds_ratio.detach().mean(),
        "orpo/accuracy": (log_odds_ratio.detach() > 0).float().mean(),
    }
    return loss, metrics


def kto_loss(
    policy_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    desirable: torch.Tensor,
    reference_point_logratios: torch.Tensor,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KTO (Ethayarajh et al. 2024) on unpaired thumbs-up / thumbs-down episodes (book
    ch.11 "Other feedback types"; form from checklist 8.2 [EXT/CC]):

        r = log pi(y|x) - log ref(y|x),  z0 = max(0, mean of reference_point_logratios), detached
        desirable:   lambda_D (1 - sigma(beta (r - z0)))
        undesirable: lambda_U (1 - sigma(beta (z0 - r)))

    policy_logps, ref_logps [B] summed log-probs; desirable [B] bool;
    reference_point_logratios [M]: log pi - log ref on mismatched (x, y') pairs, the
    estimate of KL(pi || ref) that sets the reference point z0.
    returns (loss [] = mean over all B samples of the weighted per-sample losses, as in
    the paper's expectation E[lambda_y - v(x, y)]; metrics kto/z0, kto/{desirable,
    undesirable}_reward).
    """
    _pairs(("policy_logps", policy_logps), ("ref_logps", ref_logps), ("desirable", desirable))
    expect_dim("reference_point_logratios", reference_point_logratios, 1)
    z0 = reference_point_logratios.detach().mean().clamp(min=0)
    r = policy_logps - ref_logps.detach()  # [B]
    good = desirable.bool()
    losses = torch.where(
        good,
        desirable_weight * (1 - torch.sigmoid(beta * (r - z0))),
        undesirable_weight * (1 - torch.sigmoid(beta * (z0 - r))),
    )
    rd = (beta * r).detach()
    nan = rd.new_tensor(float("nan"))
    metrics = {
        "kto/z0": z0,
        "kto/desirable_reward": rd[good].mean() if good.any() else nan,
        "kto/undesirable_reward": rd[~good].mean() if (~good).any() else nan,
    }
    return losses.mean(), metrics


# --- SLiC-HF, APO-zero / APO-down, Plackett-Luce DPO (checklist 8.1c, 8.2l, 8.2n, 8.2o) ---------------------------
# Pure losses with hand-worked tests (tests/unit/test_preference_extras.py); `trajtune dpo --loss` does not offer them
# (its choices are wired in algorithms/dpo.py).


def slic_hinge_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    delta: float = 1.0,
    *,
    nll_weight: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SLiC-HF (Zhao et al. 2023; the book names it, the hinge from checklist 8.2 [EXT]): a calibration hinge on the
    policy's own log-likelihoods, no reference model,

        L = max(0, delta - log pi(y_c) + log pi(y_r))  +  nll_weight * (-log pi(y_c))

    The second term is the paper's regulariser (cross-entropy on a target sequence; here the chosen reply).
    policy_chosen_logps, policy_rejected_logps [B] summed over POLICY tokens; delta >= 0 the margin.
    returns (loss [] mean over pairs, metrics slic/margin (log pi(y_c) - log pi(y_r)), slic/active (share of
    pairs inside the margin, the only ones with a gradient), slic/nll when nll_weight > 0).
    """
    _pairs(("policy_chosen_logps", policy_chosen_logps), ("policy_rejected_logps", policy_rejected_logps))
    if delta < 0:
        raise ValueError(f"slic_hinge_loss: delta must be >= 0, got {delta}")
    margin = policy_chosen_logps - policy_rejected_logps  # [B]
    hinge = (delta - margin).clamp(min=0)  # [B]
    losses = hinge + nll_weight * -policy_chosen_logps if nll_weight else hinge
    metrics = {"slic/margin": margin.detach().mean(), "slic/active": (hinge.detach() > 0).float().mean()}
    if nll_weight:
        metrics["slic/nll"] = -policy_chosen_logps.detach().mean()
    return losses.mean(), metrics


def apo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    *,
    variant: Literal["zero", "down"] = "zero",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Anchored Preference Optimization (D'Oosterlinck et al. 2024; checklist 8.2 [CC only, not in the book]).
    With lr = log pi - log ref per reply:

        zero  L = -sigma(beta lr_c) + sigma(beta lr_r)            chosen up, rejected down (chosen better than
                                                                   the model's own outputs)
        down  L =  sigma(beta lr_c) - sigma(beta (lr_c - lr_r))   both down, the rejected more (chosen worse
                                                                   than the model's own outputs)

    TRL's `apo_zero` / `apo_down` add the constant 1 to these (same gradient).
    logps [B] summed over POLICY tokens (the ref ones are detached). returns (loss [] mean over pairs, metrics
    apo/chosen_reward, apo/rejected_reward (beta lr), apo/margin, apo/accuracy).
    Worked values: lr_c = lr_r = 0 -> zero 0, down 0; beta 1, lr_c = ln 3, lr_r = 0 -> zero -0.25, down 0.
    """
    _pairs(("policy_chosen_logps", policy_chosen_logps), ("policy_rejected_logps", policy_rejected_logps),
           ("ref_chosen_logps", ref_chosen_logps), ("ref_rejected_logps", ref_rejected_logps))
    lr_chosen = policy_chosen_logps - ref_chosen_logps.detach()  # [B]
    lr_rejected = policy_rejected_logps - ref_rejected_logps.detach()  # [B]
    if variant == "zero":
        losses = -torch.sigmoid(beta * lr_chosen) + torch.sigmoid(beta * lr_rejected)
    elif variant == "down":
        losses = torch.sigmoid(beta * lr_chosen) - torch.sigmoid(beta * (lr_chosen - lr_rejected))
    else:
        raise ValueError(f"apo_loss: variant must be 'zero' or 'down', got {variant!r}")
    return losses.mean(), _reward_metrics("apo", beta * lr_chosen, beta * lr_rejected)


def plackett_luce_dpo_loss(
    policy_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    beta: float = 0.1,
    ranking: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Plackett-Luce DPO (Rafailov et al. 2023, the DPO paper's ranked-list form; book ch.8 "rarely used";
    checklist 8.1c): the K-wise Plackett-Luce loss (`objectives.reward_model.plackett_luce_loss`, checklist 5.5)
    on DPO's implicit rewards r_k = beta (log pi(y_k) - log ref(y_k)),

        L = -sum_k log( exp(r_sigma(k)) / sum_{j >= k} exp(r_sigma(j)) )

    policy_logps, ref_logps [B, K] summed over POLICY tokens, K completions per prompt; ranking [B, K] long or
    None: ranking[b, k] is the index of the k-th best completion (None: already best-first).
    At K = 2 this is the DPO loss. returns (loss [] mean over prompts, metrics pl_dpo/top1_accuracy (the best
    completion has the highest implicit reward), pl_dpo/reward_spread (best minus worst implicit reward)).
    """
    from .reward_model import plackett_luce_loss  # one place for the Plackett-Luce math

    expect_dim("policy_logps", policy_logps, 2)
    expect_like("ref_logps", ref_logps, "policy_logps", policy_logps)
    rewards = beta * (policy_logps - ref_logps.detach())  # [B, K]
    loss, m = plackett_luce_loss(rewards, ranking)
    ordered = (rewards if ranking is None else rewards.gather(1, ranking)).detach()  # [B, K] best first
    return loss, {"pl_dpo/top1_accuracy": m["rm/top1_accuracy"],
                  "pl_dpo/reward_spread": (ordered[:, 0] - ordered[:, -1]).mean()}
