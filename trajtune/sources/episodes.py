"""Collecting a step's episodes: `collect(tasks, n_per_task, generator)` for the algorithm loops.

`make_collect` packages a sampler, an environment factory and a renderer as the
one callable the loops (algorithms/common.py `Collect`) sample through; they
never see environments. Three concerns live here, on top of the episode loop
(`trajtune.sources.rollout.rollout_batch`):

  * grouping: `n_per_task` episodes of every task, task-major, one group per
    task instance;
  * seeding: with `episode_seeds` (or a shard), episode e of a call samples from
    its own generator, seeded by `episode_seed(base, e)` from one draw `base` of
    the call's generator, so its actions do not depend on the batch it runs in;
  * sharding: with `shard` (`trajtune.engine.distributed.Shard`), each process runs only
    its share of the episodes and all-gathers the finished trajectories;

and the run-level fault limit (`trajtune.sources.faults.check_faults`) on every call.
"""

from __future__ import annotations

import time

from typing import Any, Callable, Sequence

import torch

from .process import routed
from ..seeding import episode_seed
from ..envs.base import Env
from .faults import STEP_TIMEOUT_S, check_faults
from .rollout import Sampler, rollout_batch
from ..text.render import RendererProtocol
from ..trajectory import Trajectory


def make_collect(
    policy: Sampler, make_env: Callable[[], Env], renderer: RendererProtocol, *, episode_seeds: bool = False,
    shard: Any = None, max_fault_share: float = 0.5, step_timeout_s: float | None = STEP_TIMEOUT_S,
    **rollout_kwargs: Any
) -> Callable[[Sequence[Any], int, torch.Generator], list[Trajectory]]:
    """Package a sampler, an environment factory and a renderer as `collect(tasks, n_per_task, generator)`.

    `collect` runs `n_per_task` episodes of every task in one lockstep batch, task-major
    (task 0's episodes first), and gives the episodes of `tasks[i]` group id i — one
    group per task *instance*, so a task listed twice makes two groups. The algorithm
    loops (algorithms/common.py) sample through it and never see environments.
    `rollout_kwargs` go to `rollout_batch` (max_turns, max_tokens, temperature, ...).

    episode_seeds: episode e of a call samples from its own generator, seeded by one
    draw of `generator` and e, so its actions do not depend on the batch it runs in.
    shard: run only this process's share of the episodes and all-gather the finished
    trajectories (`trajtune.engine.distributed.Shard`, e.g. `engine.shard`;
    implies episode_seeds): every process returns the same whole list, in order.
    max_fault_share: an episode whose environment raised gets reward 0 and info["env_error"];
    if more than this share of a call's episodes fail, `faults.TooManyFaults` stops the run.
    step_timeout_s: an `env.reset` / `env.step` call running longer than this (default 60 s;
    0 or None: no limit) fails its episode the same way (`faults.StepTimeout`, main thread only).
    """
    rollout_kwargs["step_timeout_s"] = step_timeout_s

    def collect(tasks: Sequence[Any], n_per_task: int, generator: torch.Generator) -> list[Trajectory]:
        batch = [task for task in tasks for _ in range(n_per_task)]
        groups = [i for i in range(len(tasks)) for _ in range(n_per_task)]
        if not episode_seeds and shard is None:
            envs = [make_env() for _ in batch]
            trajs = rollout_for(policy)(policy, envs, batch, renderer, generator, groups=groups, **rollout_kwargs)
            check_faults(trajs, max_fault_share)
            return trajs
        base = int(torch.randint(0, 2**62, (1,), generator=generator))
        mine = list(range(len(batch))) if shard is None else shard.rows(len(batch))
        trajs = rollout_for(policy)(policy, [make_env() for _ in mine], [batch[i] for i in mine], renderer, None,
                              groups=[groups[i] for i in mine], row_seeds=[episode_seed(base, i) for i in mine],
                              **rollout_kwargs) if mine else []
        trajs = trajs if shard is None else shard.gather(len(batch), trajs)
        check_faults(trajs, max_fault_share)
        return trajs

    return collect


def rollout_for(policy: Sampler) -> Callable[..., list[Trajectory]]:
    """Where `policy`'s episodes run: `rollout_batch` here, or in the sampler process of an overlapped
    RL loop that is collecting with it (`trajtune.sources.process.routed`)."""
    sampler = routed(policy)
    return rollout_batch if sampler is None else sampler.rollout


def timed(collect: Callable[[Sequence[Any], int, torch.Generator], list[Trajectory]], counters: dict,
          key: str = "sampling_s") -> Callable[[Sequence[Any], int, torch.Generator], list[Trajectory]]:
    """`collect` that adds its wall seconds (sampling and environments) to `counters[key]`
    (a stage's `ctx.counters`: the runner reports each stage's sampling share)."""
    counters.setdefault(key, 0.0)

    def timed_collect(tasks: Sequence[Any], n_per_task: int, generator: torch.Generator) -> list[Trajectory]:
        t0 = time.perf_counter()
        try:
            return collect(tasks, n_per_task, generator)
        finally:
            counters[key] += time.perf_counter() - t0

    return timed_collect
