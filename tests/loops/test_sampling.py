import pytest
import torch

from trajtune.engine.decoding import filter_logits, pick_next, sample

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]]


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_same_seed_same_samples_and_cache_equals_recompute(tiny_model):
    a = sample(tiny_model, PROMPTS, 12, gen(0), temperature=0.9, stop_ids=[7])
    b = sample(tiny_model, PROMPTS, 12, gen(0), temperature=0.9, stop_ids=[7])
    c = sample(tiny_model, PROMPTS, 12, gen(0), temperature=0.9, stop_ids=[7], use_cache=False)
    d = sample(tiny_model, PROMPTS, 12, gen(1), temperature=0.9, stop_ids=[7])
    assert a == b
    assert a.tokens == c.tokens
    assert a.tokens != d.tokens


def test_logprobs_are_the_models_log_probs(tiny_model):
    out = sample(tiny_model, PROMPTS, 6, gen(2))
    for p, toks, lps in zip(PROMPTS, out.tokens, out.logprobs):
        ids = torch.tensor([p + toks])
        ref = torch.log_softmax(tiny_model(ids)[0, len(p) - 1 : -1], -1).gather(-1, torch.tensor(toks)[:, None])
        assert torch.allclose(torch.tensor(lps), ref.squeeze(-1), atol=1e-5)


def test_batched_greedy_equals_one_prompt_at_a_time(tiny_model):
    batched = sample(tiny_model, PROMPTS, 10, greedy=True)
    for p, toks in zip(PROMPTS, batched.tokens):
        assert sample(tiny_model, [p], 10, greedy=True).tokens[0] == toks


def test_stop_tokens_and_budget(tiny_model):
    greedy = sample(tiny_model, PROMPTS, 10, greedy=True)
    stop = greedy.tokens[0][2]  # force a stop where this token first appears in row 0
    out = sample(tiny_model, PROMPTS, 10, greedy=True, stop_ids=[stop])
    first = greedy.tokens[0].index(stop)
    assert out.tokens[0] == greedy.tokens[0][: first + 1] and out.stopped[0]
    for toks, s in zip(out.tokens, out.stopped):
        assert len(toks) <= 10 and (s == (stop in toks))
        if s:
            assert toks.index(stop) == len(toks) - 1


def test_top_k_1_and_tiny_top_p_are_greedy(tiny_model):
    greedy = sample(tiny_model, PROMPTS, 8, greedy=True).tokens
    assert sample(tiny_model, PROMPTS, 8, gen(3), top_k=1).tokens == greedy
    assert sample(tiny_model, PROMPTS, 8, gen(3), top_p=1e-6).tokens == greedy


@pytest.mark.parametrize("kw", [{}, {"temperature": 0.7}, {"top_k": 3}, {"top_p": 0.8}])
def test_per_row_generators_draw_what_multinomial_draws_row_by_row(kw):
    # the batched exponential race of pick_next(generators=...) is torch.multinomial on each row
    # alone with its own generator: same tokens, same log-probs, generators left in the same state
    logits = torch.randn(7, 50, generator=gen(4)) * 3
    batched = [gen(10 + b) for b in range(7)]
    alone = [gen(10 + b) for b in range(7)]
    for _ in range(5):
        tok, lp = pick_next(logits, None, generators=batched, **kw)
        for b in range(7):
            t, l = pick_next(logits[b : b + 1], alone[b], **kw)
            assert int(t) == int(tok[b]) and torch.equal(l, lp[b : b + 1])
    assert all(torch.equal(x.get_state(), y.get_state()) for x, y in zip(batched, alone))


