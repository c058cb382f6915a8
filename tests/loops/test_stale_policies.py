"""What becomes of stale work (`sampling.stale`, trajtune.sources.staleness): pace, discard and partial on the real
overlapped loop, each exact -- decided on the virtual clock (tokens_per_update), so a run gives the same numbers
twice whatever the threads' timing."""

import pytest
import torch

from trajtune.algorithms.rl import RLConfig
from trajtune.envs.base import SingleTurnEnv
from trajtune.sources.overlap import overlapped
from trajtune.sources.sampler import Decoder, SamplerSettings
from trajtune.sources.sampling import SamplingConfig
from trajtune.trajectory import Outcome

from test_algorithms import engine
from test_async_rl import graded, graded_source, same_weights, train, untimed
from test_async_rl import one_thread  # noqa: F401 - autouse: one torch thread

SETTINGS = SamplerSettings(max_new_tokens=4)



def source(e, k, stale, tokens_per_update, spy=None):
    """The graded task (answers of 1 to 4 tokens), `k` steps ahead in a sampler process, `stale` work handled so."""
    sampling = SamplingConfig(max_staleness=k, stale=stale, tokens_per_update=tokens_per_update, max_new_tokens=4)
    src = overlapped(e, sampling, lambda p: graded_source(e, p, make_env=lambda: SingleTurnEnv(graded)),
                     Decoder(e.sample, SETTINGS))
    if spy is not None:
        take = src.take

        def spied(draw, ahead=None):
            episodes = take(draw, ahead)
            spy.append(episodes)
            return episodes

        src.take = spied
    return src


CFG = RLConfig(steps=6, tasks_per_step=4, group_size=4, advantage="grpo", tis_cap=2.0, seed=2)


def test_discard_drops_exactly_the_groups_that_would_arrive_after_their_step_and_repeats_itself():
    """At two decode steps per update, a 4-token answer takes 2 updates: one update behind, every group with one is
    dropped (Outcome.STALE, never in a loss), the first step (sampled now, the trainer waits) never; the row counts
    them and the length bias is negative (the long answers are the ones thrown away). The same run twice: the same
    rows and weights."""
    seen: list = []
    cfg = RLConfig(steps=6, tasks_per_step=6, group_size=2, advantage="grpo", tis_cap=2.0, seed=2)
    a = engine()
    rows = train(a, source(a, 1, "discard", 2, seen), cfg)
    b = engine()
    assert untimed(train(b, source(b, 1, "discard", 2), cfg)) == untimed(rows) and same_weights(a, b)
    for episodes, row in zip(seen, rows, strict=True):
        groups: dict[int, list] = {}
        for t in episodes.trajs:
            groups.setdefault(t.group, []).append(t)
        for trajs in groups.values():
            late = episodes.step > 0 and max(t.count(2) for t in trajs) // 2 > 1
            assert all((t.outcome is Outcome.STALE) == late for t in trajs)
        dropped = sum(t.outcome is Outcome.STALE for t in episodes.trajs) / len(episodes.trajs)
        assert row["staleness/discarded_share"] == pytest.approx(dropped)
    assert any(r["staleness/discarded_share"] > 0 for r in rows)
    bias = [r["staleness/length_bias"] for r in rows if "staleness/length_bias" in r]  # (absent: all dropped)
    assert all(b <= 0 for b in bias) and any(b < 0 for b in bias), bias


def test_pace_and_a_discard_with_a_fast_enough_sampler_drop_nothing_and_train_the_same():
    """Pace never drops; discard with a clock where every answer fits in one update (4 decode steps per update)
    drops nothing either: the two runs are the same run."""
    a, b = engine(), engine()
    paced = train(a, source(a, 2, "pace", 0), CFG)
    fast = train(b, source(b, 2, "discard", 4), CFG)
    assert untimed(paced) == untimed(fast) and same_weights(a, b)
    assert all(r["staleness/discarded_share"] == 0.0 for r in paced)


@pytest.mark.parametrize("kw,message", [
    ({"stale": "discard", "max_staleness": 1}, "needs max_staleness >= 1 and tokens_per_update >= 1"),
    ({"stale": "partial", "tokens_per_update": 4}, "needs max_staleness >= 1 and tokens_per_update >= 1"),
    ({"stale": "drop", "max_staleness": 1, "tokens_per_update": 1}, "stale"),
    ({"tokens_per_update": -1}, "tokens_per_update must be >= 0"),
])
def test_bad_stale_settings_are_refused_naming_the_field(kw, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**kw)


