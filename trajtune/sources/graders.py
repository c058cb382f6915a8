"""Graders: what scores a batch of finished episodes, and the one weighted list of them that `Scored` takes.

A grader (`Grader`) has a name, scores N completions (a `RewardBatch`) with a number each or None where it does
not apply (left out of the weighted sum), and reports metrics of that call (`Grades`). The kinds:

    RewardFunction  a TRL-style reward function (sources.rewards): user code, called on rank 0 in a worker
                    process or a thread under its time limit, its grades broadcast (`main_only`)
    RewardModel     a trained reward model's score (sources.scoring), sharded over the ranks
    RewardEnsemble  several reward models as one (sources.ensemble)
    Judge           a language model's verdict (sources.judge)
    RubricReward    a rubric's weighted items (sources.rewards.rubric)

A model-graded kind scores finished completions only (`finished_only`: `Scored` gives an unfinished one its
penalty instead). Graders are started together and then waited for in order (`Grader.start` returns the wait),
so reward functions in worker processes run at the same time. `Weighted` pairs a grader with its weight;
`Scored(source, engine, [Weighted(f, 1.0), Weighted(rm, 0.5)])` gives each episode the weighted sum over the
graders that scored it (`rewards.combine`). How a command builds the list from its options:
`trajtune.experiments.hf.graders` (its registry `GRADERS`: a new kind is its class and one line there). Nothing
here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

if TYPE_CHECKING:
    from .rewards.functions import RewardBatch, RewardState


@dataclass
class Grades:
    """What one grader gave a batch of N completions."""

    scores: Sequence[float | None]
    """[N] a finite number per completion, or None where the grader does not apply (or could not grade it)"""
    metrics: dict[str, float] = field(default_factory=dict)
    """reward/<name>/... of this call (what a function logged, a judge's unparseable share, ...)"""
    failed: dict[int, str] = field(default_factory=dict)
    """row -> why it got no score because the call failed on it (a reward call past its time limit): the episode
    is REWARD_ERROR, not merely unscored"""
    extras: dict[str, list] = field(default_factory=dict)
    """column -> [N] values kept with each episode (info['reward_extra']; a function's log_extra)"""


class Grader(Protocol):
    """Scores a batch of finished completions (module docstring)."""

    name: str
    """its name among the graders: its metrics are reward/<name>/mean and /std, its score info['rewards'][name]"""
    finished_only: bool
    """True: it scores finished completions only (a model): `Scored` replaces its score of an unfinished one"""
    main_only: bool
    """True: `Scored` starts it on rank 0 only and broadcasts its grades (user code, run once); False: every rank
    starts it (a model sharded over the ranks)"""

    def start(self, batch: RewardBatch, state: RewardState) -> Callable[[], Grades]:
        """Begin grading `batch` (N completions; `state`: the optimizer steps so far and in all) and return the
        call that waits for and returns its `Grades` (a grader that computes here may do it all in that call).
        Raises `RewardError` for user code that fails or returns a non-score, naming it and the rows."""
        ...

    def close(self) -> None:
        """Stop what it runs (worker processes); a later `start` starts them again."""
        ...


@dataclass(frozen=True)
class Weighted:
    """A grader and its weight in the sum."""

    grader: Grader
    weight: float = 1.0


def weighted(graders: Sequence[Grader], weights: Sequence[float] = ()) -> list[Weighted]:
    """`graders` with `weights` in their order (empty: 1 each); a count that differs is a ValueError naming them."""
    if weights and len(weights) != len(graders):
        raise ValueError(f"{len(weights)} weights for {len(graders)} graders {[g.name for g in graders]}")
    return [Weighted(g, float(w)) for g, w in zip(graders, weights or [1.0] * len(graders), strict=True)]


def grade_all(graders: Sequence[Grader], batch: RewardBatch, state: RewardState) -> list[Grades]:
    """Every grader's Grades of `batch`: all started, then waited for in order."""
    waits = [g.start(batch, state) for g in graders]
    return [wait() for wait in waits]


def check_faults(grades: Sequence[Grades], batch: RewardBatch, max_fault_share: float) -> dict[int, str]:
    """The rows some grader failed on (row -> the first grader's reason); more than `max_fault_share` of the batch
    is a `RewardError` listing them."""
    from .rewards.functions import RewardError, _listing

    failed: dict[int, str] = {}
    for g in grades:
        failed.update({i: why for i, why in g.failed.items() if i not in failed})
    n = len(batch)
    if len(failed) > max_fault_share * n:
        raise RewardError(f"{len(failed)} of {n} completions got no reward (limit {max_fault_share:.0%}): "
                          + _listing(sorted(failed), batch, lambda i: failed[i]))
    return failed
