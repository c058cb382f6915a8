"""Bringing your own task: the task contract, the token budget and the step contract are checked,
and a violation is a clear error (before the run) or a reported fault (during it), never silent."""

import logging
import math
import re
import string
from dataclasses import dataclass
from functools import partial

import pytest
import torch

from trajtune.sources.episodes import EpisodeSource
from trajtune.envs import base
from trajtune.envs.base import Env, SingleTurnEnv, StepResult, TaskError, check_tasks
from trajtune.sources.faults import TooManyFaults, check_step
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.sources.rollout import TokenBudgetError, rollout_batch, scripted_rollout
from trajtune.engine.decoding import Samples, sample
from trajtune.text.render import Renderer
from trajtune.text.tokenizers import CharTokenizer
from trajtune.sources.sampler import Decoder, SamplerSettings

TOK = CharTokenizer.from_corpus(string.ascii_lowercase + string.digits + " :,'Q")
R = Renderer(TOK)


@dataclass(frozen=True)
class Task:
    name: str
    prompt: str = "Q: a"


class Sampler:
    """A fake model: every action is `text` then the stop token."""

    def __init__(self, text="a"):
        self.text, self.calls = text, 0

    def __call__(self, prompts, max_new_tokens, generator, *, stop_ids=(), **kw):
        self.calls += 1
        tokens = [(TOK.encode(self.text) + [stop_ids[0]])[:max_new_tokens] for _ in prompts]
        return Samples(tokens, [[-0.5] * len(t) for t in tokens], [t[-1] in stop_ids for t in tokens])


def rollout(tasks, env=lambda: SingleTurnEnv(lambda t, r: (1.0, {})), max_action_tokens=3, **kw):
    kw = {"max_turns": 1, "max_tokens": 32, **kw}
    sampler = Decoder(Sampler(), SamplerSettings(max_new_tokens=max_action_tokens))
    return rollout_batch(sampler, [env() for _ in tasks], tasks, R, None, **kw)


# --- the Env docstring's example is real code that runs -------------------------------------------
def docstring_example() -> dict:
    """Execute the code block of the `Env` docstring; returns its namespace (CountTask, CountEnv)."""
    doc = Env.__doc__
    block = doc[doc.index("::") + 2 : doc.index("The rules")]
    lines = [line for line in block.splitlines() if line.strip()]
    indent = min(len(line) - len(line.lstrip()) for line in lines)
    namespace = {"dataclass": dataclass, "Env": Env, "StepResult": StepResult}
    exec("\n".join(line[indent:] for line in lines), namespace)
    return namespace


def test_the_env_docstring_example_runs_through_the_rollout():
    ns = docstring_example()
    task = ns["CountTask"](2)

    class Count:  # a scripted policy: 'more' until the observation shows the target, then 'stop'
        def act(self, messages):
            return "stop" if messages[-1]["content"] == "count 2" else "more"

    traj = scripted_rollout(Count(), ns["CountEnv"](), task, R, max_tokens=400, max_action_tokens=8)
    assert traj.reward == 1.0 and traj.info["actions"] == ["more", "more", "stop"]
    assert traj.info["task"] == "count-to-2" and traj.info["stop_reason"] == "done" and traj.info["n_invalid"] == 0
    sampled = rollout([task], ns["CountEnv"], max_turns=2, max_tokens=400, max_action_tokens=8)[0]
    assert sampled.info["n_invalid"] == 2 and sampled.reward == 0.0  # "a" is not an action of the game


# --- what a task must provide ---------------------------------------------------------------------
def test_a_task_without_a_name_is_an_error_before_any_episode_starts():
    resets = []

    class Env_(SingleTurnEnv):
        def reset(self, task):
            resets.append(task)
            return super().reset(task)

    @dataclass(frozen=True)
    class Nameless:
        prompt: str = "Q: a"

    with pytest.raises(TaskError, match=r"task 1 \(.*Nameless.*\) has no attribute 'name'"):
        rollout([Task("ok"), Nameless()], lambda: Env_(lambda t, r: (1.0, {})))
    assert resets == []  # refused before the run, not episode by episode
    with pytest.raises(TaskError, match="has name 3"):
        check_tasks([Task(3)])
    with pytest.raises(TaskError, match="has name ''"):
        check_tasks([Task("")])


