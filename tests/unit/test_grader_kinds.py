"""A new grader kind is one class and one registry line (trajtune.experiments.hf.graders.GRADERS): the command's
checks name it by its option, it is built with its weight, and `Scored` sums it with the other graders."""

from __future__ import annotations

import types

import pytest
import torch

from trajtune.experiments.hf.graders import GRADERS, GraderKind, build_graders, check_graders
from trajtune.experiments.hf.sampling import PromptRewardRun
from trajtune.sources.base import Draw
from trajtune.sources.data import PromptTask
from trajtune.sources.graders import Grades
from trajtune.sources.scoring import Scored
from trajtune.trajectory import Outcome, Owner, Trajectory

from test_sources import Scripted


class Vowels:
    """The toy kind: a completion's share of vowels (None for an empty one)."""

    finished_only, main_only = False, False

    def __init__(self, name: str = "vowels"):
        self.name = name

    def start(self, batch, state):
        texts = [batch.text(i) for i in range(len(batch))]
        scores = [sum(c in "aeiou" for c in t) / len(t) if t else None for t in texts]
        return lambda: Grades(scores, {f"reward/{self.name}/calls": 1.0})

    def close(self) -> None:
        pass


def config(tmp_path, **kw):
    (tmp_path / "r.py").write_text("def length(completions, **kw):\n    return [float(len(c)) for c in completions]\n")
    fields = {**vars(PromptRewardRun()), "reward": [f"{tmp_path / 'r.py'}:length"], "vowels": False, **kw}
    return types.SimpleNamespace(**fields)


def test_a_new_grader_kind_is_one_class_and_one_registry_line(tmp_path, monkeypatch):
    monkeypatch.setitem(GRADERS, "vowels", GraderKind(lambda ctx, c, columns, built: [Vowels()] if c.vowels else []))

    with pytest.raises(ValueError, match="needs a reward source: .*--rubric FILE, --vowels SPEC"):
        check_graders(config(tmp_path, reward=[]), "grpo")
    with pytest.raises(ValueError, match=r"1 numbers for 2 reward sources \(--reward .*:length, --vowels True\)"):
        check_graders(config(tmp_path, vowels=True, reward_weights=[1.0]), "grpo")
    c = config(tmp_path, vowels=True, reward_weights=[1.0, 4.0])
    check_graders(c, "grpo")
    graders = build_graders(None, c)
    assert [(w.grader.name, w.weight) for w in graders] == [("length", 1.0), ("vowels", 4.0)]

    replies = ["abab", "", "xyz"]
    trajs = [Trajectory([1, 2], [Owner.PROMPT, Owner.POLICY], [0, 0], group=i, info={"actions": [r]})
             for i, r in enumerate(replies)]
    tasks = [PromptTask(f"row{i}", "q", {}, f"p.jsonl:{i + 1}") for i in range(3)]
    engine = types.SimpleNamespace(step=0, is_main=True)
    with Scored(Scripted(lambda draw: trajs), engine, graders) as source:
        episodes = source.take(Draw(tasks, 1, torch.Generator()))
    assert [t.reward for t in trajs] == [4.0 + 4.0 * 0.5, 0.0, 3.0]  # length + 4 x vowels; "" scored by length only
    assert trajs[1].info["rewards"] == {"length": 0.0, "vowels": None} and all(t.outcome is Outcome.OK for t in trajs)
    assert episodes.metrics["reward/vowels/calls"] == 1.0 and episodes.metrics["reward/vowels/mean"] == 0.25
