"""The output layer only where a loss reads (`make_engine(head_positions="actions")`, `TokenHead.keep`): the
same losses and gradients as every position to 1e-6 (SFT, DPO, GRPO-style with entropy / old and reference
log-probs; whole and chunked head; the TinyTransformer and a random HF Llama), exactly 0.0 at the positions
not kept, the layer really run on the kept rows only, and every reader that reads other positions (a forward
without `positions="actions"`, `Loss(positions="all")`, the agent experiment's unmasked NLL) still gets the
real log-probs."""

from dataclasses import replace

import pytest
import torch

from trajtune.algorithms.dpo import DPOConfig, preference_loss_fn, summed_logps, with_ref_sums
from trajtune.algorithms.rl import RLConfig, rl_loss, score
from trajtune.algorithms.sft import sft_loss_fn
from trajtune.engine import ForwardOutput, Loss, make_engine
from trajtune.logprobs import TokenHead, token_log_probs
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.objectives.inputs import PGInputs
from trajtune.objectives.sft import sft_loss
from trajtune.trajectory import Batch, Owner, Trajectory, collate, pair_batch

from test_chunked_logits import _trajs as chunked_trajs

TOL = 1e-6


def _trajs(n=6, vocab=40, seed=0):
    """test_chunked_logits' rows, rows 0 and 3 ending in a TOOL token (a position after the completion)."""
    return chunked_trajs(n, vocab, seed, tool_every=3)


def _tiny(value_head=False):
    torch.manual_seed(0)
    return TinyTransformer(TinyConfig(vocab_size=40, dim=32, n_layers=2, n_heads=4, max_len=64, value_head=value_head))


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _step(model, positions, batch, loss, **kw):
    engine = make_engine(model, head_positions=positions, **kw)
    model.zero_grad(set_to_none=True)
    return engine.forward_backward(batch, loss), _grads(model)


def _assert_same(a, b, tol=TOL):
    (ma, ga), (mb, gb) = a, b
    assert ma.keys() == mb.keys() and ga.keys() == gb.keys()
    for k in ma:
        assert ma[k] == pytest.approx(mb[k], abs=tol), k
    for k in ga:
        assert torch.allclose(ga[k], gb[k], atol=tol, rtol=0), (k, float((ga[k] - gb[k]).abs().max()))


def _pairs(vocab=40, n=3):
    """n preference pairs, each side its pair's prompt (3-5 tokens) then its own completion (3-6 tokens)."""
    g = torch.Generator().manual_seed(1)
    r = lambda k: torch.randint(3, vocab, (k,), generator=g).tolist()  # noqa: E731
    pairs = []
    for i in range(n):
        prompt = r(3 + i % 3)
        sides = []
        for j in range(2):
            t = Trajectory()
            t.append(prompt, Owner.PROMPT, 0)
            t.append(r(3 + (i + j) % 4), Owner.POLICY, 0)
            sides.append(t)
        pairs.append(tuple(sides))
    return pair_batch(pairs, pad_id=0)


def _grpo_batch(batch: Batch, engine, config: RLConfig) -> Batch:
    """The batch as the RL loop scores it: GRPO advantages, old and reference log-probs (positions="actions")."""
    return score(engine, engine.reference_engine(), batch, config, use_old=True)[0]  # (batch, the scoring metrics)


# --- TokenHead.keep ------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [0, 2, 5])
def test_token_head_keep_runs_the_layer_on_the_kept_rows_only(chunk):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 7, 16, generator=g, requires_grad=True)  # [B, T, D]
    w = torch.randn(50, 16, generator=g).requires_grad_()  # [V, D]
    b = torch.randn(50, generator=g).requires_grad_()
    ids = torch.randint(0, 50, (3, 7), generator=g)
    keep = torch.rand(3, 6, generator=g) < 0.4  # [B, T-1]
    keep[1] = False  # a row with nothing kept
    up_lp, up_ent = torch.randn(3, 6, generator=g), torch.randn(3, 6, generator=g)  # upstream gradients
    rows_seen = []

    def project(x):
        rows_seen.append(x.shape[:-1])
        return x @ w.T + b

    def run(k):
        out = TokenHead(ids, chunk, entropy=True, keep=k)(h, w, b, project)
        grads = torch.autograd.grad((out.logprobs * up_lp).sum() + (out.entropy * up_ent).sum(), (h, w, b))
        return out, grads

    every, _ = run(None)
    rows_seen.clear()
    part, g_part = run(keep)
    K = int(keep.sum())
    assert 0 < K < 18
    if chunk == 0:
        assert rows_seen == [torch.Size([K])]  # the unchunked path: one [K, D] -> [K, V] matmul
    assert torch.equal(part.logprobs[~keep], torch.zeros(18 - K))
    assert torch.equal(part.entropy[~keep], torch.zeros(18 - K))
    assert torch.allclose(part.logprobs[keep], every.logprobs[keep], atol=TOL, rtol=0)
    assert torch.allclose(part.entropy[keep], every.entropy[keep], atol=TOL, rtol=0)
    # the gradient is that of the kept positions only: the same loss with the others' upstream gradients 0
    every = TokenHead(ids, chunk, entropy=True)(h, w, b, project)
    every_masked = torch.autograd.grad(((every.logprobs * up_lp + every.entropy * up_ent) * keep).sum(), (h, w, b))
    for x, y in zip(g_part, every_masked, strict=True):  # to 1e-6 of the largest entry (randn logits: ~10)
        assert torch.allclose(x, y, atol=TOL * float(y.abs().max()), rtol=0), float((x - y).abs().max())
    assert torch.equal(g_part[0][:, -1], torch.zeros(3, 16))  # the last position predicts nothing
    assert torch.equal(g_part[0][1], torch.zeros(7, 16))  # nor does any position of a row with nothing kept


