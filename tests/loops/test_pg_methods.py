"""Issue 31's policy-gradient pieces (RLHF book ch.6, ch.15): TOPR, the adaptive KL controller, REINFORCE
baselines, reward scaling, the group advantage's std options (E7), DAPO's overlong penalty, filtering and
dynamic sampling, PPO-ptx, value-head initialization from a reward model, RL's Razor -- hand-worked numbers
first, then the loop."""

import copy
import math

import pytest
import torch
from test_algorithms import RENDER, TASKS, TOK, collect_for, demo, engine, pass_rate
from test_resume import collect_for as graded_source, interrupt_at, rows, same_weights, untimed

from trajtune.algorithms.reference import rl_razor
from trajtune.algorithms.reward_model import init_value_head_from_reward_model
from trajtune.algorithms.rl import RLConfig, advantages_for, score, train_rl
from trajtune.algorithms.sft import SFTConfig, train_sft
from trajtune.engine import make_engine
from trajtune.envs.base import SingleTurnEnv
from trajtune.metrics import MetricsLogger
from trajtune.objectives.advantages import group_advantages, minmax_scale, moving_average_baseline, overlong_penalty
from trajtune.objectives.kl import adaptive_kl_coef, forgetting_and_forward_kl
from trajtune.objectives.inputs import PGInputs, PGOptions
from trajtune.objectives.policy_gradient import policy_gradient_loss
from trajtune.objectives.reward_model import last_token_values
from trajtune.runs.loop import Run
from trajtune.runs.resume import Checkpointer, RunInterrupted
from trajtune.sources.episodes import EpisodeSource
from trajtune.trajectory import Owner, Trajectory, collate, tool_call_mask
from trajtune.sources.sampler import Decoder, SamplerSettings


# --- TOPR (checklist 6.11) ----------------------------------------------------------------
def test_topr_weights_negative_episodes_by_their_clipped_sequence_ratio_and_leaves_positive_ones():
    # rows: A=+1 with sequence ratio e (no correction: weight 1); A=-1 with ratio 0.5 (weight 0.5);
    # A=-1 with ratio 2 (clipped to 1)
    old = torch.zeros(3, 2)
    logp = torch.tensor([[0.5, 0.5], [-math.log(2), 0.0], [math.log(2), 0.0]], requires_grad=True)
    mask = torch.ones(3, 2)
    loss, m = policy_gradient_loss(logp, mask, PGInputs(torch.tensor([1.0, -1.0, -1.0]), old),
                                   PGOptions(surrogate="topr", aggregation="sequence"))
    loss.backward()
    # per-token loss -w A log pi, sequence aggregation: (1/3) sum_i (1/2) sum_t -> d/dlogp = -w A / 6
    expected = torch.tensor([[-1.0, -1.0], [0.5, 0.5], [1.0, 1.0]]) / 6
    assert torch.allclose(logp.grad, expected, atol=1e-6)
    assert m["pg/clip_frac"].item() == pytest.approx(2 / 6)  # the two tokens of row 3


def test_topr_on_policy_is_reinforce():
    logp = torch.tensor([[-0.3, -1.2]], requires_grad=True)
    a = policy_gradient_loss(logp, torch.ones(1, 2), PGInputs(torch.tensor([-2.0])), PGOptions(surrogate="topr"))[0]
    b = policy_gradient_loss(logp, torch.ones(1, 2), PGInputs(torch.tensor([-2.0])))[0]
    assert a.item() == pytest.approx(b.item())


def test_maxrl_advantages_by_hand():
    """MaxRL ([CC] only, checklist 6.18g): (R - mean) / mean per group, 0 where the group never succeeds."""
    from trajtune.objectives.advantages import maxrl_advantages

    adv = maxrl_advantages(torch.tensor([1.0, 0, 0, 0, 0, 0, 1, 1]), torch.tensor([0, 0, 0, 0, 1, 1, 2, 2]))
    assert adv.tolist() == pytest.approx([3.0, -1.0, -1.0, -1.0, 0.0, 0.0, 0.0, 0.0])


