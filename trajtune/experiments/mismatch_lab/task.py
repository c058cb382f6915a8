"""The mismatch lab's task: name the first letter of a 3-letter word, with the tiny char model from scratch.

"first of bed" -> "b". Words are a first letter from `FIRST` and two letters from `LETTERS`; the reply's first
character is scored (1 when it is the word's first letter, else 0), so a random policy scores about 1 / vocabulary
and a policy that has learnt to answer with a first letter 1 / len(FIRST) before it copies. The held-out words are
words the training never saw. Chosen because it learns within 30 GRPO steps on one CPU core in about two seconds
(held-out reward ~0.08 -> ~0.4 at seed 0), cheap enough to run the lab's ~150 trainings in minutes.

Everything is module-level (picklable): the sampler process runs the episodes.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from ...envs.base import SingleTurnEnv
from ...text.tokenizers import CharTokenizer

FIRST = "ab"
"""the letters a word starts with"""
LETTERS = "abcdef"
"""the letters of its second and third place"""


@dataclass(frozen=True)
class FirstLetter:
    """One task: the word, its prompt and its answer."""

    name: str
    prompt: str
    answer: str


def verify(task: FirstLetter, reply: str) -> tuple[float, dict]:
    """1.0 when the reply starts with the word's first letter."""
    ok = reply[:1] == task.answer
    return float(ok), {"correct": ok}


make_env = functools.partial(SingleTurnEnv, verify)
"""the lab's environment factory (one turn, scored by `verify`)"""


def tasks(n_train: int, n_eval: int, seed: int = 0) -> tuple[list[FirstLetter], list[FirstLetter]]:
    """(train, held-out): `n_train` and `n_eval` distinct words (shuffled with `seed`), no word in both."""
    words = [f + a + b for f in FIRST for a in LETTERS for b in LETTERS]
    if n_train + n_eval > len(words):
        raise ValueError(f"mismatch_lab: n_train + n_eval = {n_train + n_eval} exceeds the {len(words)} distinct "
                         "words of the task")
    random.Random(seed).shuffle(words)
    made = [FirstLetter(w, f"first of {w}", w[0]) for w in words]
    return made[:n_train], made[n_train:n_train + n_eval]


def tokenizer() -> CharTokenizer:
    """The char tokenizer of every prompt and answer."""
    return CharTokenizer.from_corpus("first of " + LETTERS)
