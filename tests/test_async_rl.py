"""Overlapped RL (RLConfig.max_staleness, trajtune.async_sampler): the sampler process gives exactly
the one-process run at staleness 0, the one-step-off-policy run still learns, a broken weight sync
stops the run, and an overlapped run resumes exactly."""

import os
import signal

import pytest
import torch

from trajtune.algorithms.rl import RLConfig, train_rl
from trajtune.async_sampler import SamplerProcess, SyncError
from trajtune.collect import make_collect
from trajtune.envs.base import SingleTurnEnv
from trajtune.loop import Run
from trajtune.metrics import MetricsLogger
from trajtune.resume import Checkpointer, RunInterrupted

from test_algorithms import RENDER, TASKS, TOK, collect_for, engine, pass_rate
from test_resume import graded, rows, same_weights

PAD = TOK.pad_id


@pytest.fixture(autouse=True)
def one_thread():
    """Trainer and sampler on one torch thread each (bit for bit needs the same count in both)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def graded_collect(e, episode_seeds=False):
    return make_collect(e.sample, lambda: SingleTurnEnv(graded), RENDER, max_turns=1, max_tokens=32,
                        max_action_tokens=2, episode_seeds=episode_seeds)


def without_sync(history):
    return [{k: v for k, v in r.items() if not k.startswith("sync/")} for r in history]


@pytest.mark.parametrize("episode_seeds", [False, True], ids=["shared_generator", "episode_seeds"])
def test_staleness_0_through_the_sampler_process_equals_the_one_process_loop_bit_for_bit(episode_seeds):
    cfg = RLConfig(steps=4, tasks_per_step=2, group_size=4, advantage="grpo", surrogate="ppo", epochs=2, tis_cap=2.0,
                   seed=3)
    ref = engine()
    expected = train_rl(ref, TASKS, graded_collect(ref, episode_seeds), cfg, PAD)
    e = engine()
    got = train_rl(e, TASKS, graded_collect(e, episode_seeds), RLConfig(**{**vars(cfg), "sampler_process": True}), PAD)
    assert same_weights(e, ref) and e.step == ref.step
    assert without_sync(got) == expected  # every sampled token, reward, loss and gradient norm
    assert [r["sync/logprob_diff"] for r in got] == [0.0] * 4  # the same weights compute the same log-probs


def test_staleness_1_samples_one_update_behind_and_still_learns():
    e = engine()
    before = pass_rate(e)
    cfg = RLConfig(steps=20, tasks_per_step=4, group_size=8, max_staleness=1, tis_cap=2.0)
    hist = train_rl(e, TASKS, collect_for(e), cfg, PAD)
    assert pass_rate(e) > before + 0.3, (before, [h["rollout/pass_rate"] for h in hist])
    # step 0 samples with the policy it trains; later steps with the one before the last update
    lag = [abs(h["pg/tis_weight_mean"] - 1.0) for h in hist]
    assert lag[0] < 1e-5 and max(lag[1:]) > 1e-3, lag
    assert all(h["sync/logprob_diff"] <= cfg.sync_tolerance for h in hist)


def test_an_overlapped_run_resumes_exactly(tmp_path, monkeypatch):
    """The rollouts in flight at the checkpoint (sampled one update behind) are saved with it. The
    interrupt is a terminal's Ctrl-C: it reaches the sampler process too, which keeps serving."""
    cfg = RLConfig(steps=6, tasks_per_step=2, group_size=4, advantage="grpo", max_staleness=1, tis_cap=2.0, seed=1)
    ref = engine()
    with MetricsLogger(tmp_path / "ref") as log:
        expected = train_rl(ref, TASKS, graded_collect(ref), cfg, PAD, Run("rl", log))
    samplers = []
    start = SamplerProcess._start
    monkeypatch.setattr(SamplerProcess, "_start", lambda self, child: (start(self, child), samplers.append(self)))
    first = engine()
    inner = first.optim_step

    def optim_step():  # SIGINT to the trainer and its sampler process while optimizer step 3 runs
        if first.step + 1 == 3:
            for pid in (os.getpid(), samplers[-1]._process.pid):
                os.kill(pid, signal.SIGINT)
        return inner()

    first.optim_step = optim_step
    with MetricsLogger(tmp_path / "run") as log, Checkpointer(tmp_path / "run" / "rl") as ck:
        with pytest.raises(RunInterrupted):
            train_rl(first, TASKS, graded_collect(first), cfg, PAD, Run("rl", log, checkpointer=ck))
    assert first.step < ref.step
    resumed = engine(seed=9)  # other weights: everything comes from the checkpoint
    with MetricsLogger(tmp_path / "run") as log, Checkpointer(tmp_path / "run" / "rl") as ck:
        got = train_rl(resumed, TASKS, graded_collect(resumed), cfg, PAD, Run("rl", log, checkpointer=ck))
    assert same_weights(resumed, ref) and got == expected
    assert rows(tmp_path / "run") == rows(tmp_path / "ref")


def skip_publish(self):
    """A sync that sends nothing: the sampler keeps its old weights."""


def corrupt_publish(self, _publish=SamplerProcess._publish):
    """A sync that delivers one wrong weight."""
    _publish(self)
    self._shared["head.weight" if "head.weight" in self._shared else next(iter(self._shared))].view(-1)[0] += 0.5


@pytest.mark.parametrize("sabotage,message", [
    (skip_publish, "the trainer's weights changed at optimizer step 1 but the sampler process's did not"),
    (corrupt_publish, r"log-probs of the same tokens differ by .* weights differ from the trainer's in 1 tensor"),
], ids=["skipped_update", "corrupted_weight"])
def test_a_sabotaged_weight_sync_stops_the_run_with_a_clear_error(monkeypatch, sabotage, message):
    monkeypatch.setattr(SamplerProcess, "_publish", sabotage)
    e = engine()
    with pytest.raises(SyncError, match=message):
        train_rl(e, TASKS, graded_collect(e), RLConfig(steps=3, tasks_per_step=2, group_size=4, max_staleness=1,
                                                       tis_cap=2.0), PAD)


def test_a_collect_that_bypasses_engine_sample_is_refused():
    """A backend that samples from the trainer's model itself (HF generate) would race the update thread."""
    from functools import partial

    from trajtune.sampling import sample

    e = engine()
    own = make_collect(partial(sample, e.model), lambda: SingleTurnEnv(graded), RENDER, max_turns=1, max_tokens=32,
                       max_action_tokens=2)
    with pytest.raises(ValueError, match="sampled without calling engine.sample"):
        train_rl(e, TASKS, own, RLConfig(steps=2, tasks_per_step=2, group_size=4, sampler_process=True), PAD)


@pytest.mark.parametrize("kw,message", [
    ({"max_staleness": 1}, "set tis_cap"),
    ({"max_staleness": 2, "tis_cap": 2.0}, "max_staleness must be 0"),
    ({"sync_tolerance": 0.0}, "sync_tolerance must be > 0"),
    ({"sampler_threads": 0}, "sampler_threads must be >= 1"),
])
def test_bad_overlap_settings_are_refused_naming_the_field(kw, message):
    with pytest.raises(ValueError, match=message):
        RLConfig(**kw)
