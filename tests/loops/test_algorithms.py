"""Each algorithm loop trains a tiny model on a tiny task and the quantity it optimises moves the right way."""

import copy
from dataclasses import dataclass

import pytest
import torch

from trajtune.algorithms.best_of_n import best_of_n, best_of_n_kl_bound
from trajtune.algorithms.distill import DistillConfig, train_distill
from trajtune.algorithms.dpo import DPOConfig, train_dpo
from trajtune.algorithms.iw_sft import IWSFTConfig, train_iw_sft
from trajtune.algorithms.reward_model import RewardModelConfig, train_reward_model
from trajtune.sources.scoring import pair_accuracy, reward_model_scores
from trajtune.algorithms.rft import RFTConfig, train_rft
from trajtune.algorithms.rl import RLConfig, train_rl
from trajtune.algorithms.sft import SFTConfig, train_sft
from trajtune.engine import make_engine, OptimConfig
from trajtune.runs.loop import Run
from trajtune.envs.base import SingleTurnEnv
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.sources.episodes import EpisodeSource
from trajtune.text.render import Renderer
from trajtune.text.tokenizers import CharTokenizer
from trajtune.sources.sampler import Decoder, SamplerSettings

# The task: answer "Q: pick" with one letter; the verifier wants "a" (1 of 6 letters).
TOK = CharTokenizer.from_corpus("Q: pickabcdef")
RENDER = Renderer(TOK)


@dataclass(frozen=True)
class Task:
    name: str = "pick"
    prompt: str = "Q: pick"


TASKS = [Task(f"pick{i}") for i in range(4)]


def verifier(task, reply):
    return float(reply == "a"), {"correct": reply == "a"}


def engine(seed=0, lr=1e-2, value_head=False):
    torch.manual_seed(seed)
    model = TinyTransformer(TinyConfig(TOK.vocab_size, dim=32, n_layers=1, n_heads=2, max_len=32,
                                       value_head=value_head))
    return make_engine(model, OptimConfig(lr=lr))


def collect_for(e):
    return EpisodeSource(Decoder(e.sample, SamplerSettings(max_new_tokens=2)), lambda: SingleTurnEnv(verifier), RENDER,
                         max_turns=1, max_tokens=32)


