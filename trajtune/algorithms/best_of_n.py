"""Best-of-N sampling (RLHF book ch.9): draw n episodes per prompt, keep the one a scorer likes best.

No training: the policy is changed only by selection. Its KL from the sampling
policy is bounded analytically by log n - (n-1)/n (Beirami et al.; seed ch.13
step 2), which makes best-of-n the yardstick for "reward per nat" of other methods.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from ..trajectory import Trajectory
from ..sources.base import Draw, Source


def best_of_n_kl_bound(n: int) -> float:
    """Analytic upper bound on KL(best-of-n || base) in nats: log n - (n - 1) / n."""
    if n < 1:
        raise ValueError(f"best_of_n_kl_bound: n must be >= 1, got {n}")
    return math.log(n) - (n - 1) / n


def best_of_n(
    tasks: Sequence,
    source: Source,
    n: int,
    generator: torch.Generator,
    score: Callable[[list[Trajectory]], list[float]] | None = None,
) -> tuple[list[Trajectory], list[Trajectory]]:
    """Sample n episodes of every task and pick the highest-scoring one per task.

    score(trajs) -> one float each (a reward model); None uses each episode's own reward.
    Ties go to the earliest sample; an episode whose environment or reward failed is never picked
    (a task whose every sample failed has none). Returns (best per task, in task order; all samples).
    The chosen episode's `info['best_of_n_score']` records its score.
    """
    if n < 1:
        raise ValueError(f"best_of_n: n must be >= 1, got {n}")
    samples = source.take(Draw(list(tasks), n, generator)).trainable
    scores = score(samples) if score is not None else [t.reward for t in samples]
    best: dict[int, tuple[float, Trajectory]] = {}
    order: list[int] = []
    for t, s in zip(samples, scores, strict=True):
        if t.group not in best:
            order.append(t.group)
        if t.group not in best or s > best[t.group][0]:
            best[t.group] = (s, t)
    chosen = []
    for gid in order:
        s, t = best[gid]
        t.info["best_of_n_score"] = float(s)
        chosen.append(t)
    return chosen, samples
