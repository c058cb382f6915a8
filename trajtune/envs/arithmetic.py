"""Arithmetic gym: `Q: 23+45\\nA: ` -> `68`, scored by exact match (post-training ch.13 step 4, RLVR).

Problems add two 2-digit numbers (10..99). The held-out test set is the seed's:
problem i is drawn from `random.Random(10_000 + i)`, 256 of them. Training
problems come from a seeded stream that skips every held-out pair, so a score
on the test set is a score on problems never trained on.

The verifier is exact string match: the reply (the assistant's text, without
its stop token) must equal the decimal sum — no spaces, no leading zeros.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

from ..text.tokenizers import CharTokenizer
from .base import SingleTurnEnv

ALPHABET = "0123456789+QA: \n"
N_TEST = 256


@dataclass(frozen=True)
class ArithmeticTask:
    """a + b, both 2-digit."""

    a: int
    b: int

    @property
    def name(self) -> str:
        return f"{self.a}+{self.b}"

    @property
    def prompt(self) -> str:
        return f"Q: {self.a}+{self.b}\nA: "

    @property
    def answer(self) -> str:
        return str(self.a + self.b)


def problem(rng: random.Random) -> ArithmeticTask:
    """One problem from a seeded generator (two draws from `rng`)."""
    return ArithmeticTask(rng.randint(10, 99), rng.randint(10, 99))


@lru_cache(maxsize=1)
def heldout_tasks() -> tuple[ArithmeticTask, ...]:
    """The fixed held-out set: problem i from Random(10_000 + i), i < 256 (duplicates kept, as in the seed)."""
    return tuple(problem(random.Random(10_000 + i)) for i in range(N_TEST))


def train_tasks(n: int, seed: int = 0) -> list[ArithmeticTask]:
    """`n` training problems from `Random(seed)`, never a held-out pair (same seed, same list)."""
    rng, held = random.Random(seed), set(heldout_tasks())
    out: list[ArithmeticTask] = []
    while len(out) < n:
        task = problem(rng)
        if task not in held:
            out.append(task)
    return out


def make_tasks(split: str = "train", n: int = 256, seed: int = 0) -> list[ArithmeticTask]:
    """"train": `train_tasks(n, seed)`; "heldout": the fixed test set (n and seed ignored)."""
    if split == "train":
        return train_tasks(n, seed)
    if split == "heldout":
        return list(heldout_tasks())
    raise ValueError(f"arithmetic split must be 'train' or 'heldout', got {split!r}")


def exact_match(task: ArithmeticTask, reply: str) -> tuple[float, dict]:
    correct = reply == task.answer
    return float(correct), {"correct": correct, "answer": task.answer, "reply": reply}


def arithmetic_env() -> SingleTurnEnv:
    """A one-step environment: reward 1.0 iff the reply is exactly the sum."""
    return SingleTurnEnv(exact_match)


def arithmetic_tokenizer() -> CharTokenizer:
    """Characters of the format: digits, '+', 'Q', 'A', ':', space, newline (plus the special tokens)."""
    return CharTokenizer(sorted(set(ALPHABET)))
