"""The engine's fast paths compute what the slow ones do: the multi-tensor AdamW is the one-tensor loop bit
for bit, an HF forward without a KV cache is the cached default bit for bit, and pairs that share a prompt
(`logprobs.SharedPrefix`: the prompt once, then each completion) give the unpacked rows' log-probs, values,
losses and gradients to float rounding. Speed itself is a benchmark (benchmarks/vs_trl.py), never a test."""

import dataclasses

import pytest
import torch

from trajtune.algorithms.dpo import DPOConfig, pair_step, preference_loss_fn, summed_logps, with_ref_sums
from trajtune.algorithms.sft import sft_loss_fn
from trajtune.engine import OptimConfig, make_engine
from trajtune.logprobs import SharedPrefix, TokenHead, token_log_probs
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.objectives.inputs import PGInputs
from trajtune.trajectory import Owner, Trajectory, collate, pair_batch

TOL = 1e-5


def _traj(prompt, completion):
    t = Trajectory()
    t.append(list(prompt), Owner.PROMPT, 0)
    t.append(list(completion), Owner.POLICY, 0)
    return t


def test_shared_prefix_packs_a_pair_as_worked_by_hand():
    # chosen 5 6 | 7 8, rejected 5 6 | 9 (right-padded with 0): the prefix 5 6 once, then 7 8, then 9
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 0]])
    real = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    p = SharedPrefix.of(ids, real, [[0, 1]])
    assert p.ids.tolist() == [[5, 6, 7, 8, 9]]
    assert p.positions.tolist() == [[0, 1, 2, 3, 2]]  # 9 sits where 7 does: right after the prompt
    assert p.source.tolist() == [[0, 1, 2, 3], [0, 1, 4, 0]]  # the rejected row's padding -> position 0
    assert p.mask[0, 0].int().tolist() == [[1, 0, 0, 0, 0],
                                           [1, 1, 0, 0, 0],
                                           [1, 1, 1, 0, 0],
                                           [1, 1, 1, 1, 0],
                                           [1, 1, 0, 0, 1]]  # 9 sees the prompt and itself, never 7 8
    assert torch.equal(p.gather(p.ids[..., None])[..., 0][real], ids[real])
    # nothing shared (different first tokens, or rows on their own): no packing
    assert SharedPrefix.of(torch.tensor([[5, 6], [7, 6]]), torch.ones(2, 2, dtype=torch.bool), [[0, 1]]) is None
    assert SharedPrefix.of(ids, real, [[0], [1]]) is None


def _sft_batches(n=3):
    g = torch.Generator().manual_seed(0)
    return [collate([_traj(torch.randint(3, 40, (3 + i,), generator=g).tolist(),
                           torch.randint(3, 40, (4 + i % 3,), generator=g).tolist()) for i in range(5)], 0)
            for _ in range(n)]


def test_the_multi_tensor_adamw_is_the_one_tensor_loop_bit_for_bit():
    config = OptimConfig(lr=3e-3, weight_decay=0.1, warmup_steps=2, decay_steps=3, grad_clip=0.5)
    engines = []
    for foreach in (True, False):
        torch.manual_seed(0)
        model = TinyTransformer(TinyConfig(vocab_size=40, dim=32, n_layers=2, n_heads=4, max_len=64))
        e = make_engine(model, config)
        if not foreach:  # the one-tensor-at-a-time loop, everything else as the engine builds it
            e._optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                                             betas=(config.beta1, config.beta2), weight_decay=config.weight_decay,
                                             foreach=False)
        engines.append(e)
    assert engines[0].optimizer.defaults["foreach"] is True
    loss = sft_loss_fn()
    for batch in _sft_batches(4):
        for e in engines:
            e.forward_backward(batch, loss)
            e.optim_step()
    a, b = (dict(e.model.named_parameters()) for e in engines)
    assert all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = (e.optimizer.state_dict()["state"] for e in engines)
    assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from trajtune.models.hf_random import make_random_model

    return make_random_model(tmp_path_factory.mktemp("fast") / "m", "llama", "tiny")


def _pairs():
    """Two pairs sharing their prompts, one pair whose sides differ from the first token, one shared up to
    the first completion token."""
    g = torch.Generator().manual_seed(1)
    r = lambda n: torch.randint(3, 300, (n,), generator=g).tolist()  # noqa: E731
    p1, p2, p4 = r(6), r(9), r(5)
    return [(_traj(p1, r(4)), _traj(p1, r(7))), (_traj(p2, r(5)), _traj(p2, r(3))),
            (_traj(r(4), r(3)), _traj(r(5), r(4))), (_traj(p4, [7] + r(3)), _traj(p4, [7] + r(5)))]


