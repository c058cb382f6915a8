"""The smollm2 recipe's task: mixed arithmetic (a+b, a-b with 2-digit numbers, a*d with a 1-digit d) asked as
`What is 47*6?` with a short system turn, answered by the number alone; the held-out set, the training rows
(SFT demonstrations, GRPO prompts) and the reward file GRPO is given."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

HELDOUT_SEED = 20_000
"""held-out problem i comes from Random(HELDOUT_SEED + i): the same set for every seed and every run"""
NUMBER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class Problem:
    a: int
    op: str
    b: int

    @property
    def question(self) -> str:
        return f"What is {self.a}{self.op}{self.b}?"

    @property
    def answer(self) -> str:
        return str({"+": self.a + self.b, "-": self.a - self.b, "*": self.a * self.b}[self.op])


def problem(rng: random.Random, ops) -> Problem:
    """One problem from a seeded generator: the operation, then its numbers (a >= b for a-b)."""
    op = rng.choice(list(ops))
    if op == "*":
        return Problem(rng.randint(10, 99), op, rng.randint(2, 9))
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return Problem(max(a, b), op, min(a, b)) if op == "-" else Problem(a, op, b)


@lru_cache(maxsize=8)
def heldout(n: int, ops: tuple[str, ...]) -> tuple[Problem, ...]:
    """The fixed held-out set: problem i from Random(HELDOUT_SEED + i)."""
    return tuple(problem(random.Random(HELDOUT_SEED + i), ops) for i in range(n))


def training(n: int, seed: int, ops: tuple[str, ...], n_heldout: int) -> list[Problem]:
    """`n` training problems from Random(seed), never one of the held-out set (same seed, same list)."""
    rng, held = random.Random(seed), set(heldout(n_heldout, ops))
    out: list[Problem] = []
    while len(out) < n:
        p = problem(rng, ops)
        if p not in held:
            out.append(p)
    return out


def opening(system: str, p: Problem) -> list[dict]:
    """The prompt's messages: the system turn, the question."""
    return [{"role": "system", "content": system}, {"role": "user", "content": p.question}]


def is_number(reply: str) -> bool:
    """The format the warm start teaches: the reply is one integer, nothing else (surrounding spaces allowed)."""
    return NUMBER.fullmatch(reply.strip()) is not None


REWARD_FILE = '''"""The smollm2 recipe's GRPO reward (written by trajtune; TRL's signature)."""


def exact_answer(prompts, completions, answer, **kwargs):
    """1.0 when the reply is exactly the answer (surrounding spaces allowed), else 0.0."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(t.strip() == str(a)) for t, a in zip(texts, answer, strict=True)]
'''
"""data/rewards.py: the reward function file GRPO is given (--reward data/rewards.py:exact_answer)"""


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    """Atomically: a rerun after a cut never reads half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)
    return path


def write_data(config, data_dir: Path) -> dict[str, Path]:
    """data/sft.jsonl ({"messages"}: system, question, the answer), data/prompts.jsonl ({"prompt": the
    messages, "answer"}), data/heldout.jsonl (the same rows for the held-out set, for reading) and rewards.py."""
    ops = tuple(config.ops)
    data_dir.mkdir(parents=True, exist_ok=True)
    sft = [{"messages": opening(config.system, p) + [{"role": "assistant", "content": p.answer}]}
           for p in training(config.n_sft, config.seed * 101 + 1, ops, config.n_eval)]
    prompts = [{"prompt": opening(config.system, p), "answer": p.answer}
               for p in training(config.n_grpo, config.seed * 101 + 2, ops, config.n_eval)]
    held = [{"prompt": opening(config.system, p), "answer": p.answer} for p in heldout(config.n_eval, ops)]
    (data_dir / "rewards.py").write_text(REWARD_FILE, encoding="utf-8")
    return {"sft": write_jsonl(data_dir / "sft.jsonl", sft), "prompts": write_jsonl(data_dir / "prompts.jsonl",
                                                                                    prompts),
            "heldout": write_jsonl(data_dir / "heldout.jsonl", held), "rewards": data_dir / "rewards.py"}
