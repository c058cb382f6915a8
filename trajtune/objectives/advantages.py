"""Advantages: group baselines (REINFORCE / RLOO / GRPO / Dr. GRPO), GAE, whitening.

Every advantage estimator of the policy-gradient family lives here once:

| method              | call                                                           |
|---------------------|----------------------------------------------------------------|
| REINFORCE, batch    | group_advantages(r, None)              (baseline = batch mean)  |
| REINFORCE, group    | group_advantages(r, groups)            (baseline = group mean)  |
| RLOO                | group_advantages(r, groups, baseline="leave_one_out")          |
| GRPO                | group_advantages(r, groups, std_normalize=True)                |
| Dr. GRPO            | group_advantages(r, groups)            (mean baseline, no std)  |
| REINFORCE, moving   | r - b, b from moving_average_baseline(b, r, decay)              |
| PPO (value head)    | gae(token_rewards, values, mask, gamma, lam)                   |

Before the baseline, rewards may be shaped: `overlong_penalty` (DAPO's soft length
penalty), `minmax_scale` to [0, 1] or `whiten` over the batch (book "Implementation":
reward normalization and whitening; checklist 6.16).

Sources: RLHF book "Policy Gradient Algorithms" (REINFORCE eq. REINFORCE_with_baseline,
RLOO eqs. RLOO_baseline / RLOO_advantage, GRPO eq. GRPO_ADV, Dr. GRPO eq. DrGRPO_ADV
and the identity eq. RLOO_GRPO_EQUIV) and "Auxiliary Topics" (GAE eq. GAE_DFN).
"""

from __future__ import annotations

from typing import Literal

import torch

from ._checks import expect_dim, expect_like, expect_rows

Baseline = Literal["mean", "leave_one_out", "none"]