def test_an_hf_forward_without_a_kv_cache_is_the_cached_default_bit_for_bit(llama_dir):
    from trajtune.models.hf import load_policy

    policy = load_policy(llama_dir).eval()
    batch = pair_batch(_pairs(), 0)
    mask = batch.attention_mask
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ours = policy(batch.ids, mask, head=TokenHead(batch.ids)).logprobs
        decoder = policy.model.model
        h = decoder(input_ids=batch.ids, attention_mask=mask.long(), position_ids=pos, use_cache=True).last_hidden_state
        cached_default = token_log_probs(policy.model.lm_head(h), batch.ids)
    assert torch.equal(ours, cached_default)


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("chunk", [-1, 7])
def test_pairs_sharing_a_prompt_match_the_unpacked_rows(llama_dir, chunk):
    from trajtune.models.hf import load_policy

    full = pair_batch(_pairs(), 0)
    assert SharedPrefix.of(full.ids, full.attention_mask, [[i, i + 4] for i in range(4)]) is not None
    outs = []
    for share in (True, False):
        policy = load_policy(llama_dir)
        assert policy.supports_shared_prefix
        engine = make_engine(policy, logits_chunk=chunk, share_prefix=share)
        ref = engine.reference_engine()
        assert ref.share_prefix is share
        ref_sums = summed_logps(ref.forward(full).logprobs, full.action_mask)
        batch = with_ref_sums(full, ref_sums + 0.25 * torch.arange(full.size))  # a margin to learn from
        metrics = pair_step(engine, batch, torch.arange(4), preference_loss_fn(DPOConfig(nll_weight=0.5)))
        logprobs = engine.forward(full, entropy=True)
        outs.append((ref_sums, metrics, _grads(policy), logprobs))
    (ra, ma, ga, fa), (rb, mb, gb, fb) = outs
    real = full.action_mask.bool()
    assert torch.allclose(ra, rb, atol=TOL, rtol=0)
    assert ma.keys() == mb.keys() and all(ma[k] == pytest.approx(mb[k], abs=TOL) for k in ma)
    assert ga.keys() == gb.keys()
    for k in ga:
        assert torch.allclose(ga[k], gb[k], atol=TOL, rtol=0), (k, float((ga[k] - gb[k]).abs().max()))
    assert torch.allclose(fa.logprobs[real], fb.logprobs[real], atol=TOL, rtol=0)
    assert torch.allclose(fa.entropy[real], fb.entropy[real], atol=TOL, rtol=0)


def test_a_reward_model_on_shared_prompts_scores_the_unpacked_rows(llama_dir):
    from trajtune.models.hf import load_policy
    from trajtune.objectives.reward_model import last_token_values

    full = pair_batch(_pairs(), 0)
    scores = []
    for share in (True, False):
        torch.manual_seed(0)
        engine = make_engine(load_policy(llama_dir, value_head=True), share_prefix=share)
        out = engine.forward(full, values=True)
        scores.append(last_token_values(out.values, full.attention_mask))
    assert torch.allclose(scores[0], scores[1], atol=TOL, rtol=0)


def test_rows_of_one_prompt_merge_into_units_while_the_packed_row_stays_short():
    # rows 0-3: prompt 5 6, completions of 2 tokens (rows of 4); row 4: another prompt; row 5: no policy token
    trajs = [_traj([5, 6], c) for c in ([9, 1], [10, 11], [12, 2], [13, 3])] + [_traj([5, 1], [9])]
    t = Trajectory()
    t.append([5, 6, 9], Owner.PROMPT, 0)
    b = collate(trajs + [t], 0)
    units = SharedPrefix.prompt_units(b.ids, b.attention_mask, b.action_mask, [[i] for i in range(6)])
    # rows 0 1 2 pack into 2 + 3 x 2 = 8 <= 2 x 4; with row 3 it would be 10 > 8: a new unit
    assert units == [[0, 1, 2], [3], [4], [5]]
    # a unit given (a pair) is never split; one whose rows differ in prompt (or lack a policy token) stays as it is
    assert SharedPrefix.prompt_units(b.ids, b.attention_mask, b.action_mask, [[0, 1], [2], [3], [4, 5]]) == \
        [[0, 1, 2], [3], [4, 5]]
    assert SharedPrefix.prompt_units(b.ids, b.attention_mask, b.action_mask, [[0, 1], [2, 3], [4, 5]]) == \
        [[0, 1], [2, 3], [4, 5]]  # 2 + 4 x 2 = 10 > 8
    p = SharedPrefix.of(b.ids, b.attention_mask, units)
    assert p.ids[0].tolist() == [5, 6, 9, 1, 10, 11, 12, 2]  # the prompt once, then each completion