def test_token_head_keep_on_whole_logits_and_bad_masks():
    model = _tiny().eval()
    batch = collate(_trajs(), pad_id=0)
    keep = batch.action_mask != 0
    with torch.no_grad():
        logits = model(batch.ids, attention_mask=batch.attention_mask)
        out = TokenHead(batch.ids, keep=keep).of_logits(logits)  # a model without a `head` argument
    every = token_log_probs(logits, batch.ids)
    assert torch.equal(out.logprobs[keep], every[keep])
    assert torch.equal(out.logprobs[~keep], torch.zeros(int((~keep).sum())))
    with pytest.raises(ValueError, match=r"keep must be a bool mask \[B, T-1\]"):
        TokenHead(batch.ids, keep=batch.action_mask)  # float, not bool
    with pytest.raises(ValueError, match=r"keep must be a bool mask \[B, T-1\]"):
        TokenHead(batch.ids, keep=torch.ones(batch.ids.shape, dtype=torch.bool))  # [B, T]
    with pytest.raises(ValueError, match="exclude each other"):
        TokenHead(batch.ids, keep=keep, logits=True)


# --- the engine: losses and gradients ------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [0, 3])
def test_tiny_sft_dpo_grpo_losses_and_gradients_match_every_position(chunk):
    batch = collate(_trajs(), pad_id=0)
    assert batch.action_mask.sum() < batch.attention_mask[:, 1:].sum()  # prompts (and a TOOL token) are skipped
    _assert_same(_step(_tiny(), "actions", batch, sft_loss_fn(), logits_chunk=chunk),
                 _step(_tiny(), "all", batch, sft_loss_fn(), logits_chunk=chunk))
    pairs = _pairs()
    ref = make_engine(_tiny(), frozen=True, logits_chunk=chunk).forward(pairs).logprobs
    pairs = with_ref_sums(pairs, summed_logps(ref * 0.9, pairs.action_mask))
    for nll_weight in (0.0, 0.5):
        loss = preference_loss_fn(DPOConfig(beta=0.1, nll_weight=nll_weight))
        _assert_same(_step(_tiny(), "actions", pairs, loss, logits_chunk=chunk),
                     _step(_tiny(), "all", pairs, loss, logits_chunk=chunk))
    config = RLConfig(advantage="grpo", surrogate="ppo", entropy_coef=0.01, kl_coef=0.05)
    scored = {p: _grpo_batch(batch, make_engine(_tiny(), head_positions=p, logits_chunk=chunk), config)
              for p in ("actions", "all")}
    mask = batch.action_mask.bool()
    for k in ("old_logp", "ref_logp"):  # scored at the POLICY tokens only: 0.0 elsewhere, the same values there
        a, b = getattr(scored["actions"].pg, k), getattr(scored["all"].pg, k)
        assert torch.allclose(a[mask], b[mask], atol=TOL, rtol=0) and not a[~mask].any() and b[~mask].any()
    loss = rl_loss(config, use_old=True)
    assert loss.entropy and loss.positions == "actions"
    _assert_same(_step(_tiny(), "actions", scored["actions"], loss, logits_chunk=chunk),
                 _step(_tiny(), "all", scored["all"], loss, logits_chunk=chunk))


def test_micro_batches_length_buckets_value_head_and_an_empty_mask():
    batch = collate(_trajs(8), pad_id=0)
    adv = torch.randn(batch.size, generator=torch.Generator().manual_seed(2))
    config = RLConfig(advantage="gae", surrogate="ppo", entropy_coef=0.01, kl_coef=0.0)
    x = dict(advantages=adv[:, None].expand_as(batch.action_mask).contiguous(),
             old_logp=torch.zeros_like(batch.action_mask),
             returns=torch.randn(batch.action_mask.shape), old_values=torch.zeros_like(batch.action_mask))
    loss, scored = rl_loss(config, use_old=True), replace(batch, pg=PGInputs(**x))
    for kw in (dict(micro_batch_size=3), dict(logits_chunk=4)):
        a = make_engine(_tiny(True), head_positions="actions", **kw)
        b = make_engine(_tiny(True), head_positions="all", **kw)
        _assert_same((a.forward_backward(scored, loss, buckets=2), _grads(a.model)),
                     (b.forward_backward(scored, loss, buckets=2), _grads(b.model)))
    # a batch without a POLICY token: nothing through the output layer, the loss still backpropagates (to 0)
    empty = batch.select([0, 1])
    empty.action_mask.zero_()
    engine = make_engine(_tiny(), head_positions="actions")
    m = engine.forward_backward(empty, sft_loss_fn())
    assert m["loss"] == 0.0 and all(not p.grad.any() for p in engine.model.parameters() if p.grad is not None)


