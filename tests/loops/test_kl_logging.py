"""Checklist 0.7, "Always log KL-to-reference": the RL loop logs KL(pi || ref) wherever a reference exists,
also when kl_coef is 0 or the KL sits in the reward, and the log changes no trained number."""

import math

import pytest
import torch

from trajtune.algorithms.rl import RLConfig, train_rl
from trajtune.objectives.inputs import PGInputs, PGOptions
from trajtune.objectives.policy_gradient import policy_gradient_loss
from trajtune.sources.sampler import Decoder, SamplerSettings

from test_algorithms import TASKS, TOK, collect_for, engine


def test_the_loss_logs_the_kl_when_kl_coef_is_zero_and_leaves_the_loss_alone():
    logp = torch.tensor([[-1.0, -2.0, 0.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -2.0, -7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv = torch.tensor([1.0])
    loss0, m0 = policy_gradient_loss(logp, mask, PGInputs(adv))
    loss, m = policy_gradient_loss(logp, mask, PGInputs(adv, ref_logp=ref), PGOptions(kl_coef=0.0))
    assert float(loss.detach()) == float(loss0.detach())  # the KL is logged, not added
    # log ratio [0.5, 0] (the masked third token is 0); k3 = expm1(-0.5) + 0.5 = 0.106531, then 0
    k3 = math.expm1(-0.5) + 0.5
    assert float(m["kl/k3"]) == pytest.approx(k3 / 2)        # per POLICY token: (0.106531 + 0) / 2
    assert "kl/sequence" not in m  # per episode: the loop's (kl/k3 x POLICY tokens per episode), exact under any split
    assert "kl/k3" not in m0
    # with kl_coef the same numbers, and the term is in the loss: token mean of -A logp + 0.1 k3
    loss1, m1 = policy_gradient_loss(logp, mask, PGInputs(adv, ref_logp=ref), PGOptions(kl_coef=0.1))
    assert float(loss1) == pytest.approx((1.0 + 2.0) / 2 + 0.1 * k3 / 2)
    assert float(m1["kl/k3"]) == pytest.approx(k3 / 2)


def rows(log_kl="auto", seed=0, **kw):
    e = engine(seed=seed)
    cfg = RLConfig(steps=6, tasks_per_step=4, group_size=8, log_kl=log_kl, **kw)
    hist = train_rl(e, TASKS, collect_for(e), cfg, TOK.pad_id)
    return e, hist


def test_kl_in_the_reward_is_logged():
    e = engine(value_head=True)
    cfg = RLConfig(steps=3, tasks_per_step=2, group_size=4, advantage="gae", surrogate="ppo", epochs=2,
                   kl_coef=0.05, kl_in_reward=True)
    hist = train_rl(e, TASKS, collect_for(e), cfg, TOK.pad_id)
    assert all("kl/k3" in h and "kl/sequence" in h for h in hist)
    assert hist[-1]["kl/k3"] > 0  # two epochs a step: the policy has left its start


def test_copy_logs_the_kl_with_kl_coef_zero_and_changes_no_trained_number():
    e_off, off = rows("off")
    e_copy, logged = rows("copy")
    assert all("kl/k3" not in h for h in off)
    assert [h["kl/k3"] for h in logged][0] == pytest.approx(0.0, abs=1e-7)  # step 1 samples the start itself
    assert logged[-1]["kl/k3"] > 0 and logged[-1]["kl/sequence"] > 0
    for a, b in zip(off, logged, strict=True):  # every other number the same: the extra forward draws nothing
        assert {k: v for k, v in a.items() if not k.startswith("time/")} == \
            {k: v for k, v in b.items() if not k.startswith(("time/", "kl/"))}
    for (n, p), (_, q) in zip(e_off.model.state_dict().items(), e_copy.model.state_dict().items(), strict=True):
        assert torch.equal(p, q), n


def test_the_kl_is_logged_by_default_and_off_turns_it_off():
    """The decision: with kl_coef 0 the KL is still logged by default -- on a full model at the logging steps (every
    log_kl_every steps and the last) against its starting weights read back from disk (issue 38: no resident copy;
    tests/loops/test_kl_reference.py), every step with log_kl_every 1."""
    assert RLConfig().log_kl == "auto"
    _, hist = rows(log_kl_every=4)
    assert [("kl/k3" in h, "kl/sequence" in h) for h in hist] == [(s in (4, 6),) * 2 for s in range(1, 7)]
    _, every = rows(log_kl_every=1)
    assert all("kl/k3" in h and "kl/sequence" in h for h in every)
    _, off = rows("off")
    assert all("kl/k3" not in h for h in off)


def test_a_lora_model_logs_the_kl_to_its_base_for_free(tmp_path):
    pytest.importorskip("peft")
    from trajtune.engine import OptimConfig, make_engine
    from trajtune.envs.base import SingleTurnEnv
    from trajtune.models.hf import LoraSettings, load_policy, load_tokenizer
    from trajtune.models.hf_random import make_random_model
    from trajtune.sources.episodes import EpisodeSource
    from trajtune.text.chat import ChatRenderer

    path = make_random_model(tmp_path / "m", "llama", "tiny")
    torch.manual_seed(0)
    policy = load_policy(path, lora=LoraSettings(r=4, dropout=0.0))
    e = make_engine(policy, OptimConfig(lr=5e-2))
    r = ChatRenderer(load_tokenizer(path))
    source = EpisodeSource(Decoder(e.sample, SamplerSettings(max_new_tokens=4)),
                           lambda: SingleTurnEnv(lambda t, reply: (float(len(reply) % 2), {})), r,
                           max_turns=1, max_tokens=64)
    hist = train_rl(e, TASKS, source, RLConfig(steps=3, tasks_per_step=2, group_size=4), 0)
    assert all("kl/k3" in h for h in hist)
    assert hist[0]["kl/k3"] == pytest.approx(0.0, abs=1e-6)  # the adapters start at 0: the base is the start
    assert hist[-1]["kl/k3"] > 0


def test_kl_per_episode_does_not_depend_on_how_the_engine_splits_the_batch():
    """kl/sequence is the token mean times the tokens per episode, so micro-batches (and torchrun's shards, which the
    engine weighs by tokens too) give the number of the whole batch."""
    from trajtune.engine import OptimConfig, make_engine

    whole = rows("copy")[1]
    e = engine(seed=0)
    split = make_engine(e.model, OptimConfig(lr=1e-2), micro_batch_size=5)
    cfg = RLConfig(steps=6, tasks_per_step=4, group_size=8, log_kl="copy")
    parts = train_rl(split, TASKS, collect_for(split), cfg, TOK.pad_id)
    for a, b in zip(whole, parts, strict=True):
        assert b["kl/sequence"] == pytest.approx(a["kl/sequence"], rel=1e-4, abs=1e-6)
