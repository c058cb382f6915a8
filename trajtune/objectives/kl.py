"""KL(pi || pi_ref) from the policy's own samples: estimators, reward penalty, loss term.

Sign convention (RLHF book ch.15 "Regularization", eq. kl_expectation; checklist 6.16
and erratum E11): everything here takes

    log_ratio = log pi(x) - log pi_ref(x)        at x ~ pi (the policy's own tokens)

and estimates KL(pi || pi_ref) = E_{x~pi}[log pi(x) - log pi_ref(x)] (the *reverse*
KL of RLHF). With Schulman's r = pi_ref(x)/pi(x) = exp(-log_ratio):

    k1 = -log r          = log_ratio                       unbiased, high variance, can be < 0
    k2 = (log r)^2 / 2   = log_ratio^2 / 2                 biased, low variance, >= 0
    k3 = (r - 1) - log r = expm1(-log_ratio) + log_ratio   unbiased, >= 0, low variance

(J. Schulman, "Approximating KL Divergence", 2020 — the book cites it as
[@schulman2016klapprox] without defining the estimators.) The book's companion code
uses the inverted ratio inside k3 (erratum E11); this module does not.
"""

from __future__ import annotations

from typing import Literal

import torch

from ..logprobs import Aggregation, aggregate
from ._checks import expect_dim, expect_like, expect_rows
from .advantages import place_at_last_action

KLEstimator = Literal["k1", "k2", "k3"]
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")


def kl_estimate(log_ratio: torch.Tensor, kind: KLEstimator = "k3") -> torch.Tensor:
    """Per-sample KL(pi || pi_ref) estimate from log pi(x) - log pi_ref(x), x ~ pi.

    log_ratio [...] (any shape, e.g. [B, T-1]) -> same shape. Differentiable: used as a
    loss term (GRPO, checklist 6.7) the gradient flows through `log_ratio`.
    """
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.pow(2)
    if kind == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"unknown KL estimator {kind!r}; choose one of {KL_ESTIMATORS}")


