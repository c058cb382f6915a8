"""A policy in environments as a source: `EpisodeSource(policy, make_env, renderer)`.

`take(draw)` runs `draw.n` episodes of every task of the draw in one lockstep batch (the
episode loop, `trajtune.sources.rollout.rollout_batch`), task-major (task 0's episodes
first), with group id i for the episodes of `draw.tasks[i]` -- one group per task
*instance*, so a task drawn twice makes two groups. Around the episode loop:

  * seeding: with `episode_seeds` (or a shard), episode e of a draw samples from its own
    generator, seeded by `seeding.episode_seed(base, e)` from one draw `base` of the draw's
    generator, so its actions do not depend on the batch or the process it runs in;
  * sharding: with `shard` (`trajtune.engine.distributed.Shard`), each process runs only its
    share of the episodes and all-gathers the finished trajectories;
  * the run-level fault limit (`trajtune.sources.faults.check_faults`) on every draw;
  * its wall time, returned as the metric `time/sampling_s`.

Where the episode loop runs is the `policy`, passed explicitly:

    EpisodeSource(Decoder(engine.sample, settings), ...)    here, with a `trajtune.sources.sampler.Sampler`
    EpisodeSource(SamplerProcess(engine, settings), ...)   in a process holding its own copy of the weights,
                                                           synced and checked after every update (`after_update`)

`Measured(source, fn)` adds `fn(trajectories)` to a source's metrics (an experiment's counts).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, cast

import torch

from ..envs.base import Env
from ..seeding import episode_seed
from ..text.render import RendererProtocol
from ..trajectory import Trajectory
from .base import Draw, Episodes, Schedule, Source, Wrapper
from .faults import STEP_TIMEOUT_S, check_faults
from .rollout import rollout_batch
from .sampler import Sampler


@dataclass(frozen=True)
class Limits:
    """An episode's limits (`rollout.rollout_batch`'s): policy turns, tokens in all, seconds per environment call."""

    max_turns: int = 6
    max_tokens: int = 512
    step_timeout_s: float | None = STEP_TIMEOUT_S


class EpisodeRunner(Protocol):
    """Where the episode loop runs: `rollout(envs, tasks, renderer, generator, limits, groups, row_seeds)` is
    `rollout_batch(<its sampler>, envs, tasks, renderer, generator, ...)`, here or elsewhere."""

    def rollout(self, envs: Sequence[Env], tasks: Sequence[Any], renderer: RendererProtocol,
                generator: torch.Generator | None, limits: Limits, groups: Sequence[int] | None = None,
                row_seeds: Sequence[int] | None = None) -> list[Trajectory]: ...

    def after_update(self, engine: Any) -> dict[str, float]: ...

    def close(self) -> None: ...


class Here:
    """The episode loop in this process, sampling with `sampler` (e.g. `Decoder(engine.sample, settings)`)."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler

    def rollout(self, envs: Sequence[Env], tasks: Sequence[Any], renderer: RendererProtocol,
                generator: torch.Generator | None, limits: Limits, groups: Sequence[int] | None = None,
                row_seeds: Sequence[int] | None = None) -> list[Trajectory]:
        return run_episodes(self.sampler, envs, tasks, renderer, generator, limits, groups, row_seeds)

    def after_update(self, engine: Any) -> dict[str, float]:
        return {}  # the sampler reads the trainer's own weights

    def close(self) -> None:
        pass


