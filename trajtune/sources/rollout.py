"""Episodes -> trajectories: lockstep model rollouts and scripted rollouts, one renderer for both.

`rollout_batch` runs many episodes at once. Each turn, every unfinished episode
renders its history plus the assistant header, all of them are sampled in ONE
batched KV-cached call, each sampled action is decoded and handed to its
environment, and the environment's answer is appended as a tool message::

    turn 0: [prompt_0, prompt_1, ...] --sample--> [a_0, a_1, ...] --env.step--> [o_0, o_1, ...]
    turn 1: [prompt_0 a_0 o_0, ...]   --sample--> ...           (finished episodes drop out)

History is re-prefilled every turn (simple; the prompts are short). Episodes
end when the environment says `done`, after `max_turns` policy turns, or when
the next turn would not fit the token budget: a turn is only sampled if
`len(history) + header + max_action_tokens <= max_tokens`, so every sampled
sequence fits the model's context. (The observation answering the last action
is always appended, so a finished trajectory can be longer than `max_tokens`
by that one observation.) While an episode runs, its rendering is a
`Transcript` (trajtune/text/render.py); only its trajectory is returned.

An action that uses up `max_action_tokens` without the stop token is still
decoded and given to the environment (environments see text, not tokens); the
turn has no closing `<|end|>` and is counted in `Trajectory.unterminated`. With a
budget longer than any valid action such text is an invalid call.

`scripted_rollout` runs a Python policy (envs/scripted.py) through the same
loop on messages and renders the finished conversation with
`Renderer.render`; tests/loops/test_rollout.py checks that a model that samples the
same actions produces the identical token ids, owners and turns.

Returned trajectories: ids/owners/turns from the renderer, sampler logprobs on
POLICY tokens (model rollouts), reward = sum of step rewards, group = index of
the task among the distinct tasks of the batch, info = the environment's last
info plus stop_reason, n_turns and, where the task's data gives one, `expected` (`expected_answer`: the
answer or reference to check the reply against); unterminated = the actions cut at the token budget.
stop_reason, the first that applies:

    env_error     the environment (or the reward inside it) failed: the episode trains nothing
    length        the environment said done after an action that used up `max_action_tokens`
                  without its stop token: the reply that ended the episode was cut at the token
                  budget (a one-turn env is done after any reply: a cut completion reads "length")
    done          the environment said done after a finished action
    token_budget  the next turn would not fit `max_tokens`
    max_turns     `max_turns` policy turns were taken

Before any episode starts, the tasks are checked (`envs.base.check_tasks`: a `.name` and
the environment's `task_attributes`) and so is the budget: an episode whose
opening does not leave room for one action (`prompt + header + max_action_tokens >
max_tokens`) would end before acting with reward 0, so `rollout_batch` raises
`TokenBudgetError` with the numbers instead.

Faults: an `env.reset` / `env.step` that raises, runs past `step_timeout_s`, or
returns something that is not a StepResult of the documented types (a reward
that is None, a string or NaN: `faults.InvalidStep`) fails its episode alone
(outcome ENV_ERROR: the loops train on it never and leave it out of its group's
baseline; info["env_error"], logged here with its task and the user's traceback); the time limit and the
run-level fault limit are in trajtune/sources/faults.py.
Collecting a step's episodes (seeding, sharding, the fault limit) is
trajtune/sources/episodes.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch

from ..envs.base import Env, check_tasks
from .faults import STEP_TIMEOUT_S, check_reset, check_step, describe_fault, time_limit
from ..text.render import Message, RendererProtocol, Transcript
from ..trajectory import Outcome, Trajectory
from .sampler import Sampler

log = logging.getLogger("trajtune.sources.rollout")

class ScriptedPolicy(Protocol):
    """A Python policy: `act(messages) -> action text`, given the conversation so far."""

    def act(self, messages: Sequence[Message]) -> str: ...


@dataclass
class _Episode:
    """Bookkeeping for one episode while it runs."""

    env: Env
    task: Any
    transcript: Transcript | None = None  # the renderer's state (model rollouts; set by `start`)
    reward: float = 0.0
    info: dict = field(default_factory=dict)
    n_turns: int = 0
    n_unterminated: int = 0
    cut: bool = False  # the last action ran out of max_action_tokens before its stop token (stop_reason "length")
    stop_reason: str | None = None
    generator: torch.Generator | None = None  # the episode's own stream (rollout_batch row_seeds)

    def start(self, renderer: RendererProtocol | None, timeout_s: float | None) -> list:
        """Reset the environment on the task -> the opening messages (also rendered into
        `self.transcript` when a renderer is given, i.e. for model rollouts).

        If `env.reset` raises or runs past `timeout_s`, the episode fails before its first
        turn: outcome ENV_ERROR, info["env_error"], zero turns, and its conversation is one empty
        user message (a valid trajectory without POLICY tokens, so it trains nothing).
        """
        try:
            with time_limit(timeout_s, "env.reset"):
                first = self.env.reset(self.task)
            messages = _opening(check_reset(self.env, first))
        except Exception as exc:  # noqa: BLE001 - user code: any failure is this episode's failure
            self._fail("reset", exc)
            messages = [_user("")]
        if renderer is not None:
            self.transcript = renderer.start(messages)
        return messages

    def respond(self, action: str, timeout_s: float | None = None) -> str:
        """Give one action to the environment; returns the observation ("" for none).

        An exception in the environment (or the reward function inside it), or a step
        that runs past `timeout_s` seconds (`faults.StepTimeout`), ends this episode with
        outcome ENV_ERROR and `info["env_error"]`, logged with its task; the other episodes of
        the batch go on (see `faults.check_faults` for the run-level limit).
        """
        try:
            with time_limit(timeout_s, "env.step"):
                result = self.env.step(action)
            observation, reward, done, info = check_step(self.env, result)
        except Exception as exc:  # noqa: BLE001 - user code: any failure is this episode's failure
            self.n_turns += 1
            self._fail("step", exc)
            return ""
        self.reward += reward
        self.info = info
        self.n_turns += 1
        if done:
            self.stop_reason = "done"
        return observation

    def _fail(self, call: str, exc: Exception) -> None:
        """A failed user call fails this episode alone: outcome ENV_ERROR (set by `finish`), stop_reason "env_error",
        info["env_error"] = the exception, logged with its task (policy: trajtune/sources/faults.py)."""
        task = getattr(self.task, "name", str(self.task))
        log.warning("env.%s failed on task %s: %s: %s (the episode is an infrastructure failure: no loss or baseline "
                    "sees it)\n%s", call, task, type(exc).__name__,
                    exc, describe_fault(exc))
        self.reward, self.stop_reason = 0.0, "env_error"
        self.info = {**self.info, "env_error": f"{type(exc).__name__}: {exc}"}

    def finish(self, traj: Trajectory, group: int) -> Trajectory:
        """Give the episode's rendered `traj` its reward, group and info (replacing any info it had)."""
        info = {"task": getattr(self.task, "name", str(self.task)), **self.info}
        expected = expected_answer(self.task)
        if expected is not None and "expected" not in info:
            info["expected"] = expected
        stop = "length" if self.cut and self.stop_reason == "done" else self.stop_reason or "max_turns"
        info.update(stop_reason=stop, n_turns=self.n_turns)
        traj.reward, traj.group, traj.info, traj.unterminated = self.reward, group, info, self.n_unterminated
        traj.outcome = Outcome.ENV_ERROR if self.stop_reason == "env_error" else Outcome.OK
        return traj


