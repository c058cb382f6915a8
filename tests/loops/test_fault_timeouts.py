"""Faults in user code: an environment whose reset or step raises or hangs fails its episode, not the run."""

import signal
import threading
import time
from dataclasses import dataclass

import pytest

from trajtune.sources import faults
from trajtune.sources.episodes import EpisodeSource
from trajtune.envs.base import SingleTurnEnv
from trajtune.sources.faults import StepTimeout, TooManyFaults, time_limit
from trajtune.sources.rollout import rollout_batch, scripted_rollout
from trajtune.engine.decoding import Samples
from trajtune.text.render import Renderer
from trajtune.text.tokenizers import CharTokenizer
from trajtune.trajectory import Owner, collate
from trajtune.sources.sampler import Decoder, SamplerSettings

TOK = CharTokenizer.from_corpus("abc Q:")
R = Renderer(TOK)
LIMIT = 0.2

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="the step time limit needs SIGALRM")


@dataclass(frozen=True)
class Task:
    name: str
    prompt: str = "Q: a"


def hang(how):
    if how == "sleep":
        time.sleep(1e9)
    while True:  # a busy loop: interrupted between bytecodes
        pass


def reward(task, reply):
    if task.name.startswith("hang"):
        hang(task.name.split("-")[1])
    return 1.0, {}


class FlakyResetEnv(SingleTurnEnv):
    """reset raises on task "broken" and hangs on task "stuck"."""

    def __init__(self):
        super().__init__(reward)

    def reset(self, task):
        if task.name == "broken":
            raise KeyError("no such fixture")
        if task.name == "stuck":
            hang("sleep")
        return super().reset(task)


class Sampler:
    """A fake model: every action is "a" then the stop token; remembers how many prompts each call got."""

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, max_new_tokens, generator, *, stop_ids=(), **kw):
        self.calls.append(len(prompts))
        tokens = [TOK.encode("a") + [stop_ids[0]] for _ in prompts]
        return Samples(tokens, [[-0.5] * len(t) for t in tokens], [True] * len(tokens))


class Answer:
    def act(self, messages):
        return "a"


def run(tasks, env=lambda: SingleTurnEnv(reward), step_timeout_s=LIMIT):
    return rollout_batch(Decoder(Sampler(), SamplerSettings(max_new_tokens=3)), [env() for _ in tasks], tasks, R, None,
                         max_turns=1, max_tokens=32, step_timeout_s=step_timeout_s)


@pytest.mark.parametrize("how", ["sleep", "busy"])
def test_a_hanging_step_fails_its_episode_and_the_others_finish(how, caplog):
    tasks = [Task("good"), Task(f"hang-{how}"), Task("good")]
    handler = signal.getsignal(signal.SIGALRM)
    t0 = time.monotonic()
    with caplog.at_level("WARNING", logger="trajtune.sources.rollout"):
        trajs = run(tasks)
        scripted = scripted_rollout(Answer(), SingleTurnEnv(reward), tasks[1], R, max_turns=1, step_timeout_s=LIMIT)
    assert time.monotonic() - t0 < 3.0
    assert [t.reward for t in trajs] == [1.0, 0.0, 1.0]
    for bad in (trajs[1], scripted):
        assert bad.info["env_error"] == "StepTimeout: env.step exceeded 0.2 s"
        assert bad.info["stop_reason"] == "env_error" and bad.info["n_turns"] == 1
    assert all("env_error" not in t.info and t.info["stop_reason"] == "done" for t in (trajs[0], trajs[2]))
    assert f"task hang-{how}" in caplog.text and "StepTimeout" in caplog.text
    assert signal.getsignal(signal.SIGALRM) is handler and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    collate(trajs, TOK.pad_id)