class EpisodeSource:
    """Episodes of `policy` in fresh environments from `make_env`, rendered by `renderer` (module docstring).

    policy:          a `Sampler` (`Decoder(engine.sample, settings)`: the episode loop runs here) or an
                     `EpisodeRunner` (a `trajtune.sources.process.SamplerProcess`: it runs there)
    max_turns, max_tokens: an episode's limits (`rollout.rollout_batch`)
    episode_seeds:   episode e of a draw samples from its own generator (module docstring)
    shard:           run this process's share of the episodes and all-gather them (`engine.shard`; implies
                     episode_seeds): every process returns the same whole list, in order
    max_fault_share: more failed environments than this share of a draw stop the run (`faults.TooManyFaults`)
    step_timeout_s:  time limit of each `env.reset` / `env.step` call (default 60 s; 0 or None: none); an
                     environment that raises or overruns fails its episode alone (outcome ENV_ERROR)
    """

    def __init__(self, policy: Sampler | EpisodeRunner, make_env: Callable[[], Env], renderer: RendererProtocol, *,
                 max_turns: int = 6, max_tokens: int = 512, episode_seeds: bool = False, shard: Any = None,
                 max_fault_share: float = 0.5, step_timeout_s: float | None = STEP_TIMEOUT_S):
        self.runner = cast(EpisodeRunner, policy) if hasattr(policy, "rollout") else Here(cast(Sampler, policy))
        self.make_env, self.renderer, self.shard = make_env, renderer, shard
        self.episode_seeds, self.max_fault_share = episode_seeds, max_fault_share
        self.limits = Limits(max_turns, max_tokens, step_timeout_s)

    def take(self, draw: Draw, ahead: Schedule | None = None) -> Episodes:
        t0 = time.perf_counter()
        trajs = self.run(draw.tasks, draw.n, draw.generator)
        return Episodes(trajs, {"time/sampling_s": time.perf_counter() - t0}, draw.generator, draw.step)

    def run(self, tasks: Sequence[Any], n: int, generator: torch.Generator) -> list[Trajectory]:
        """`n` episodes of every task, task-major, group i for tasks[i] (advances `generator`)."""
        batch = [task for task in tasks for _ in range(n)]
        groups = [i for i in range(len(tasks)) for _ in range(n)]
        if not self.episode_seeds and self.shard is None:
            trajs = self.runner.rollout([self.make_env() for _ in batch], batch, self.renderer, generator,
                                        self.limits, groups)
        else:
            base = int(torch.randint(0, 2**62, (1,), generator=generator))
            mine = list(range(len(batch))) if self.shard is None else self.shard.rows(len(batch))
            trajs = self.runner.rollout([self.make_env() for _ in mine], [batch[i] for i in mine], self.renderer, None,
                                        self.limits, [groups[i] for i in mine],
                                        [episode_seed(base, i) for i in mine]) if mine else []
            trajs = trajs if self.shard is None else self.shard.gather(len(batch), trajs)
        check_faults(trajs, self.max_fault_share)
        return trajs

    def after_update(self, engine: Any) -> dict[str, float]:
        return self.runner.after_update(engine)

    def pending(self) -> list[Episodes]:
        return []

    def restore(self, episodes: list[Episodes]) -> None:
        if episodes:
            raise ValueError(f"EpisodeSource draws nothing ahead; a checkpoint's pending episodes of step "
                             f"{episodes[0].step} belong to an overlapped source (trajtune.sources.overlap.Overlapped)")

    def close(self) -> None:
        self.runner.close()

    def __enter__(self) -> "EpisodeSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Measured(Wrapper):
    """`inner`'s episodes, with `measure(trajectories) -> {metric: float}` added to their metrics (e.g. an
    experiment's cost counters: sampled episodes, verifier calls)."""

    def __init__(self, inner: Source, measure: Callable[[list[Trajectory]], dict[str, float]]):
        super().__init__(inner)
        self.measure = measure

    def take(self, draw: Draw, ahead: Schedule | None = None) -> Episodes:
        episodes = self.inner.take(draw, ahead)
        episodes.metrics.update(self.measure(episodes.trajs))
        return episodes


def run_episodes(sampler: Sampler, envs: Sequence[Env], tasks: Sequence[Any], renderer: RendererProtocol,
                 generator: torch.Generator | None, limits: Limits, groups: Sequence[int] | None = None,
                 row_seeds: Sequence[int] | None = None) -> list[Trajectory]:
    """`rollout.rollout_batch` under `limits` (what every `EpisodeRunner` runs, wherever it runs)."""
    return rollout_batch(sampler, envs, tasks, renderer, generator, max_turns=limits.max_turns,
                         max_tokens=limits.max_tokens, groups=groups, row_seeds=row_seeds,
                         step_timeout_s=limits.step_timeout_s)


def sample_episodes(source: Source, tasks: Sequence[Any], n: int, seed: int | torch.Generator) -> list[Trajectory]:
    """Every episode of one draw of `source` outside a loop (evaluation, a set of preference pairs): `n` of each
    of `tasks`, from `seed` (an int, or a generator to advance)."""
    g = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)
    return source.take(Draw(list(tasks), n, g)).trajs