def test_partial_without_an_update_inside_a_draw_is_pace_bit_for_bit():
    """With more decode steps per update than a draw takes, no version changes inside a draw: the partial run
    (the episode loop here, sampling through the process turn by turn) is the paced run (the episode loop in the
    process), token for token and weight for weight."""
    a, b = engine(), engine()
    paced = train(a, source(a, 2, "pace", 0), CFG)
    partial = train(b, source(b, 2, "partial", 1000), CFG)
    assert untimed(partial) == untimed(paced) and same_weights(a, b)
    assert all(r["staleness/resumed_share"] == 0.0 for r in partial)


def test_partial_continues_the_episodes_in_flight_under_the_next_update_and_repeats_itself():
    """At one decode step per update, an answer's first token comes from the weights the draw started with and the
    rest from the next update's (one update at most: trajtune.sources.partial); nothing is dropped; the same run
    twice gives the same numbers."""
    seen: list = []
    a = engine()
    rows = train(a, source(a, 2, "partial", 1, seen), CFG)
    b = engine()
    assert untimed(train(b, source(b, 2, "partial", 1), CFG)) == untimed(rows) and same_weights(a, b)
    for episodes in seen:
        s = episodes.step
        start, cap = max(0, s - 2), min(max(0, s - 2) + 1, s)
        for t in episodes.trajs:
            assert t.outcome is Outcome.OK
            got = [v for v, o in zip(t.versions, t.owners) if o == 2]
            assert got == [start] + [cap] * (len(got) - 1), (s, got)
    assert all(r["staleness/discarded_share"] == 0.0 for r in rows)
    assert [r["staleness/resumed_share"] > 0 for r in rows] == [False] + [True] * 5  # step 0: sampled now
    assert all(r["staleness/max"] <= 2 for r in rows)


KILL_AT = """
import os, signal, sys
from trajtune.engine.torch_engine import TorchEngine
step = TorchEngine.optim_step
def killing(self):
    if self.step + 1 == int(os.environ["KILL_AT_STEP"]):  # a hard kill in the middle of the run, no clean-up at all
        os.kill(os.getpid(), signal.SIGKILL)
    return step(self)
TorchEngine.optim_step = killing
from trajtune.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_kill_9_of_a_multi_turn_run_with_partial_rollouts_in_flight_resumes_exactly(tmp_path):
    """`trajtune run textarena` (multi-turn games, the environments in the trainer's background thread), two steps
    ahead with partial rollouts (every draw in flight continued under the next update), checkpointing every 2 steps:
    SIGKILL in the middle of optimizer step 5 leaves the checkpoint of step 4 with the draws of steps 4 and 5 saved
    half-way through their versions; the same command resumes from it and ends with the uninterrupted run's
    weights, tensor for tensor, and its rows (the staleness histogram and resumed share included)."""
    pytest.importorskip("textarena")
    import json
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file

    from trajtune.cli import main

    sets = ["config.n_train=4", "config.n_eval=2", "config.eval_samples=1", "config.dim=16", "config.n_layers=1",
            "config.max_turns=3", "config.rl.steps=7", "config.rl.tasks_per_step=2", "config.rl.group_size=2",
            "config.rl.eval_every=0", "config.rl.tis_cap=2.0", "config.sampling.max_staleness=2",
            "config.sampling.stale=partial", "config.sampling.tokens_per_update=3", "config.runner.checkpoint_every=2"]
    args = ["run", "textarena"] + [a for s in sets for a in ("--set", s)]
    assert main([*args, "--run-dir", str(tmp_path / "straight")]) == 0
    env = {**os.environ, "KILL_AT_STEP": "5", "PYTHONPATH": os.getcwd()}
    p = subprocess.run([sys.executable, "-c", KILL_AT, *args, "--run-dir", str(tmp_path / "killed")], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == -9, p.stderr[-3000:]
    assert main([*args, "--run-dir", str(tmp_path / "killed")]) == 0

    def rows(run):
        out = [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/")}
                for r in out if r.get("stage") == "rl" and "train/loss" in r]

    straight, resumed = rows("straight"), rows("killed")
    assert [r["step"] for r in resumed] == list(range(1, 8))
    assert [{k: v for k, v in r.items() if not k.startswith("sync/")} for r in resumed] == \
        [{k: v for k, v in r.items() if not k.startswith("sync/")} for r in straight]
    assert any(r["staleness/resumed_share"] > 0 for r in straight) and max(r["staleness/max"] for r in straight) == 2
    a, b = (load_file(str(tmp_path / run / "rl" / "checkpoint" / "model.safetensors"))
            for run in ("straight", "killed"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
