"""Pieces the loops share: rollout statistics, selection, train rows.

The loop template itself (signature, numbered phases, the `Run` object for logging,
evaluation, checkpoints and hooks) is in `trajtune.runs.loop`. A loop that trains on the
policy's own samples gets them from a source (`trajtune.sources.base.Source`):

    episodes = source.take(draws(step), ahead=draws)   # Episodes(trajs, metrics, generator)

whose trajectories come back with `reward`, `group` (one id per task instance), `info` and
`outcome` set; the loops train on `episodes.trainable` only. Experiments build the source
(`trajtune.sources`: an `EpisodeSource` of a policy, environments and a renderer, wrapped as
they need); loops never see environments.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Literal, Sequence

from ..trajectory import Outcome, Owner, Trajectory


def rollout_metrics(trajs: Sequence[Trajectory], prefix: str = "rollout") -> dict[str, float]:
    """Of the episodes whose environment and reward worked: mean reward, pass rate (reward >= 1), POLICY tokens and
    invalid calls per episode, the share with a turn cut at the token budget; and how many failed in the infrastructure
    (environment or reward: `Outcome`)."""
    if not trajs:
        return {}
    failed = sum(t.outcome in (Outcome.ENV_ERROR, Outcome.REWARD_ERROR) for t in trajs)
    trajs = [t for t in trajs if t.trainable]
    out = {f"{prefix}/infra_failures": float(failed)}
    if not trajs:
        return out
    n = len(trajs)
    out.update({
        f"{prefix}/reward": sum(t.reward for t in trajs) / n,
        f"{prefix}/pass_rate": sum(t.reward >= 1.0 for t in trajs) / n,
        f"{prefix}/policy_tokens": sum(t.count(Owner.POLICY) for t in trajs) / n,
    })
    if all("n_invalid" in t.info for t in trajs):
        out[f"{prefix}/invalid_per_episode"] = sum(t.info["n_invalid"] for t in trajs) / n
    if all(t.unterminated is not None for t in trajs):  # a turn cut at the token budget (sources.rollout)
        out[f"{prefix}/truncated_share"] = sum(t.truncated for t in trajs) / n
    return out


Selection = Literal["accepted", "top_per_prompt", "top_overall"]


def check_selection(config, name: str) -> None:
    """Shared checks of the sample-and-select loops' configs (RFT, iw-SFT)."""
    if not math.isfinite(config.threshold):
        raise ValueError(f"{name}: threshold must be a finite number, got {config.threshold}")
    if config.aggregation == "constant":
        raise ValueError(f"{name}: aggregation='constant' needs a constant, which {name} has not "
                         "(use token or sequence)")


def select_episodes(
    trajs: Sequence[Trajectory],
    mode: Selection = "accepted",
    threshold: float = 1.0,
    top_fraction: float = 0.25,
    random_control: bool = False,
    seed: int = 0,
    top_k: int = 0,
) -> list[Trajectory]:
    """Which sampled episodes rejection sampling keeps (RLHF book ch.9.3), in sampling order.

    accepted:        reward >= threshold (a verifier's yes)
    top_per_prompt:  the best-scoring episode of each group, S(R)_i = argmax_j r_ij (ties: the first)
    top_overall:     the K best of all episodes, S_K(R_flat) = argsort(R_flat)[-K:] (ties: the first sampled);
                     K = `top_k`, or round(top_fraction x episodes) when top_k is 0
    random_control:  the matched control of ch.9.6: top_per_prompt -> one episode per group, uniformly at
                     random (random-per-prompt); otherwise as many episodes as the selection keeps, uniformly at
                     random over all (random-K-overall) -- it shows how much the scorer's choice matters
    """
    trajs = list(trajs)
    rng = random.Random(seed)
    if mode == "accepted":
        kept = [t for t in trajs if t.reward >= threshold]
    elif mode == "top_per_prompt":
        groups: dict[int, list[Trajectory]] = {}
        for t in trajs:
            groups.setdefault(t.group, []).append(t)
        if random_control:
            return sorted((rng.choice(g) for g in groups.values()), key=trajs.index)
        kept = [max(g, key=lambda t: t.reward) for g in groups.values()]  # max keeps the first of equal rewards
    elif mode == "top_overall":
        if top_k < 0:
            raise ValueError(f"select_episodes: top_k must be >= 0 (0: use top_fraction), got {top_k}")
        k = min(len(trajs), top_k) if top_k else max(1, round(top_fraction * len(trajs)))
        order = sorted(range(len(trajs)), key=lambda i: -trajs[i].reward)[:k]  # stable: ties to the first sampled
        kept = [trajs[i] for i in sorted(order)]
    else:
        raise ValueError(f"unknown selection {mode!r}; choose accepted, top_per_prompt or top_overall")
    if random_control:
        kept = [trajs[i] for i in sorted(rng.sample(range(len(trajs)), len(kept)))]
    return kept


def action_key(t: Trajectory) -> tuple:
    """Identity of an episode for deduplication: its task and its sequence of actions."""
    return (t.info.get("task"), tuple(t.info.get("actions", ())) or tuple(t.tokens_of(Owner.POLICY)))


def dedup_and_cap(trajs: Sequence[Trajectory], dedup: bool, per_task_cap: int) -> list[Trajectory]:
    """Drop repeated (task, action sequence) episodes and keep at most `per_task_cap` per task (0: no cap)."""
    seen, per_task, out = set(), Counter(), []
    for t in trajs:
        key = action_key(t)
        if dedup and key in seen:
            continue
        task = t.info.get("task", t.group)
        if per_task_cap and per_task[task] >= per_task_cap:
            continue
        seen.add(key)
        per_task[task] += 1
        out.append(t)
    return out


def shares(trajs: Sequence[Trajectory], key: str) -> dict[str, float]:
    """Share of episodes per value of `info[key]` (e.g. the task family)."""
    counts = Counter(str(t.info.get(key)) for t in trajs)
    n = max(1, len(trajs))
    return {k: v / n for k, v in sorted(counts.items())}


def train_row(loss_metrics: dict, optim_metrics: dict) -> dict:
    """The `train/*` metrics of one optimizer step plus the loss function's own statistics."""
    row = {"train/loss": loss_metrics["loss"], "train/grad_norm": optim_metrics["grad_norm"],
           "train/lr": optim_metrics["lr"], "train/skipped": optim_metrics.get("skipped", 0.0)}
    row.update({k: v for k, v in loss_metrics.items() if k != "loss"})
    return row