EXPECTED_FIELDS = ("answer", "expected", "reference", "solution", "ground_truth", "target")
"""where `expected_answer` looks, in order: a prompt row's columns, then the task's attributes"""


def expected_answer(task: Any) -> Any:
    """What the task's data says the reply should be, or None: the first of `EXPECTED_FIELDS` among a prompt row's
    columns (`sources.data.PromptTask`: e.g. the "answer" column of {"prompt", "answer"} rows), else among the
    task's attributes (`ArithmeticTask.answer`). Text, a number or a list / dict of them; anything else as its str."""
    columns = getattr(task, "columns", None)
    for name in EXPECTED_FIELDS:
        value = columns.get(name) if isinstance(columns, dict) else None
        if value is None:
            value = getattr(task, name, None)
        if value is not None and not callable(value):
            return value if isinstance(value, (str, int, float, bool, list, dict)) else str(value)
    return None


def rollout_batch(
    sampler: Sampler,
    envs: Sequence[Env],
    tasks: Sequence[Any],
    renderer: RendererProtocol,
    generator: torch.Generator | None,
    *,
    max_turns: int = 6,
    max_tokens: int = 512,
    groups: Sequence[int] | None = None,
    row_seeds: Sequence[int] | None = None,
    step_timeout_s: float | None = STEP_TIMEOUT_S,
) -> list[Trajectory]:
    """Run one episode per (env, task) in lockstep with a sampled policy -> one Trajectory each, in order.

    sampler:   the policy (`trajtune.sources.sampler.Sampler`), called once per turn on all unfinished episodes;
               its settings say how tokens are drawn and the token budget of one action (`max_action_tokens`
               above: `sampler.settings.max_new_tokens`); each Trajectory records the temperature of the policy
               its log-probs belong to (`SamplerSettings.policy_temperature`: 1.0 when greedy)
    envs:      one environment instance per episode (they hold episode state)
    generator: seeds the sampler (same seed, same episodes)
    groups:    group id per episode; default: equal tasks share an id (for group baselines)
    row_seeds: optional seed per episode: each episode samples from its own generator
               (replaces `generator`), so its actions do not depend on the other
               episodes of the batch (sharded rollouts, trajtune.engine.distributed)
    step_timeout_s: time limit of each `env.reset` / `env.step` call (0 or None: none);
               an episode whose environment raises or overruns fails alone (module docstring)
    """
    max_action_tokens = sampler.settings.max_new_tokens
    if len(envs) != len(tasks):
        raise ValueError(f"rollout_batch: {len(envs)} envs for {len(tasks)} tasks")
    if max_action_tokens < 1:
        raise ValueError(f"rollout_batch: max_action_tokens must be >= 1, got {max_action_tokens}")
    check_tasks(tasks, envs[0] if envs else None)
    episodes = [_Episode(env, task) for env, task in zip(envs, tasks, strict=True)]
    for ep in episodes:
        ep.start(renderer, step_timeout_s)
    if row_seeds is not None:
        if len(row_seeds) != len(episodes):
            raise ValueError(f"rollout_batch: {len(row_seeds)} row_seeds for {len(episodes)} episodes")
        for ep, seed in zip(episodes, row_seeds, strict=True):
            ep.generator = torch.Generator().manual_seed(int(seed))
    for turn in range(max_turns):
        # 1. which episodes take this turn: not done, and a whole action still fits the budget
        #    (on the first turn an episode that cannot act at all is an error: `check_budget`)
        waiting = [(ep, renderer.prompt_ids(ep.transcript)) for ep in episodes if ep.stop_reason is None]
        if turn == 0:
            check_budget([(ep.task, len(ids)) for ep, ids in waiting], max_action_tokens, max_tokens)
        for ep, ids in waiting:
            if len(ids) + max_action_tokens > max_tokens:
                ep.stop_reason = "token_budget"
        active = [(ep, ids) for ep, ids in waiting if ep.stop_reason is None]
        if not active:
            break
        # 2. one batched, KV-cached sampler call for all of them
        seeds = generator if row_seeds is None else [ep.generator for ep, _ in active]
        samples = sampler.sample([ids for _, ids in active], renderer.stop_ids, seeds)
        # 3. record each action, let its environment answer, append the answer
        for (ep, _), tokens, logprobs, stopped in zip(active, samples.tokens, samples.logprobs, samples.stopped,
                                                      strict=True):
            renderer.append_sampled(ep.transcript, tokens, logprobs, turn)
            ep.n_unterminated += not stopped
            ep.cut = not stopped
            observation = ep.respond(ep.transcript.messages[-1]["content"], step_timeout_s)  # the action's text
            if observation:
                renderer.append_message(ep.transcript, _tool(observation), turn)
    group_ids = list(groups) if groups is not None else task_groups(tasks)
    trajs = [ep.finish(ep.transcript.traj, g) for ep, g in zip(episodes, group_ids, strict=True)]
    for t in trajs:  # the policy the trainer reads for them: softmax(logits / temperature) (greedy: the logits)
        t.temperature = sampler.settings.policy_temperature
    return trajs


