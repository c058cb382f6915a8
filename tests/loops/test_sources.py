"""The sources layer (trajtune/sources/): the Protocol every source meets, draws as pure functions of (seed, step),
episodes that come back with their metrics, typed outcomes that keep failed episodes out of losses and group
baselines, and the run's hooks that see what the loop sampled. The overlapped source and the sampler process
have their own file (tests/loops/test_async_rl.py)."""

import torch
import pytest

from trajtune.algorithms.rft import RFTConfig, train_rft
from trajtune.algorithms.rl import RLConfig, train_rl
from trajtune.objectives.advantages import group_advantages
from trajtune.runs.hooks import Hook
from trajtune.runs.loop import Run
from trajtune.seeding import generator
from trajtune.sources.base import Draw, Draws, Episodes, Source, pick_tasks
from trajtune.sources.episodes import Measured
from trajtune.sources.overlap import Overlapped
from trajtune.sources.process import SamplerProcess
from trajtune.sources.scoring import Scored
from trajtune.trajectory import Outcome

from test_algorithms import TASKS, TOK, collect_for, demo, engine

PAD = TOK.pad_id


class Scripted:
    """A source of its own: the Protocol's five methods and no base class. Every draw's episodes are `make(draw)`;
    it keeps the draws it was asked for and counts the updates it was told of."""

    def __init__(self, make):
        self.make, self.draws, self.updates = make, [], 0

    def take(self, draw, ahead=None):
        self.draws.append(draw)
        return Episodes(self.make(draw), {"time/sampling_s": 0.5}, draw.generator, draw.step)

    def after_update(self, engine):
        self.updates += 1
        return {}

    def pending(self):
        return []

    def restore(self, episodes):
        pass

    def close(self):
        pass


def Replay(replies, groups, rewards, outcomes=None) -> Scripted:
    """Fixed episodes for every draw: each demo of `replies` one episode of group `groups[i]`, with reward
    `rewards[i]` and outcome `outcomes[i]`."""
    outcomes = outcomes or [Outcome.OK] * len(replies)

    def make(draw):
        trajs = []
        for reply, group, reward, outcome in zip(replies, groups, rewards, outcomes, strict=True):
            t = demo(reply)
            t.group, t.reward, t.outcome, t.info = group, reward, outcome, {"task": f"pick{group}"}
            trajs.append(t)
        return trajs

    return Scripted(make)


class Advantages(Hook):
    """What the RL loop weighted each step: the scored batch's advantages and rewards, per row."""

    def __init__(self):
        self.seen = []

    def on_episodes(self, engine, step, trajs, batch=None, kept=None, every=None):
        self.seen.append((batch.pg.advantages.clone(), [t.reward for t in trajs]))


@pytest.mark.parametrize("advantage", ["reinforce", "rloo", "grpo"])
def test_a_failed_episode_is_out_of_the_loss_and_its_groups_baseline(advantage):
    """One failed environment in a group of four: the other three get exactly the advantages of a group of three,
    the failure is counted, and the update trains on seven rows, not eight. (Trained as a reward-0 attempt, it
    would pull the group mean down and push the others up.)"""
    cfg = RLConfig(steps=1, tasks_per_step=2, group_size=4, advantage=advantage)
    replies, groups, rewards = list("abcdabcd"), [0, 0, 0, 0, 1, 1, 1, 1], [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    failed = [Outcome.OK, Outcome.OK, Outcome.OK, Outcome.ENV_ERROR] + [Outcome.OK] * 4
    hook = Advantages()
    row = train_rl(engine(), TASKS, Replay(replies, groups, rewards, failed), cfg, PAD, Run("rl", hooks=[hook]))[0]
    (adv, seen), = hook.seen
    assert seen == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0] and row["train/kept_episodes"] == 7.0
    assert row["rollout/infra_failures"] == 1.0
    keep = [0, 1, 2, 4, 5, 6, 7]
    alone = Advantages()
    train_rl(engine(), TASKS, Replay([replies[i] for i in keep], [groups[i] for i in keep], [rewards[i] for i in keep]),
             cfg, PAD, Run("rl", hooks=[alone]))
    assert torch.equal(adv, alone.seen[0][0])
    baseline, std = {"reinforce": ("mean", False), "rloo": ("leave_one_out", False), "grpo": ("mean", True)}[advantage]
    three = group_advantages(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 0]), baseline=baseline,
                             std_normalize=std)
    assert torch.allclose(adv[:3], three)