def test_hf_llama_sft_dpo_grpo_match_every_position(tmp_path):
    pytest.importorskip("transformers")
    from trajtune.models.hf import load_policy
    from trajtune.models.hf_random import make_random_model

    path = make_random_model(tmp_path / "llama", "llama", "tiny")

    def policy():
        torch.manual_seed(0)
        return load_policy(path)

    batch = collate(_trajs(vocab=300), pad_id=0)
    assert policy()._plain_head() is not None  # the TokenHead path (decoder, then the head on [K, D])
    act = batch.action_mask.bool()
    lp = make_engine(policy(), head_positions="actions").forward(batch, positions="actions").logprobs
    assert not lp[~act].any() and lp[act].ne(0).all()
    for chunk in (-1, 4):
        _assert_same(_step(policy(), "actions", batch, sft_loss_fn(), logits_chunk=chunk),
                     _step(policy(), "all", batch, sft_loss_fn(), logits_chunk=chunk))
    pairs = _pairs(vocab=300)  # each pair's prompt runs once (SharedPrefix), then the head on the kept rows
    assert policy().supports_shared_prefix
    pairs = with_ref_sums(pairs, summed_logps(make_engine(policy()).forward(pairs).logprobs * 0.9,
                                              pairs.action_mask))
    loss = preference_loss_fn(DPOConfig(beta=0.1, nll_weight=0.5))
    _assert_same(_step(policy(), "actions", pairs, loss), _step(policy(), "all", pairs, loss))
    config = RLConfig(advantage="grpo", surrogate="ppo", entropy_coef=0.01, kl_coef=0.05)
    scored = {p: _grpo_batch(batch, make_engine(policy(), head_positions=p), config) for p in ("actions", "all")}
    loss = rl_loss(config, use_old=True)
    _assert_same(_step(policy(), "actions", scored["actions"], loss), _step(policy(), "all", scored["all"], loss))


# --- readers of other positions get the real log-probs -------------------------------------------------
def test_readers_of_every_position_get_real_log_probs():
    batch = collate(_trajs(), pad_id=0)
    on, off = make_engine(_tiny(), head_positions="actions"), make_engine(_tiny(), head_positions="all")
    real = batch.attention_mask[:, 1:]  # [B, T-1] every predicted, non-padding token
    prompt = real & (batch.action_mask == 0)
    assert prompt.any()
    # 1. a forward that does not say it reads only the actions: every position, as without the option
    a, b = on.forward(batch, entropy=True), off.forward(batch, entropy=True)
    assert torch.equal(a.logprobs, b.logprobs) and torch.equal(a.entropy, b.entropy) and a.logprobs[prompt].ne(0).all()
    # ... and one that does: zeros off the actions (why a reader must say so)
    c = on.forward(batch, positions="actions")
    act = batch.action_mask.bool()
    assert not c.logprobs[~act].any() and torch.allclose(c.logprobs[act], b.logprobs[act], atol=TOL, rtol=0)
    # 2. a loss that reads every real token (all-token NLL) declares it, and gets every position
    every_token = Loss(lambda out, bt: sft_loss(out.logprobs, bt.attention_mask[:, 1:].float()), "token",
                       positions="all")
    _assert_same(_step(_tiny(), "actions", batch, every_token), _step(_tiny(), "all", batch, every_token))
    masked_only = Loss(every_token.fn, "token")  # the same reader, not declared: sees zeros, so a smaller NLL
    masked_loss = _step(_tiny(), "actions", batch, masked_only)[0]["loss"]
    assert masked_loss < _step(_tiny(), "all", batch, masked_only)[0]["loss"]
    # 3. the agent experiment's A1 (masked vs unmasked NLL at init) reads every real token through engine.forward
    from trajtune.experiments.agent.diagnostics import owners_and_init_loss

    trajs = _trajs()
    assert owners_and_init_loss(on, trajs, 0, 40) == owners_and_init_loss(off, trajs, 0, 40)


def test_the_option_is_validated_and_inherited():
    with pytest.raises(ValueError, match=r"engine: head_positions='loss'; choose one of \('actions', 'all'\)"):
        make_engine(_tiny(), head_positions="loss")
    with pytest.raises(ValueError, match=r"Loss.positions: 'some' is not one of \['actions', 'all'\]"):
        Loss(lambda out, b: (out.logprobs.sum(), {}), "token", positions="some")
    engine = make_engine(_tiny(), head_positions="actions")
    with pytest.raises(ValueError, match="engine.forward: positions='policy'"):
        engine.forward(collate(_trajs(), 0), positions="policy")
    assert engine.reference_engine().head_positions == "actions"
    assert isinstance(engine.forward(collate(_trajs(), 0)), ForwardOutput)