def test_sapo_gate_by_hand_and_its_gradient_is_the_policy_gradient_at_ratio_one():
    """SAPO ([CC] only, checklist 6.18b): -sigmoid(t (rho - 1)) 4 / t A, t = 1.0 for A > 0 and 1.05 for A <= 0."""
    old = torch.zeros(2, 1)
    logp = torch.tensor([[0.0], [math.log(2.0)]], requires_grad=True)  # ratios 1 and 2
    loss, m = policy_gradient_loss(logp, torch.ones(2, 1), PGInputs(torch.tensor([1.0, -1.0]), old),
                                   PGOptions(surrogate="sapo", aggregation="sequence"))
    t = 1.05
    per = [-(1 / (1 + math.exp(0))) * 4 / 1.0, (1 / (1 + math.exp(-t))) * 4 / t]  # rho 1, A +1; rho 2, A -1
    assert loss.item() == pytest.approx(sum(per) / 2, rel=1e-6) and m["pg/clip_frac"].item() == 0.0
    loss.backward()
    sig = 1 / (1 + math.exp(-t))
    # d/dlogp of -gate A = -A rho d gate / d rho = -A rho 4 sigma' (t (rho - 1)); at rho 1: -A (the PG gradient)
    assert logp.grad[:, 0].tolist() == pytest.approx([-1.0 / 2, 2.0 * 4 * sig * (1 - sig) / 2], rel=1e-5)
    logp2 = torch.tensor([[-0.3, -1.2]], requires_grad=True)  # on-policy (no old log-probs): REINFORCE's gradient
    sapo = PGOptions(surrogate="sapo")
    policy_gradient_loss(logp2, torch.ones(1, 2), PGInputs(torch.tensor([2.0])), sapo)[0].backward()
    logp3 = torch.tensor([[-0.3, -1.2]], requires_grad=True)
    policy_gradient_loss(logp3, torch.ones(1, 2), PGInputs(torch.tensor([2.0])))[0].backward()
    assert torch.allclose(logp2.grad, logp3.grad, atol=1e-6)
    with pytest.raises(ValueError, match="sapo_tau_neg"):
        RLConfig(surrogate="sapo", sapo_tau_neg=0.0)


def test_topr_refuses_the_sequence_ratio_level():
    with pytest.raises(ValueError, match="ratio_level 'token'"):
        policy_gradient_loss(torch.zeros(1, 1), torch.ones(1, 1), PGInputs(torch.ones(1), torch.zeros(1, 1)),
                             PGOptions(surrogate="topr", ratio_level="sequence"))


# --- the adaptive KL controller (checklist 6.16; Ziegler et al. 2019) ----------------------
@pytest.mark.parametrize("kl, expected", [
    (0.3, 0.1 * (1 + 0.2 * 64 / 10_000)),  # KL/target - 1 = 0.5, clipped to 0.2: beta rises
    (0.21, 0.1 * (1 + 0.05 * 64 / 10_000)),  # inside the clip: e = 0.05
    (0.0, 0.1 * (1 - 0.2 * 64 / 10_000)),  # e = -1 clipped to -0.2: beta falls
    (0.2, 0.1),  # on target: unchanged
])
def test_adaptive_kl_coef_moves_beta_toward_the_target(kl, expected):
    assert adaptive_kl_coef(0.1, kl, target=0.2, horizon=10_000, n=64) == pytest.approx(expected, rel=1e-12)


def test_adaptive_kl_coef_names_bad_arguments():
    with pytest.raises(ValueError, match="target and horizon"):
        adaptive_kl_coef(0.1, 0.2, target=0.0, horizon=10, n=1)


# --- REINFORCE baselines, reward scaling, GRPO's std (E7) -----------------------------------
def test_moving_average_baseline_starts_at_the_first_batch_mean_then_decays():
    used, nxt = moving_average_baseline(None, torch.tensor([1.0, 0.0, 0.0, 1.0]), decay=0.9)
    assert (used, nxt) == (0.5, pytest.approx(0.5))
    used, nxt = moving_average_baseline(nxt, torch.tensor([1.0, 1.0]), decay=0.9)
    assert used == pytest.approx(0.5) and nxt == pytest.approx(0.9 * 0.5 + 0.1 * 1.0)
    with pytest.raises(ValueError, match="decay"):
        moving_average_baseline(None, torch.ones(2), decay=1.0)


