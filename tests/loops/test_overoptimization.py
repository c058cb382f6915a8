"""The over-optimization probe (trajtune.overoptimization): proxy, gold and KL on hand-made episodes where
each is known, and on a tiny model (same seed -> same samples; policy == reference -> KL 0)."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch

from trajtune.engine import make_engine
from trajtune.envs.instruct import InstructTask, instruct_env
from trajtune.metrics import is_documented
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.overoptimization import (
    OverOptProbe, batch_grader, episode_rewards, mean_score, peak, reward_batch, sampled_kl, verifier_grader,
)
from trajtune.sources.base import Episodes
from trajtune.sources.ensemble import RewardEnsemble
from trajtune.sources.episodes import EpisodeSource
from trajtune.text.render import Renderer
from trajtune.text.tokenizers import CharTokenizer
from trajtune.trajectory import Outcome, Owner, Trajectory
from trajtune.sources.sampler import Decoder, SamplerSettings


def episode(reply: str, reward: float, n_policy: int) -> Trajectory:
    """Two prompt tokens, then `n_policy` POLICY tokens; the reply text as its action."""
    t = Trajectory(reward=reward, info={"actions": [reply]})
    t.append([1, 2], Owner.PROMPT, 0)
    t.append([3] * n_policy, Owner.POLICY, 0)
    return t


class FixedSource:
    """Hands back copies of the same episodes (n of each task, task-major) and counts its calls."""

    def __init__(self, trajs: list[Trajectory]):
        self.trajs, self.calls, self.seeds = trajs, 0, []

    def take(self, draw, ahead=None) -> Episodes:
        self.calls += 1
        self.seeds.append(int(draw.generator.initial_seed()))
        assert len(draw.tasks) * draw.n == len(self.trajs)
        return Episodes([copy.deepcopy(t) for t in self.trajs], {}, draw.generator, draw.step)


class ConstantLogprob:
    """An engine whose every next-token log-prob is `value` (log pi at every position)."""

    def __init__(self, value: float):
        self.value = value

    def forward(self, batch, positions="all"):
        return SimpleNamespace(logprobs=torch.full(batch.action_mask.shape, self.value))


def test_probe_hand_worked():
    # two tasks x 2 samples; POLICY tokens 1, 3, 2, 2; log pi - log pi_ref = -0.5 - (-1.5) = 1.0 per token
    # KL = mean over episodes of the per-episode sums = (1 + 3 + 2 + 2) / 4 = 2.0
    trajs = [episode("Good.", 1.0, 1), episode("Good", 3.0, 3), episode("Lord.", 0.0, 2), episode("Lord", -1.0, 2)]
    tasks = [InstructTask("good"), InstructTask("lord")]
    source = FixedSource(trajs)
    gold = verifier_grader(lambda task, reply: (float(reply.endswith(".")), {}))
    second = verifier_grader(lambda task, reply: None if task.word == "lord" else float(len(reply)))
    probe = OverOptProbe(ConstantLogprob(-0.5), ConstantLogprob(-1.5), source, tasks, 2, episode_rewards(),
                         {"period": gold, "length": second}, pad_id=0, seed=7)
    row = probe(5)
    assert row["overopt/proxy"] == pytest.approx((1 + 3 + 0 - 1) / 4)
    assert row["overopt/gold"] == pytest.approx(0.5)  # the first gold grader: 2 of 4 end with a period
    assert row["overopt/gold/period"] == pytest.approx(0.5)
    assert row["overopt/gold/length"] == pytest.approx((5 + 4) / 2)  # None (lord) left out of the mean
    assert row["overopt/kl"] == pytest.approx(2.0)
    assert row["overopt/graded"] == 4
    probe(10)
    assert source.seeds == [7, 7]  # every call samples from the same seed
    assert [h["step"] for h in probe.history] == [5, 10]
    for key in row:
        assert is_documented(key), key


def test_probe_leaves_failed_episodes_out():
    trajs = [episode("a.", 1.0, 1), episode("b", 5.0, 4)]
    trajs[1].outcome = Outcome.REWARD_ERROR
    probe = OverOptProbe(ConstantLogprob(0.0), ConstantLogprob(-1.0), FixedSource(trajs), [InstructTask("good")], 2,
                         episode_rewards(), {"v": verifier_grader(lambda task, reply: 1.0)}, pad_id=0, seed=0)
    row = probe(1)
    assert row["overopt/proxy"] == 1.0 and row["overopt/kl"] == pytest.approx(1.0) and row["overopt/graded"] == 1
    trajs[0].outcome = Outcome.ENV_ERROR
    with pytest.raises(RuntimeError, match="every one of the 2 evaluation episodes failed"):
        probe(2)


def test_batch_grader_and_ensemble():
    # a RewardBatch scorer sees the prompts and the replies; an ensemble (min) of two is a scorer too
    trajs = [episode("Good.", 0.0, 1), episode("Lord", 0.0, 1)]
    tasks = [InstructTask("good"), InstructTask("lord")]
    batch = reward_batch(tasks, trajs)
    assert batch.prompts == ["Q: good\nA: ", "Q: lord\nA: "] and [batch.text(i) for i in range(2)] == ["Good.", "Lord"]
    assert batch.where == ["good", "lord"]
    length = lambda b: [float(len(b.text(i))) for i in range(len(b))]  # noqa: E731
    period = lambda b: [10.0 * b.text(i).endswith(".") for i in range(len(b))]  # noqa: E731
    assert batch_grader(length)(tasks, trajs) == [5.0, 4.0]
    assert batch_grader(RewardEnsemble([length, period], how="min"))(tasks, trajs) == [5.0, 0.0]


def test_mean_score_and_peak():
    assert mean_score([1.0, None, 3.0]) == 2.0 and math.isnan(mean_score([None]))
    assert peak([0, 10, 20, 30], [0.1, 0.5, 0.5, 0.2]) == (10, 0.5)  # the first of equal highs
    with pytest.raises(ValueError, match="2 steps and 1 values"):
        peak([0, 1], [0.3])


def test_probe_refuses_empty_settings():
    with pytest.raises(ValueError, match="n >= 1"):
        OverOptProbe(None, None, FixedSource([]), [InstructTask("good")], 0, episode_rewards(), {"g": None}, 0, 0)
    with pytest.raises(ValueError, match="at least one gold grader"):
        OverOptProbe(None, None, FixedSource([]), [InstructTask("good")], 1, episode_rewards(), {}, 0, 0)


def test_probe_on_a_tiny_model():
    """The real path: an EpisodeSource on a tiny model. Policy == reference: KL exactly 0; the same seed gives
    the same samples (and scores); after the policy moves, the KL is > 0 and the samples change."""
    tok = CharTokenizer.from_corpus(["Q: A:\nabcdefghijklmnopqrstuvwxyz.GLK "])
    torch.manual_seed(0)
    model = TinyTransformer(TinyConfig(tok.vocab_size, 16, 1, 2, max_len=48))
    policy = make_engine(model)
    reference = policy.reference_engine()
    source = EpisodeSource(Decoder(policy.sample, SamplerSettings(max_new_tokens=12)),
                           lambda: instruct_env("preference"), Renderer(tok), max_turns=1,
                           max_tokens=48)
    tasks = [InstructTask("good"), InstructTask("lord")]
    length = verifier_grader(lambda task, reply: float(len(reply)))
    probe = OverOptProbe(policy, reference, source, tasks, 4, episode_rewards(), {"length": length},
                         tok.pad_id, seed=3)
    a, b = probe(0), probe(0)
    assert a == b and a["overopt/kl"] == 0.0 and a["overopt/graded"] == 8
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    c = probe(1)
    assert c["overopt/kl"] > 0.05 and c["overopt/gold"] != a["overopt/gold"]


def test_sampled_kl_matches_sequence_sums():
    # the k1 estimate: per episode sum_t (log pi - log pi_ref) over POLICY tokens, mean over episodes
    trajs = [episode("x", 0.0, 2), episode("y", 0.0, 5)]
    assert sampled_kl(ConstantLogprob(-1.0), ConstantLogprob(-1.25), trajs, 0) == pytest.approx((0.5 + 1.25) / 2)


# --- `trajtune grpo --gold-reward ...` on a tiny random Hugging Face model ----------------------------------

@pytest.fixture(scope="module")
def hf_work(tmp_path_factory):
    pytest.importorskip("transformers")
    import json

    from trajtune.models.hf_random import make_random_model

    d = tmp_path_factory.mktemp("overopt_hf")
    make_random_model(d / "model", arch="llama", size="tiny")
    with open(d / "prompts.jsonl", "w") as f:
        for i in range(4):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"what is {i}+5?"}],
                                "answer": str(i + 5)}) + "\n")
    (d / "rewards.py").write_text(
        "def has_digit(prompts, completions, **kw):\n"
        "    return [float(any(ch.isdigit() for ch in c[-1]['content'])) for c in completions]\n"
        "def exact(completions, answer, **kw):\n"
        "    return [float(c[-1]['content'].strip() == a) for c, a in zip(completions, answer)]\n"
        "def short(completions, **kw):\n"
        "    return [-len(c[-1]['content']) / 10 for c in completions]\n"
        "def needs_label(completions, label, **kw):\n"
        "    return [0.0 for _ in completions]\n")
    return d


def test_grpo_logs_the_probe_every_n_steps(hf_work):
    from trajtune.cli import main
    from trajtune.metrics import read_metrics

    out, rewards = hf_work / "grpo", hf_work / "rewards.py"
    assert main(["grpo", "--model", str(hf_work / "model"), "--data", str(hf_work / "prompts.jsonl"),
                 "--reward", f"{rewards}:has_digit", "--gold-reward", f"{rewards}:exact", "--gold-reward",
                 f"{rewards}:short", "--eval-every", "2", "--eval-prompts", "2", "--eval-samples", "3", "--steps", "4",
                 "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", "6", "--lr", "1e-2",
                 "--out", str(out)]) == 0
    rows = [r for r in read_metrics(out) if "overopt/kl" in r]
    assert [r["step"] for r in rows] == [0, 2, 4]  # before the first step, every 2 steps, after the last
    assert rows[0]["overopt/kl"] == 0.0 and rows[-1]["overopt/kl"] != 0.0  # the starting policy is the reference
    assert all(r["overopt/graded"] == 6 and r["overopt/gold"] == r["overopt/gold/exact"] for r in rows)
    assert all(0 <= r["overopt/proxy"] <= 1 and r["overopt/gold/short"] <= 0 for r in rows)
    for key in rows[0]:
        assert key in ("step", "time", "stage") or is_documented(key), key


def test_grpo_gold_reward_is_checked_before_the_model_loads(hf_work, capsys):
    from trajtune.cli import main

    rewards = hf_work / "rewards.py"
    base = ["grpo", "--model", str(hf_work / "model"), "--data", str(hf_work / "prompts.jsonl"), "--reward",
            f"{rewards}:has_digit", "--out", str(hf_work / "bad")]
    assert main([*base, "--gold-reward", f"{rewards}:needs_label"]) == 2
    assert "needs column 'label'" in capsys.readouterr().err
    assert main([*base, "--gold-reward", f"{rewards}:nope"]) == 2
    assert "has no callable 'nope'" in capsys.readouterr().err
    assert main([*base, "--gold-reward", f"{rewards}:exact", "--eval-samples", "0"]) == 2
    assert "--eval-samples must be >= 1" in capsys.readouterr().err
