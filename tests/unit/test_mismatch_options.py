"""The mismatch lab's two sampling options, by hand: raw against processed log-probs under top-k / top-p
(`sampling.logprobs`, trajtune.engine.decoding), and the sampler process's rounded weights (`sampling.sampler_dtype`,
trajtune.sources.serve.round_weights); and the sampling section's checks of both."""

import math

import pytest
import torch

from trajtune.engine.decoding import pick_next, sample
from trajtune.sources.sampler import Decoder, SamplerSettings
from trajtune.sources.sampling import SamplingConfig, check_sampling
from trajtune.sources.serve import round_weights

PROBS = [0.5, 0.3, 0.2]


@pytest.mark.parametrize("draw", ["race", "cdf"])
def test_top_p_raw_logprob_is_the_full_softmax_processed_the_truncated(draw):
    # top_p 0.7 over (0.5, 0.3, 0.2): the mass before each token is 0, 0.5, 0.8; the last (0.8 >= 0.7) is cut.
    # Processed: the nucleus renormalised, 0.5 / 0.8 = 0.625 and 0.3 / 0.8 = 0.375; raw: 0.5 and 0.3 themselves.
    logits = torch.tensor([PROBS]).log().repeat(64, 1)  # [64, 3]
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    tok, processed = pick_next(logits, g1, top_p=0.7, draw=draw)
    tok_raw, raw = pick_next(logits, g2, top_p=0.7, draw=draw, logprobs="raw")
    assert torch.equal(tok, tok_raw) and set(tok.tolist()) == {0, 1}  # the same draws, never the cut token
    want_processed = {0: 0.625, 1: 0.375}
    want_raw = {0: 0.5, 1: 0.3}
    for t, p, r in zip(tok.tolist(), processed.exp().tolist(), raw.exp().tolist()):
        assert p == pytest.approx(want_processed[t], abs=1e-6) and r == pytest.approx(want_raw[t], abs=1e-6)


def test_top_k_raw_and_untruncated_and_greedy_rows():
    logits = torch.tensor([PROBS]).log()
    # top_k 1: only token 0, processed log-prob log 1 = 0, raw log 0.5
    _, processed = pick_next(logits, torch.Generator().manual_seed(0), top_k=1)
    _, raw = pick_next(logits, torch.Generator().manual_seed(0), top_k=1, logprobs="raw")
    assert processed.item() == pytest.approx(0.0, abs=1e-6) and raw.item() == pytest.approx(math.log(0.5), abs=1e-6)
    # temperature 2 without a filter: both are log softmax(logits / 2); token 0 has sqrt(.5) / (sqrt(.5) + sqrt(.3)
    # + sqrt(.2)) = 0.70711 / (0.70711 + 0.54772 + 0.44721) = 0.70711 / 1.70204 = 0.41545
    g = torch.Generator().manual_seed(0)
    tok, lp = pick_next(logits.repeat(32, 1), g, temperature=2.0, logprobs="raw")
    assert lp[tok == 0].exp().tolist() == pytest.approx([0.41545] * int((tok == 0).sum()), abs=1e-4)
    with pytest.raises(ValueError, match="logprobs must be one of"):
        pick_next(logits, None, logprobs="full")


class Fixed(torch.nn.Module):
    """A 'model' whose next-token distribution is always PROBS over 3 tokens (the sampler's contract, no cache)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(PROBS).log())

    def forward(self, ids, attention_mask=None, cache=None):
        return self.w.expand(*ids.shape, 3)


def test_sample_and_decoder_pass_the_option_through():
    model = Fixed()
    kw = dict(top_p=0.7, use_cache=False)
    a = sample(model, [[0]] * 8, 2, torch.Generator().manual_seed(1), **kw)
    b = sample(model, [[0]] * 8, 2, torch.Generator().manual_seed(1), logprobs="raw", **kw)
    assert a.tokens == b.tokens
    for row_a, row_b, toks in zip(a.logprobs, b.logprobs, a.tokens):
        for la, lb, t in zip(row_a, row_b, toks):
            assert math.exp(la) == pytest.approx({0: 0.625, 1: 0.375}[t], abs=1e-6)
            assert math.exp(lb) == pytest.approx({0: 0.5, 1: 0.3}[t], abs=1e-6)
    seen = {}

    def decode(prompts, n, generator, **kw):
        seen.update(kw)
        return sample(model, prompts, n, generator, use_cache=False, **kw)

    Decoder(decode, SamplerSettings(top_p=0.7)).sample([[0]], [], None)
    assert "logprobs" not in seen  # the default is not passed (a decoder without the option works)
    Decoder(decode, SamplerSettings(top_p=0.7, logprobs="raw")).sample([[0]], [], None)
    assert seen["logprobs"] == "raw"


def test_round_weights_by_hand():
    # bf16 keeps 7 fraction bits: 1/3 = 1.0101010|1...b x 2^-2 rounds up to 1.0101011b x 2^-2 = 0.333984375;
    # 0.0013 = 1.3312 x 2^-10, 0.3312 x 128 = 42.4 -> 42: 1.328125 x 2^-10 = 0.0012969970703125; 1000, -500 exact.
    # float8 e4m3 keeps 3: 1/3 -> 1.011b x 2^-2 = 0.34375; 1000 and -500 saturate at +-448; 0.0013 is 0.67 of the
    # smallest subnormal 2^-9 = 0.001953125 and rounds to it. Integer tensors are left alone.
    values = [1.0, 1 / 3, 1000.0, 0.0013, -500.0]
    for dtype, want in (("bf16", [1.0, 0.333984375, 1000.0, 0.0012969970703125, -500.0]),
                        ("fp8", [1.0, 0.34375, 448.0, 0.001953125, -448.0]),
                        ("fp32", torch.tensor(values).tolist())):  # unchanged
        state = {"w": torch.tensor(values), "steps": torch.tensor([3, 5])}
        round_weights(state, dtype)
        assert state["w"].tolist() == want
        assert state["steps"].tolist() == [3, 5]


def test_sampling_checks_name_the_options():
    with pytest.raises(ValueError, match="sampler_dtype bf16 rounds the weights of the sampler process"):
        check_sampling(SamplingConfig(sampler_dtype="bf16", sync_tolerance=1.0), "run")
    with pytest.raises(ValueError, match="sampling.sync_tolerance"):
        check_sampling(SamplingConfig(sampler_dtype="fp8", sampler_process=True), "run")
    check_sampling(SamplingConfig(sampler_dtype="fp8", sampler_process=True, sync_tolerance=5.0), "run")
    check_sampling(SamplingConfig(sampler_dtype="bf16", max_staleness=1, sync_tolerance=1.0), "run")
    with pytest.raises(ValueError, match="sampling.logprobs raw is the built-in sampler's option"):
        check_sampling(SamplingConfig(logprobs="raw", backend="generate"), "run")
    with pytest.raises(ValueError, match="sampler_dtype"):
        SamplingConfig(sampler_dtype="fp16")  # type: ignore[arg-type]
    s = SamplingConfig(top_p=0.9, logprobs="raw", sampler_dtype="bf16", sampler_process=True, sync_tolerance=1.0)
    assert (s.settings().logprobs, s.settings().weights_dtype) == ("raw", "bf16")