def test_minmax_scale_maps_the_batch_to_zero_one():
    assert minmax_scale(torch.tensor([2.0, 4.0, 3.0])).tolist() == [0.0, 1.0, 0.5]
    assert minmax_scale(torch.tensor([3.0, 3.0])).tolist() == [0.0, 0.0]


def test_group_std_unbiased_and_eps_are_the_codes_by_default():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])  # mean 0.25; unbiased std sqrt(0.75/3) = 0.5, biased sqrt(0.1875)
    default = group_advantages(r, None, std_normalize=True)
    assert default[0].item() == pytest.approx(0.75 / (0.5 + 1e-4))
    biased = group_advantages(r, None, std_normalize=True, unbiased_std=False, eps=0.0)
    assert biased[0].item() == pytest.approx(0.75 / math.sqrt(0.1875))


# --- DAPO's overlong soft penalty (checklist 6.17) ------------------------------------------
def test_overlong_penalty_ramps_from_zero_to_minus_one_over_the_cache():
    # L_max 512, L_cache 128: safe = 384
    out = overlong_penalty(torch.tensor([100, 384, 448, 512, 600]), max_len=512, cache=128)
    assert out.tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]
    with pytest.raises(ValueError, match="cache"):
        overlong_penalty(torch.tensor([1]), max_len=4, cache=8)


