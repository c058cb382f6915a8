"""Evaluation statistics: pass@k, pass^k, distinct answers, entropy, KL, informative groups, hacks.

Pure functions of counts, answers and tensors; nothing here samples or trains.
Sources: RLHF book ch.16 "Evaluation" (pass@k, checklist 16.2(c) [EXT]: Chen et al.
2021's unbiased estimator), ch.13 (pass^k of tau-bench, checklist 13.6 [EXT]),
post-training ch.13 (distinct answers per k samples, share of groups with signal),
agent-rl ch.15 / REPRODUCE A10, A13 (informative groups, reward hacking).
"""

from __future__ import annotations

import math
from typing import Hashable, Sequence

import torch

from .logprobs import entropy_from_logits, masked_mean
from .objectives.advantages import group_reward_range
from .objectives.kl import KLEstimator, sequence_kl


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task from n samples of which c are correct (Chen et al.
    2021, "Evaluating Large Language Models Trained on Code", numerically stable form):

        pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k / i)

    The probability that at least one of k samples drawn without replacement from the
    n is correct. Needs 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k (tau-bench; checklist 13.6 [EXT]): the probability that k samples drawn
    without replacement are *all* correct, C(c, k) / C(n, k). Measures consistency."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_hat_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return math.comb(c, k) / math.comb(n, k)


def mean_pass_at_k(correct_per_task: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k averaged over tasks; task i contributes pass_at_k(len(s_i), sum(s_i), k).

    correct_per_task: one sequence of booleans (or 0/1) per task, each of length >= k.
    """
    if not correct_per_task:
        raise ValueError("mean_pass_at_k: no tasks")
    vals = [pass_at_k(len(s), int(sum(bool(x) for x in s)), k) for s in correct_per_task]
    return sum(vals) / len(vals)


def distinct_answers(answers_per_task: Sequence[Sequence[Hashable]], k: int | None = None) -> float:
    """Mean number of distinct answers among the first k samples of each task (post-training
    ch.13: diversity collapse under RL, e.g. 7.3 -> 4.3 distinct answers per 16 samples).

    answers_per_task: one sequence of hashable answers per task (e.g. parsed numbers,
    or None for unparsable); k None = all samples of the task.
    """
    if not answers_per_task:
        raise ValueError("distinct_answers: no tasks")
    counts = []
    for answers in answers_per_task:
        picked = list(answers) if k is None else list(answers)[:k]
        if k is not None and len(picked) < k:
            raise ValueError(f"distinct_answers: a task has {len(picked)} samples, fewer than k={k}")
        counts.append(len(set(picked)))
    return sum(counts) / len(counts)


def mean_action_entropy(logits: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean entropy (nats) of the policy's next-token distribution at the positions that
    predict POLICY tokens.

    logits [B, T, V] from a forward pass over the batch, mask [B, T-1] (Batch.action_mask):
    position t of the mask is predicted by logits[:, t].
    """
    if logits.dim() != 3 or mask.shape != (logits.shape[0], logits.shape[1] - 1):
        raise ValueError(f"mean_action_entropy: logits {tuple(logits.shape)} vs mask {tuple(mask.shape)}")
    with torch.no_grad():
        ent = entropy_from_logits(logits[:, :-1])  # [B, T-1]
        return float(masked_mean(ent, mask))


def kl_from_reference(
    logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, kind: KLEstimator = "k3"
) -> dict[str, float]:
    """KL(pi || pi_ref) estimated on the policy's own samples (RLHF book ch.15 "KL
    Divergence in RL Optimization"; checklist 0.7: always log it).

    logp, ref_logp, mask [B, T-1]: log-probs of sampled POLICY tokens under the policy
    and the reference. returns {"kl/sequence": mean over episodes of the summed per-token
    estimate, "kl/token": mean per POLICY token} in nats; `kind` picks k1 / k2 / k3.
    """
    with torch.no_grad():
        seq = sequence_kl(logp, ref_logp, mask, kind, reduce="sum")  # [B]
        n_tok = mask.float().sum().clamp(min=1)
        return {"kl/sequence": float(seq.mean()), "kl/token": float(seq.sum() / n_tok)}


def informative_group_share(rewards: torch.Tensor, groups: torch.Tensor) -> float:
    """Share of groups whose rewards are not all equal: the groups that give a group
    baseline any signal (REPRODUCE A10; RLHF book checklist 6.7 / DAPO dynamic sampling).

    rewards [B], groups [B] long (any ids, any order, any sizes). A group of one is
    not informative.
    """
    if rewards.dim() != 1 or groups.shape != rewards.shape:
        raise ValueError(f"informative_group_share: rewards {tuple(rewards.shape)}, groups {tuple(groups.shape)}")
    if len(rewards) == 0:
        return 0.0
    spread, _ = group_reward_range(rewards, groups)  # [n_groups]
    return float((spread > 0).float().mean())


def hack_rate(public_pass: Sequence[bool], hidden_pass: Sequence[bool], among_public_pass: bool = False) -> float:
    """Share of episodes that pass the public tests but fail the hidden ones (REPRODUCE
    A13: reward hacking with `hardcode_tests`).

    public_pass, hidden_pass: one bool per episode. `among_public_pass=True` divides by
    the episodes that passed the public tests (the hack share of a filtered / kept set)
    instead of all episodes; 0.0 when that set is empty.
    """
    if len(public_pass) != len(hidden_pass):
        raise ValueError(f"hack_rate: {len(public_pass)} public vs {len(hidden_pass)} hidden results")
    hacks = sum(1 for p, h in zip(public_pass, hidden_pass, strict=True) if p and not h)
    denom = sum(1 for p in public_pass if p) if among_public_pass else len(public_pass)
    return hacks / denom if denom else 0.0
