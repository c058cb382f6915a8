"""Online DPO (RLHF book ch.8.2): pairs sampled from the current policy, labelled by a reward, ties skipped; the
loop raises the reward on a tiny model, and `trajtune dpo --reward file.py:fn` runs it on a tiny HF model."""

import json

import pytest
import torch
from test_algorithms import RENDER, TOK, Task  # the one-letter "Q: pick" task

from trajtune.algorithms.dpo import DPOConfig, NoPairs, OnlinePairs, labelled_pairs, train_dpo
from trajtune.engine import OptimConfig, make_engine
from trajtune.envs.base import SingleTurnEnv
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.sources.episodes import EpisodeSource
from trajtune.trajectory import Outcome, Trajectory
from trajtune.sources.sampler import Decoder, SamplerSettings


def ep(reward, ok=True):
    return Trajectory([1, 2], [0, 2], [0, 0], reward=reward, outcome=Outcome.OK if ok else Outcome.REWARD_ERROR)


def test_labelled_pairs_best_against_worst_ties_skipped():
    trajs = [ep(0.2), ep(0.9), ep(0.5), ep(0.5), ep(1.0), ep(0.0, ok=False), ep(0.3), ep(0.1)]
    pairs, m = labelled_pairs(trajs, 2)
    assert [(c.reward, r.reward) for c, r in pairs] == [(0.9, 0.2), (0.3, 0.1)]
    assert m == {"online/pairs": 2.0, "online/ties": 1.0, "online/chosen_reward": pytest.approx(0.6),
                 "online/rejected_reward": pytest.approx(0.15)}
    with pytest.raises(ValueError, match="groups of n = 2"):
        labelled_pairs(trajs[:3], 2)


def reply_a(task, reply):
    return float(reply[:1] in ("a", "b", "c")), {}


def tiny(seed=0, lr=1e-2):
    torch.manual_seed(seed)
    return make_engine(TinyTransformer(TinyConfig(TOK.vocab_size, dim=32, n_layers=1, n_heads=2, max_len=32)),
                       OptimConfig(lr=lr))


def share_a(e, n=64):
    source = EpisodeSource(Decoder(e.sample, SamplerSettings(max_new_tokens=2)), lambda: SingleTurnEnv(reply_a), RENDER,
                           max_turns=1, max_tokens=32)
    trajs = source.run([Task()], n, torch.Generator().manual_seed(99))
    return sum(t.reward for t in trajs) / n


def test_online_dpo_raises_the_reward_it_labels_with():
    tasks = [Task(f"pick{i}") for i in range(4)]
    e = tiny()
    before = share_a(e)
    source = EpisodeSource(Decoder(e.sample, SamplerSettings(max_new_tokens=2, temperature=1.0)),
                           lambda: SingleTurnEnv(reply_a), RENDER, max_turns=1, max_tokens=32)
    maker = OnlinePairs(source, tasks, prompts=16)
    hist = train_dpo(e, [], DPOConfig(steps=30, beta=0.5, regenerate_every=2), TOK.pad_id, make_pairs=maker)
    made = [h for h in hist if "online/pairs" in h]
    assert len(made) == 15 and all(h["online/chosen_reward"] == 1.0 and h["online/rejected_reward"] == 0.0
                                   for h in made if h["online/pairs"])
    assert all(h["online/pairs"] + h["online/ties"] == 16 for h in made)
    assert share_a(e) > before + 0.2
    with pytest.raises(ValueError, match="prompts must be >= 1 and samples >= 2"):
        OnlinePairs(source, tasks, prompts=0)


def test_a_round_of_ties_keeps_the_last_pairs_and_a_first_one_is_refused():
    e = tiny()
    never = EpisodeSource(Decoder(e.sample, SamplerSettings(max_new_tokens=2)),
                          lambda: SingleTurnEnv(lambda t, r: (0.0, {})), RENDER, max_turns=1, max_tokens=32)
    with pytest.raises(NoPairs, match="no pair to train on"):
        OnlinePairs(never, [Task()], prompts=2)(e, torch.Generator().manual_seed(0))


def test_the_dpo_command_with_a_reward_function(tmp_path, capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from trajtune.cli import main
    from trajtune.experiments.hf.dpo import DPORun
    from trajtune.experiments.hf.model import ModelConfig
    from trajtune.metrics import is_documented, read_metrics
    from trajtune.models.hf_random import make_random_model

    make_random_model(tmp_path / "model", "llama", "tiny")
    with open(tmp_path / "prompts.jsonl", "w") as f:
        for i in range(4):
            f.write(json.dumps({"prompt": f"what is {i}+5?"}) + "\n")
    (tmp_path / "rewards.py").write_text(
        "def shorter(completion_ids, **kw):\n"
        "    return [-float(len(ids)) for ids in completion_ids]\n")
    out = tmp_path / "odpo"
    assert main(["dpo", "--model", str(tmp_path / "model"), "--data", str(tmp_path / "prompts.jsonl"),
                 "--reward", f"{tmp_path / 'rewards.py'}:shorter", "--regenerate-every", "2", "--pair-prompts", "4",
                 "--steps", "4", "--batch-size", "4", "--max-new-tokens", "8", "--lr", "1e-3", "--out", str(out)]) == 0
    m = read_metrics(out)
    assert len(m) == 4 and [("online/pairs" in r) for r in m] == [True, False, True, False]
    made = [r for r in m if r.get("online/pairs")]
    assert made and all(r["online/chosen_reward"] > r["online/rejected_reward"] for r in made)
    assert all(is_documented(k) for r in m for k in r if k not in ("step", "time", "stage"))
    # a reward that ties every pair: one line for the user, exit 1, no traceback
    (tmp_path / "flat.py").write_text("def flat(completions, **kw):\n    return [0.0] * len(completions)\n")
    assert main(["dpo", "--model", str(tmp_path / "model"), "--data", str(tmp_path / "prompts.jsonl"),
                 "--reward", f"{tmp_path / 'flat.py'}:flat", "--regenerate-every", "1", "--steps", "1",
                 "--max-new-tokens", "4", "--out", str(tmp_path / "flat")]) == 1
    err = capsys.readouterr().err
    assert "no pair to train on" in err and "Traceback" not in err
    with pytest.raises(ValueError, match="online DPO .* --regenerate-every"):
        DPORun(model=ModelConfig(path="m"), data="p.jsonl", reward=["r.py:f"])
    with pytest.raises(ValueError, match="needs a pair generator: a reward source"):
        DPORun(model=ModelConfig(path="m"), data="p.jsonl", dpo=DPOConfig(regenerate_every=2))
    with pytest.raises(ValueError, match="--loss kto trains on labelled rows"):
        DPORun(model=ModelConfig(path="m"), data="p.jsonl", reward=["r.py:f"], dpo=DPOConfig(loss="kto"))
