"""Scripted policies: Python functions of the conversation that act in a gym.

They play two roles (seed ch.15 §15.1-15.2): demonstrators (the oracle's
episodes are SFT data) and baselines with a known skill level (blind and random
play builds the "weak base": right format, no skill). Every policy sees only
what a model would see — the messages so far — and draws randomness from its
own seeded `random.Random`, so the same seed replays the same episodes.

BugFix policies (hidden-reward pass rate over 20 seeds, train / held-out, 6 turns;
tests/unit/test_envs_bugfix.py checks them):

| policy | behaviour                                                                  | pass        |
|--------|----------------------------------------------------------------------------|-------------|
| oracle | read; edit with the op the listing shows (`bugfix.diagnose`); submit        | 1.00 / 1.00 |
| blind  | edit with one op drawn per seed (whatever the task: not from its code,     | 0.20 / 0.20 |
|        | never read, nor from its name); submit                                     |             |
| random | per turn, uniformly: read / edit <random op> / hardcode_tests / submit      | 0.09 / 0.09 |
|        | (public reward: 0.39, because 30% of its episodes are hacks)               |             |

Blind and random play take `ops`, the edits they draw from (default all five). Without one family's op
they never solve that family, the blind spot of the seed's weak base (it never solves `init`):
`experiments.bugfix.train_weak_base(blind_spot=...)`.

Single-turn gyms: `oracle` answers correctly (arithmetic) or with a real
demonstration line (instruct); `random` answers a random number / a random
corpus line.
"""

from __future__ import annotations

import random
import re
from typing import Mapping, Sequence

from ..text.render import Message
from .bugfix import OPS, diagnose


def _assistant_actions(messages: Sequence[Message]) -> list[str]:
    return [m["content"].strip() for m in messages if m["role"] == "assistant"]


def _entry_from_issue(messages: Sequence[Message]) -> str:
    return messages[0]["content"].split()[-1]


class BugFixOracle:
    """read -> edit <op diagnosed from the listing> -> submit."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def act(self, messages: Sequence[Message]) -> str:
        actions = _assistant_actions(messages)
        if "read" not in actions:
            return "read"
        if not any(a.startswith("edit ") for a in actions):
            listing = _observation_after(messages, "read")
            op = diagnose(listing) if listing is not None else None
            return f"edit {op}" if op is not None else "submit"
        return "submit"


class BugFixBlind:
    """edit <one guessed op> -> submit, without reading.

    The guess is drawn once per seed, so it carries no information about the task: not its code
    (never read) and not its name. A name-keyed guess (one op per (seed, name), as this policy
    used to draw) teaches a student trained on blind play that the name predicts the edit, the
    shortcut the held-out split (unseen names) punishes: with it, oracle SFT from the weak base
    passed 0.85 of the training tasks renamed to held-out names (seed 0) against 1.00 without it."""

    def __init__(self, seed: int = 0, ops: Sequence[str] = OPS):
        self.seed = seed
        self.op = random.Random(f"blind:{seed}").choice(_ops(ops))

    def guess(self, entry: str) -> str:
        """The op this policy edits with, whatever the task (`entry` is ignored)."""
        return self.op

    def act(self, messages: Sequence[Message]) -> str:
        if not _assistant_actions(messages):
            return f"edit {self.guess(_entry_from_issue(messages))}"
        return "submit"


class BugFixRandom:
    """Each turn: read, edit <random op>, hardcode_tests or submit, uniformly (all well-formed)."""

    KINDS = ("read", "edit", "hardcode_tests", "submit")

    def __init__(self, seed: int = 0, ops: Sequence[str] = OPS):
        self.rng = random.Random(f"random:{seed}")
        self.ops = _ops(ops)

    def act(self, messages: Sequence[Message]) -> str:
        kind = self.rng.choice(self.KINDS)
        return f"edit {self.rng.choice(self.ops)}" if kind == "edit" else kind


class ArithmeticOracle:
    """Answers `Q: a+b\\nA: ` with the exact sum."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def act(self, messages: Sequence[Message]) -> str:
        a, b = re.search(r"(\d+)\+(\d+)", messages[-1]["content"]).groups()
        return str(int(a) + int(b))


class ArithmeticRandom:
    """Answers a uniformly random number in the range of possible sums."""

    def __init__(self, seed: int = 0, low: int = 20, high: int = 198):
        self.rng, self.low, self.high = random.Random(f"arith:{seed}"), low, high

    def act(self, messages: Sequence[Message]) -> str:
        return str(self.rng.randint(self.low, self.high))


class InstructOracle:
    """Answers `Q: word\\nA: ` with a real Shakespeare line cut to start at the word (a demonstration)."""

    def __init__(self, demos: Mapping[str, Sequence[str]], seed: int = 0):
        self.demos, self.rng = demos, random.Random(f"instruct:{seed}")

    def act(self, messages: Sequence[Message]) -> str:
        word = re.search(r"Q: (\w+)", messages[-1]["content"]).group(1)
        return self.rng.choice(list(self.demos[word]))


class InstructRandom:
    """Answers with a random corpus line (ignores the instruction)."""

    def __init__(self, lines: Sequence[str], seed: int = 0):
        self.lines, self.rng = list(lines), random.Random(f"instruct-random:{seed}")

    def act(self, messages: Sequence[Message]) -> str:
        return self.rng.choice(self.lines)


BUGFIX_POLICIES = {"oracle": BugFixOracle, "blind": BugFixBlind, "random": BugFixRandom}


def bugfix_policy(kind: str, seed: int = 0, ops: Sequence[str] = OPS):
    """A BugFix scripted policy by name: "oracle", "blind" or "random". `ops`: the edits blind and random play
    draw from (default all five; the oracle edits with the op it reads off the listing, whatever `ops`)."""
    if kind not in BUGFIX_POLICIES:
        raise ValueError(f"unknown BugFix policy {kind!r}; choose from {sorted(BUGFIX_POLICIES)}")
    return BUGFIX_POLICIES[kind](seed) if kind == "oracle" else BUGFIX_POLICIES[kind](seed, ops)


def _ops(ops: Sequence[str]) -> tuple[str, ...]:
    """`ops` checked against the gym's edits (a tuple, in the order given)."""
    ops = tuple(ops)
    unknown = [op for op in ops if op not in OPS]
    if not ops or unknown:
        raise ValueError(f"scripted play: ops must be a non-empty subset of {', '.join(OPS)}; got {list(ops)}")
    return ops


def _observation_after(messages: Sequence[Message], action: str) -> str | None:
    """The tool message answering the most recent assistant message equal to `action`."""
    found = None
    for prev, msg in zip(messages[:-1], messages[1:], strict=True):
        if prev["role"] == "assistant" and prev["content"].strip() == action and msg["role"] == "tool":
            found = msg["content"]
    return found
