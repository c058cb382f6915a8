"""One log-prob convention (issue 29): a sampled token's recorded log-prob is its log-prob under the
distribution it was drawn from -- logits / temperature, truncated by top-k / top-p and renormalised -- in every
sampling backend; the trainer reads softmax(logits / T) at the batch's temperature (`Batch.temperature`), so
on-policy the importance ratio is 1 and the truncation is corrected by pi_T / mu."""

import functools
import json

import pytest
import torch

from trajtune.engine import make_engine
from trajtune.engine import decoding
from trajtune.engine.decoding import filter_logits, pick_next, sample
from trajtune.logprobs import TokenHead, token_log_probs
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.runs.resume import trajectories_from_json, trajectories_to_json
from trajtune.trajectory import Owner, Trajectory, collate
from trajtune.sources.sampler import Decoder, SamplerSettings

T, TOP_K, TOP_P, N = 0.7, 5, 0.9, 20_000
LOGITS = torch.tensor([2.0, 1.6, 1.3, 1.1, 0.4, 0.9, -0.5, 0.0, -1.0, 0.2, -2.0, 0.6])  # V = 12
"""at T = 0.7 top-k 5 keeps tokens 0, 1, 2, 3, 5 and the 0.9 nucleus of those cuts token 5 as well"""


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def check_draws(tok: torch.Tensor, lp: torch.Tensor) -> None:
    """tok [N], recorded lp [N] of one context: (a) one log-prob per token, (b) they sum to 1 over the tokens
    drawn, (c) the counts fit N x exp(log-prob) (chi-square, p > 1e-3)."""
    seen = torch.unique(tok)
    recorded = torch.stack([lp[tok == t][0] for t in seen]).double()  # [k]
    for t, r in zip(seen, recorded):
        assert torch.allclose(lp[tok == t].double(), r, atol=1e-5, rtol=0), f"token {int(t)}: several log-probs"
    assert abs(float(recorded.exp().sum()) - 1) < 1e-5, recorded.exp().sum()
    assert p_value(tok, seen, recorded) > 1e-3


def p_value(tok: torch.Tensor, seen: torch.Tensor, logp: torch.Tensor) -> float:
    counts = torch.stack([(tok == t).sum() for t in seen]).double()
    expected = len(tok) * logp.exp()
    chi2 = ((counts - expected) ** 2 / expected).sum()
    df = torch.tensor(len(seen) - 1, dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, chi2 / 2))


@pytest.mark.parametrize("how", ["race", "cdf", "cdf-blocks"])
def test_the_samplers_record_the_truncated_distribution(how, monkeypatch):
    if how == "cdf-blocks":
        monkeypatch.setattr(decoding, "CDF_BLOCK", 4)  # V = 12: the two-level search over 3 blocks
    tok, lp = pick_next(LOGITS.expand(N, -1), gen(1), temperature=T, top_k=TOP_K, top_p=TOP_P,
                        draw="race" if how == "race" else "cdf")
    assert set(torch.unique(tok).tolist()) == {0, 1, 2, 3}
    check_draws(tok, lp)
    # per-row generators draw from the same distribution and record the same log-probs
    rows = [gen(100 + b) for b in range(64)]
    t2, l2 = pick_next(LOGITS.expand(64, -1), None, temperature=T, top_k=TOP_K, top_p=TOP_P, generators=rows,
                       draw="race" if how == "race" else "cdf")
    for t, l in zip(t2.tolist(), l2.tolist()):
        assert abs(l - float(lp[tok == t][0])) < 1e-5


def test_the_old_untruncated_log_probs_fail_the_check():
    # what the samplers recorded before: log softmax(logits / T), ignoring the cut -- not a distribution over
    # the tokens drawn, and the counts do not fit them (so the check above can fail)
    tok, _ = pick_next(LOGITS.expand(N, -1), gen(1), temperature=T, top_k=TOP_K, top_p=TOP_P)
    seen = torch.unique(tok)
    old = torch.log_softmax(LOGITS / T, -1)[seen].double()
    assert float(old.exp().sum()) < 0.99  # (b) fails
    assert p_value(tok, seen, old) < 1e-3  # (c) fails
    assert p_value(tok, seen, old - old.exp().sum().log()) > 1e-3  # renormalised over the cut: they fit


