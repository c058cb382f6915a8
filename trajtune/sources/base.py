"""The contract of a source: where the trajectories a loop trains on come from (DESIGN.md, "sources").

A loop asks its source for each step's episodes and tells it when the weights changed:

    draws = Draws(tasks, n=config.group_size, seed=config.seed, steps=config.steps, per_step=8)
    for step in ...:
        episodes = source.take(draws(step), ahead=draws)    # Episodes(trajs, metrics, ...)
        ... weight the trainable episodes, update the engine ...
        row.update(source.after_update(engine))

`Draw` says what one step samples (`n` episodes of each of its tasks, task-major, from its
generator); `Draws` is a loop's schedule of them, each a pure function of (seed, step), so a
source that samples ahead can draw the next steps early (`ahead`: the schedule) and a resumed run draws the same.
`Episodes` is what comes back: the trajectories *with* their metrics (sampling time, reward
statistics, anything a wrapper measured), the draw's generator (advanced past the sampling:
a loop shuffles its minibatches with it), and how many updates the sampling policy lagged.

Sources compose explicitly, each a wrapper of another (trajtune/sources/):

    EpisodeSource(policy, make_env, renderer)   episodes.py   the policy in environments
                                                              (grouping, seeds, shards, faults)
    Scored(source, engine, graders)             scoring.py    rewards: the weighted sum of graders (graders.py)
    Overlapped(source, process, K)              overlap.py    steps s+1..s+K drawn while step s trains, in a
                                                              SamplerProcess (or vLLM), each exactly K updates behind
    Refilling(source, tasks, tries, seed)       refill.py     more draws until the step's groups carry signal (DAPO)
    Measured(source, fn)                        episodes.py   fn(trajectories) added to the metrics

An episode whose environment or reward failed has `Trajectory.outcome` other than OK: the
source keeps it (the viewer and the counts see it), and the loops train on `trainable` ones only.
This module and `refill.py` (built on it alone; the RL loop composes it) are the only parts of
`trajtune.sources` the algorithms import (tests/unit/test_layout.py).

A source of your own implements the four methods (no base class needed):

    class Constant:                              # the same episodes every step
        def __init__(self, trajs): self.trajs = trajs
        def take(self, draw, ahead=None): return Episodes(list(self.trajs), {}, draw.generator, draw.step)
        def after_update(self, engine): return {}
        def pending(self): return []
        def restore(self, episodes): pass
        def close(self): pass
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, runtime_checkable

import torch

from ..seeding import generator as step_generator
from ..trajectory import Trajectory

if TYPE_CHECKING:
    from ..engine import Engine


@dataclass(frozen=True, eq=False)
class Draw:
    """What one step samples: `n` episodes of each of `tasks` (task-major: task 0's episodes first; one group
    per task instance), drawn from `generator` (which the source advances as it samples)."""

    tasks: Sequence[Any]
    n: int
    generator: torch.Generator
    step: int = 0
    version: int | None = None
    """the weights that sample it, as the count of updates they had (None: the step's own, `step`); an overlapped
    source draws ahead with older ones (`trajtune.sources.overlap`) and says so here"""

    @property
    def sampled_by(self) -> int:
        """The version of the weights that sample this draw (`version`, else `step`)."""
        return self.step if self.version is None else self.version

    def same_as(self, other: "Draw") -> bool:
        """The same step asks for the same episodes (a source that sampled ahead checks what it drew)."""
        return (self.step, self.n, [task_name(t) for t in self.tasks]) == \
            (other.step, other.n, [task_name(t) for t in other.tasks])


Schedule = Callable[[int], "Draw | None"]
"""A loop's draws by step (`Draws`): what a source that samples ahead asks for the steps to come (None: no such
step)"""


@dataclass(frozen=True)
class Draws:
    """A loop's schedule: step s draws `n` episodes of `per_step` tasks picked from `tasks` (or of every task,
    `per_step` None) with `seeding.generator(seed, s)`; None from step `steps` on (no step after the last)."""

    tasks: Sequence[Any]
    n: int
    seed: int
    steps: int
    per_step: int | None = None

    def __call__(self, step: int) -> Draw | None:
        if step >= self.steps:
            return None
        g = step_generator(self.seed, step)
        picked = list(self.tasks) if self.per_step is None else pick_tasks(self.tasks, self.per_step, g)
        return Draw(picked, self.n, g, step)


@dataclass
class Episodes:
    """One step's episodes, as a source returns them.

    trajs:     every episode of the draw, task-major (failed ones included, `outcome` says which)
    metrics:   flat floats for the step's row: time/sampling_s, reward/<source>/mean, ... (`metrics.METRICS`)
    generator: the draw's generator after the sampling (the loop shuffles its minibatches with it)
    step:      the draw's step
    behind:    how many updates the sampling policy lagged the trained one (0: on-policy; an overlapped source
               gives up to its max_staleness K, and a loop then needs an importance correction: `RLConfig.tis_cap`)
    """

    trajs: list[Trajectory]
    metrics: dict[str, float] = field(default_factory=dict)
    generator: torch.Generator | None = None
    step: int = 0
    behind: int = 0

    @property
    def trainable(self) -> list[Trajectory]:
        """The episodes a loss may see: those whose environment and reward worked (`Trajectory.trainable`)."""
        return [t for t in self.trajs if t.trainable]


@runtime_checkable
class Source(Protocol):
    """Where a loop's trajectories come from (module docstring)."""

    def take(self, draw: Draw, ahead: Schedule | None = None) -> Episodes:
        """The episodes of `draw`. `ahead`: the loop's schedule (`Draws`: step -> the draw that step will ask
        for), from which a source that samples ahead may start the next steps now (the others ignore it)."""
        ...

    def after_update(self, engine: "Engine") -> dict[str, float]:
        """The engine's weights changed (an optimizer step, a round): bring a sampler holding its own copy up to
        date. -> metrics for the step's row (e.g. sync/logprob_diff)."""
        ...

    def pending(self) -> list[Episodes]:
        """Episodes drawn ahead and not taken yet, in step order, which a checkpoint must keep for an exact resume
        ([]: none)."""
        ...

    def restore(self, episodes: list[Episodes]) -> None:
        """Take back what `pending` gave, after a resume (the next `take`s of those steps return them)."""
        ...

    def close(self) -> None:
        """Stop what the source started (processes, threads); it is not used afterwards."""
        ...


