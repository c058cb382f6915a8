"""Evaluation statistics: pass@k, pass^k, distinct answers, entropy, KL, informative groups, hacks,
and `score_policy`: a policy's mean reward, pass@k and per-task table on a list of tasks.

Pure functions of counts, answers, trajectories and tensors; nothing here trains, and the one
function that samples (`score_policy`) does it through the source it is given (`trajtune.sources.base.Source`,
e.g. an `EpisodeSource`), so this module knows nothing about models or environments.
Sources: RLHF book ch.16 "Evaluation" (pass@k, checklist 16.2(c) [EXT]: Chen et al.
2021's unbiased estimator), ch.13 (pass^k of tau-bench, checklist 13.6 [EXT]),
post-training ch.13 (distinct answers per k samples, share of groups with signal),
agent-rl ch.15 / REPRODUCE A10, A13 (informative groups, reward hacking).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import torch

from .logprobs import entropy_from_logits, masked_mean
from .objectives.advantages import group_reward_range
from .objectives.kl import KLEstimator, sequence_kl
from .sources.base import Draw, Source
from .trajectory import Trajectory


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


@dataclass(frozen=True)
class TaskScore:
    """One task's row of a `PolicyScore`: its name (info["task"]), episodes, mean reward, correct episodes."""

    name: str
    n: int
    mean_reward: float
    n_correct: int
    n_failed: int = 0
    """episodes whose environment or reward failed (`Trajectory.outcome`; they count as reward 0, not correct)"""


@dataclass(frozen=True)
class PolicyScore:
    """A policy scored on a list of tasks, `n` episodes each (`score_policy`, `score_trajectories`).

    mean_reward: mean episode reward over all episodes (every task weighs the same: each has n)
    pass_at:     {k: pass@k averaged over tasks}, unbiased estimator (`pass_at_k`) from the n episodes
    per_task:    one `TaskScore` per task, in the order of the tasks
    threshold:   an episode is correct when its reward >= threshold
    """

    mean_reward: float
    pass_at: dict[int, float]
    per_task: tuple[TaskScore, ...]
    threshold: float = 1.0

    @property
    def n_failed(self) -> int:
        """Episodes whose environment raised (reported per task in `per_task`)."""
        return sum(t.n_failed for t in self.per_task)

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        """Flat metrics for a log row: {prefix}/reward, {prefix}/pass@k for each k, {prefix}/env_errors."""
        out = {f"{prefix}/reward": self.mean_reward, **{f"{prefix}/pass@{k}": v for k, v in self.pass_at.items()}}
        out[f"{prefix}/env_errors"] = float(self.n_failed)
        return out

    def table(self, max_rows: int | None = 20) -> str:
        """A markdown table, one row per task (the worst first, so what fails is on top; `max_rows`
        None: all), then the totals."""
        ks = sorted(self.pass_at)
        head = "| task | episodes | mean reward | correct |" + "".join(f" pass@{k} |" for k in ks)
        lines = [head, "|---" * (4 + len(ks)) + "|"]
        rows = sorted(self.per_task, key=lambda t: (t.mean_reward, t.name))
        for t in rows if max_rows is None else rows[:max_rows]:
            passes = "".join(f" {pass_at_k(t.n, t.n_correct, k):.2f} |" for k in ks)
            failed = f" ({t.n_failed} env errors)" if t.n_failed else ""
            lines.append(f"| {t.name} | {t.n} | {t.mean_reward:.3f} | {t.n_correct}/{t.n}{failed} |{passes}")
        if max_rows is not None and len(rows) > max_rows:
            lines.append(f"| ... {len(rows) - max_rows} more tasks | | | |" + " |" * len(ks))
        total = "".join(f" **{self.pass_at[k]:.3f}** |" for k in ks)
        lines.append(f"| **all {len(rows)} tasks** | {sum(t.n for t in rows)} | **{self.mean_reward:.3f}** | "
                     f"{sum(t.n_correct for t in rows)}/{sum(t.n for t in rows)} |{total}")
        return "\n".join(lines)


def score_trajectories(trajs: Sequence[Trajectory], ks: Sequence[int] = (1,), threshold: float = 1.0) -> PolicyScore:
    """Score finished episodes grouped by `traj.group` (a source's layout: group i = tasks[i]).

    Each group is one task; its name is the first episode's info["task"]. Every group needs at
    least max(ks) episodes (pass@k draws k of them). Correct: reward >= threshold.
    """
    if not trajs:
        raise ValueError("score_trajectories: no episodes")
    groups: dict[int, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(t.group, []).append(t)
    per_task = []
    for g, episodes in groups.items():
        rewards = [float(t.reward) for t in episodes]
        per_task.append(TaskScore(str(episodes[0].info.get("task", f"group {g}")), len(episodes),
                                  sum(rewards) / len(rewards), sum(r >= threshold for r in rewards),
                                  sum(not t.trainable for t in episodes)))
    fewest = min(t.n for t in per_task)
    if not ks or min(ks) < 1 or max(ks) > fewest:
        raise ValueError(f"score_trajectories: every k of ks={list(ks)} must be in 1..{fewest} "
                         f"(the fewest episodes of a task)")
    pass_at = {k: sum(pass_at_k(t.n, t.n_correct, k) for t in per_task) / len(per_task) for k in sorted(set(ks))}
    mean = sum(float(t.reward) for t in trajs) / len(trajs)
    return PolicyScore(mean, pass_at, tuple(per_task), threshold)


def score_policy(source: Source, tasks: Sequence[Any], n: int = 8, ks: Sequence[int] = (1,), *, seed: int = 0,
                 threshold: float = 1.0) -> PolicyScore:
    """Run `n` episodes of every task with the policy behind `source` and score them.

    source:  e.g. `trajtune.sources.episodes.EpisodeSource(engine.sample, make_env, renderer, ...)`; give it
             `greedy=True` for greedy decoding (then use n=1), a temperature otherwise.
    n:       episodes per task; pass@k for every k in `ks` (each <= n, unbiased estimator)
    seed:    the sampling seed (same seed, same episodes)
    Returns a `PolicyScore`: `.mean_reward`, `.pass_at[k]`, `.per_task`, `.table()`, `.metrics()`.
    """
    if not tasks:
        raise ValueError("score_policy: no tasks")
    if n < 1 or max(ks, default=1) > n:
        raise ValueError(f"score_policy: n={n} episodes per task; it must be >= 1 and >= every k of ks={list(ks)}")
    with torch.no_grad():
        trajs = source.take(Draw(list(tasks), n, torch.Generator().manual_seed(seed))).trajs
    return score_trajectories(trajs, ks, threshold)