def test_a_grpo_group_sharing_its_prompt_matches_the_unpacked_rows(llama_dir):
    from trajtune.algorithms.rl import RLConfig, rl_loss
    from trajtune.models.hf import load_policy

    g = torch.Generator().manual_seed(2)
    r = lambda n: torch.randint(3, 300, (n,), generator=g).tolist()  # noqa: E731
    prompts = [r(9), r(12)]
    batch = collate([_traj(p, r(2 + i % 3)) for p in prompts for i in range(4)], 0)
    units = SharedPrefix.prompt_units(batch.ids, batch.attention_mask, batch.action_mask, [[i] for i in range(8)])
    assert len(units) == 2  # each group's prompt once
    batch = dataclasses.replace(batch, pg=PGInputs(torch.linspace(-1, 1, 8)))
    loss = rl_loss(RLConfig(advantage="grpo", entropy_coef=0.01), use_old=False)
    outs = []
    for share in (True, False):
        policy = load_policy(llama_dir)
        engine = make_engine(policy, share_prefix=share, head_positions="actions")
        metrics = engine.forward_backward(batch, loss)
        outs.append((metrics, _grads(policy), engine.forward(batch).logprobs))
    (ma, ga, la), (mb, gb, lb) = outs
    assert all(ma[k] == pytest.approx(mb[k], abs=TOL) for k in ma)
    for k in ga:
        assert torch.allclose(ga[k], gb[k], atol=TOL, rtol=0), (k, float((ga[k] - gb[k]).abs().max()))
    real = batch.attention_mask[:, 1:].bool()
    assert torch.allclose(la[real], lb[real], atol=TOL, rtol=0)


class _Counting(torch.nn.Module):
    """A model wrapper that records the rows of every forward (what the sampler ran)."""

    def __init__(self, model):
        super().__init__()
        self.model, self.rows = model, []

    def forward(self, ids, attention_mask=None, cache=None):
        self.rows.append(ids.shape[0])
        return self.model(ids, attention_mask=attention_mask, cache=cache)

    def new_cache(self, batch_size, max_len=None):
        return self.model.new_cache(batch_size, max_len)


class _NoSelect:
    """A cache without `select_rows` (a model that cannot copy cache rows): the sampler prefills every row."""

    def __init__(self, cache):
        object.__setattr__(self, "_cache", cache)

    def __getattr__(self, name):
        if name == "select_rows":
            raise AttributeError(name)
        return getattr(self._cache, name)

    def __setattr__(self, name, value):
        setattr(self._cache, name, value)


@pytest.mark.parametrize("kind", ["tiny", "llama"])
def test_a_prompt_shared_by_a_group_is_prefilled_once_and_samples_what_every_row_would(kind, request):
    from trajtune.engine.decoding import sample

    if kind == "tiny":
        torch.manual_seed(0)
        model = TinyTransformer(TinyConfig(vocab_size=60, dim=32, n_layers=2, n_heads=4, max_len=64)).eval()
    else:
        from trajtune.models.hf import load_policy

        model = load_policy(request.getfixturevalue("llama_dir")).eval()
    prompts = [[5, 6, 7]] * 3 + [[9, 10, 11, 12, 13]] * 4 + [[20]] + [[5, 6, 7]] * 2  # 3 distinct, 10 rows
    counted = _Counting(model)
    for kw in ({"temperature": 0.8}, {"draw": "cdf"}, {"greedy": True},
               {"generators": [torch.Generator().manual_seed(40 + b) for b in range(10)]}):
        fresh = lambda: {k: (  # noqa: E731
            [torch.Generator().manual_seed(40 + b) for b in range(10)] if k == "generators" else v)
                         for k, v in kw.items()}
        gen = lambda: torch.Generator().manual_seed(3)  # noqa: E731
        every = sample(model, prompts, 8, gen(), stop_ids=[4], **fresh())
        counted.rows.clear()
        shared = sample(counted, prompts, 8, gen(), stop_ids=[4], share_prompts=True, **fresh())
        assert counted.rows[0] == 3 and set(counted.rows[1:]) <= {10}, counted.rows  # prefill 3 rows, decode 10
        assert shared.tokens == every.tokens and shared.stopped == every.stopped, kw
        for a, b in zip(shared.logprobs, every.logprobs):
            assert a == pytest.approx(b, abs=TOL)
        counted.rows.clear()  # all distinct: one prefill of every row
        sample(counted, [[5], [6, 7]], 3, gen(), share_prompts=True, **({} if "generators" in kw else kw))
        assert counted.rows[0] == 2
    bare = _Counting(model)
    bare.new_cache = lambda n, max_len=None: _NoSelect(model.new_cache(n, max_len))
    out = sample(bare, prompts, 8, torch.Generator().manual_seed(3), stop_ids=[4], share_prompts=True)
    assert bare.rows[0] == 10  # the cache cannot copy rows: every row prefilled, the same samples
    assert out.tokens == sample(model, prompts, 8, torch.Generator().manual_seed(3), stop_ids=[4]).tokens


def test_set_mode_puts_every_submodule_in_the_mode_even_when_the_root_already_is():
    """A Hugging Face model loads in eval mode inside a wrapper built in train mode: training must still switch the
    inner model (its dropout) to train mode, as `model.train()` would, and an eval forward must switch it back."""
    from trajtune.engine import set_mode

    inner = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5)).eval()
    outer = torch.nn.Module()
    outer.inner = inner  # the root is in train mode (a new module), its child in eval mode
    assert outer.training and not inner[1].training
    assert set_mode(outer, True) is True and all(m.training for m in outer.modules())
    assert set_mode(outer, False) is True and not any(m.training for m in outer.modules())
    assert set_mode(outer, False) is False and not any(m.training for m in outer.modules())