def masked_log_ratio(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log pi - log pi_ref on POLICY tokens and exactly 0 elsewhere (so padding can never
    turn into inf/NaN inside an estimator). logp, ref_logp, mask [B, T-1] -> [B, T-1];
    the gradient flows through `logp` only.
    """
    expect_dim("logp", logp, 2)
    expect_like("ref_logp", ref_logp, "logp", logp)
    expect_like("mask", mask, "logp", logp)
    diff = logp - ref_logp.detach()
    return torch.where(mask > 0, diff, torch.zeros_like(diff))


def sequence_kl(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    kind: KLEstimator = "k1",
    reduce: Literal["sum", "mean"] = "sum",
) -> torch.Tensor:
    """Per-sequence KL estimate over POLICY tokens.

    logp, ref_logp, mask [B, T-1] -> [B]. "sum" is the sequence-level KL (the book's
    RLOO "aggregates the per-token KL over the completion"); "mean" is the per-token
    average the companion code folds into the reward (erratum E12). Default: sum.
    """
    m = mask.to(logp.dtype)
    summed = (kl_estimate(masked_log_ratio(logp, ref_logp, mask), kind) * m).sum(-1)  # [B]
    if reduce == "sum":
        return summed
    if reduce == "mean":
        return summed / m.sum(-1).clamp(min=1)
    raise ValueError(f"sequence_kl: reduce must be 'sum' or 'mean', got {reduce!r}")


def kl_penalized_rewards(
    rewards: torch.Tensor,
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    kind: KLEstimator = "k1",
) -> torch.Tensor:
    """KL as a per-token reward penalty (PPO style; RLHF book "Example: PPO",
    checklist 6.4): r_t = -beta * k_t on every POLICY token, plus the episode reward
    on the last POLICY token.

    rewards [B] episode rewards; logp, ref_logp, mask [B, T-1] -> per-token rewards
    [B, T-1], detached (a reward is data, not a function of theta). Rows without a
    POLICY token get no reward. Feed the result to `advantages.gae`.
    """
    expect_rows("rewards", rewards, logp.shape[0])
    with torch.no_grad():
        m = mask.to(logp.dtype)
        penalty = -beta * kl_estimate(masked_log_ratio(logp, ref_logp, mask), kind) * m  # [B, T-1]
        return penalty + place_at_last_action(rewards.to(logp.dtype), mask)


def kl_loss(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    kind: KLEstimator = "k3",
    aggregation: Aggregation = "token",
    constant: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL(pi || pi_ref) as a loss term (GRPO style, RLHF book eq. grpo_loss_kl:
    L = L_pg + beta * KL; checklist 6.7). Multiply by beta yourself, or pass
    `kl_coef` to `policy_gradient_loss`, which calls this.

    logp [B, T-1] (with grad), ref_logp [B, T-1] (frozen), mask [B, T-1]
    returns (loss [], metrics {"kl/<kind>": token-mean estimate})
    """
    per_tok = kl_estimate(masked_log_ratio(logp, ref_logp, mask), kind)  # [B, T-1]
    loss = aggregate(per_tok, mask, aggregation, constant)
    m = mask.to(logp.dtype)
    value = (per_tok.detach() * m).sum() / m.sum().clamp(min=1)
    return loss, {f"kl/{kind}": value}


def full_kl(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """Exact KL(p || q) between two categorical distributions given by logits.

    logits_p, logits_q [..., V] -> [...] in nats: sum_v p_v (log p_v - log q_v).
    The correct form of the book's `F.kl_div` call (erratum E3). Gradient flows into both.
    """
    expect_like("logits_q", logits_q, "logits_p", logits_p)
    logp = torch.log_softmax(logits_p.float(), dim=-1)
    logq = torch.log_softmax(logits_q.float(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(-1)


def adaptive_kl_coef(coef: float, kl: float, target: float, horizon: float, n: int, clip: float = 0.2) -> float:
    """The adaptive KL controller of Ziegler et al. 2019 (the PPO-RLHF of InstructGPT; checklist 6.16
    "KL controllers"): beta moves toward the value that holds the measured KL at a target.

        e = clip(KL / KL_target - 1, -0.2, 0.2)        (proportional error, clipped)
        beta' = beta * (1 + e * n / horizon)          (K_beta = n / horizon)

    coef beta > 0, kl the step's measured KL (mean sequence KL of its episodes), target KL_target > 0,
    horizon > 0, n the episodes the KL was measured on -> the next beta. A KL above target raises beta.
    """
    if coef <= 0 or target <= 0 or horizon <= 0:
        raise ValueError(f"adaptive_kl_coef: coef, target and horizon must be > 0, got {coef}, {target}, {horizon}")
    error = min(max(kl / target - 1.0, -clip), clip)
    return coef * (1.0 + error * n / horizon)


def forgetting_and_forward_kl(
    old_logp0: torch.Tensor,
    old_logp: torch.Tensor,
    old_mask: torch.Tensor,
    new_logp0: torch.Tensor,
    new_logp: torch.Tensor,
    new_mask: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """RL's Razor as a metric (Shenfeld et al.; RLHF book ch.15 "RL's Razor", checklist 15.5): forgetting on the
    old task against the forward KL(pi_0 || pi) on the *new* task's inputs.

    old_logp0, old_logp, old_mask [B_old, T-1]  log pi_0 and log pi of old-task episodes' POLICY tokens
    new_logp0, new_logp, new_mask [B_new, T-1]  the same on new-task episodes sampled from pi_0
    returns (all [] floats, detached):
        razor/forgetting  mean over old-task episodes of log pi_0(y|x) - log pi(y|x) (summed over the
                          episode's POLICY tokens): how much old-task likelihood was lost (> 0: forgot)
        razor/forward_kl  mean over new-task episodes y ~ pi_0 of log pi_0(y|x) - log pi(y|x): the k1
                          estimate of the sequence KL(pi_0 || pi) (samples from pi_0, so forward)
    """
    with torch.no_grad():
        forgetting = sequence_kl(old_logp0, old_logp, old_mask, "k1", "sum").mean()
        forward = sequence_kl(new_logp0, new_logp, new_mask, "k1", "sum").mean()
    return {"razor/forgetting": forgetting, "razor/forward_kl": forward}


# --- SFT as forward KL, RL as reverse KL to the tilted optimum (checklist 15.5a, 15.5b) -----------------------------


def sft_forward_kl(target_logp: torch.Tensor, policy_logp: torch.Tensor) -> dict[str, torch.Tensor]:
    """SFT is forward KL (RLHF book ch.15 "Implicit regularization", checklist 15.5a), as a diagnostic:

        KL(pi* || pi_theta) = -H(pi*) + L_SFT(theta),   L_SFT = E_{y ~ pi*}[-log pi_theta(y)]

    target_logp [..., V] log pi* (the data distribution), policy_logp [..., V] log pi_theta, each normalised over
    the last axis (a token's vocabulary, or a small finite set of whole outputs). Mode covering: the KL is large
    wherever pi* has mass and pi_theta has little.
    returns (each [...], detached): fkl/kl (the two sides agree), fkl/sft_loss (the cross-entropy, what SFT
    minimises), fkl/target_entropy (H(pi*), the floor of the SFT loss).
    """
    expect_like("policy_logp", policy_logp, "target_logp", target_logp)
    with torch.no_grad():
        p = target_logp.float().exp()
        entropy = -(p * target_logp.float()).sum(-1)  # [...]
        cross = -(p * policy_logp.float()).sum(-1)  # [...]
    return {"fkl/kl": cross - entropy, "fkl/sft_loss": cross, "fkl/target_entropy": entropy}


def rl_reverse_kl(policy_logp: torch.Tensor, ref_logp: torch.Tensor, rewards: torch.Tensor,
                  beta: float) -> dict[str, torch.Tensor]:
    """KL-regularised RL is reverse KL to the tilted optimum (RLHF book ch.15 "Implicit regularization",
    checklist 15.5b), as a diagnostic over a finite set of outputs:

        pi*(y) = pi_ref(y) exp(r(y)/beta) / Z,   J(pi) = E_pi[r] - beta KL(pi || pi_ref)
        KL(pi || pi*) = -(1/beta) J(pi) + log Z

    so maximising J is minimising the reverse (mode-seeking) KL to pi*; at pi = pi*, J = beta log Z.
    policy_logp, ref_logp [..., N] log-probs of N outputs (normalised over the last axis); rewards [..., N];
    beta > 0. returns (each [...], detached): rkl/kl (KL(pi || pi*), computed directly), rkl/objective (J),
    rkl/log_z (log Z), rkl/kl_to_ref (KL(pi || pi_ref)).
    """
    expect_like("ref_logp", ref_logp, "policy_logp", policy_logp)
    expect_like("rewards", rewards, "policy_logp", policy_logp)
    if not beta > 0:
        raise ValueError(f"rl_reverse_kl: beta must be > 0, got {beta}")
    with torch.no_grad():
        logp, ref, r = policy_logp.float(), ref_logp.float(), rewards.float()
        tilted = ref + r / beta  # [..., N] log of the unnormalised pi*
        log_z = torch.logsumexp(tilted, dim=-1)  # [...]
        p = logp.exp()
        kl_optimum = (p * (logp - (tilted - log_z[..., None]))).sum(-1)
        kl_ref = (p * (logp - ref)).sum(-1)
        objective = (p * r).sum(-1) - beta * kl_ref
    return {"rkl/kl": kl_optimum, "rkl/objective": objective, "rkl/log_z": log_z, "rkl/kl_to_ref": kl_ref}