def scripted_rollout(
    policy: ScriptedPolicy,
    env: Env,
    task: Any,
    renderer: RendererProtocol,
    *,
    max_turns: int = 6,
    max_tokens: int = 512,
    max_action_tokens: int = 16,
    group: int = -1,
    step_timeout_s: float | None = STEP_TIMEOUT_S,
) -> Trajectory:
    """Run one episode with a Python policy and render it (same limits, faults and info as `rollout_batch`)."""
    check_tasks([task], env)
    episode = _Episode(env, task)
    messages: list[dict[str, str]] = episode.start(None, step_timeout_s)
    for turn in range(max_turns if episode.stop_reason is None else 0):
        n_prompt = len(renderer.generation_prompt(messages))
        if n_prompt + max_action_tokens > max_tokens:
            if turn == 0:  # not even one action fits: an error with the numbers, not a silent reward 0
                check_budget([(task, n_prompt)], max_action_tokens, max_tokens)
            episode.stop_reason = "token_budget"
            break
        action = policy.act(messages)
        messages.append({"role": "assistant", "content": action})
        observation = episode.respond(action, step_timeout_s)
        if observation:
            messages.append(_tool(observation))
        if episode.stop_reason is not None:
            break
    return episode.finish(renderer.render(messages), group)


class TokenBudgetError(ValueError):
    """An episode's opening leaves no room for one action within `max_tokens`: it would end before
    acting, with reward 0, and RL would train on nothing (`check_budget`)."""