def pass_rate(e, n=64, seed=123):
    trajs = collect_for(e).run(TASKS, n // len(TASKS), torch.Generator().manual_seed(seed))
    return sum(t.reward for t in trajs) / len(trajs)


def demo(reply):
    return RENDER.render([{"role": "user", "content": "Q: pick"}, {"role": "assistant", "content": reply}])


def test_sft_learns_the_demonstrated_answer():
    e = engine()
    before = pass_rate(e)
    train_sft(e, [demo("a")] * 8, SFTConfig(steps=15, batch_size=8), TOK.pad_id)
    assert pass_rate(e) > max(0.9, before + 0.5)


@pytest.mark.parametrize("advantage,surrogate,epochs", [
    ("reinforce", "reinforce", 1), ("rloo", "reinforce", 1), ("grpo", "ppo", 2), ("dr_grpo", "cispo", 2),
    ("maxrl", "sapo", 2),
])
def test_rl_raises_pass_rate(advantage, surrogate, epochs):
    e = engine()
    before = pass_rate(e)
    cfg = RLConfig(steps=20, tasks_per_step=4, group_size=8, advantage=advantage, surrogate=surrogate, epochs=epochs)
    hist = train_rl(e, TASKS, collect_for(e), cfg, TOK.pad_id)
    assert pass_rate(e) > before + 0.3, (before, [h["rollout/pass_rate"] for h in hist])


def test_ppo_with_value_head_and_gsposequence_ratio_and_kl():
    e = engine(value_head=True)
    before = pass_rate(e)
    cfg = RLConfig(steps=20, tasks_per_step=4, group_size=8, advantage="gae", surrogate="ppo", epochs=2,
                   kl_coef=0.01, kl_in_reward=True, value_clip=0.2, lam=1.0)
    hist = train_rl(e, TASKS, collect_for(e), cfg, TOK.pad_id)
    assert pass_rate(e) > before + 0.3
    assert "value/loss" in hist[-1]
    e2 = engine()
    cfg = RLConfig(steps=20, tasks_per_step=4, group_size=8, advantage="grpo", surrogate="ppo", ratio_level="sequence",
                   epochs=2, kl_coef=0.05, skip_zero_variance=True)
    train_rl(e2, TASKS, collect_for(e2), cfg, TOK.pad_id)
    assert pass_rate(e2) > before + 0.3


def test_rft_and_iw_sft_raise_pass_rate():
    for loop, cfg in [(train_rft,
                       RFTConfig(rounds=3, samples_per_task=8, steps_per_round=5, batch_size=8, dedup=False)),
                      (train_iw_sft, IWSFTConfig(rounds=3, samples_per_task=8, steps_per_round=5, batch_size=8))]:
        e = engine()
        before = pass_rate(e)
        hist = loop(e, TASKS, collect_for(e), cfg, TOK.pad_id)
        assert hist[-1]["rollout/pass_rate"] > hist[0]["rollout/pass_rate"]
        assert pass_rate(e) > before + 0.3, loop.__name__


def test_dpo_pushes_chosen_over_rejected():
    e = engine(lr=3e-3)
    pairs = [(demo("a"), demo("b")), (demo("a"), demo("c"))]
    hist = train_dpo(e, pairs, DPOConfig(steps=15, beta=0.5, nll_weight=1.0), TOK.pad_id)
    assert hist[0]["dpo/margin"] == pytest.approx(0.0, abs=1e-5)  # policy == reference at step 1
    assert hist[-1]["dpo/margin"] > 0.5 and hist[-1]["train/loss"] < hist[0]["train/loss"]
    for loss in ("ipo", "simpo", "orpo"):
        h = train_dpo(engine(lr=3e-3), pairs, DPOConfig(steps=10, loss=loss, beta=0.5), TOK.pad_id)
        assert h[-1]["train/loss"] < h[0]["train/loss"], loss


def test_reward_model_learns_the_preference_and_best_of_n_uses_it():
    rm = engine(lr=3e-3, value_head=True)
    pairs = [(demo("a"), demo(x)) for x in "bcdef"]
    hist = train_reward_model(rm, pairs, RewardModelConfig(steps=30, batch_size=5), TOK.pad_id)
    assert abs(hist[0]["rm/margin"]) < 0.1 < 1.0 < hist[-1]["rm/margin"]  # untrained head: no preference
    assert pair_accuracy(rm, pairs, TOK.pad_id) == 1.0
    policy = engine()
    best, samples = best_of_n(TASKS, collect_for(policy), 8, torch.Generator().manual_seed(0),
                              score=lambda ts: reward_model_scores(rm, ts, TOK.pad_id))
    assert len(best) == len(TASKS) and len(samples) == 8 * len(TASKS)
    assert sum(t.reward for t in best) / len(best) >= sum(t.reward for t in samples) / len(samples)
    assert best_of_n_kl_bound(1) == 0.0 and best_of_n_kl_bound(8) == pytest.approx(1.2044, abs=1e-4)


def test_distillation_moves_student_towards_teacher():
    teacher = engine(seed=1)
    train_sft(teacher, [demo("a")] * 8, SFTConfig(steps=15, batch_size=8), TOK.pad_id)
    for mode in ("sampled", "full"):
        # the sampled estimator is much noisier (per-token advantages of several nats): smaller steps
        student = engine(seed=2, lr=3e-3 if mode == "sampled" else 1e-2)
        before = pass_rate(student)
        hist = train_distill(student, make_engine(teacher.model, frozen=True), TASKS, collect_for(student),
                             DistillConfig(steps=60, tasks_per_step=4, samples_per_task=4, mode=mode), TOK.pad_id)
        if mode == "full":
            assert pass_rate(student) > before + 0.3
            kl = [h["distill/reverse_kl"] for h in hist]
        else:  # the mean per-token advantage is minus the k1 estimate of KL(student || teacher)
            kl = [-h["pg/advantage_mean"] for h in hist]
        assert sum(kl[-5:]) < 0.6 * sum(kl[:5]), (mode, kl)


def test_every_metric_a_loop_logs_is_documented(tmp_path):
    from trajtune.metrics import MetricsLogger

    e = engine(value_head=True)
    with MetricsLogger(tmp_path, strict=True) as log:
        train_rl(e, TASKS, collect_for(e), RLConfig(steps=1, tasks_per_step=2, group_size=4, advantage="gae",
                                                    surrogate="ppo", kl_coef=0.1, entropy_coef=0.01, tis_cap=2.0),
                 TOK.pad_id, Run("t", log))
        train_rft(e, TASKS, collect_for(e), RFTConfig(rounds=1, samples_per_task=2, steps_per_round=1, threshold=0.0),
                  TOK.pad_id, Run("t", log))
        train_iw_sft(e, TASKS, collect_for(e),
                     IWSFTConfig(rounds=1, samples_per_task=2, steps_per_round=1, threshold=0.0), TOK.pad_id,
                     Run("t", log))
        pairs = [(demo("a"), demo("b"))]
        for loss in ("dpo", "simpo", "orpo"):
            train_dpo(e, pairs, DPOConfig(steps=1, loss=loss, nll_weight=1.0 if loss == "dpo" else 0.0), TOK.pad_id,
                      Run("t", log))
        train_reward_model(e, pairs, RewardModelConfig(steps=1), TOK.pad_id, Run("t", log))
        train_distill(e, make_engine(copy.deepcopy(e.model), frozen=True), TASKS, collect_for(e),
                      DistillConfig(steps=1), TOK.pad_id, Run("t", log))
        train_distill(e, make_engine(copy.deepcopy(e.model), frozen=True), TASKS, collect_for(e),
                      DistillConfig(steps=1, mode="full"), TOK.pad_id, Run("t", log))