def test_the_failed_ones_are_never_kept_by_rejection_sampling():
    """A failed episode with a high reward (a stale or bogus score) is never selected, even by top-per-prompt."""
    failed = [Outcome.REWARD_ERROR, Outcome.OK, Outcome.OK, Outcome.OK]
    hook = type("Kept", (Hook,), {"on_episodes": lambda self, e, s, trajs, batch=None, kept=None, every=None:
                                  setattr(self, "kept", kept)})()
    train_rft(engine(), TASKS, Replay(list("abcd"), [0, 0, 1, 1], [5.0, 1.0, 0.5, 0.2], failed),
              RFTConfig(rounds=1, samples_per_task=2, steps_per_round=1, select="top_per_prompt"), PAD,
              Run("rft", hooks=[hook]))
    assert [t.reward for t in hook.kept] == [1.0, 0.5]


def test_a_loop_tells_its_source_of_every_update_and_logs_its_metrics():
    source = Replay(list("ab"), [0, 0], [1.0, 0.0])
    rows = train_rl(engine(), TASKS, source, RLConfig(steps=3, tasks_per_step=1, group_size=2), PAD)
    assert source.updates == 3 and all(r["time/sampling_s"] == 0.5 for r in rows)
    counters = {}
    Run("rl", counters=counters).end_step(engine(), 1, {"time/sampling_s": 0.5, "time/reward_s": 0.25}, save=False)
    assert counters == {"sampling_s": 0.5, "reward_s": 0.25}


def test_draws_are_a_pure_function_of_seed_and_step():
    draws = Draws(TASKS, n=3, seed=7, steps=4, per_step=2)
    a, b = draws(2), draws(2)
    assert [t.name for t in a.tasks] == [t.name for t in b.tasks] and a.same_as(b) and a.n == 3 and a.step == 2
    assert torch.equal(a.generator.get_state(), b.generator.get_state())
    g = generator(7, 2)
    assert [t.name for t in a.tasks] == [t.name for t in pick_tasks(TASKS, 2, g)]  # seeding.generator(seed, step)
    assert draws(4) is None and Draws(TASKS, n=2, seed=0, steps=1)(0).tasks == list(TASKS)  # per_step None: all


def test_an_episode_source_returns_its_episodes_with_their_wall_time_and_advances_the_generator():
    e = engine()
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    episodes = collect_for(e).take(Draw(TASKS[:2], 3, g1))
    same = collect_for(e).run(TASKS[:2], 3, g2)
    assert [t.ids for t in episodes.trajs] == [t.ids for t in same] and [t.group for t in same] == [0] * 3 + [1] * 3
    assert torch.equal(g1.get_state(), g2.get_state()) and episodes.generator is g1
    assert episodes.metrics["time/sampling_s"] > 0 and episodes.behind == 0


def test_measured_adds_an_experiments_counts_to_the_metrics():
    e = engine()
    source = Measured(collect_for(e), lambda trajs: {"cost/sampled": len(trajs)})
    episodes = source.take(Draw(TASKS[:2], 2, torch.Generator()))
    assert episodes.metrics["cost/sampled"] == 4 and "time/sampling_s" in episodes.metrics


def test_every_source_meets_the_protocol():
    """At runtime (the method names; tests/unit/test_protocols.py's type check verifies the signatures too)."""
    e = engine()
    base = collect_for(e)
    for source in (base, Measured(base, lambda trajs: {"cost/sampled": float(len(trajs))}), Scored(base, e, []),
                   Overlapped(base, SamplerProcess(e)), Replay([], [], [])):
        assert isinstance(source, Source), type(source).__name__


def test_hooks_see_the_start_every_steps_episodes_and_every_save_point():
    calls = []

    class Spy(Hook):
        def on_start(self, engine, start):
            calls.append(("start", start))

        def on_episodes(self, engine, step, trajs, batch=None, kept=None, every=None):
            calls.append(("episodes", step, len(trajs)))

        def on_save_point(self, engine, completed, allowed):
            calls.append(("save point", completed, allowed))

    train_rl(engine(), TASKS, Replay(list("ab"), [0, 0], [1.0, 0.0]), RLConfig(steps=2, tasks_per_step=1, group_size=2),
             PAD, Run("rl", hooks=[Spy()]))
    assert calls == [("start", 0), ("episodes", 1, 2), ("save point", 1, True), ("episodes", 2, 2),
                     ("save point", 2, True)]