def _group_index(rewards: torch.Tensor, groups: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Flatten rewards and map each row to a dense group index.

    rewards [B] with groups [B] (any ids, any order), [B] with groups None (one group),
    or [P, G] with groups None (each row a group) -> (rewards [N], index [N] long, n_groups).
    """
    if rewards.dim() == 2:
        if groups is not None:
            raise ValueError("group_advantages: pass [P, G] rewards without `groups`, or [B] rewards with groups [B]")
        P, G = rewards.shape
        index = torch.arange(P, device=rewards.device).repeat_interleave(G)  # [P*G]
        return rewards.reshape(-1), index, P
    expect_dim("rewards", rewards, 1)
    if groups is None:
        return rewards, torch.zeros_like(rewards, dtype=torch.long), 1
    expect_rows("groups", groups, rewards.shape[0])
    _, index = torch.unique(groups, return_inverse=True)
    return rewards, index, int(index.max()) + 1 if len(index) else 0


def _group_sum(values: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=values.dtype, device=values.device).index_add_(0, index, values)  # [n]


def group_advantages(
    rewards: torch.Tensor,
    groups: torch.Tensor | None = None,
    *,
    baseline: Baseline = "mean",
    std_normalize: bool = False,
    eps: float = 1e-4,
    unbiased_std: bool = True,
) -> torch.Tensor:
    """Sequence-level advantages from episode rewards and group ids (detached).

    rewards [B] with groups [B] long (episodes sampled for the same prompt share an id;
            any order, any group sizes), or [B] with groups None (the whole batch is one
            group), or [P, G] with groups None (row p is the group of prompt p)
    baseline "mean": A_i = R_i - mean_group(R)                      (REINFORCE / Dr. GRPO)
             "leave_one_out": A_i = R_i - mean_{j != i} R_j         (RLOO, book eq. RLOO_baseline;
                       a group of size 1 has no other sample and gets A = 0)
             "none": A_i = R_i                                      (vanilla REINFORCE, 0/1 PG)
    std_normalize: divide by (std_group(R) + eps) (GRPO, book eq. GRPO_ADV with the code's
             `std + 1e-4`; torch's unbiased std unless `unbiased_std=False`, erratum E7)
    returns  advantages of the same shape as `rewards`

    A group whose rewards are all equal gets exactly zero advantage with any baseline
    (checklist 6.7 pitfall), even where float rounding of the mean would leave ~1e-8.
    """
    flat, index, n = _group_index(rewards, groups)  # [N], [N]
    flat = flat.detach().to(torch.float32 if not flat.is_floating_point() else flat.dtype)
    count = _group_sum(torch.ones_like(flat), index, n)  # [n]
    total = _group_sum(flat, index, n)  # [n]
    mean = (total / count.clamp(min=1))[index]  # [N]
    if baseline == "mean":
        adv = flat - mean
    elif baseline == "leave_one_out":
        others = (count - 1)[index]  # [N]
        loo = (total[index] - flat) / others.clamp(min=1)
        adv = torch.where(others > 0, flat - loo, torch.zeros_like(flat))
    elif baseline == "none":
        adv = flat.clone()
    else:
        raise ValueError(f"unknown baseline {baseline!r}; choose 'mean', 'leave_one_out' or 'none'")
    if std_normalize:
        dof = (count - 1) if unbiased_std else count  # [n]
        var = _group_sum((flat - mean).pow(2), index, n) / dof.clamp(min=1)
        adv = adv / (var.sqrt()[index] + eps)
    if baseline != "none":
        spread, _ = group_reward_range(rewards, groups)  # [n]
        adv = torch.where((spread == 0)[index], torch.zeros_like(adv), adv)
    return adv.reshape(rewards.shape)


def maxrl_advantages(rewards: torch.Tensor, groups: torch.Tensor | None = None) -> torch.Tensor:
    """MaxRL's advantage (checklist 6.18, the book's companion code [CC]) on a binary reward: A_i = (R_i - mean) /
    mean within the group when its mean is > 0, else 0 (a group that never succeeds teaches nothing; a rare success
    weighs 1/mean). rewards [B] (or [P, G]) with groups as `group_advantages` -> advantages, same shape, detached.
    Worked values: rewards [1, 0, 0, 0] -> mean 0.25 -> [3, -1, -1, -1]; [0, 0] -> [0, 0]."""
    flat, index, n = _group_index(rewards, groups)  # [N], [N]
    flat = flat.detach().to(torch.float32 if not flat.is_floating_point() else flat.dtype)
    mean = (_group_sum(flat, index, n) / _group_sum(torch.ones_like(flat), index, n).clamp(min=1))[index]  # [N]
    adv = torch.where(mean > 0, (flat - mean) / mean.clamp(min=1e-12), torch.zeros_like(flat))
    return adv.reshape(rewards.shape)


SequenceAdvantage = Literal["reinforce", "rloo", "grpo", "dr_grpo", "none", "batch", "moving_average", "maxrl"]
BASELINES: dict[str, tuple[Baseline, bool]] = {
    "reinforce": ("mean", False), "rloo": ("leave_one_out", False), "grpo": ("mean", True),
    "dr_grpo": ("mean", False), "none": ("none", False), "batch": ("mean", False)}
"""the group baseline and std normalisation of each sequence-level advantage `group_advantages` computes"""


def sequence_advantages(rewards: torch.Tensor, groups: torch.Tensor | None, kind: SequenceAdvantage,
                        eps: float = 1e-4, unbiased_std: bool = True, baseline: float | None = None) -> torch.Tensor:
    """One advantage per episode [B] from its reward [B] by name (RLConfig.advantage, every kind but GAE):
    reinforce: R - group mean; rloo: leave-one-out mean; grpo: (R - mean) / (std + eps) (unbiased_std: torch's
    .std()); dr_grpo: R - mean; none: R; batch: R - the batch mean (groups ignored); moving_average: R - baseline
    (None: the batch mean); maxrl: `maxrl_advantages`. groups [B] (None: one group)."""
    if kind == "moving_average":
        return (rewards - (rewards.mean() if baseline is None else baseline)).detach()
    if kind == "maxrl":
        return maxrl_advantages(rewards, groups)
    base, std = BASELINES[kind]
    return group_advantages(rewards, None if kind == "batch" else groups, baseline=base, std_normalize=std, eps=eps,
                            unbiased_std=unbiased_std)


def group_reward_range(rewards: torch.Tensor, groups: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """max - min of the rewards of each group: 0 marks a group without signal.

    rewards/groups as in `group_advantages` -> (range [n_groups], group index [N] of each
    flattened episode, dense in 0..n_groups-1).
    """
    flat, index, n = _group_index(rewards, groups)
    flat = flat.detach() if flat.is_floating_point() else flat.detach().float()
    hi = torch.full((n,), -torch.inf, dtype=flat.dtype, device=flat.device).scatter_reduce(0, index, flat, "amax")
    lo = torch.full((n,), torch.inf, dtype=flat.dtype, device=flat.device).scatter_reduce(0, index, flat, "amin")
    return hi - lo, index


def whiten(
    values: torch.Tensor, mask: torch.Tensor | None = None, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Zero-mean, unit-variance advantages or rewards over the masked entries (RLHF book
    "Implementation": whitening; the PPO example whitens with `std + 1e-8`). Statistics
    use only mask == 1 entries (erratum E4: the book's example includes padding);
    masked-out entries come back as 0.

    values [...] and mask [...] (same shape; None = all) -> same shape, detached.
    `shift_mean=False` only rescales (keeps the sign of every entry).
    """
    values = values.detach()
    m = torch.ones_like(values) if mask is None else mask.to(values.dtype)
    if mask is not None:
        expect_like("mask", mask, "values", values)
    n = m.sum()
    mean = (values * m).sum() / n.clamp(min=1)
    var = ((values - mean).pow(2) * m).sum() / (n - 1).clamp(min=1)  # unbiased, like torch.std
    out = (values - mean) if shift_mean else values
    return out / (var.sqrt() + eps) * m


def minmax_scale(values: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Rewards scaled to [0, 1] over the batch: (R - min) / (max - min) (checklist 6.16, "reward
    normalization to [0, 1]"). values [B] -> [B] detached; a batch whose values are all equal
    (max - min < eps) comes back as zeros.
    """
    expect_dim("values", values, 1)
    v = values.detach().float() if not values.is_floating_point() else values.detach()
    if v.numel() == 0:
        return v
    lo, hi = v.min(), v.max()
    if hi - lo < eps:
        return torch.zeros_like(v)
    return (v - lo) / (hi - lo)


def moving_average_baseline(previous: float | None, rewards: torch.Tensor, decay: float) -> tuple[float, float]:
    """REINFORCE's moving-average baseline (Williams 1992; checklist 6.2 "baselines: batch-mean
    reward or a moving average"): the baseline this batch is compared with, and the next one.

        b_used = previous  (the first batch: its own mean, as there is no history yet)
        b_next = decay * b_used + (1 - decay) * mean(R)

    previous float or None, rewards [B], decay in [0, 1) -> (b_used, b_next) floats. The advantage
    is R - b_used; the baseline is a state of the loop (saved with its checkpoint).
    """
    expect_dim("rewards", rewards, 1)
    if not 0 <= decay < 1:
        raise ValueError(f"moving_average_baseline: decay must be in [0, 1), got {decay}")
    mean = float(rewards.detach().float().mean()) if rewards.numel() else 0.0
    used = mean if previous is None else float(previous)
    return used, decay * used + (1 - decay) * mean


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (checklist 6.17; book ch.6 DAPO), added to the reward:

        safe = L_max - L_cache
        0                        if len <= safe
        (safe - len) / L_cache   if safe < len <= L_max     (a linear ramp from 0 to -1)
        -1                       if len > L_max

    lengths [B] (generated tokens per episode), max_len L_max >= cache L_cache >= 1 -> [B] float.
    """
    expect_dim("lengths", lengths, 1)
    if not 1 <= cache <= max_len:
        raise ValueError(f"overlong_penalty: need 1 <= cache ({cache}) <= max_len ({max_len})")
    n = lengths.float()
    safe = max_len - cache
    ramp = (safe - n) / cache
    return torch.where(n <= safe, torch.zeros_like(n), torch.where(n <= max_len, ramp, torch.full_like(n, -1.0)))


def place_at_last_action(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Put one number per sequence on its last POLICY token (where an outcome reward lives
    in token-level RL; checklist 6.6 [CC]: "scalar reward placed at the last action index").

    values [B], mask [B, T-1] -> [B, T-1], zero elsewhere and on rows without a POLICY token.
    """
    expect_dim("mask", mask, 2)
    expect_rows("values", values, mask.shape[0])
    m = mask > 0
    T1 = mask.shape[1]
    pos = torch.arange(T1, device=mask.device).expand_as(mask)  # [B, T-1]
    last = torch.where(m, pos, torch.full_like(pos, -1)).max(-1).values  # [B]
    out = torch.zeros(mask.shape, dtype=values.dtype, device=values.device)
    has = last >= 0
    out[has.nonzero(as_tuple=True)[0], last[has]] = values[has]
    return out


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
    bootstrap: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation over the POLICY tokens of each episode
    (RLHF book "Auxiliary Topics", eqs. TD_RESIDUAL and GAE_DFN; checklist 6.6):

        delta_t = r_t + gamma V(s_{t+1}) - V(s_t),   A_t = sum_l (gamma lam)^l delta_{t+l}

    rewards [B, T-1]  per-token rewards (e.g. `kl_penalized_rewards`); only entries on
                      POLICY tokens are read: put outcome rewards on the last action
    values  [B, T-1]  V(s_t) from the value head, at the same positions
    mask    [B, T-1]  1.0 on POLICY tokens. Non-policy tokens in between (tool output,
                      templates) are skipped: "the next state" of an action is the next
                      action of the same episode, so a multi-turn episode is one chain
                      of decisions
    bootstrap [B] or None  value after the last action (a truncated, not finished,
                      episode); None = 0 (the episode ended)
    returns (advantages [B, T-1], returns [B, T-1]) detached, zero off the mask;
            returns = advantages + values are the value-regression targets.

    lam=1 gives Monte-Carlo returns minus V, lam=0 the one-step TD residual. The loop runs
    over the longest count of POLICY tokens in the batch, vectorised over episodes.
    """
    expect_dim("rewards", rewards, 2)
    expect_like("values", values, "rewards", rewards)
    expect_like("mask", mask, "rewards", rewards)
    B, T1 = rewards.shape
    r, v, m = rewards.detach().float(), values.detach().float(), mask > 0
    # compact each row's POLICY tokens to the left, in order: [B, n_max]
    order = torch.sort((~m).to(torch.int8), dim=1, stable=True).indices  # actions first
    n_act = m.sum(-1)  # [B]
    n_max = int(n_act.max()) if B else 0
    order = order[:, :n_max]
    r_c, v_c = r.gather(1, order), v.gather(1, order)
    valid = torch.arange(n_max, device=r.device)[None, :] < n_act[:, None]  # [B, n_max]
    adv_c = torch.zeros_like(r_c)
    acc = torch.zeros(B, device=r.device)
    next_v = torch.zeros(B, device=r.device) if bootstrap is None else bootstrap.detach().float()
    for k in reversed(range(n_max)):
        live = valid[:, k]
        delta = r_c[:, k] + gamma * next_v - v_c[:, k]
        new = delta + gamma * lam * acc
        acc = torch.where(live, new, acc)
        next_v = torch.where(live, v_c[:, k], next_v)
        adv_c[:, k] = torch.where(live, new, torch.zeros_like(new))
    adv = torch.zeros_like(r).scatter(1, order, adv_c) * m
    return adv.to(rewards.dtype), ((adv + v) * m).to(rewards.dtype)


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Monte-Carlo returns G_t = r_t + gamma G_{t+1} over POLICY tokens (checklist 6.5,
    "MC targets (no GAE)"): GAE with V = 0 and lam = 1.

    rewards [B, T-1], mask [B, T-1] -> [B, T-1] detached, zero off the mask.
    """
    return gae(rewards, torch.zeros_like(rewards), mask, gamma=gamma, lam=1.0)[0]


# --- GRPO process supervision (checklist 6.7b) ------------------------------------------------------------------


def process_advantages(
    step_rewards: torch.Tensor,
    step_mask: torch.Tensor,
    step_ends: torch.Tensor,
    action_mask: torch.Tensor,
    groups: torch.Tensor | None = None,
    *,
    std_normalize: bool = True,
    eps: float = 1e-4,
) -> torch.Tensor:
    """GRPO with process supervision (DeepSeekMath §4.1.3; book ch.6 GRPO, checklist 6.7b): per-token advantages
    from per-step rewards (a PRM's score of each reasoning step).

        r~_{i,k} = (r_{i,k} - mean(R_g)) / (std(R_g) + eps),   R_g = every step reward of every completion of the group
        A_{i,t}  = sum of r~_{i,k} over the steps k whose last token is at or after t

    step_rewards [B, S] one reward per step (steps padded to S); step_mask [B, S] nonzero on real steps;
    step_ends [B, S] long: the index, on the [B, T-1] action axis, of each step's last token (padded steps:
    any value); action_mask [B, T-1] (POLICY tokens); groups [B] (completions of one prompt share an id) or
    None (the batch is one group). std_normalize False: only the group mean is subtracted (Dr. GRPO's choice);
    std is torch's unbiased std (as `group_advantages`). A group whose step rewards are all equal gets zero.
    returns [B, T-1] detached, zero off the action mask and on tokens after the last step's end.
    """
    expect_dim("step_rewards", step_rewards, 2)
    expect_like("step_mask", step_mask, "step_rewards", step_rewards)
    expect_like("step_ends", step_ends, "step_rewards", step_rewards)
    expect_dim("action_mask", action_mask, 2)
    B, S = step_rewards.shape
    if action_mask.shape[0] != B:
        raise ValueError(f"action_mask: expected {B} rows like step_rewards, got {tuple(action_mask.shape)}")
    on = step_mask > 0  # [B, S]
    r = step_rewards.detach().float()
    if groups is None:
        groups = torch.zeros(B, dtype=torch.long, device=r.device)
    expect_rows("groups", groups, B)
    _, index = torch.unique(groups, return_inverse=True)  # [B]
    n = int(index.max()) + 1 if B else 0
    step_index = index[:, None].expand(B, S)[on]  # [N] the group of each real step
    flat = r[on]  # [N]
    count = _group_sum(torch.ones_like(flat), step_index, n)  # [n]
    mean = _group_sum(flat, step_index, n) / count.clamp(min=1)  # [n]
    centred = flat - mean[step_index]  # [N]
    if std_normalize:
        var = _group_sum(centred.pow(2), step_index, n) / (count - 1).clamp(min=1)  # [n]
        centred = centred / (var.sqrt()[step_index] + eps)
    flat_max = torch.full((n,), float("-inf"), device=r.device).scatter_reduce(0, step_index, flat, "amax")
    flat_min = torch.full((n,), float("inf"), device=r.device).scatter_reduce(0, step_index, flat, "amin")
    centred = torch.where((flat_max == flat_min)[step_index], torch.zeros_like(centred), centred)
    normed = torch.zeros_like(r).masked_scatter(on, centred)  # [B, S], 0 on padded steps
    t = torch.arange(action_mask.shape[1], device=r.device)  # [T-1]
    at_or_after = (step_ends[:, :, None] >= t[None, None, :]) & on[:, :, None]  # [B, S, T-1]
    adv = (normed[:, :, None] * at_or_after).sum(1)  # [B, T-1]
    return adv * (action_mask > 0)