def test_rows_with_own_generators_do_not_depend_on_their_batch(tiny_model):
    together = sample(tiny_model, PROMPTS, 12, stop_ids=[7], generators=[gen(20 + b) for b in range(len(PROMPTS))])
    for b, p in enumerate(PROMPTS):
        alone = sample(tiny_model, [p], 12, stop_ids=[7], generators=[gen(20 + b)])
        assert alone.tokens[0] == together.tokens[b] and alone.stopped[0] == together.stopped[b]
        assert torch.allclose(torch.tensor(alone.logprobs[0]), torch.tensor(together.logprobs[b]), atol=1e-5)
    assert any(together.stopped) and not all(together.stopped)  # a row that stopped early and one that ran on


def test_filter_logits():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[True, False, False, True]]
    # probs ~ [0.09, 0.67, 0.24, 0.03]: the 0.8 nucleus keeps the two most likely tokens
    assert torch.isinf(filter_logits(logits, top_p=0.8)).tolist() == [[True, False, False, True]]


def test_bad_arguments(tiny_model):
    with pytest.raises(ValueError, match="at least one token"):
        sample(tiny_model, [[]], 3)
    with pytest.raises(ValueError, match="temperature"):
        sample(tiny_model, PROMPTS, 3, temperature=0.0)
    assert sample(tiny_model, [], 3).tokens == []


def test_decoding_past_the_context_is_an_error_and_up_to_it_is_not(tiny_model):
    # tiny_model's max_len is 64: a 60-token prompt has room for 4 new tokens' positions (60..63)
    long = [list(range(1, 31)) * 2, [1, 2]]
    assert [len(t) for t in sample(tiny_model, long, 4, gen(0)).tokens] == [4, 4]
    with pytest.raises(ValueError, match="context max_len=64"):
        sample(tiny_model, long, 6, gen(0))


