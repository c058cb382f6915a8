"""Reward-model ensembles (RLHF book ch.14.4, Coste et al. 2023): several scorers as one reward source.

Over-optimization exploits the errors of one reward model; members trained on other data or seeds err
elsewhere, so a conservative combination of their scores is harder to exploit:

    mean            the members' mean
    min             the worst case (Coste et al.'s WCO): a completion is as good as its lowest score
    mean_minus_std  mean - k * std over the members (an uncertainty penalty; Coste et al.'s UWO uses the
                    variance, the issue's and TRL-style tooling the std; population std, over the M members)

`combine_ensemble` is the pure function on a [M, B] score tensor; `RewardEnsemble` wraps scorers that take a
`RewardBatch` (a `trajtune.sources.scoring.RewardModel`, a judge, any callable) and is one itself -- and a grader
(`trajtune.sources.graders.Grader`) -- with the
members' disagreement of its last call in `metrics` (reward/<name>/member_std: the mean over completions of
the std over members).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Literal, Sequence, get_args

import torch

from .graders import Grades

if TYPE_CHECKING:
    from .rewards import RewardBatch, RewardState

Combine = Literal["mean", "min", "mean_minus_std"]
COMBINES: tuple[str, ...] = get_args(Combine)


def combine_ensemble(scores: torch.Tensor, how: str = "mean", k: float = 1.0) -> torch.Tensor:
    """scores [M, B] (M members' scores of B completions) -> [B] combined: mean, min, or mean - k * std
    (population std over the M members; one member: std 0)."""
    if scores.dim() != 2 or scores.shape[0] < 1:
        raise ValueError(f"combine_ensemble: scores must be [M, B] with M >= 1, got shape {tuple(scores.shape)}")
    if how not in COMBINES:
        raise ValueError(f"combine_ensemble: how must be one of {COMBINES}, got {how!r}")
    if how == "min":
        return scores.min(0).values
    mean = scores.mean(0)
    if how == "mean":
        return mean
    if not k >= 0:
        raise ValueError(f"combine_ensemble: k must be >= 0, got {k}")
    return mean - k * scores.std(0, unbiased=False)


class RewardEnsemble:
    """Several scorers (`RewardBatch` -> [N] floats or None) as one: `combine_ensemble` of their scores.

    A completion some member left None (does not apply) is None in the ensemble too: the members must agree on
    what they score. `metrics` holds reward/<name>/member_std of the last call."""

    finished_only = True
    main_only = False

    def __init__(self, members: Sequence[Callable], how: str = "mean", k: float = 1.0, name: str = "reward_ensemble"):
        if not members:
            raise ValueError("RewardEnsemble: no members")
        if how not in COMBINES:
            raise ValueError(f"RewardEnsemble: how must be one of {COMBINES}, got {how!r}")
        if not k >= 0:
            raise ValueError(f"RewardEnsemble: k must be >= 0, got {k}")
        self.members, self.how, self.k, self.name = list(members), how, float(k), name
        self.metrics: dict[str, float] = {}

    def __call__(self, batch) -> list[float | None]:
        per = [list(m(batch)) for m in self.members]  # [M][N]
        n = len(per[0])
        if any(len(p) != n for p in per):
            raise ValueError(f"RewardEnsemble {self.name}: members returned {[len(p) for p in per]} scores")
        rows = [i for i in range(n) if all(p[i] is not None for p in per)]
        out: list[float | None] = [None] * n
        if rows:
            scores = torch.tensor([[float(p[i]) for i in rows] for p in per], dtype=torch.float64)  # [M, R]
            for i, v in zip(rows, combine_ensemble(scores, self.how, self.k).tolist(), strict=True):
                out[i] = v
            self.metrics = {f"reward/{self.name}/member_std": float(scores.std(0, unbiased=False).mean())}
        return out

    def start(self, batch: RewardBatch, state: RewardState) -> Callable[[], Grades]:
        """As a grader (`trajtune.sources.graders.Grader`): its scores and `metrics`, computed in the wait."""
        return lambda: Grades(self(batch), self.metrics)

    def close(self) -> None:
        pass
