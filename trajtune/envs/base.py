"""The environment protocol, and the single-turn case of it.

An environment is a text game: `reset(task)` returns the first observation
(the user message), and each `step(action_text)` returns what the world says
back. Environments know nothing about models or tokens: they see the decoded
text of one action at a time.

A single-turn task with a verifier (arithmetic, instruction following) is the
one-step case: `reset` returns the prompt, the first `step` receives the reply,
scores it and ends the episode with an empty observation. There is no separate
code path for it anywhere in the library.

Rules every environment follows (DESIGN.md, "Contracts"):
  * `step` never raises on a malformed action: it answers with an error
    observation and counts the call in `info["n_invalid"]`;
  * everything that happened goes into `info` (task name, actions, counters);
  * randomness, if any, comes from a seed given at construction.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable


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
    """A text environment for one episode at a time.

    `reset(task) -> str` starts an episode on `task` and returns the first
    observation (rendered as the user message). `step(action_text) -> StepResult`
    applies one policy action. Create one instance per concurrent episode.
    """

    def reset(self, task: Any) -> str: ...

    def step(self, action: str) -> StepResult: ...


Verifier = Callable[[Any, str], "tuple[float, dict[str, Any]]"]
"""`verifier(task, reply) -> (reward, checks)`: scores one reply; `checks` goes into info."""


class SingleTurnEnv:
    """A one-step episode: the prompt is `task.prompt`, the reply is scored by `verifier`.

    info: task (task.name), actions ([reply]), n_invalid (always 0: any text is a
    valid reply), submitted (True after the reply) plus the verifier's checks.
    Without a verifier the reward is 0 and the reply is scored later with the rest of its
    batch (`trajtune.rewards`: TRL-style reward functions, one call per batch).
    """

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
        reward, checks = self.verifier(self.task, action) if self.verifier is not None else (0.0, {})
        info = {"task": self.task.name, "actions": [action], "n_invalid": 0, "submitted": True, **checks}
        return StepResult("", float(reward), True, info)