def check_budget(openings: Sequence[tuple[Any, int]], max_action_tokens: int, max_tokens: int) -> None:
    """Raise `TokenBudgetError` with the numbers if an opening (task, its prompt length in tokens,
    assistant header included) plus `max_action_tokens` does not fit `max_tokens`."""
    too_long = [(task, n) for task, n in openings if n + max_action_tokens > max_tokens]
    if not too_long:
        return
    task, n = max(too_long, key=lambda x: x[1])
    name = getattr(task, "name", repr(task))
    raise TokenBudgetError(
        f"rollout: {len(too_long)} of {len(openings)} episodes cannot take a single action: task {name!r} renders "
        f"to {n} prompt tokens (assistant header included) + max_action_tokens {max_action_tokens} = "
        f"{n + max_action_tokens} > max_tokens {max_tokens}. They would end before acting with reward 0. "
        f"Raise max_tokens to at least {n + max_action_tokens} (plus room for the later turns of a multi-turn "
        f"task; and the model's context, e.g. TinyConfig.max_len, must hold it), or shorten the prompt.")


def task_groups(tasks: Sequence[Any]) -> list[int]:
    """Group id per task: equal tasks share an id, numbered in order of first appearance
    (a task that is not hashable is compared by its repr)."""
    ids: dict[Any, int] = {}
    return [ids.setdefault(_key(t), len(ids)) for t in tasks]


def _key(task: Any) -> Any:
    try:
        hash(task)
        return task
    except TypeError:
        return repr(task)


def _opening(first: str | Sequence[Message]) -> list:
    """The conversation an episode starts with: `env.reset` returns the user message's text,
    or a list of messages (e.g. a system prompt and a user message) for chat datasets."""
    return [_user(first)] if isinstance(first, str) else [dict(m) for m in first]


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _tool(text: str) -> dict[str, str]:
    return {"role": "tool", "content": text}
