"""The environment protocol, the task contract, and the single-turn case of both.

An environment is a text game: `reset(task)` returns the first observation
(the user message), and each `step(action_text)` returns what the world says
back. Environments know nothing about models or tokens: they see the decoded
text of one action at a time. docs/environments.md is the guide; examples/ has
a single-turn and a multi-turn task trained end to end.

A single-turn task with a verifier (arithmetic, instruction following) is the
one-step case: `reset` returns the prompt, the first `step` receives the reply,
scores it and ends the episode with an empty observation. There is no separate
code path for it anywhere in the library.

Rules every environment follows (DESIGN.md, "Contracts"; the `Env` docstring has the full list):
  * one instance per episode: the rollout creates it, calls `reset` once and `step` until done;
  * `step` never raises on a malformed action: it answers with an error
    observation and counts the call in `info["n_invalid"]`;
  * everything that happened goes into `info` (task name, actions, counters);
  * randomness, if any, comes from a seed given at construction or in the task.

What a task must provide (`check_tasks`, called by the rollout before any episode starts):
a `.name` (a non-empty str: logs, info["task"], per-task tables, RFT dedup) and whatever its
environment reads, declared in the environment's `task_attributes` (SingleTurnEnv: `.prompt`).
Grouping: an `EpisodeSource` (what the training loops sample through) gives every task instance of a draw
its own group, by position; `rollout_batch` without `groups` puts equal tasks in one group,
by hash and equality, or by repr for a task that is not hashable (a frozen dataclass holding
lists, like BugFixTask). A frozen dataclass of plain values is the easy choice.
"""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Any, Callable, Iterable, NamedTuple, Protocol, runtime_checkable



class StepResult(NamedTuple):
    """What `Env.step` returns; unpacks as `observation, reward, done, info`.

    observation: text shown to the policy next (a tool message); "" for none
    reward:      reward for this step (an episode's reward is the sum over steps)
    done:        True when the episode is over
    info:        what happened so far (a fresh dict; the rollout copies it)
    """

    observation: str
    reward: float
    done: bool
    info: dict[str, Any]


@runtime_checkable
class Env(Protocol):
    """A text environment for one episode at a time. A complete one, a counter the policy must
    stop at `task.target` (examples/ and docs/environments.md train tasks like it)::

        @dataclass(frozen=True)              # frozen: a value; equal tasks are the same task
        class CountTask:
            target: int
            @property
            def name(self) -> str:           # required: logs, info["task"], per-task tables
                return f"count-to-{self.target}"

        class CountEnv(Env):
            task_attributes = ("target",)    # what reset reads; checked before the run starts
            def reset(self, task: CountTask) -> str:
                self.task, self.count = task, 0
                self.info = {"task": task.name, "actions": [], "n_invalid": 0}
                return f"say 'more' until the count is {task.target}, then 'stop'"
            def step(self, action: str) -> StepResult:
                self.info["actions"].append(action)
                if action == "more":
                    self.count += 1
                    return StepResult(f"count {self.count}", 0.0, False, dict(self.info))
                if action == "stop":
                    return StepResult("", float(self.count == self.task.target), True, dict(self.info))
                self.info["n_invalid"] += 1   # never raise on a bad action: say so and go on
                return StepResult("say 'more' or 'stop'", 0.0, False, dict(self.info))

    The rules (the rollout, trajtune/sources/rollout.py, relies on them):
      * single use: the rollout makes one instance per episode (`make_env()`), calls `reset`
        once and `step` until `done`, max_turns, or the token budget; never again after that.
      * `reset(task) -> str` (the user message), or a list of {"role", "content"} messages.
      * `step(action_text) -> StepResult(observation, reward, done, info)`: observation a str
        ("" for none; shown to the policy as a TOOL message), reward a finite number (the
        episode's reward is the sum over its steps), done a bool, info a dict. Anything else
        (None, a string, NaN as reward) fails the episode like an exception does.
      * raising, or running past the time limit, fails that episode alone (reward 0,
        info["env_error"], logged with the task and the traceback; trajtune/sources/faults.py).
      * info keys the library reads: "task" (set from task.name if absent), "n_invalid"
        (rollout/invalid_per_episode, when every episode has it), "actions" (RFT / iw-SFT
        dedup: an episode's identity), "public_pass" / "hidden_pass" (hack rate, when present).
        The rollout adds stop_reason, n_turns, expected (and env_error): do not use them.
      * a reward >= 1 counts as a pass (rollout/pass_rate, pass@k; `score_policy(threshold=)`).
    """

    def reset(self, task: Any) -> str: ...

    def step(self, action: str) -> StepResult: ...


class TaskError(ValueError):
    """A task object lacks what the library or its environment reads (see `check_tasks`)."""


