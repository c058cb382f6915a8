"""Refilling: DAPO's dynamic sampling as a wrapper of a source (RLHF book checklist 6.17).

A group baseline gets no signal from a group whose rewards are all equal. `Refilling(inner, tasks,
tries, seed)` answers a draw of `len(draw.tasks)` tasks with the inner source's episodes of that draw,
then -- while fewer than `len(draw.tasks)` groups have rewards that differ and tries remain -- with
further draws of as many tasks, draw k (k = 1, 2, ...) a pure function of (seed, step, k):

    g_k = seeding.generator(derive(seed, step), k);  tasks_k = pick_tasks(tasks, len(draw.tasks), g_k)

so a resumed run refills exactly as an uninterrupted one. Each refill's group ids are shifted past
the ones already there (groups of different draws stay apart); the metrics merge as times adding up
(`time/...`) and every other statistic the last draw's; the episodes carry the last draw's generator;
`rollout/dynamic_draws` counts the draws (1: the first was enough). Everything drawn comes back,
failed and no-signal groups included: which groups a loop trains on is the loop's choice
(`informative_groups(trajs, keep)`: the first `keep` groups with signal, in sampling order).

Nothing is drawn ahead (`ahead` is not passed on): the refills depend on this step's rewards, so an
overlapped source inside samples synchronously.

    source = Refilling(EpisodeSource(Decoder(engine.sample, settings), make_env, renderer), tasks, tries=8, seed=0)
    episodes = source.take(draws(step))          # >= len(tasks) informative groups, or the tries ran out

The RL loop composes it for `RLConfig.dynamic_sampling_tries > 0` (`algorithms.rl.train_rl`); with
`trajtune.sources.base`, this module is the part of the sources layer the algorithms import.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch

from ..metrics import register
from ..objectives.advantages import group_reward_range
from ..seeding import derive, generator
from ..trajectory import Trajectory
from .base import Draw, Episodes, Schedule, Source, Wrapper, pick_tasks

register("rollout/dynamic_draws", "draws the step took to find tasks_per_step groups with differing rewards "
         "(dynamic_sampling_tries; 1: the first was enough)")


class Refilling(Wrapper):
    """`inner`'s episodes of a draw, refilled by up to `tries` further draws of `tasks` until `len(draw.tasks)`
    groups have differing rewards (module docstring). `seed`: the loop's seed (draw k of step s is seeded by
    (seed, s, k))."""

    def __init__(self, inner: Source, tasks: Sequence[Any], tries: int, seed: int):
        super().__init__(inner)
        if tries < 0:
            raise ValueError(f"Refilling: tries must be >= 0, got {tries}")
        self.tasks, self.tries, self.seed = tasks, tries, seed

    def take(self, draw: Draw, ahead: Schedule | None = None) -> Episodes:
        want = len(draw.tasks)
        episodes = self.inner.take(draw)  # nothing ahead: the refills depend on this draw's rewards
        k = 1
        while k <= self.tries and informative_count(episodes.trainable) < want:
            g = generator(derive(self.seed, draw.step), k)
            more = self.inner.take(Draw(pick_tasks(self.tasks, want, g), draw.n, g, draw.step))
            episodes = merged(episodes, more)
            k += 1
        return dataclasses.replace(episodes, metrics={**episodes.metrics, "rollout/dynamic_draws": float(k)})


def merged(first: Episodes, more: Episodes) -> Episodes:
    """`first`'s episodes then `more`'s, `more`'s groups renumbered past `first`'s (in place); times add up, other
    statistics are `more`'s; the generator is `more`'s (advanced past both draws)."""
    offset = 1 + max((t.group for t in first.trajs), default=-1)
    for t in more.trajs:
        t.group += offset
    metrics = dict(first.metrics)
    for k, v in more.metrics.items():
        metrics[k] = metrics.get(k, 0.0) + v if k.startswith("time/") else v
    return dataclasses.replace(first, trajs=first.trajs + more.trajs, metrics=metrics, generator=more.generator)


def informative_groups(trajs: list[Trajectory], keep: int | None = None) -> list[Trajectory]:
    """The episodes of the groups whose rewards differ (the others give a group baseline no signal): of the first
    `keep` such groups in sampling order (DAPO's dynamic sampling), or of all of them (None)."""
    if not trajs:
        return []
    spread, index = group_reward_range(torch.tensor([t.reward for t in trajs]), torch.tensor([t.group for t in trajs]))
    kept = [t for t, s in zip(trajs, spread[index].tolist(), strict=True) if s > 0]
    if keep is None:
        return kept
    chosen = set(list(dict.fromkeys(t.group for t in kept))[:keep])
    return [t for t in kept if t.group in chosen]


def informative_count(trajs: list[Trajectory]) -> int:
    """How many groups of `trajs` have rewards that differ."""
    return len({t.group for t in informative_groups(trajs)})
