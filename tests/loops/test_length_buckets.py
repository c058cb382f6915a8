"""Length-bucketed pair steps: the same gradient and metrics as one padded batch (float rounding aside)."""

import dataclasses

import pytest
import torch

from trajtune.algorithms.dpo import DPOConfig, pair_step, preference_loss_fn, summed_logps, with_ref_sums
from trajtune.algorithms.reward_model import RewardModelConfig, train_reward_model
from trajtune.objectives.inputs import PGInputs
from trajtune.trajectory import collate, pair_batch

from test_algorithms import TOK, demo, engine

# answers of very different lengths, so the buckets really trim padding
PAIRS = [(demo("a" * n), demo("b" * (9 - n))) for n in range(1, 9)] + [(demo("ab"), demo("c"))]


def grads(e):
    return torch.cat([p.grad.flatten() for p in e.model.parameters() if p.grad is not None])


@pytest.mark.parametrize("loss, nll", [("dpo", 0.0), ("dpo", 1.0), ("ipo", 0.0), ("simpo", 0.0), ("orpo", 0.0)])
def test_bucketed_pair_step_equals_one_batch(loss, nll):
    full = pair_batch(PAIRS, TOK.pad_id)
    e = engine(seed=3)
    ref = summed_logps(e.forward(full).logprobs, full.action_mask)
    full = with_ref_sums(full, ref + 0.3)  # policy != reference
    fn = preference_loss_fn(DPOConfig(loss=loss, beta=0.5, nll_weight=nll))
    rows = torch.tensor([0, 2, 3, 5, 6, 7, 8])  # a minibatch of pairs
    one = pair_step(e, full, rows, fn, buckets=1)
    g1 = grads(e).clone()
    e.model.zero_grad()
    three = pair_step(e, full, rows, fn, buckets=3)
    assert torch.allclose(grads(e), g1, atol=1e-6, rtol=1e-5)
    assert one.keys() == three.keys() and all(abs(one[k] - three[k]) < 1e-5 for k in one)


def test_bucketed_reward_model_step_equals_one_batch():
    from trajtune.algorithms.reward_model import bradley_terry_loss_fn

    rm_loss = bradley_terry_loss_fn(RewardModelConfig())  # the loss train_reward_model uses

    full, rows = pair_batch(PAIRS, TOK.pad_id), torch.arange(len(PAIRS))
    e = engine(seed=2, value_head=True)
    one = pair_step(e, full, rows, rm_loss, buckets=1)
    g1 = grads(e).clone()
    e.model.zero_grad()
    four = pair_step(e, full, rows, rm_loss, buckets=4)
    assert torch.allclose(grads(e), g1, atol=1e-6, rtol=1e-5) and abs(one["rm/margin"] - four["rm/margin"]) < 1e-5
    hist = train_reward_model(engine(seed=2, lr=3e-3, value_head=True), PAIRS,
                              RewardModelConfig(steps=20, batch_size=6, length_buckets=4), TOK.pad_id)
    assert hist[-1]["rm/margin"] > hist[0]["rm/margin"] + 0.5  # and it trains


@pytest.mark.parametrize("aggregation", ["token", "sequence", "constant"])
def test_bucketed_sft_step_equals_one_batch(aggregation):
    from trajtune.algorithms.sft import sft_loss_fn

    batch = collate([demo("a" * n) for n in (1, 7, 2, 9, 3, 3, 12)], TOK.pad_id)
    fn = sft_loss_fn(aggregation, 12.0)
    e = engine(seed=4)
    one = e.forward_backward(batch, fn)
    g1 = grads(e).clone()
    e.model.zero_grad()
    three = e.forward_backward(batch, fn, buckets=3)
    assert torch.allclose(grads(e), g1, atol=1e-6, rtol=1e-5) and abs(one["loss"] - three["loss"]) < 1e-5


def test_trim_keeps_the_real_tokens_and_drops_unused_padding():
    b = collate([demo("a"), demo("abc")], TOK.pad_id)
    short = b.select(torch.tensor([0])).trim()
    assert short.ids.shape[1] == int(b.attention_mask[0].sum()) and short.action_mask.shape[1] == short.ids.shape[1] - 1
    assert torch.equal(short.ids[0], b.ids[0, : short.ids.shape[1]]) and b.trim() is b


