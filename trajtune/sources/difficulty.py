"""Offline difficulty filtering (RLHF book ch.7.3): before RL, sample N completions of every prompt with the
starting policy and keep the prompts it solves sometimes -- "sample N (e.g. 16) completions per prompt and keep
prompts with a 20-80% pass rate. 0% or 100% prompts give no gradient" (a group whose rewards are all equal has
zero advantage under a group baseline).

    kept, rates = filter_by_difficulty(source, tasks, n=16, low=0.2, high=0.8, seed=0)

`source` is any `Source` that scores its episodes (e.g. `Scored(EpisodeSource(...), ...)`, or an environment
whose episodes carry a reward); an episode solves its task when its reward is >= `solved_at`. Episodes whose
environment or reward failed (`Trajectory.outcome`) count for nothing: a task's rate is over the episodes that
worked, and a task none of whose episodes worked is dropped (rate None). Seeded: chunk c of the tasks is drawn
with `seeding.generator(seed, c)`, so a rerun keeps the same tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..seeding import generator
from .base import Draw, Source


@dataclass(frozen=True)
class Difficulty:
    """What the filter measured of one task."""

    task: Any
    solved: int
    """episodes with reward >= solved_at"""
    scored: int
    """episodes whose environment and reward worked (the rate's denominator)"""

    @property
    def rate(self) -> float | None:
        """solved / scored (None: no episode worked)"""
        return self.solved / self.scored if self.scored else None


def solve_rates(source: Source, tasks: Sequence[Any], n: int = 16, seed: int = 0, solved_at: float = 1.0,
                chunk: int = 8) -> list[Difficulty]:
    """`n` episodes of every task from `source`, `chunk` tasks per draw (draw c seeded with (seed, c)) ->
    one `Difficulty` per task, in the order of `tasks`."""
    if n < 1 or chunk < 1:
        raise ValueError(f"solve_rates: n and chunk must be >= 1, got n={n}, chunk={chunk}")
    out = []
    for c, start in enumerate(range(0, len(tasks), chunk)):
        part = list(tasks[start : start + chunk])
        episodes = source.take(Draw(part, n, generator(seed, c), c))
        if len(episodes.trajs) != len(part) * n:
            raise ValueError(f"solve_rates: the source gave {len(episodes.trajs)} episodes for {len(part)} tasks x "
                             f"{n}; a source for this filter must return every episode of its draw, task-major")
        for i, task in enumerate(part):
            group = [t for t in episodes.trajs[i * n : (i + 1) * n] if t.trainable]
            out.append(Difficulty(task, sum(t.reward >= solved_at for t in group), len(group)))
    return out


def filter_by_difficulty(source: Source, tasks: Sequence[Any], n: int = 16, low: float = 0.2, high: float = 0.8,
                         seed: int = 0, solved_at: float = 1.0, chunk: int = 8) -> tuple[list[Any], dict[str, float]]:
    """The tasks whose solve rate over `n` episodes lies in [low, high] (both ends kept), in their order, and
    every task's rate by name (its `.name`, else the task itself as a string; a task none of whose episodes
    worked is absent and not kept)."""
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"filter_by_difficulty: need 0 <= low <= high <= 1, got low={low}, high={high}")
    measured = solve_rates(source, tasks, n, seed, solved_at, chunk)
    rates = {str(getattr(d.task, "name", d.task)): d.rate for d in measured if d.rate is not None}
    kept = [d.task for d in measured if d.rate is not None and low <= d.rate <= high]
    return kept, rates
