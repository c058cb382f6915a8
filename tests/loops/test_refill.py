"""`sources.refill.Refilling` alone, around a scripted source: DAPO's dynamic sampling as a wrapper (the RL loop's
use of it is tested in tests/loops/test_pg_methods.py: the refilled batch, exact resume)."""

import pytest
import torch

from trajtune.seeding import derive, generator
from trajtune.sources.base import Draws, Episodes, Source, pick_tasks
from trajtune.sources.refill import Refilling, informative_count, informative_groups
from trajtune.trajectory import Outcome, Trajectory

TASKS = list("abcdefgh")


class Scripted:
    """Draw k's rewards are `rewards[k]` (one list per group); it keeps what it was asked for."""

    def __init__(self, rewards):
        self.rewards, self.asked = rewards, []

    def take(self, draw, ahead=None):
        k = len(self.asked)
        self.asked.append((draw, ahead))
        trajs = [Trajectory(reward=r, group=g) for g, group in enumerate(self.rewards[k]) for r in group]
        torch.rand(1, generator=draw.generator)  # sampling advances the draw's generator
        return Episodes(trajs, {"time/sampling_s": 0.5, "reward/mean": float(k)}, draw.generator, draw.step)

    def after_update(self, engine):
        return {"sync/x": 1.0}

    def pending(self):
        return []

    def restore(self, episodes):
        pass

    def close(self):
        pass


def first_draw(step=3, seed=5):
    return Draws(TASKS, n=2, seed=seed, steps=10, per_step=2)(step)


def test_refills_until_enough_groups_differ_renumbering_groups_and_merging_metrics():
    flat, signal = [1.0, 1.0], [0.0, 1.0]
    inner = Scripted([[flat, signal], [flat, flat], [signal, flat], [signal, signal]])
    source = Refilling(inner, TASKS, tries=5, seed=5)
    draw = first_draw()
    episodes = source.take(draw, ahead=Draws(TASKS, n=2, seed=5, steps=10, per_step=2))
    # draw 0 has 1 group with signal, draw 1 none, draw 2 one more: 2 = len(draw.tasks), so no 4th draw
    assert len(inner.asked) == 3 and episodes.metrics["rollout/dynamic_draws"] == 3.0
    assert [t.group for t in episodes.trajs] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]  # groups of draws stay apart
    assert [t.reward for t in episodes.trajs] == [1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1]
    assert episodes.metrics["time/sampling_s"] == 1.5 and episodes.metrics["reward/mean"] == 2.0  # times add up
    assert all(ahead is None for _, ahead in inner.asked)  # nothing drawn ahead: refills depend on the rewards
    assert inner.asked[0][0] is draw
    for k, (d, _) in enumerate(inner.asked[1:], start=1):  # draw k: a function of (seed, step, k)
        g = generator(derive(5, 3), k)
        assert (d.step, d.n, d.tasks) == (3, 2, pick_tasks(TASKS, 2, g))
    assert episodes.generator is inner.asked[-1][0].generator  # the last draw's, for the minibatch order
    assert informative_count(episodes.trainable) == 2
    kept = informative_groups(episodes.trainable, keep=2)
    assert [t.group for t in kept] == [1, 1, 4, 4]


def test_stops_when_the_tries_run_out_and_leaves_a_full_first_draw_alone():
    inner = Scripted([[[1.0, 1.0], [0.0, 0.0]]] * 3)
    episodes = Refilling(inner, TASKS, tries=2, seed=0).take(first_draw())
    assert len(inner.asked) == 3 and episodes.metrics["rollout/dynamic_draws"] == 3.0 and len(episodes.trajs) == 12
    inner = Scripted([[[0.0, 1.0], [1.0, 0.0]]])
    episodes = Refilling(inner, TASKS, tries=2, seed=0).take(first_draw())
    assert len(inner.asked) == 1 and episodes.metrics == {"time/sampling_s": 0.5, "reward/mean": 0.0,
                                                          "rollout/dynamic_draws": 1.0}


def test_failed_episodes_do_not_count_as_signal_and_the_rest_passes_through():
    inner = Scripted([[[0.0, 1.0], [1.0, 1.0]], [[0.0, 1.0], [1.0, 1.0]]])
    original = inner.take

    def failing_take(draw, ahead=None):  # the first draw's signal comes from a failed episode
        episodes = original(draw, ahead)
        if len(inner.asked) == 1:
            episodes.trajs[0].outcome = Outcome.ENV_ERROR
        return episodes

    inner.take = failing_take
    source = Refilling(inner, TASKS, tries=1, seed=0)
    episodes = source.take(first_draw())
    assert len(inner.asked) == 2 and informative_count(episodes.trainable) == 1
    assert isinstance(source, Source) and source.after_update(None) == {"sync/x": 1.0} and source.pending() == []
    with pytest.raises(ValueError, match="tries"):
        Refilling(inner, TASKS, tries=-1, seed=0)


def test_informative_groups_keeps_sampling_order():
    trajs = [Trajectory(reward=r, group=g) for g, r in [(7, 1.0), (7, 0.0), (2, 1.0), (2, 1.0), (4, 0.0), (4, 2.0),
                                                          (9, 3.0)]]
    assert [t.group for t in informative_groups(trajs)] == [7, 7, 4, 4]
    assert [t.group for t in informative_groups(trajs, keep=1)] == [7, 7]
    assert informative_groups([]) == [] and informative_count(trajs) == 2
