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
by that one observation.)

An action that uses up `max_action_tokens` without the stop token is still
decoded and given to the environment (environments see text, not tokens); the
turn has no closing `<|end|>` and is counted in info["n_unterminated"]. With a
budget longer than any valid action such text is an invalid call.

`scripted_rollout` runs a Python policy (envs/scripted.py) through the same
loop on messages and renders the finished conversation with
`Renderer.render`; tests/test_rollout.py checks that a model that samples the
same actions produces the identical token ids, owners and turns.

Returned trajectories: ids/owners/turns from the renderer, sampler logprobs on
POLICY tokens (model rollouts), reward = sum of step rewards, group = index of
the task among the distinct tasks of the batch, info = the environment's last
info plus stop_reason ("done", "max_turns", "token_budget", "env_error"),
n_turns and n_unterminated.

Faults in user code fail one episode, not the run: an `env.reset` or `env.step`
(or the reward function inside it) that raises, or runs past `step_timeout_s`
(default 60 s, `StepTimeout`), gives that episode reward 0 and
info["env_error"], logged with its task; `make_collect` stops the run with
`TooManyFaults` when more than `max_fault_share` of a call's episodes fail.
The time limit is a SIGALRM timer (see `time_limit` for what it can and cannot
interrupt); it only works in the main thread.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, Sequence

import torch

from .envs.base import Env
from .sampling import Samples
from .text.render import Message, Renderer
from .trajectory import Trajectory

log = logging.getLogger("trajtune.rollout")

STEP_TIMEOUT_S = 60.0
"""Default time limit of one `env.reset` / `env.step` call, in seconds (0 or None: none)."""

Sampler = Callable[..., Samples]
"""`sampler(prompts: list[list[int]], max_new_tokens, generator, *, temperature, top_k, top_p, greedy, stop_ids) -> Samples`,
e.g. `engine.sample` or `functools.partial(trajtune.sampling.sample, model)`."""


class ScriptedPolicy(Protocol):
    """A Python policy: `act(messages) -> action text`, given the conversation so far."""

    def act(self, messages: Sequence[Message]) -> str: ...


@dataclass
class _Episode:
    """Bookkeeping for one episode while it runs."""

    env: Env
    task: Any
    traj: Trajectory
    reward: float = 0.0
    info: dict = field(default_factory=dict)
    n_turns: int = 0
    n_unterminated: int = 0
    stop_reason: str | None = None
    generator: torch.Generator | None = None  # the episode's own stream (rollout_batch row_seeds)

    def start(self, renderer: Renderer | None, timeout_s: float | None) -> list:
        """Reset the environment on the task -> the opening messages (also rendered into
        `traj` when a renderer is given, i.e. for model rollouts).

        If `env.reset` raises or runs past `timeout_s`, the episode fails before its first
        turn: reward 0, info["env_error"], zero turns, and its conversation is one empty
        user message (a valid trajectory without POLICY tokens, so it trains nothing).
        """
        try:
            with time_limit(timeout_s, "env.reset"):
                messages = _opening(self.env.reset(self.task))
        except Exception as exc:  # noqa: BLE001 - user code: any failure is this episode's failure
            self._fail("reset", exc)
            messages = [_user("")]
        if renderer is not None:
            self.traj = renderer.start(messages)
        return messages

    def respond(self, action: str, timeout_s: float | None = None) -> str:
        """Give one action to the environment; returns the observation ("" for none).

        An exception in the environment (or the reward function inside it), or a step
        that runs past `timeout_s` seconds (`StepTimeout`), ends this episode with
        reward 0 and `info["env_error"]`, logged with its task; the other episodes of
        the batch go on (see `check_faults` for the run-level limit).
        """
        try:
            with time_limit(timeout_s, "env.step"):
                observation, reward, done, info = self.env.step(action)
        except Exception as exc:  # noqa: BLE001 - user code: any failure is this episode's failure
            self.n_turns += 1
            self._fail("step", exc)
            return ""
        self.reward += float(reward)
        self.info = info
        self.n_turns += 1
        if done:
            self.stop_reason = "done"
        return observation

    def _fail(self, call: str, exc: Exception) -> None:
        task = getattr(self.task, "name", str(self.task))
        log.warning("env.%s failed on task %s: %s: %s (episode gets reward 0)", call, task, type(exc).__name__, exc)
        self.reward, self.stop_reason = 0.0, "env_error"
        self.info = {**self.info, "env_error": f"{type(exc).__name__}: {exc}"}

    def finish(self, group: int) -> Trajectory:
        info = {"task": getattr(self.task, "name", str(self.task)), **self.info}
        info.update(stop_reason=self.stop_reason or "max_turns", n_turns=self.n_turns, n_unterminated=self.n_unterminated)
        self.traj.reward, self.traj.group, self.traj.info = self.reward, group, info
        return self.traj