class Wrapper:
    """A source around another: passes `after_update`, `pending`, `restore` and `close` to `inner`; a wrapper
    changes `take` (and may add to the others). The one base class of the sources."""

    def __init__(self, inner: Source):
        self.inner = inner

    def take(self, draw: Draw, ahead: Schedule | None = None) -> Episodes:
        return self.inner.take(draw, ahead)

    def after_update(self, engine: "Engine") -> dict[str, float]:
        return self.inner.after_update(engine)

    def pending(self) -> list[Episodes]:
        return self.inner.pending()

    def restore(self, episodes: list[Episodes]) -> None:
        self.inner.restore(episodes)

    def close(self) -> None:
        self.inner.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def pick_tasks(tasks: Sequence[Any], n: int, generator: torch.Generator) -> list[Any]:
    """`n` tasks: a random permutation's prefix when n <= len(tasks), else whole passes plus a prefix."""
    if n > 0 and not tasks:
        raise ValueError(f"no tasks to draw {n} from: the task list is empty")
    out: list[Any] = []
    while len(out) < n:
        perm = torch.randperm(len(tasks), generator=generator).tolist()
        out += [tasks[i] for i in perm[: n - len(out)]]
    return out


def task_name(task: Any) -> str:
    """A task's name (its `.name`, else its repr): how messages and checks name it."""
    return str(getattr(task, "name", repr(task)))