@pytest.mark.parametrize("advantage, surrogate, extra", [
    ("grpo", "reinforce", {}),
    ("rloo", "ppo", {"epochs": 2, "kl_coef": 0.1, "tis_cap": 2.0}),
    ("gae", "ppo", {"kl_coef": 0.05, "kl_in_reward": True, "value_clip": 0.2}),
    ("dr_grpo", "cispo", {"ratio_level": "sequence", "aggregation": "constant", "aggregation_constant": 8.0}),
])
def test_bucketed_rl_step_equals_one_batch(advantage, surrogate, extra):
    """The RL step's per-token tensors travel on the batch and are cut with it to a trimmed bucket's width."""
    from trajtune.algorithms.rl import RLConfig, advantages_for, rl_loss

    config = RLConfig(advantage=advantage, surrogate=surrogate, group_size=3, **extra)
    e = engine(seed=5, value_head=advantage == "gae")
    trajs = [demo("a" * n) for n in (1, 6, 2, 9, 3, 4)]
    for i, t in enumerate(trajs):
        t.reward, t.group = float(i % 3 == 0) + 0.1 * i, i // 3
        t.logprobs = [-0.5] * len(t)
    batch = collate(trajs, TOK.pad_id)
    old = e.forward(batch, values=advantage == "gae")
    old_values = old.values[:, :-1] if advantage == "gae" else None
    ref_logp = old.logprobs - 0.05  # a reference that differs from the policy
    adv, returns = advantages_for(batch, config, old_values, ref_logp, old.logprobs)
    old_logp = old.logprobs - 0.02 * torch.arange(batch.size)[:, None]  # ratios from 1 to e^0.1, one per row
    inputs = PGInputs(adv, old_logp=old_logp, ref_logp=ref_logp, returns=returns,
                      old_values=old_values if returns is not None else None)
    batch, fn = dataclasses.replace(batch, pg=inputs), rl_loss(config, use_old=True)
    one = e.forward_backward(batch, fn)
    g1 = grads(e).clone()
    e.model.zero_grad()
    three = e.forward_backward(batch, fn, buckets=3)
    assert torch.allclose(grads(e), g1, atol=1e-6, rtol=1e-5)
    assert abs(one["loss"] - three["loss"]) < 1e-5
    assert abs(one["pg/ratio_max"] - three["pg/ratio_max"]) < 1e-6  # an extremum is a max over the parts, not a mean
    if surrogate != "reinforce":
        assert one["pg/ratio_max"] > 1.05  # the largest ratio is in one bucket only


def _padded(batch, groups):
    lengths = batch.attention_mask.sum(-1)
    return sum(len(g) * int(lengths[g].max()) for g in groups)


def test_length_buckets_pad_the_fewest_tokens_and_keep_units_whole():
    """Against every way of cutting the sorted units into at most k groups; pairs stay in one group."""
    import itertools
    import random

    from trajtune.trajectory import length_buckets

    rng = random.Random(0)
    for trial in range(40):
        sizes = [rng.choice([1, 2, 3, 5, 9, 14, 30]) for _ in range(rng.randint(2, 9))]
        pairs = [(demo("a" * n), demo("b" * rng.randint(1, n))) for n in sizes]
        batch, k = pair_batch(pairs, TOK.pad_id), rng.randint(1, 4)
        groups = length_buckets(batch, k)
        rows = torch.cat(groups).tolist()
        assert sorted(rows) == list(range(batch.size)) and len(groups) <= k
        P = batch.size // 2
        for g in groups:  # a pair's chosen and rejected rows together, chosen rows first (the pair layout)
            half = len(g) // 2
            assert torch.equal(g[half:], g[:half] + P)
        lengths = batch.attention_mask.sum(-1)
        unit_len = sorted(int(max(lengths[i], lengths[i + P])) for i in range(P))
        best = min(sum(2 * (e - s) * unit_len[e - 1] for s, e in zip((0, *cut), (*cut, P)))
                   for j in range(min(k, P)) for cut in itertools.combinations(range(1, P), j))
        assert _padded(batch, groups) == best, trial
        widest = [int(lengths[g].max()) for g in groups]
        assert widest == sorted(widest)  # shortest group first


def test_length_buckets_beat_equal_groups_on_a_long_tail():
    from trajtune.trajectory import length_buckets

    batch = collate([demo("a" * n) for n in [2] * 9 + [3, 40]], TOK.pad_id)
    equal = [torch.tensor(r) for r in ([0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10])]  # 4 groups of ceil(11 / 4)
    assert _padded(batch, length_buckets(batch, 4)) < _padded(batch, equal)
    assert len(length_buckets(collate([demo("ab")] * 6, TOK.pad_id), 4)) == 1  # equal lengths: one group