# --- draw="cdf": one random number per row, the same distribution as the race ------------------------
def _cdf_logits(V=2600, seed=5):
    # a row whose mass sits in several blocks of CDF_BLOCK (1,024) entries, the ragged last block included
    # (V = 2600: two-level search), or in one block (V <= 1024: one level)
    g = gen(seed)
    logits = torch.randn(V, generator=g) - 6.0
    hot = [3, 1030, 1031, 2047, 2048, V - 2, V - 1] if V > 2048 else [3, V // 2 - 1, V // 2, V - 3, V - 2, V - 1]
    logits[torch.tensor(hot)] = torch.tensor([2.0, 0.2, 0.0, -0.5, 0.5, 1.5, -1.0][-len(hot):])
    return logits


@pytest.mark.parametrize("kw", [{}, {"temperature": 0.7}, {"top_k": 5}, {"top_p": 0.6}])
@pytest.mark.parametrize("V", [2600, 600])
def test_cdf_draws_the_distribution_and_reports_its_log_probs(kw, V):
    from trajtune.engine.decoding import CDF_BLOCK

    logits = _cdf_logits(V)
    assert (logits.numel() % CDF_BLOCK and logits.numel() > 2 * CDF_BLOCK) or logits.numel() < CDF_BLOCK
    scaled = logits / kw.get("temperature", 1.0)
    probs = torch.softmax(filter_logits(scaled[None], kw.get("top_k", 0), kw.get("top_p", 1.0)), -1)[0]
    n, g, counts = 12_000, gen(7), torch.zeros_like(probs)
    for _ in range(2):
        tok, lp = pick_next(logits.expand(n // 2, -1), g, draw="cdf", **kw)
        counts += torch.bincount(tok, minlength=logits.numel())
        assert torch.allclose(lp, probs.log()[tok], atol=1e-5)  # the truncated distribution drawn from, as "race"
    freq = counts / n
    assert (counts[probs == 0] == 0).all()  # a token cut by top-k / top-p is never drawn
    se = (probs * (1 - probs) / n).sqrt()
    assert ((freq - probs).abs() <= 5 * se + 1e-4).all(), (freq - probs).abs().max()
    # a sabotage check of the check: the race's frequencies of another distribution fail it
    other = torch.softmax(logits.roll(1), -1)
    assert not ((freq - other).abs() <= 5 * se + 1e-4).all()


@pytest.mark.parametrize("V", [2600, 600])
def test_cdf_rows_with_own_generators_and_seeds(V):
    logits = torch.stack([_cdf_logits(V, seed=s) for s in range(6)])  # [6, V]
    batched, alone = [gen(30 + b) for b in range(6)], [gen(30 + b) for b in range(6)]
    for _ in range(5):
        tok, lp = pick_next(logits, None, generators=batched, draw="cdf")
        for b in range(6):
            t, l = pick_next(logits[b : b + 1], alone[b], draw="cdf")
            assert int(t) == int(tok[b]) and torch.equal(l, lp[b : b + 1])
    assert all(torch.equal(x.get_state(), y.get_state()) for x, y in zip(batched, alone))
    # one float64 per row and pick: the generator moves as torch.rand(B, dtype=float64) does
    g, h = gen(3), gen(3)
    pick_next(logits, g, draw="cdf")
    torch.rand(6, dtype=torch.float64, generator=h)
    assert torch.equal(g.get_state(), h.get_state())
    # top_k=1 and greedy agree with the argmax
    assert torch.equal(pick_next(logits, gen(1), top_k=1, draw="cdf")[0], logits.argmax(-1))


def test_sample_with_cdf_draw(tiny_model):
    a = sample(tiny_model, PROMPTS, 12, gen(0), stop_ids=[7], draw="cdf")
    assert a == sample(tiny_model, PROMPTS, 12, gen(0), stop_ids=[7], draw="cdf")
    assert a.tokens != sample(tiny_model, PROMPTS, 12, gen(0), stop_ids=[7]).tokens  # another draw than the race
    for p, toks, lps in zip(PROMPTS, a.tokens, a.logprobs):
        ref = torch.log_softmax(tiny_model(torch.tensor([p + toks]))[0, len(p) - 1 : -1], -1)
        assert torch.allclose(torch.tensor(lps), ref.gather(-1, torch.tensor(toks)[:, None]).squeeze(-1), atol=1e-5)
    together = sample(tiny_model, PROMPTS, 12, stop_ids=[7], generators=[gen(20 + b) for b in range(3)], draw="cdf")
    for b, p in enumerate(PROMPTS):
        assert (sample(tiny_model, [p], 12, stop_ids=[7], generators=[gen(20 + b)], draw="cdf").tokens[0]
                == together.tokens[b])
    with pytest.raises(ValueError, match="draw must be one of"):
        sample(tiny_model, PROMPTS, 3, gen(0), draw="gumbel")


def test_engine_sample_is_the_sampler_in_eval_mode_and_restores_the_mode(tiny_model):
    from trajtune.engine import make_engine

    engine = make_engine(tiny_model.train())
    prompts = [[1, 2, 3], [4, 5]]
    seen = []
    engine.model.blocks[0].register_forward_hook(lambda m, i, o: seen.append(m.training))
    ours = engine.sample(prompts, 4, torch.Generator().manual_seed(3), temperature=0.8, pad_id=7)
    assert seen and not any(seen) and engine.model.training  # sampled in eval mode, left in train mode
    theirs = sample(tiny_model.eval(), prompts, 4, torch.Generator().manual_seed(3), temperature=0.8, pad_id=7)
    assert ours == theirs
    assert engine.sample(prompts, 4, torch.Generator().manual_seed(3), backend="sampler", temperature=0.8,
                         pad_id=7) == theirs


def test_engine_sample_names_the_backends_it_has(tiny_model):
    from trajtune.engine import make_engine

    engine = make_engine(tiny_model)
    with pytest.raises(ValueError, match=r"backend='vllm'; choose one of \['sampler', 'generate'\]"):
        engine.sample([[1, 2]], 2, backend="vllm")
    with pytest.raises(ValueError, match='backend="generate" needs a Hugging Face model .* not a TinyTransformer'):
        engine.sample([[1, 2]], 2, backend="generate")