def test_an_env_declares_the_task_attributes_it_reads():
    @dataclass(frozen=True)
    class NoPrompt:
        name: str = "x"

    with pytest.raises(TaskError, match=r"task 0 \(.*\) has no attribute 'prompt', which SingleTurnEnv reads"):
        rollout([NoPrompt()])
    with pytest.raises(TaskError, match="'prompt'"):
        EpisodeSource(Decoder(Sampler()), lambda: SingleTurnEnv(None), R, max_turns=1).run([NoPrompt()], 2, None)
    with pytest.raises(TaskError, match="'prompt'"):
        scripted_rollout(None, SingleTurnEnv(None), NoPrompt(), R)
    check_tasks([NoPrompt()])  # without an env only the name is needed


def test_unhashable_tasks_are_grouped_by_value():
    @dataclass(frozen=True)
    class ListTask:  # frozen but holding a list: not hashable (like BugFixTask)
        name: str
        items: list
        prompt: str = "Q: a"

    trajs = rollout([ListTask("a", [1]), ListTask("b", [2]), ListTask("a", [1])])
    assert [t.group for t in trajs] == [0, 1, 0]


# --- the token budget -------------------------------------------------------------------------------
def test_a_prompt_that_leaves_no_room_for_an_action_fails_with_the_numbers():
    long = Task("long", "Q: " + "abc " * 10)  # 43 characters
    n = len(R.generation_prompt([{"role": "user", "content": long.prompt}]))
    with pytest.raises(TokenBudgetError) as err:
        rollout([Task("short"), long], max_tokens=40, max_action_tokens=8)
    msg = str(err.value)
    assert "1 of 2 episodes" in msg and "task 'long'" in msg
    assert f"{n} prompt tokens" in msg and f"max_action_tokens 8 = {n + 8} > max_tokens 40" in msg
    assert f"at least {n + 8}" in msg
    with pytest.raises(TokenBudgetError, match=f"{n} prompt tokens"):
        scripted_rollout(None, SingleTurnEnv(None), long, R, max_tokens=40, max_action_tokens=8)
    # exactly fitting is fine; the episode acts
    (traj,) = rollout([long], max_tokens=n + 8, max_action_tokens=8)
    assert traj.info["n_turns"] == 1 and traj.info["stop_reason"] == "done"


def test_an_episode_whose_reset_failed_is_not_a_budget_error():
    class Broken(SingleTurnEnv):
        def reset(self, task):
            raise KeyError("fixture")

    trajs = rollout([Task("a")], lambda: Broken(None), max_tokens=4, max_action_tokens=1)
    assert trajs[0].info["stop_reason"] == "env_error"


# --- a step's result ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [None, "1.0", float("nan"), float("inf"), [1.0], {"r": 1}])
def test_a_reward_that_is_not_a_finite_number_is_a_fault_naming_the_task(bad, caplog):
    def verifier(task, reply):
        return (bad if task.name == "bad" else 1.0), {}

    with caplog.at_level(logging.WARNING, logger="trajtune.sources.rollout"):
        trajs = rollout([Task("good"), Task("bad")], lambda: SingleTurnEnv(verifier))
    good, failed = trajs
    assert good.reward == 1.0 and "env_error" not in good.info
    assert failed.reward == 0.0 and failed.info["stop_reason"] == "env_error"
    assert "InvalidStep" in failed.info["env_error"] and "reward" in failed.info["env_error"]
    # where the user's verifier is defined: its name, file and line
    assert f"verifier {verifier.__qualname__} ({__file__}:" in failed.info["env_error"]
    assert "task bad" in caplog.text and "finite number" in caplog.text
    # counted like any other fault: the run-level limit stops a run where most episodes fail
    collect = EpisodeSource(Decoder(Sampler(), SamplerSettings(max_new_tokens=3)), lambda: SingleTurnEnv(verifier), R,
                            max_turns=1, max_tokens=32)
    with pytest.raises(TooManyFaults, match="bad: InvalidStep"):
        collect.run([Task("bad")], 2, None)