# --- RL's Razor (checklist 15.5) -------------------------------------------------------------
def test_forgetting_and_forward_kl_on_a_constructed_case():
    # old task: pi_0 gave -1 per token to a 2-token episode, pi gives -1.5: forgetting 1.0 per episode
    # new task (samples from pi_0): log pi_0 - log pi = [0.2, 0.0] and [0.4, pad]: sequence KL 0.2, 0.4 -> 0.3
    m = forgetting_and_forward_kl(
        torch.full((1, 2), -1.0), torch.full((1, 2), -1.5), torch.ones(1, 2),
        torch.tensor([[-1.0, -2.0], [-0.5, -9.0]]), torch.tensor([[-1.2, -2.0], [-0.9, 0.0]]),
        torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
    assert m["razor/forgetting"].item() == pytest.approx(1.0)
    assert m["razor/forward_kl"].item() == pytest.approx(0.3)


# --- the loop: RLConfig reaches every piece ----------------------------------------------------
PAD = TOK.pad_id


def _batch(rewards, groups=None, lengths=None, unterminated=None):
    """A batch of one-token-prompt episodes with `lengths` POLICY tokens each (default 1)."""
    trajs = []
    for i, r in enumerate(rewards):
        n = 1 if lengths is None else lengths[i]
        t = Trajectory(reward=r, group=i if groups is None else groups[i],
                       unterminated=unterminated[i] if unterminated else None)
        t.append([1], Owner.PROMPT, 0)
        t.append([2] * n, Owner.POLICY, 0)
        trajs.append(t)
    return collate(trajs, PAD)


@pytest.mark.parametrize("kw, expected", [
    ({"advantage": "batch"}, [0.5, -0.5, -0.5, 0.5]),  # R - batch mean (groups ignored)
    ({"advantage": "moving_average"}, [0.5, -0.5, -0.5, 0.5]),  # no history yet: the batch mean
    ({"advantage": "batch", "reward_scaling": "minmax"}, [0.5, -0.5, -0.5, 0.5]),  # already in [0, 1]
    ({"advantage": "none", "reward_scaling": "minmax"}, [1.0, 0.0, 0.0, 1.0]),
    ({"advantage": "none", "reward_scaling": "whiten"}, [0.866, -0.866, -0.866, 0.866]),  # std (unbiased) 0.577
    ({"advantage": "grpo", "unbiased_std": False, "std_eps": 0.0}, [1.0, -1.0, -1.0, 1.0]),  # biased std 0.5
    ({"advantage": "grpo"}, [x * 0.5 / (0.5 ** 0.5 + 1e-4) for x in (1, -1, -1, 1)]),  # the defaults (E7)
    ({"advantage": "maxrl"}, [1.0, -1.0, -1.0, 1.0]),  # (R - 0.5) / 0.5 in each group
])
def test_rlconfig_reaches_the_baselines_and_reward_scaling(kw, expected):
    batch = _batch([1.0, 0.0, 0.0, 1.0], groups=[0, 0, 1, 1])
    adv, _ = advantages_for(batch, RLConfig(group_size=2, **kw), None, None, None,
                            baseline=0.5 if kw["advantage"] == "moving_average" else None)
    assert adv.tolist() == pytest.approx(expected, abs=1e-3)


def test_overlong_penalty_enters_the_reward_and_overlong_filter_leaves_the_loss():
    # L_max 4, L_cache 2: safe 2; lengths 2, 3, 5 -> penalties 0, -0.5, -1
    cfg = RLConfig(advantage="none", group_size=2, overlong_max=4, overlong_cache=2, overlong_filter=True)
    batch = _batch([1.0, 1.0, 1.0], lengths=[2, 3, 5],
                   unterminated=[0, 0, 1])
    scored, metrics = score(engine(), None, batch, cfg, use_old=False)
    assert scored.pg.advantages.tolist() == [1.0, 0.5, 0.0]
    assert scored.action_mask.sum(-1).tolist() == [2.0, 3.0, 0.0]  # the cut-off episode leaves the loss
    assert metrics["rollout/overlong_filtered"] == 1.0 and metrics["rollout/overlong_penalty"] == pytest.approx(-0.5)


def test_tool_call_tokens_are_the_policy_turns_a_tool_answered():
    # turn 0: a call answered by the tool; turn 1: the answer (no tool result)
    t = RENDER.render([{"role": "user", "content": "Q: pick"}, {"role": "assistant", "content": "ab"},
                       {"role": "tool", "content": "cd"}, {"role": "assistant", "content": "a"}])
    batch = collate([t], PAD)
    calls = tool_call_mask(batch)[0]
    policy = batch.action_mask[0] > 0
    owners, turns = batch.owners[0, 1:], batch.turns[0, 1:]
    by_policy = owners == Owner.POLICY
    assert bool((by_policy & (turns == 0)).any()) and bool((by_policy & (turns == 1)).any())
    assert torch.equal(calls > 0, policy & (turns == 0))  # turn 0's POLICY tokens exactly; the answer stays
    scored, _ = score(engine(), None, batch, RLConfig(advantage="none", train_tool_calls=False), use_old=False)
    assert torch.equal(scored.action_mask[0] > 0, policy & (turns == 1))  # only the answer is trained
    scored, _ = score(engine(), None, batch, RLConfig(advantage="none"), use_old=False)
    assert torch.equal(scored.action_mask[0] > 0, policy)  # the default trains the call too


def test_rlconfig_names_bad_new_options():
    for kw, field in [({"kl_target": 1.0}, "kl_coef"), ({"overlong_max": 4, "overlong_cache": 8}, "overlong_cache"),
                      ({"overlong_cache": 2}, "overlong_max"), ({"baseline_decay": 1.0}, "baseline_decay"),
                      ({"surrogate": "topr", "ratio_level": "sequence"}, "ratio_level"),
                      ({"dynamic_sampling_tries": 2, "advantage": "batch"}, "dynamic_sampling_tries"),
                      ({"kl_horizon": 0.0}, "kl_horizon"), ({"std_eps": -1.0}, "std_eps")]:
        with pytest.raises(ValueError, match=field):
            RLConfig(**kw)


def test_adaptive_kl_controller_moves_the_logged_coefficient_by_the_measured_kl():
    e = engine()
    cfg = RLConfig(steps=5, tasks_per_step=2, group_size=4, advantage="grpo", surrogate="ppo", kl_coef=0.1,
                   kl_target=1e-3, kl_horizon=10.0)
    hist = train_rl(e, TASKS, graded_source(e), cfg, PAD)
    assert hist[0]["kl/coef"] == 0.1 and hist[0]["kl/controller_kl"] == 0.0  # step 0: pi_old is the reference
    for a, b in zip(hist, hist[1:]):
        assert b["kl/coef"] == pytest.approx(adaptive_kl_coef(a["kl/coef"], a["kl/controller_kl"], 1e-3, 10.0, 8))
    moves = [b["kl/coef"] > a["kl/coef"] for a, b in zip(hist, hist[1:])]
    assert moves == [a["kl/controller_kl"] > 1e-3 for a in hist[:-1]] and True in moves and False in moves


def coin_source(e):
    """A reward of 1 for about half the replies: a group of two is all-equal half the time."""
    return EpisodeSource(Decoder(e.sample, SamplerSettings(max_new_tokens=2)),
                         lambda: SingleTurnEnv(lambda task, reply: (float(reply[:1] in "abc"), {})),
                         RENDER, max_turns=1, max_tokens=32)


def test_dynamic_sampling_refills_the_batch_with_groups_that_carry_signal():
    e = engine()
    cfg = RLConfig(steps=4, tasks_per_step=3, group_size=2, advantage="rloo", dynamic_sampling_tries=8)
    hist = train_rl(e, TASKS, coin_source(e), cfg, PAD)
    assert any(h["rollout/dynamic_draws"] > 1 for h in hist)  # some first draw had under 3 informative groups
    assert [h["train/kept_episodes"] for h in hist] == [6.0] * 4  # each step refilled to 3 groups of 2
    plain = RLConfig(steps=4, tasks_per_step=3, group_size=2, advantage="rloo", skip_zero_variance=True)
    e = engine()
    assert any(h["train/kept_episodes"] < 6.0 for h in train_rl(e, TASKS, coin_source(e), plain, PAD))


def test_ppo_ptx_alone_teaches_the_pretraining_text():
    e = engine()
    before = pass_rate(e)
    zero = lambda: EpisodeSource(Decoder(e.sample, SamplerSettings(max_new_tokens=2)),  # noqa: E731
                                 lambda: SingleTurnEnv(lambda task, reply: (0.0, {})), RENDER,
                                 max_turns=1, max_tokens=32)
    cfg = RLConfig(steps=15, tasks_per_step=2, group_size=2, ptx_coef=1.0, ptx_batch_size=4)
    hist = train_rl(e, TASKS, zero(), cfg, PAD, ptx=[demo("a")] * 4)  # no reward signal: only the ptx gradient
    assert pass_rate(e) > before + 0.5, [h["train/ptx_loss"] for h in hist]
    with pytest.raises(ValueError, match="ptx_coef"):
        train_rl(e, TASKS, zero(), cfg, PAD)


def test_value_head_starts_as_the_reward_models_head():
    policy = engine(value_head=True).model
    rm = copy.deepcopy(policy)  # a reward model on the policy's body, with a head of its own
    torch.nn.init.normal_(rm.value.weight, std=1.0)
    batch = collate([demo("a"), demo("bc")], PAD)
    rm_scores = last_token_values(rm.values(batch.ids, batch.attention_mask), batch.attention_mask)
    assert not torch.allclose(last_token_values(policy.values(batch.ids, batch.attention_mask), batch.attention_mask),
                              rm_scores)
    init_value_head_from_reward_model(policy, rm)
    values = make_engine(policy).forward(batch, values=True).values  # what PPO's first step reads
    assert torch.allclose(last_token_values(values, batch.attention_mask), rm_scores, atol=1e-6)
    with pytest.raises(ValueError, match="value head"):
        init_value_head_from_reward_model(engine().model, rm)


def test_an_hf_policy_value_head_starts_as_the_reward_models(tmp_path):
    pytest.importorskip("transformers")
    from trajtune.models.hf import load_policy
    from trajtune.models.hf_random import make_random_model

    path = make_random_model(tmp_path / "m", "llama", "tiny")
    policy, rm = load_policy(path, value_head=True), load_policy(path, value_head=True)  # an RM on the same body
    torch.nn.init.normal_(rm.value.weight, std=1.0)
    t = Trajectory()
    t.append([5, 6, 7], Owner.PROMPT, 0)
    t.append([8, 9], Owner.POLICY, 0)
    batch = collate([t], 0)
    score_of = lambda model: last_token_values(make_engine(model).forward(batch, values=True).values,  # noqa: E731
                                               batch.attention_mask)
    init_value_head_from_reward_model(policy, rm)
    assert torch.allclose(score_of(policy), score_of(rm), atol=1e-5)


def test_rl_razor_sees_forgetting_and_kl_after_sft_on_a_new_task():
    start = engine()
    pi0 = copy.deepcopy(start.model)
    frozen = make_engine(pi0, frozen=True)
    new_samples = collect_for(frozen).run(TASKS, 4, torch.Generator().manual_seed(0))  # new task, from pi_0
    same = rl_razor(frozen, start, [demo("b")] * 2, new_samples, PAD)
    assert same == {"razor/forgetting": pytest.approx(0.0, abs=1e-6), "razor/forward_kl": pytest.approx(0.0, abs=1e-6)}
    train_sft(start, [demo("a")] * 8, SFTConfig(steps=10, batch_size=8), PAD)  # the new task: answer "a"
    moved = rl_razor(frozen, start, [demo("b")] * 2, new_samples, PAD)
    assert moved["razor/forgetting"] > 0.5 and moved["razor/forward_kl"] > 0.1


def _new_options_run(e, log, ck):
    cfg = RLConfig(steps=5, tasks_per_step=2, group_size=2, advantage="moving_average", surrogate="topr", epochs=2,
                   kl_coef=0.1, kl_target=1e-3, kl_horizon=20.0, overlong_max=3, overlong_cache=2,
                   reward_scaling="minmax", ptx_coef=0.5, ptx_batch_size=2, seed=3)
    return train_rl(e, TASKS, graded_source(e), cfg, PAD, Run("loop", log, checkpointer=ck), ptx=[demo("a"), demo("b")])


def test_adaptive_kl_and_moving_baseline_resume_exactly(tmp_path):
    ref = engine()
    with MetricsLogger(tmp_path / "ref", strict=True) as log:  # strict: every logged key is documented
        expected = _new_options_run(ref, log, None)
    assert len({h["kl/coef"] for h in expected}) > 1 and len({h["rollout/baseline"] for h in expected}) > 1
    first = engine()
    interrupt_at(first, 5)  # step 3 of 5 (two optimizer steps a step)
    with MetricsLogger(tmp_path / "run") as log, Checkpointer(tmp_path / "run" / "loop") as ck:
        with pytest.raises(RunInterrupted):
            _new_options_run(first, log, ck)
    resumed = engine()
    with MetricsLogger(tmp_path / "run") as log, Checkpointer(tmp_path / "run" / "loop") as ck:
        got = _new_options_run(resumed, log, ck)
    assert same_weights(resumed, ref) and untimed(got) == untimed(expected)
    assert rows(tmp_path / "run") == rows(tmp_path / "ref")


def test_dynamic_sampling_resumes_exactly(tmp_path):
    def run(e, log, ck):
        cfg = RLConfig(steps=4, tasks_per_step=3, group_size=2, advantage="grpo", dynamic_sampling_tries=3, seed=1)
        return train_rl(e, TASKS, coin_source(e), cfg, PAD, Run("loop", log, checkpointer=ck))

    ref = engine()
    with MetricsLogger(tmp_path / "ref", strict=True) as log:  # strict: every logged key is documented
        expected = run(ref, log, None)
    first = engine()
    assert sum(h["rollout/dynamic_draws"] > 1 for h in expected[2:]) >= 1  # a refill after the interruption
    interrupt_at(first, 2)
    with MetricsLogger(tmp_path / "run") as log, Checkpointer(tmp_path / "run" / "loop") as ck:
        with pytest.raises(RunInterrupted):
            run(first, log, ck)
    resumed = engine()
    with MetricsLogger(tmp_path / "run") as log, Checkpointer(tmp_path / "run" / "loop") as ck:
        got = run(resumed, log, ck)
    assert same_weights(resumed, ref) and untimed(got) == untimed(expected)
