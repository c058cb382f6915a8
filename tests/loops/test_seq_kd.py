"""Sequence-level knowledge distillation (SEQ-KD, book ch.12.3; issue 31): SFT on the teacher's own decoding."""

import pytest
import torch

from trajtune.algorithms.distill import SeqKDConfig, teacher_completions, train_seq_kd
from trajtune.algorithms.sft import SFTConfig, train_sft
from trajtune.envs.base import SingleTurnEnv
from trajtune.sources.episodes import EpisodeSource
from trajtune.sources.sampler import Decoder, SamplerSettings

from test_algorithms import RENDER, TASKS, TOK, demo, engine, verifier


def source(e, **decoding):
    return EpisodeSource(Decoder(e.sample, SamplerSettings(max_new_tokens=2, **decoding)),
                         lambda: SingleTurnEnv(verifier), RENDER, max_turns=1, max_tokens=32)


def greedy_replies(e):
    return [t.info["actions"][-1] for t in source(e, greedy=True).run(TASKS, 1, torch.Generator().manual_seed(0))]


def test_seq_kd_moves_the_students_greedy_replies_to_the_teachers():
    teacher = engine(seed=0)
    train_sft(teacher, [demo("c")] * 8, SFTConfig(steps=15, batch_size=8), TOK.pad_id)
    taught = greedy_replies(teacher)
    student = engine(seed=1)
    before = greedy_replies(student)
    assert taught == ["c"] * len(TASKS) and before != taught  # the student starts elsewhere
    out = train_seq_kd(student, source(teacher, greedy=True), TASKS, SeqKDConfig(), SFTConfig(steps=15, batch_size=4),
                       TOK.pad_id)
    assert [d.info["actions"][-1] for d in out.demos] == taught and out.metrics["seqkd/demos"] == len(TASKS)
    assert greedy_replies(student) == taught
    assert out.history[-1]["train/loss"] < out.history[0]["train/loss"]


def test_seq_kd_is_a_function_of_its_seed_and_filters_by_reward():
    teacher = engine(seed=2)  # untrained: its sampled replies vary

    def run(seed):
        student = engine(seed=3)
        out = train_seq_kd(student, source(teacher, temperature=1.0), TASKS, SeqKDConfig(samples_per_task=4, seed=seed),
                           SFTConfig(steps=3, batch_size=8), TOK.pad_id)
        return [d.ids for d in out.demos], [p.detach().clone() for p in student.model.parameters()]

    (demos_a, weights_a), (demos_b, weights_b), (demos_c, _) = run(0), run(0), run(1)
    assert demos_a == demos_b and all(torch.equal(a, b) for a, b in zip(weights_a, weights_b, strict=True))
    assert demos_a != demos_c
    kept, m = teacher_completions(source(teacher, temperature=1.0), TASKS,
                                  SeqKDConfig(samples_per_task=4, min_reward=1.0))
    assert all(t.reward >= 1.0 for t in kept) and m["seqkd/demos"] + m["seqkd/dropped"] == 4 * len(TASKS)
    assert m["seqkd/dropped"] > 0
    with pytest.raises(ValueError, match="no teacher completion was kept"):
        train_seq_kd(engine(), source(teacher, temperature=1.0), TASKS, SeqKDConfig(min_reward=2.0), SFTConfig(),
                     TOK.pad_id)