def test_without_a_filter_the_log_probs_are_unchanged():
    # bit for bit what the samplers recorded before the convention: log softmax(logits / T) gathered
    logits = torch.randn(16, 50, generator=gen(2)) * 3
    for draw in ("race", "cdf"):
        for temp in (1.0, 0.7):
            tok, lp = pick_next(logits, gen(3), temperature=temp, draw=draw)
            scaled = logits if temp == 1.0 else logits / temp
            if draw == "race":
                assert torch.equal(lp, torch.log_softmax(scaled, -1).gather(-1, tok[:, None]).squeeze(-1))
            else:
                assert torch.allclose(lp, torch.log_softmax(scaled, -1).gather(-1, tok[:, None]).squeeze(-1),
                                      atol=1e-6)
    tok, lp = pick_next(logits, None, temperature=0.5, greedy=True)  # greedy: the logits' own log-probs
    assert torch.equal(lp, torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1))


def test_hf_generate_records_the_truncated_distribution(tmp_path):
    pytest.importorskip("transformers")
    from trajtune.engine.generate import generate
    from trajtune.models.hf import load_policy
    from trajtune.models.hf_random import make_random_model

    policy = load_policy(make_random_model(tmp_path / "m", "llama", "tiny")).eval()
    prompt = [1, 30, 40, 50]
    toks, lps = [], []
    for seed in range(4):  # 4 x 5,000 rows of one prompt: one context, N draws
        out = generate(policy, [prompt] * (N // 4), 1, gen(seed), temperature=T, top_k=TOP_K, top_p=TOP_P, pad_id=0)
        toks += [t[0] for t in out.tokens]
        lps += [lp[0] for lp in out.logprobs]
    tok, lp = torch.tensor(toks), torch.tensor(lps)
    assert 2 <= len(torch.unique(tok)) <= TOP_K
    check_draws(tok, lp)
    # and they are the truncated distribution of the model's logits at that context
    with torch.no_grad():
        logits = policy(torch.tensor([prompt]))[0, -1].float()
    cut = torch.log_softmax(filter_logits((logits / T)[None], TOP_K, TOP_P), -1)[0]
    assert torch.allclose(lp, cut[tok], atol=1e-4)


# --- the trainer's side: log-probs of logits / batch.temperature -------------------------------------------------
def tiny():
    torch.manual_seed(0)
    return TinyTransformer(TinyConfig(vocab_size=40, dim=32, n_layers=2, n_heads=4, max_len=64))


def batch_at(temperature: float):
    g = gen(5)
    trajs = []
    for b, n in enumerate((9, 12, 7)):
        t = Trajectory(temperature=temperature)
        t.append([b + 1, *torch.randint(3, 40, (3,), generator=g).tolist()], Owner.PROMPT, 0)
        t.append(torch.randint(3, 40, (n - 4,), generator=g).tolist(), Owner.POLICY, 0, [-1.0] * (n - 4))
        trajs.append(t)
    return collate(trajs, 0)


@pytest.mark.parametrize("chunk", [0, 4])
@pytest.mark.parametrize("head_positions", ["all", "actions"])
def test_the_engine_reads_the_batch_temperature(chunk, head_positions):
    model = tiny()
    batch = batch_at(T)
    assert batch.temperature == T and batch.select([2, 0]).temperature == T and batch.trim().temperature == T
    assert batch.with_extras(x=torch.zeros(3)).to("cpu").temperature == T
    engine = make_engine(model, logits_chunk=chunk, head_positions=head_positions)
    with torch.no_grad():
        logits = model.eval()(batch.ids, attention_mask=batch.attention_mask)
    want = token_log_probs(logits / T, batch.ids)  # [B, T-1]
    mask = batch.action_mask.bool()
    out = engine.forward(batch, entropy=True, positions="actions")
    assert torch.allclose(out.logprobs[mask], want[mask], atol=1e-5)
    assert out.entropy is not None
    p = torch.softmax(logits[:, :-1] / T, -1)
    assert torch.allclose(out.entropy[mask], -(p * p.log()).sum(-1)[mask], atol=1e-4)
    if head_positions == "all":
        assert torch.allclose(engine.forward(batch).logprobs, want, atol=1e-5)
        assert torch.allclose(engine.forward(batch, logits=True).logits, logits / T, atol=1e-5)


def test_temperature_1_is_bit_identical_and_the_chunked_gradient_is_the_unchunked():
    model = tiny().eval()
    batch = batch_at(1.0)
    with torch.no_grad():
        logits = model(batch.ids, attention_mask=batch.attention_mask)
    assert torch.equal(make_engine(model, logits_chunk=0).forward(batch).logprobs, token_log_probs(logits, batch.ids))
    # the chunked head at T: the same values and gradients as the whole logits / T
    grads = []
    for chunk in (0, 4):
        model.zero_grad()
        out = model(batch.ids, attention_mask=batch.attention_mask, head=TokenHead(batch.ids, chunk, temperature=T))
        (out.logprobs * batch.action_mask).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(*grads, strict=True))
    with pytest.raises(ValueError, match="temperature must be"):
        TokenHead(batch.ids, temperature=0.0)


@pytest.mark.parametrize("draw", ["race", "cdf"])
def test_on_policy_the_ratio_is_1(draw):
    from trajtune.envs.arithmetic import arithmetic_env, arithmetic_tokenizer, make_tasks
    from trajtune.sources.rollout import rollout_batch
    from trajtune.text.render import Renderer

    tok = arithmetic_tokenizer()
    torch.manual_seed(0)
    model = TinyTransformer(TinyConfig(vocab_size=tok.vocab_size, dim=32, n_layers=2, n_heads=4, max_len=64)).eval()
    tasks = make_tasks("heldout")[:6]
    policy = functools.partial(sample, model, pad_id=tok.pad_id)
    trajs = rollout_batch(Decoder(policy, SamplerSettings(max_new_tokens=6, temperature=T, draw=draw)),
                          [arithmetic_env() for _ in tasks], tasks, Renderer(tok), gen(4), max_tokens=60)
    assert all(t.temperature == T for t in trajs)
    batch = collate(trajs, tok.pad_id)
    assert batch.temperature == T
    mask = batch.action_mask.bool()
    lp = make_engine(model, logits_chunk=0).forward(batch).logprobs
    assert mask.sum() > 10 and torch.allclose(lp[mask], batch.old_logprobs[mask], atol=1e-5)
    greedy = rollout_batch(Decoder(policy, SamplerSettings(temperature=T, greedy=True)), [arithmetic_env()], tasks[:1],
                           Renderer(tok), None, max_tokens=60)
    assert greedy[0].temperature == 1.0


def test_the_temperature_travels_and_a_mixed_batch_is_refused():
    t = Trajectory([1, 2, 3], [1, 2, 2], [0, 0, 0], temperature=0.7)
    (back,) = trajectories_from_json(json.loads(json.dumps(trajectories_to_json([t]))))
    assert back.temperature == 0.7
    row = trajectories_to_json([t])[0]
    del row["temperature"]  # a file written before the field: temperature 1
    assert trajectories_from_json([row])[0].temperature == 1.0
    u = Trajectory([4, 5, 6], [1, 2, 2], [0, 0, 0])
    with pytest.raises(ValueError, match=r"different temperatures \(0\.7 and 1\)"):
        collate([t, u], 0)
    with pytest.raises(ValueError, match="temperature must be"):
        Trajectory(temperature=0.0)


@pytest.mark.parametrize("flags, says", [(["--top-k", "-1"], "--top-k must be >= 0"),
                                         (["--top-p", "0"], "--top-p must be > 0"),
                                         (["--top-p", "1.5"], "--top-p must be in (0, 1]")])
def test_grpo_checks_top_k_and_top_p(tmp_path, capsys, flags, says):
    from trajtune.cli import main

    assert main(["grpo", "--model", str(tmp_path), "--data", "d.jsonl", "--reward", "r.py:f",
                 "--out", str(tmp_path / "o"), *flags]) == 2
    assert says in capsys.readouterr().err
