"""On-policy distillation added to a group advantage (RLHF book ch.12, checklist 12.7: "it can be added to other
advantages (e.g. GRPO) for reward shaping"): `RLConfig.opd_coef` and train_rl's `teacher` -- hand-worked numbers
for the combined advantage, the scoring step on a real batch, then a run that moves the student to its teacher."""

import math

import pytest
import torch
from test_algorithms import RENDER, TASKS, TOK, collect_for, demo, engine

from trajtune.algorithms.rl import RLConfig, score, train_rl
from trajtune.algorithms.sft import SFTConfig, train_sft
from trajtune.engine import make_engine
from trajtune.envs.base import SingleTurnEnv
from trajtune.objectives.advantages import group_advantages
from trajtune.objectives.distill import with_distill_advantages
from trajtune.sources.episodes import EpisodeSource
from trajtune.trajectory import collate
from trajtune.sources.sampler import Decoder, SamplerSettings

PAD = TOK.pad_id


def test_the_combined_advantage_on_hand_worked_numbers():
    # two episodes, three predicted positions; the first position of each is a prompt token (mask 0)
    group_B = torch.tensor([0.5, -0.5])  # a GRPO advantage per episode
    student = torch.tensor([[-9.0, -1.0, -2.0], [-9.0, -0.5, -3.0]])
    teacher = torch.tensor([[-1.0, -0.5, -4.0], [-2.0, -1.5, -3.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])  # episode 2's last position is padding
    got = with_distill_advantages(group_B, student, teacher, mask, coef=0.5)
    # on the mask: A + 0.5 (teacher - student): 0.5 + 0.5 * 0.5 = 0.75; 0.5 + 0.5 * -2 = -0.5; -0.5 + 0.5 * -1 = -1
    expected = torch.tensor([[0.0, 0.75, -0.5], [0.0, -1.0, 0.0]])
    assert torch.equal(got, expected)
    # a per-token advantage (GAE) takes the same term; coef 0 leaves the task advantage on the mask
    assert torch.equal(with_distill_advantages(expected, student, teacher, mask, 0.0), expected)
    # the teacher term is a reward: no gradient flows back through either log-prob
    s = student.clone().requires_grad_()
    assert not with_distill_advantages(group_B, s, teacher.clone().requires_grad_(), mask, 1.0).requires_grad
    with pytest.raises(ValueError, match="advantages"):
        with_distill_advantages(torch.zeros(3), student, teacher, mask, 1.0)


class Shifted:
    """A 'teacher' whose log-probs are the student's + `delta` at every position (an engine's forward, enough
    for the scoring step)."""

    def __init__(self, student, delta):
        self.student, self.delta = student, delta

    def forward(self, batch, **kw):
        out = self.student.forward(batch, **kw)
        out.logprobs = out.logprobs + self.delta
        return out


def test_scoring_adds_the_teacher_term_to_the_group_advantage_on_policy_tokens_only():
    e = engine()
    trajs = collect_for(e).run(TASKS[:2], 4, torch.Generator().manual_seed(0))
    batch = collate(trajs, PAD)
    config = RLConfig(advantage="grpo", group_size=4, opd_coef=0.3)
    delta = torch.linspace(-1.0, 1.0, batch.action_mask.shape[1])  # [T-1]: a different teacher gap per position
    scored, metrics = score(e, None, batch, config, use_old=False, teacher=Shifted(e, delta))
    group_B = group_advantages(batch.rewards.float(), batch.groups, baseline="mean", std_normalize=True, eps=1e-4)
    mask = batch.action_mask
    expected = (group_B[:, None] + 0.3 * delta[None, :]) * mask  # teacher - student = delta on POLICY tokens
    assert torch.allclose(scored.pg.advantages, expected, atol=1e-5)
    assert bool((scored.pg.advantages[mask == 0] == 0).all())
    assert metrics["kl/teacher"] == pytest.approx(-float((delta[None, :] * mask).sum() / mask.sum()), abs=1e-5)
    plain, _ = score(e, None, batch, RLConfig(advantage="grpo", group_size=4), use_old=False)
    assert torch.equal(plain.pg.advantages, group_B)  # opd_coef 0: the group advantage, untouched


def test_opd_config_errors_name_the_field():
    with pytest.raises(ValueError, match="opd_coef"):
        RLConfig(opd_coef=-0.1)
    with pytest.raises(ValueError, match="opd_coef"):
        RLConfig(opd_coef=math.nan)
    e = engine()
    with pytest.raises(ValueError, match="opd_coef"):  # a coefficient without a teacher
        train_rl(e, TASKS, collect_for(e), RLConfig(steps=1, opd_coef=1.0), PAD)
    with pytest.raises(ValueError, match="opd_coef"):  # a teacher without a coefficient would be ignored
        train_rl(e, TASKS, collect_for(e), RLConfig(steps=1), PAD, teacher=make_engine(e.model, frozen=True))


def zero_reward_source(e):
    """Every episode scores 0: a group advantage is 0, so only the teacher's term can move the student."""
    return EpisodeSource(Decoder(e.sample, SamplerSettings(max_new_tokens=2)),
                         lambda: SingleTurnEnv(lambda task, reply: (0.0, {})), RENDER, max_turns=1,
                         max_tokens=32)


def student_teacher_gap(student, teacher) -> float:
    """Mean |log pi(a) - log pi_T(a)| over the POLICY tokens of fixed replies (not the run's own samples)."""
    batch = collate([demo(r) for r in ("a", "b", "c", "ab", "ba", "fe")], PAD)
    s, t = (x.forward(batch, positions="actions").logprobs for x in (student, teacher))
    return float(((s - t).abs() * batch.action_mask).sum() / batch.action_mask.sum())


def test_a_run_with_a_teacher_moves_the_student_toward_it():
    teacher = engine(seed=1)
    train_sft(teacher, [demo("a")] * 8, SFTConfig(steps=15, batch_size=8), PAD)
    frozen = make_engine(teacher.model, frozen=True)
    cfg = dict(steps=60, tasks_per_step=4, group_size=4, advantage="grpo")
    student = engine(seed=2, lr=3e-3)
    before = student_teacher_gap(student, frozen)
    hist = train_rl(student, TASKS, zero_reward_source(student), RLConfig(opd_coef=1.0, **cfg), PAD, teacher=frozen)
    kl = [h["kl/teacher"] for h in hist]
    assert sum(kl[-5:]) < 0.6 * sum(kl[:5]), kl  # KL(student || teacher) on the student's own samples fell
    assert student_teacher_gap(student, frozen) < 0.7 * before  # and on replies it was not trained on
    alone = engine(seed=2, lr=3e-3)  # the same run without the teacher's term: zero advantages, nothing learnt
    train_rl(alone, TASKS, zero_reward_source(alone), RLConfig(**cfg), PAD)
    assert student_teacher_gap(alone, frozen) == pytest.approx(before, rel=0.05)


def test_the_grpo_command_refuses_opd_coef_for_want_of_a_teacher():
    from trajtune.config import from_dict
    from trajtune.experiments.hf.grpo import GRPORun

    base = {"model": {"path": "m"}, "data": "d", "reward": ["r:f"]}
    with pytest.raises(ValueError, match="opd-coef"):
        from_dict(GRPORun, {**base, "rl": {"opd_coef": 0.5}})
    from_dict(GRPORun, {**base, "rl": {"opd_coef": 0.0}})