def test_a_reset_that_raises_or_hangs_fails_its_episode_with_zero_turns(caplog):
    tasks = [Task("good"), Task("broken"), Task("stuck"), Task("good")]
    sampler = Sampler()
    with caplog.at_level("WARNING", logger="trajtune.sources.rollout"):
        trajs = rollout_batch(Decoder(sampler, SamplerSettings(max_new_tokens=3)), [FlakyResetEnv() for _ in tasks],
                              tasks, R, None, max_turns=2, max_tokens=32, step_timeout_s=LIMIT)
    assert sampler.calls == [2]  # the failed episodes are never sampled
    assert [t.reward for t in trajs] == [1.0, 0.0, 0.0, 1.0]
    assert trajs[1].info["env_error"] == "KeyError: 'no such fixture'"
    assert trajs[2].info["env_error"] == "StepTimeout: env.reset exceeded 0.2 s"
    for bad in trajs[1:3]:
        assert bad.info["stop_reason"] == "env_error" and bad.info["n_turns"] == 0
        assert bad.count(Owner.POLICY) == 0 and len(bad) >= 2
    assert "task broken" in caplog.text and "task stuck" in caplog.text and "env.reset" in caplog.text
    batch = collate(trajs, TOK.pad_id)  # still one valid batch; the failed rows train nothing
    assert batch.action_mask[1:3].sum() == 0 and batch.action_mask[0].sum() > 0
    # the scripted path fails the same way and renders the same tokens
    for task, sampled in zip(tasks[1:3], trajs[1:3]):
        scripted = scripted_rollout(Answer(), FlakyResetEnv(), task, R, max_turns=2, step_timeout_s=LIMIT)
        assert (scripted.ids, scripted.owners, scripted.turns) == (sampled.ids, sampled.owners, sampled.turns)
        assert scripted.info == sampled.info and scripted.reward == 0.0


def test_too_many_timeouts_stop_the_run():
    tasks = [Task("good"), Task("hang-sleep")]
    lenient = EpisodeSource(Decoder(Sampler(), SamplerSettings(max_new_tokens=3)), lambda: SingleTurnEnv(reward), R,
                            max_turns=1, max_tokens=32, step_timeout_s=0.1)
    assert [t.reward for t in lenient.run(tasks, 2, None)] == [1.0, 1.0, 0.0, 0.0]  # 50% is not more than 50%
    strict = EpisodeSource(Decoder(Sampler(), SamplerSettings(max_new_tokens=3)), lambda: SingleTurnEnv(reward), R,
                           max_turns=1, max_tokens=32, step_timeout_s=0.1, max_fault_share=0.25)
    with pytest.raises(TooManyFaults,
                       match=r"1 of 2 episodes failed.*hang-sleep: StepTimeout: env.step exceeded 0.1 s"):
        strict.run(tasks, 1, None)


@pytest.fixture
def outer_alarm():
    """An outer SIGALRM handler that records its calls; its timer is armed by the test."""
    calls = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: calls.append(time.monotonic()))
    yield calls
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def test_an_outer_alarm_keeps_its_handler_and_its_deadline(outer_alarm):
    handler = signal.getsignal(signal.SIGALRM)
    signal.setitimer(signal.ITIMER_REAL, 5.0)
    trajs = run([Task("good"), Task("hang-busy")])
    assert trajs[1].info["env_error"] == "StepTimeout: env.step exceeded 0.2 s"
    assert signal.getsignal(signal.SIGALRM) is handler
    remaining, interval = signal.getitimer(signal.ITIMER_REAL)
    assert 3.5 < remaining < 5.0 and interval == 0.0 and outer_alarm == []


def test_an_outer_alarm_due_inside_a_step_reaches_its_own_handler(outer_alarm):
    class SlowEnv(SingleTurnEnv):
        def __init__(self):
            super().__init__(lambda task, reply: (time.sleep(0.3), (1.0, {}))[1])

    t0 = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, 0.1)
    trajs = run([Task("good")], env=SlowEnv, step_timeout_s=1.0)
    assert trajs[0].reward == 1.0 and "env_error" not in trajs[0].info  # the step finished within its limit
    assert len(outer_alarm) == 1 and 0.05 < outer_alarm[0] - t0 < 0.25  # the outer alarm fired on time
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_nested_limits_the_outer_one_wins_when_it_is_shorter():
    handler = signal.getsignal(signal.SIGALRM)
    t0 = time.monotonic()
    with pytest.raises(StepTimeout, match="outer exceeded 0.2 s"):
        with time_limit(0.2, "outer"):
            with time_limit(5.0, "inner"):
                time.sleep(10)
    assert time.monotonic() - t0 < 1.0
    assert signal.getsignal(signal.SIGALRM) is handler and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_no_limit_outside_the_main_thread_is_said_once(monkeypatch, caplog):
    monkeypatch.setattr(faults, "_warned_no_limit", False)
    out = []
    with caplog.at_level("WARNING", logger="trajtune.sources.faults"):
        worker = threading.Thread(target=lambda: out.append(run([Task("good"), Task("good")], step_timeout_s=0.01)))
        worker.start()
        worker.join()
    assert [t.reward for t in out[0]] == [1.0, 1.0]
    assert caplog.text.count("without its 0.01 s time limit") == 1