def rollout_batch(
    policy: Sampler,
    envs: Sequence[Env],
    tasks: Sequence[Any],
    renderer: Renderer,
    generator: torch.Generator | None,
    *,
    max_turns: int = 6,
    max_tokens: int = 512,
    max_action_tokens: int = 16,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool = False,
    groups: Sequence[int] | None = None,
    row_seeds: Sequence[int] | None = None,
    step_timeout_s: float | None = STEP_TIMEOUT_S,
) -> list[Trajectory]:
    """Run one episode per (env, task) in lockstep with a sampled policy -> one Trajectory each, in order.

    policy:    the sampler (see `Sampler`); called once per turn on all unfinished episodes
    envs:      one environment instance per episode (they hold episode state)
    generator: seeds the sampler (same seed, same episodes)
    groups:    group id per episode; default: equal tasks share an id (for group baselines)
    row_seeds: optional seed per episode: each episode samples from its own generator
               (replaces `generator`), so its actions do not depend on the other
               episodes of the batch (sharded rollouts, trajtune.distributed)
    step_timeout_s: time limit of each `env.reset` / `env.step` call (0 or None: none);
               an episode whose environment raises or overruns fails alone (module docstring)
    """
    if len(envs) != len(tasks):
        raise ValueError(f"rollout_batch: {len(envs)} envs for {len(tasks)} tasks")
    if max_action_tokens < 1:
        raise ValueError(f"rollout_batch: max_action_tokens must be >= 1, got {max_action_tokens}")
    episodes = [_Episode(env, task, Trajectory()) for env, task in zip(envs, tasks, strict=True)]
    for ep in episodes:
        ep.start(renderer, step_timeout_s)
    if row_seeds is not None:
        if len(row_seeds) != len(episodes):
            raise ValueError(f"rollout_batch: {len(row_seeds)} row_seeds for {len(episodes)} episodes")
        for ep, seed in zip(episodes, row_seeds, strict=True):
            ep.generator = torch.Generator().manual_seed(int(seed))
    for turn in range(max_turns):
        # 1. which episodes take this turn: not done, and a whole action still fits the budget
        for ep in episodes:
            if ep.stop_reason is None and len(renderer.prompt_ids(ep.traj)) + max_action_tokens > max_tokens:
                ep.stop_reason = "token_budget"
        active = [ep for ep in episodes if ep.stop_reason is None]
        if not active:
            break
        # 2. one batched, KV-cached sampler call for all of them
        per_row = {} if row_seeds is None else {"generators": [ep.generator for ep in active]}
        samples = policy(
            [renderer.prompt_ids(ep.traj) for ep in active], max_action_tokens, generator,
            temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy, stop_ids=renderer.stop_ids, **per_row,
        )
        # 3. record each action, let its environment answer, append the answer
        for ep, tokens, logprobs, stopped in zip(active, samples.tokens, samples.logprobs, samples.stopped, strict=True):
            renderer.append_sampled(ep.traj, tokens, logprobs, turn)
            ep.n_unterminated += not stopped
            observation = ep.respond(renderer.action_text(tokens), step_timeout_s)
            if observation:
                renderer.append_message(ep.traj, _tool(observation), turn)
    group_ids = list(groups) if groups is not None else task_groups(tasks)
    return [ep.finish(g) for ep, g in zip(episodes, group_ids, strict=True)]