@pytest.mark.parametrize("bad, said", [(1.0, "returned 1.0 (float); a verifier returns (reward, checks)"),
                                       ((1.0, "ok"), "returned checks 'ok' (str); they must be a dict"),
                                       ((1.0, {}, {}), "a verifier returns (reward, checks)")])
def test_a_verifier_that_breaks_its_contract_is_a_fault_naming_it(bad, said):
    def verifier(task, reply):
        return bad if task.name == "bad" else [1.0, {"seen": reply}]  # a list pair is a pair

    good, failed = rollout([Task("good"), Task("bad")], lambda: SingleTurnEnv(verifier))
    assert good.reward == 1.0 and "seen" in good.info and "env_error" not in good.info
    assert failed.info["stop_reason"] == "env_error" and said in failed.info["env_error"]
    assert f"verifier {verifier.__qualname__} ({__file__}:" in failed.info["env_error"]


def test_numeric_rewards_of_any_real_type_are_accepted():
    import numpy as np

    class E:
        pass

    for r in (1, 0.5, True, np.float32(0.25), np.int64(2), torch.tensor(0.75)):
        obs, value, done, info = check_step(E(), ("", r, True, {}))
        assert isinstance(value, float) and value == float(r)


@pytest.mark.parametrize("result, what", [((None, 1.0, True, {}), "observation None"),
                                          (("", 1.0, True, None), "info None"),
                                          (("", 1.0), "must return StepResult"),
                                          (None, "must return StepResult")])
def test_other_malformed_step_results_are_faults(result, what):
    class Odd(SingleTurnEnv):
        def step(self, action):
            return result

    (traj,) = rollout([Task("odd")], lambda: Odd(None))
    assert traj.info["stop_reason"] == "env_error" and what in traj.info["env_error"]
    assert re.search(r"Odd\.step \(.*test_own_tasks\.py:\d+\)", traj.info["env_error"])


def test_a_reset_that_returns_no_message_is_a_fault():
    class Silent(SingleTurnEnv):
        def reset(self, task):
            return None

    (traj,) = rollout([Task("silent")], lambda: Silent(None))
    assert traj.info["stop_reason"] == "env_error" and "Silent.reset" in traj.info["env_error"]


def test_a_fault_is_logged_with_the_users_traceback(caplog):
    def verifier(task, reply):
        return helper_that_fails(reply), {}

    def helper_that_fails(reply):
        return 1.0 / 0

    with caplog.at_level(logging.WARNING, logger="trajtune.sources.rollout"):
        (traj,) = rollout([Task("div")], lambda: SingleTurnEnv(verifier))
    assert "ZeroDivisionError" in traj.info["env_error"]
    assert "in helper_that_fails" in caplog.text and "return 1.0 / 0" in caplog.text
    assert 'rollout.py", line' not in caplog.text  # the library's own calling frames are left out


def test_a_model_rollout_with_a_real_sampler_fills_the_contract():
    """The checks cost nothing on a healthy run: a tiny model, the public Env API, rewards as floats."""
    torch.manual_seed(0)
    model = TinyTransformer(TinyConfig(TOK.vocab_size, dim=16, n_layers=1, n_heads=2, max_len=64)).eval()
    ns = docstring_example()
    tasks = [ns["CountTask"](1), ns["CountTask"](2)]
    trajs = rollout_batch(Decoder(partial(sample, model), SamplerSettings(max_new_tokens=4)),
                          [ns["CountEnv"]() for _ in tasks], tasks, R,
                          torch.Generator().manual_seed(0), max_turns=3, max_tokens=64)
    assert all(isinstance(t.reward, float) and math.isfinite(t.reward) for t in trajs)
    assert [t.info["task"] for t in trajs] == ["count-to-1", "count-to-2"]
    assert base.TaskError is TaskError