def check_tasks(tasks: Iterable[Any], env: Any = None) -> None:
    """Raise `TaskError` naming the task (its position and repr) and what it lacks, unless every task
    has a `.name` that is a non-empty str and every attribute in `env.task_attributes` (an optional
    tuple of names an environment declares it reads). Hashing is not required (see the module
    docstring: grouping falls back to the task's repr)."""
    needs = tuple(getattr(env, "task_attributes", ()) or ())
    for i, task in enumerate(tasks):
        name = getattr(task, "name", None)
        if not isinstance(name, str) or not name:
            got = "has no attribute 'name'" if not hasattr(task, "name") else f"has name {_short(name)}"
            raise TaskError(f"{_where(i, task)} {got}: a task needs a `.name`, a non-empty str (logs, info['task'], "
                            "per-task tables); e.g. a frozen dataclass with a `name` field or property")
        missing = [a for a in needs if not hasattr(task, a)]
        if missing:
            raise TaskError(f"{_where(i, task)} has no attribute {missing[0]!r}, which {type(env).__name__} reads "
                            f"(its task_attributes: {', '.join(needs)})")


def _where(i: int, task: Any) -> str:
    """How an error names task i: its position, type and (short) repr -- built only for the error (a repr can be
    long)."""
    return f"task {i} ({type(task).__name__}: {_short(task)})"


def _short(x: Any, n: int = 60) -> str:
    r = repr(x)
    return r if len(r) <= n else r[: n - 3] + "..."


def _is_scalar_tensor(x: Any) -> bool:
    """A 0-d / one-element number with __float__ (a torch or numpy scalar), not a str or None."""
    return hasattr(x, "__float__") and getattr(x, "ndim", 0) == 0 and not isinstance(x, (str, bytes))


class InvalidStep(TypeError):
    """An environment call returned what the Env contract does not allow: `check_verdict` here (a verifier's
    result), `trajtune.sources.faults.check_step` / `check_reset` (an Env's); the rollout makes it a fault of the
    episode."""


def check_reward(reward: Any, where: Callable[[], str]) -> float:
    """`reward` as a float, or `InvalidStep` saying `where()` (built only for the error) returned what is not a
    finite real number (None, a string, NaN, inf); a bool, a numpy or a one-element torch number is a number."""
    if not isinstance(reward, numbers.Real) and not _is_scalar_tensor(reward):
        raise InvalidStep(f"{where()} returned reward {_short(reward)} ({type(reward).__name__}); "
                          "a reward must be a finite number (int or float)")
    value = float(reward)
    if not math.isfinite(value):
        raise InvalidStep(f"{where()} returned reward {value}; a reward must be a finite number")
    return value


def check_verdict(verifier: Callable, result: Any) -> tuple[float, dict]:
    """A verifier's result (`SingleTurnEnv`: `verifier(task, reply) -> (reward, checks)`) as (float, dict),
    or `InvalidStep` naming the verifier (file:line) and what is wrong: not a pair, a reward that is not a
    finite real number, checks that are not a dict."""
    if isinstance(result, (tuple, list)) and len(result) == 2:
        reward, checks = result
        if type(reward) is float and type(checks) is dict and math.isfinite(reward):
            return reward, checks  # the common case
        value = check_reward(reward, lambda: _function_at(verifier))
        if not isinstance(checks, dict):
            raise InvalidStep(f"{_function_at(verifier)} returned checks {_short(checks)} ({type(checks).__name__}); "
                              "they must be a dict (it goes into the episode's info; {} for none)")
        return value, checks
    raise InvalidStep(f"{_function_at(verifier)} returned {_short(result)} ({type(result).__name__}); a verifier "
                      "returns (reward, checks): a finite number and a dict ({} for none)")


def _function_at(fn: Any) -> str:
    """`name (file:line)` of a function (or the function inside a functools.partial), for messages."""
    inner = getattr(fn, "func", fn)
    label = getattr(inner, "__qualname__", None) or repr(inner)
    try:
        return f"verifier {label} ({inspect.getsourcefile(inner)}:{inspect.getsourcelines(inner)[1]})"
    except (TypeError, OSError):
        return f"verifier {label}"


Verifier = Callable[[Any, str], "tuple[float, dict[str, Any]]"]
"""`verifier(task, reply) -> (reward, checks)`: scores one reply; `checks` goes into info."""


class SingleTurnEnv:
    """A one-step episode: the prompt is `task.prompt`, the reply is scored by `verifier`.

    A task needs `.name` and `.prompt` (text, or a list of messages). The verifier
    returns (reward, checks): reward a finite number (>= 1 counts as a pass), checks a dict.
    info: task (task.name), actions ([reply]), n_invalid (always 0: any text is a
    valid reply), submitted (True after the reply) plus the verifier's checks.
    Without a verifier the reward is 0 and the reply is scored later with the rest of its
    batch (`trajtune.sources.rewards`: TRL-style reward functions, one call per batch).
    """

    task_attributes = ("prompt",)

    def __init__(self, verifier: Verifier | None = None):
        self.verifier = verifier
        self.task: Any = None
        self.done = True

    def reset(self, task: Any) -> str:
        self.task, self.done = task, False
        return task.prompt

    def step(self, action: str) -> StepResult:
        if self.done:
            raise RuntimeError("SingleTurnEnv.step called after the episode ended; call reset(task) first")
        self.done = True
        reward, checks = 0.0, {}
        if self.verifier is not None:
            reward, checks = check_verdict(self.verifier, self.verifier(self.task, action))
        info = {"task": self.task.name, "actions": [action], "n_invalid": 0, "submitted": True, **checks}
        return StepResult("", reward, True, info)