def scripted_rollout(
    policy: ScriptedPolicy,
    env: Env,
    task: Any,
    renderer: Renderer,
    *,
    max_turns: int = 6,
    max_tokens: int = 512,
    max_action_tokens: int = 16,
    group: int = -1,
    step_timeout_s: float | None = STEP_TIMEOUT_S,
) -> Trajectory:
    """Run one episode with a Python policy and render it (same limits, faults and info as `rollout_batch`)."""
    episode = _Episode(env, task, Trajectory())
    messages: list[dict[str, str]] = episode.start(None, step_timeout_s)
    for _ in range(max_turns if episode.stop_reason is None else 0):
        if len(renderer.generation_prompt(messages)) + max_action_tokens > max_tokens:
            episode.stop_reason = "token_budget"
            break
        action = policy.act(messages)
        messages.append({"role": "assistant", "content": action})
        observation = episode.respond(action, step_timeout_s)
        if observation:
            messages.append(_tool(observation))
        if episode.stop_reason is not None:
            break
    episode.traj = renderer.render(messages)
    return episode.finish(group)


def make_collect(
    policy: Sampler, make_env: Callable[[], Env], renderer: Renderer, *, episode_seeds: bool = False,
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
    trajectories (`trajtune.distributed.Shard`, e.g. `engine.shard` of a DistributedEngine;
    implies episode_seeds): every process returns the same whole list, in order.
    max_fault_share: an episode whose environment raised gets reward 0 and info["env_error"];
    if more than this share of a call's episodes fail, `TooManyFaults` stops the run.
    step_timeout_s: an `env.reset` / `env.step` call running longer than this (default 60 s;
    0 or None: no limit) fails its episode the same way (`StepTimeout`, main thread only).
    """
    rollout_kwargs["step_timeout_s"] = step_timeout_s

    def collect(tasks: Sequence[Any], n_per_task: int, generator: torch.Generator) -> list[Trajectory]:
        batch = [task for task in tasks for _ in range(n_per_task)]
        groups = [i for i in range(len(tasks)) for _ in range(n_per_task)]
        if not episode_seeds and shard is None:
            envs = [make_env() for _ in batch]
            trajs = rollout_batch(policy, envs, batch, renderer, generator, groups=groups, **rollout_kwargs)
            check_faults(trajs, max_fault_share)
            return trajs
        base = int(torch.randint(0, 2**62, (1,), generator=generator))
        mine = list(range(len(batch))) if shard is None else shard.rows(len(batch))
        trajs = rollout_batch(policy, [make_env() for _ in mine], [batch[i] for i in mine], renderer, None,
                              groups=[groups[i] for i in mine], row_seeds=[episode_seed(base, i) for i in mine],
                              **rollout_kwargs) if mine else []
        trajs = trajs if shard is None else shard.gather(len(batch), trajs)
        check_faults(trajs, max_fault_share)
        return trajs

    return collect


def episode_seed(base: int, episode: int) -> int:
    """Seed of episode `episode` of a collect call whose generator drew `base` (a pure function)."""
    return (base * 1_000_003 + episode * 7_919 + 1) % 2**63


def task_groups(tasks: Sequence[Any]) -> list[int]:
    """Group id per task: equal tasks share an id, numbered in order of first appearance."""
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


class TooManyFaults(RuntimeError):
    """More episodes of a batch failed in user code than the run allows."""


def check_faults(trajectories: Sequence[Trajectory], max_share: float = 0.5) -> int:
    """Count episodes that ended with `env_error`; raise `TooManyFaults` if their share exceeds `max_share`.

    Returns the count. The message names the first failing tasks and their exceptions.
    """
    failed = [t for t in trajectories if "env_error" in t.info]
    if trajectories and len(failed) / len(trajectories) > max_share:
        examples = "; ".join(f"{t.info.get('task')}: {t.info['env_error']}" for t in failed[:3])
        raise TooManyFaults(f"{len(failed)} of {len(trajectories)} episodes failed in the environment "
                            f"(limit {max_share:.0%}): {examples}")
    return len(failed)


class StepTimeout(Exception):
    """An environment call ran past the rollout's time limit (`step_timeout_s`)."""


_warned_no_limit = False


@contextmanager
def time_limit(seconds: float | None, what: str = "env.step") -> Iterator[None]:
    """Raise `StepTimeout("<what> exceeded <seconds> s")` in the body if it runs longer than `seconds`.

    0 or None: no limit. The limit is a SIGALRM timer (`signal.setitimer(ITIMER_REAL)`),
    so it needs the main thread of a platform with SIGALRM; anywhere else the body runs
    without a limit and a warning is logged once.

    What it can interrupt: Python code (the alarm is handled between bytecodes: a busy
    `while True: pass`, a deep recursion) and blocking calls that return on a signal
    (`time.sleep`, `select`, socket reads). What it cannot: a C call that never returns
    to the interpreter (a regex with catastrophic backtracking, a C extension's endless
    loop) — for untrusted code use a separate process, like the BugFix sandbox
    (envs/sandbox.py). An interrupted environment is left in whatever state it was in;
    the rollout never calls it again.

    Nesting-safe: an outer alarm (another `time_limit`, a test timeout) keeps its handler
    and its deadline. If it falls due inside the body, its handler is called then, as if
    this limit were not there; afterwards the handler and the remaining time of the outer
    timer (and its interval) are restored.
    """
    if not seconds or seconds <= 0:
        yield
        return
    can_alarm = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGALRM) if can_alarm else None
    if previous is None:  # no SIGALRM, not the main thread, or a handler not installed from Python
        global _warned_no_limit
        if not _warned_no_limit:
            _warned_no_limit = True
            log.warning("%s runs without its %g s time limit: not the main thread, no SIGALRM on this "
                        "platform, or an alarm handler set outside Python (this warning is shown once)", what, seconds)
        yield
        return

    delay, interval = signal.setitimer(signal.ITIMER_REAL, 0)  # pause the outer timer (if any), read it
    now = time.monotonic()
    deadline = now + seconds
    outer = {"at": now + delay if delay > 0 else math.inf, "interval": interval}  # in monotonic time
    closing = False

    def arm() -> None:  # fire at whichever comes first: our deadline or the outer alarm
        signal.setitimer(signal.ITIMER_REAL, max(min(deadline, outer["at"]) - time.monotonic(), 1e-4))

    def on_alarm(signum: int, frame: Any) -> None:
        if closing:  # an outer alarm that is due is delivered again by the restored timer below
            return
        now = time.monotonic()
        if now >= outer["at"]:  # the outer alarm is due: hand it over, then keep our own limit
            outer["at"] = now + outer["interval"] if outer["interval"] > 0 else math.inf
            arm()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:  # what the outer alarm would have done: end the process
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
                signal.raise_signal(signal.SIGALRM)
            return
        if now < deadline:  # early (timer rounding): wait for the rest
            arm()
            return
        raise StepTimeout(f"{what} exceeded {seconds:g} s")

    try:
        signal.signal(signal.SIGALRM, on_alarm)
        arm()
        yield
    finally:
        closing = True
        signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            signal.signal(signal.SIGALRM, previous)  # runs pending signals' handlers first (our alarm: ignored)
        finally:  # ... and one of them (Ctrl-C) may raise before the handler is swapped
            if signal.getsignal(signal.SIGALRM) is on_alarm:
                signal.signal(signal.SIGALRM, previous)
            if outer["at"] < math.inf:  # the outer timer goes on with its remaining time (at once if overdue)
                signal.setitimer(signal.ITIMER_REAL, max(outer["at"] - time.monotonic(), 1e-6), outer["interval"])
