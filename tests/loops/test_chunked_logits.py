"""Logits never whole: the output layer in chunks of positions (`logprobs.TokenHead`) gives the same
losses and gradients as the whole [B, T, V] logits, for the TinyTransformer and HF models, through the
engine's forward / forward_backward, with entropy and value heads; `logits_chunk=0` turns it off."""

from dataclasses import replace

import pytest
import torch

from trajtune.algorithms.dpo import DPOConfig, preference_loss_fn, summed_logps, with_ref_sums
from trajtune.algorithms.rl import RLConfig, rl_loss
from trajtune.algorithms.sft import sft_loss_fn
from trajtune.engine import make_engine
from trajtune.logprobs import HeadOutput, TokenHead, entropy_from_logits, token_log_probs
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.objectives.inputs import PGInputs
from trajtune.trajectory import Owner, Trajectory, collate, pair_batch

TOL = 1e-5


def _trajs(n=6, vocab=40, seed=0, tool_every=0):
    """Prompts of 3-5 tokens, completions of 4-7 (padding on most rows); with tool_every k, rows 0, k, 2k ... end in
    a TOOL token."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        t = Trajectory(reward=float(i % 2), group=i // 2)
        t.append(torch.randint(3, vocab, (3 + i % 3,), generator=g).tolist(), Owner.PROMPT, 0)
        t.append(torch.randint(3, vocab, (4 + i % 4,), generator=g).tolist(), Owner.POLICY, 0)
        if tool_every and i % tool_every == 0:
            t.append([5], Owner.TOOL, 0)
        out.append(t)
    return out


def _tiny(value_head=False):
    torch.manual_seed(0)
    return TinyTransformer(TinyConfig(vocab_size=40, dim=32, n_layers=2, n_heads=4, max_len=64, value_head=value_head))


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _step(model, chunk, batch, loss):
    engine = make_engine(model, logits_chunk=chunk)
    model.zero_grad(set_to_none=True)
    metrics = engine.forward_backward(batch, loss)
    return metrics, _grads(model)


def _assert_same(a, b):
    (ma, ga), (mb, gb) = a, b
    assert ma.keys() == mb.keys() and ga.keys() == gb.keys()
    for k in ma:
        assert ma[k] == pytest.approx(mb[k], abs=TOL), k
    for k in ga:
        assert torch.allclose(ga[k], gb[k], atol=TOL, rtol=0), (k, float((ga[k] - gb[k]).abs().max()))


def test_token_head_matches_whole_logits_values_and_gradients():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 7, 16, generator=g, requires_grad=True)  # [B, T, D]
    w = torch.randn(50, 16, generator=g).requires_grad_()  # [V, D]
    b = torch.randn(50, generator=g).requires_grad_()
    ids = torch.randint(0, 50, (3, 7), generator=g)
    up_lp, up_ent = torch.randn(3, 6, generator=g), torch.randn(3, 6, generator=g)  # upstream gradients

    def run(chunk):
        out = TokenHead(ids, chunk, entropy=True)(h, w, b, lambda x: x @ w.T + b)
        grads = torch.autograd.grad((out.logprobs * up_lp).sum() + (out.entropy * up_ent).sum(), (h, w, b))
        return out, grads

    whole, g_whole = run(0)
    for chunk in (1, 4, 5, 17):
        part, g_part = run(chunk)
        assert torch.allclose(part.logprobs, whole.logprobs, atol=TOL)
        assert torch.allclose(part.entropy, whole.entropy, atol=TOL)
        for x, y in zip(g_part, g_whole):
            assert torch.allclose(x, y, atol=TOL, rtol=TOL), float((x - y).abs().max())
    # the reference numbers are today's functions on the whole logits
    logits = h @ w.T + b
    assert torch.allclose(whole.logprobs, token_log_probs(logits, ids)) and whole.logits is None
    assert torch.allclose(whole.entropy, entropy_from_logits(logits[:, :-1]))


@pytest.mark.parametrize("bias,entropy", [(True, False), (False, False), (True, True)])
def test_slices_written_into_reused_buffers_give_the_same_floats_as_fresh_ones(monkeypatch, bias, entropy):
    """The fp32 path writes every slice's logits (and logsumexp's difference) into buffers it reuses; the floats
    must be those of F.linear + torch.logsumexp on fresh tensors, bit for bit, forward and backward."""
    import trajtune.logprobs as L

    g = torch.Generator().manual_seed(1)
    h = torch.randn(2, 9, 16, generator=g, requires_grad=True)
    w = torch.randn(300, 16, generator=g).requires_grad_()
    b = torch.randn(300, generator=g).requires_grad_() if bias else None
    ids = torch.randint(0, 300, (2, 9), generator=g)
    up = torch.randn(2, 8, generator=g)

    def run():
        out = TokenHead(ids, 5, entropy=entropy)(h, w, b, lambda x: x @ w.T + (b if bias else 0))
        loss = (out.logprobs * up).sum() + (out.entropy.sum() if entropy else 0)
        return [out.logprobs.detach()] + list(torch.autograd.grad(loss, [t for t in (h, w, b) if t is not None]))

    reused = run()
    monkeypatch.setattr(L, "_slice_buffers", lambda *a: (None, None))  # every slice a fresh F.linear, logsumexp
    fresh = run()
    assert all(torch.equal(x, y) for x, y in zip(reused, fresh, strict=True))


def test_a_batch_that_fits_one_chunk_is_computed_exactly_as_unchunked():
    ids = torch.randint(0, 40, (2, 5))
    head = TokenHead(ids)  # auto: whole logits up to 2^24 values, then slices of 2^22 values
    assert head.positions(40) == 0 and TokenHead(ids, chunk=3).positions(40) == 3
    rows = torch.zeros(16, 257, dtype=torch.long)  # 4,096 positions: whole at 4,096 x 4,096 = 2^24 values, not above
    assert TokenHead(rows).positions(4096) == 0 and TokenHead(rows).positions(4097) == (1 << 22) // 4097
    long = torch.zeros(16, 1025, dtype=torch.long)  # a batch of Qwen's vocabulary: 16 x 1024 x 151,936 logits
    assert TokenHead(long).positions(151_936) == (1 << 22) // 151_936 and TokenHead(long, 0).positions(151_936) == 0
    # the FLOP row's SFT (vocabulary 16,384, width 384): slices of 384 positions, 24 MB of fp32 logits, under glibc's
    # 32 MB mmap threshold (2^23 values were exactly 32 MB: fresh pages for every slice's temporaries)
    c = TokenHead(rows).positions(16_384, 384)
    assert c == 384 and c * 16_384 * 4 < 32 << 20
    assert TokenHead(ids, chunk=8).positions(40) == 0  # 8 positions: one chunk
    assert TokenHead(ids, chunk=3, logits=True).positions(40) == 0  # whole logits asked for: never chunked
    model = _tiny().eval()
    with torch.no_grad():
        out = model(ids, head=head)
        assert isinstance(out, HeadOutput) and torch.equal(out.logprobs, token_log_probs(model(ids), ids))


@pytest.mark.parametrize("chunk", [1, 7])
def test_tiny_sft_and_dpo_losses_and_gradients_match_unchunked(chunk):
    batch = collate(_trajs(), pad_id=0)
    _assert_same(_step(_tiny(), chunk, batch, sft_loss_fn()), _step(_tiny(), 0, batch, sft_loss_fn()))
    trajs = _trajs()
    pairs = pair_batch(list(zip(trajs[0::2], trajs[1::2])), pad_id=0)
    ref = make_engine(_tiny(), frozen=True, logits_chunk=chunk).forward(pairs).logprobs
    pairs = with_ref_sums(pairs, summed_logps(ref * 0.9, pairs.action_mask))
    loss = preference_loss_fn(DPOConfig(beta=0.1))
    _assert_same(_step(_tiny(), chunk, pairs, loss), _step(_tiny(), 0, pairs, loss))


def test_rl_loss_with_entropy_and_value_head_matches_unchunked():
    batch = collate(_trajs(), pad_id=0)
    config = RLConfig(advantage="gae", entropy_coef=0.01, surrogate="ppo", kl_coef=0.0)
    model = _tiny(value_head=True)
    old = make_engine(model, logits_chunk=0).forward(batch, values=True)
    chunked = make_engine(model, logits_chunk=3).forward(batch, values=True, entropy=True)
    whole = make_engine(model, logits_chunk=0).forward(batch, values=True, entropy=True, logits=True)
    assert chunked.logits is None and whole.logits.shape == (*batch.ids.shape, 40)
    assert torch.allclose(chunked.logprobs, whole.logprobs, atol=TOL)
    assert torch.allclose(chunked.entropy, whole.entropy, atol=TOL) and torch.equal(chunked.values, whole.values)
    mask = batch.action_mask
    batch = replace(batch, pg=PGInputs(torch.randn(mask.shape, generator=torch.Generator().manual_seed(3)),
                                       old_logp=old.logprobs, returns=torch.randn(mask.shape),
                                       old_values=old.values[:, :-1]))
    loss = rl_loss(config, use_old=True)
    assert loss.entropy and loss.values
    _assert_same(_step(_tiny(True), 3, batch, loss), _step(_tiny(True), 0, batch, loss))


def test_micro_batches_and_bf16_autocast_stay_close():
    batch = collate(_trajs(8), pad_id=0)
    a = make_engine(_tiny(), micro_batch_size=3, logits_chunk=5)
    b = make_engine(_tiny(), micro_batch_size=3, logits_chunk=0)
    _assert_same((a.forward_backward(batch, sft_loss_fn()), _grads(a.model)),
                 (b.forward_backward(batch, sft_loss_fn()), _grads(b.model)))
    a = make_engine(_tiny(), autocast="bf16", logits_chunk=5)
    b = make_engine(_tiny(), autocast="bf16", logits_chunk=0)
    ma, mb = a.forward_backward(batch, sft_loss_fn()), b.forward_backward(batch, sft_loss_fn())
    assert ma["loss"] == pytest.approx(mb["loss"], abs=2e-2)
    for (n, p), q in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=2e-2, rtol=5e-2), n


def test_engine_rejects_a_bad_chunk():
    with pytest.raises(ValueError, match="logits_chunk"):
        make_engine(_tiny(), logits_chunk=-2)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from trajtune.models.hf_random import make_random_model

    return make_random_model(tmp_path_factory.mktemp("llama") / "m", "llama", "tiny")


@pytest.mark.parametrize("lora", [False, True])
def test_hf_llama_losses_and_gradients_match_unchunked(llama_dir, lora):
    pytest.importorskip("peft")
    from trajtune.models.hf import LoraSettings, load_policy

    path = llama_dir
    settings = LoraSettings(r=4, dropout=0.0) if lora else None

    def policy():
        torch.manual_seed(0)
        p = load_policy(path, lora=settings, value_head=True)
        if lora:  # adapters away from 0, so they carry gradient into the base path
            for n, w in p.named_parameters():
                if "lora_B" in n:
                    torch.nn.init.normal_(w, std=0.02)
        return p

    batch = collate(_trajs(vocab=300), pad_id=0)
    assert policy()._plain_head() is not None
    _assert_same(_step(policy(), 4, batch, sft_loss_fn()), _step(policy(), 0, batch, sft_loss_fn()))
    p = policy()
    chunked = make_engine(p, logits_chunk=4).forward(batch, values=True, entropy=True)
    whole = make_engine(p, logits_chunk=0).forward(batch, values=True, entropy=True, logits=True)
    assert torch.allclose(chunked.logprobs, whole.logprobs, atol=TOL)
    assert torch.allclose(chunked.entropy, whole.entropy, atol=TOL)
    assert torch.allclose(chunked.values, whole.values, atol=TOL)
    with torch.no_grad():  # the plain forward (HF's own logits and hidden states) agrees
        logits, values = p.eval()(batch.ids, attention_mask=batch.attention_mask, return_values=True)
    assert torch.allclose(token_log_probs(logits, batch.ids), whole.logprobs, atol=TOL)
    assert torch.allclose(values, whole.values, atol=TOL)
    if lora:  # the reference with adapters off is chunked too
        ref = make_engine(p, logits_chunk=4).reference_engine(adapters_off=True)
        whole_ref = make_engine(p, logits_chunk=0).reference_engine(adapters_off=True)
        assert torch.allclose(ref.forward(batch).logprobs, whole_ref.forward(batch).logprobs, atol=TOL)
