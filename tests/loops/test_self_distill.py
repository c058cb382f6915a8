"""Distillation pieces of issue 31 (book ch.12): the top-K reverse KL with its tail bucket, forward KL (GKD /
WORD-KD), multi-teacher advantages, and on-policy self-distillation (SDPO) on a toy task."""

import math

import pytest
import torch

from trajtune.algorithms.distill import SelfDistillConfig, train_self_distill, with_context
from trajtune.algorithms.sft import SFTConfig, train_sft
from trajtune.objectives.distill import (forward_kl_loss, multi_teacher_advantages, reverse_kl_loss, top_k_kl,
                                         top_k_reverse_kl_loss, top_k_with_tail)
from trajtune.objectives.kl import full_kl
from trajtune.trajectory import Owner, Trajectory

from trajtune.engine import OptimConfig, make_engine
from trajtune.models.tiny import TinyConfig, TinyTransformer

from test_algorithms import RENDER, TASKS, TOK, collect_for, pass_rate


def test_top_k_with_tail_by_hand():
    uniform = torch.zeros(4)  # p = 0.25 each
    got = top_k_with_tail(uniform, torch.tensor([2]))
    assert got.exp().tolist() == pytest.approx([0.25, 0.75])
    s, t = torch.tensor([0.5, 0.5]).log(), torch.tensor([0.25, 0.75]).log()
    assert top_k_kl(s, t).item() == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3))


def test_top_k_kl_is_exact_with_the_whole_vocabulary_and_a_bound_below():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 3, 7, generator=g), torch.randn(2, 3, 7, generator=g)
    mask = torch.ones(2, 3)
    exact, _ = reverse_kl_loss(s, t, mask)
    all_ids = torch.arange(7).expand(2, 3, 7)
    full, _ = top_k_reverse_kl_loss(s, all_ids, top_k_with_tail(t, all_ids), mask)
    assert full.item() == pytest.approx(exact.item(), abs=1e-5)
    ids = s.topk(3, dim=-1).indices
    coarse, m = top_k_reverse_kl_loss(s, ids, top_k_with_tail(t, ids), mask)
    assert 0 <= coarse.item() <= exact.item() + 1e-6  # merging outcomes never raises a KL (data processing)
    assert 0 < m["distill/top_k_mass"].item() < 1


def test_forward_kl_and_multi_teacher():
    g = torch.Generator().manual_seed(1)
    s, t = torch.randn(1, 2, 5, generator=g, requires_grad=True), torch.randn(1, 2, 5, generator=g)
    loss, _ = forward_kl_loss(s, t, torch.ones(1, 2))
    assert loss.item() == pytest.approx(full_kl(t, s).mean().item(), abs=1e-6)
    loss.backward()
    assert s.grad is not None and s.grad.abs().sum() > 0
    student = torch.tensor([[-1.0, -2.0]])
    teachers = torch.tensor([[[-0.5, -2.0]], [[-3.0, -1.0]]])  # two teachers
    mask = torch.tensor([[1.0, 1.0]])
    # 0.25 (0.5, 0) + 0.75 (-2, 1) = (-1.375, 0.75)
    got = multi_teacher_advantages(student, teachers, torch.tensor([0.25, 0.75]), mask)
    assert got.tolist() == [[pytest.approx(-1.375), pytest.approx(0.75)]]
    with pytest.raises(ValueError, match="must sum to 1"):
        multi_teacher_advantages(student, teachers, torch.tensor([0.5, 0.6]), mask)


def test_with_context_keeps_the_action_tokens():
    ep = Trajectory(reward=1.0, group=3)
    ep.append([1, 2], Owner.PROMPT, 0)
    ep.append([9], Owner.TEMPLATE, 0)
    ep.append([4, 5], Owner.POLICY, 0)
    t = with_context([7, 7, 7], ep)
    assert t.ids == [7, 7, 7, 4, 5] and [int(o) for o in t.owners] == [Owner.PROMPT] * 3 + [Owner.POLICY] * 2
    assert t.group == 3


def hinted(letter):
    return RENDER.render([{"role": "user", "content": f"Q: pick {letter}"}, {"role": "assistant", "content": letter}])


def test_sdpo_distills_the_hinted_self_into_the_plain_prompt():
    torch.manual_seed(3)
    e = make_engine(TinyTransformer(TinyConfig(TOK.vocab_size, dim=32, n_layers=2, n_heads=2, max_len=32)),
                    OptimConfig(lr=1e-2))
    # the model learns to copy a hint ("Q: pick c" -> "c") and to answer the plain prompt with any letter
    plain = [RENDER.render([{"role": "user", "content": "Q: pick"}, {"role": "assistant", "content": x}])
             for x in "abcdef"]
    train_sft(e, [hinted(x) for x in "abcdef"] * 4 + plain, SFTConfig(steps=300, batch_size=12), TOK.pad_id)
    before = pass_rate(e)

    def teacher_prompt(task, demo):  # privileged information: a correct sibling's answer
        return RENDER.prompt_ids(RENDER.start([{"role": "user", "content": f"Q: pick {demo.info['actions'][-1]}"}]))

    # the teacher shares the student's weights, so a large step moves it too: SDPO runs at a smaller rate
    e = make_engine(e.model, OptimConfig(lr=3e-3))
    hist = train_self_distill(e, TASKS, collect_for(e),
                              SelfDistillConfig(steps=12, tasks_per_step=4, samples_per_task=6, kl_top_k=3),
                              TOK.pad_id, teacher_prompt)
    assert pass_rate(e) > before + 0.3, (before, pass_rate(e))
    skipped = [h["distill/skipped_share"] for h in hist]
    assert sum(skipped[:4]) > sum(skipped[-4:])  # fewer prompts without a correct rollout as the student learns
    kl = [h["distill/top_k_kl"] for h in hist if "distill/top_k_kl" in h]
    assert kl[-1] < 0.5 * kl[0], kl  # the plain prompt's distribution meets its hinted self
