"""trajtune.tinker.sampling: sampler weight snapshots of a trained model, checked at every save, sampled with
Tinker's sampling parameters (a tiny random HF Llama, full fine-tune and LoRA)."""

import threading

import pytest
import torch

from trajtune.engine import Loss, OptimConfig, make_engine
from trajtune.models.hf import LoraSettings, load_policy, load_tokenizer
from trajtune.models.hf_random import make_random_model
from trajtune.objectives.sft import sft_loss
from trajtune.sources.sync import SyncError
from trajtune.tinker import sampling
from trajtune.tinker.sampling import MissingSnapshot, SamplerWeights
from trajtune.trajectory import Owner, Trajectory, collate

SFT = Loss(lambda out, b: sft_loss(out.logprobs, b.action_mask), "token")
PROMPT = [5, 17, 42, 8]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_random_model(tmp_path_factory.mktemp("tiny") / "llama", "llama", "tiny")


def make(model_dir, lora=False, **kw):
    policy = load_policy(model_dir, lora=LoraSettings(r=4, dropout=0.0) if lora else None)
    engine = make_engine(policy, OptimConfig(lr=0.05 if lora else 0.01))
    tok = load_tokenizer(model_dir)
    return engine, SamplerWeights(engine, pad_id=tok.pad_token_id, decode=tok.decode, tolerance=1e-4, **kw), tok


def batch_of(rows):
    return collate([Trajectory(ids=list(r), owners=[int(Owner.POLICY)] * len(r), turns=[0] * len(r)) for r in rows],
                   0, temperature=1.0)


def train_step(engine, rows=([3, 9, 27, 81, 4, 12],)):
    engine.forward_backward(batch_of(rows), SFT)
    engine.optim_step()


def forward_logprobs(engine, prompt, tokens, temperature=1.0):
    """The trainer's log-probs of `tokens` after `prompt` -> [n]."""
    import dataclasses
    b = dataclasses.replace(batch_of([list(prompt) + list(tokens)]), temperature=temperature)
    return engine.forward(b).logprobs[0, len(prompt) - 1:]


def draw(weights, key, n=3, **kw):
    args = dict(max_tokens=6, temperature=1.0, top_k=0, top_p=1.0, stop_ids=(), stop_strings=(), seed=11)
    return weights.sample(key, PROMPT, n, **{**args, **kw})


def test_a_snapshot_keeps_its_weights_while_the_trainer_moves_on(model_dir):
    engine, weights, _ = make(model_dir)
    train_step(engine)
    metrics = weights.save("a", [[3, 9, 27, 81, 4, 12]])
    assert set(metrics) == {"sync/logprob_diff", "sync/logprob_diff_mean"} and metrics["sync/logprob_diff"] <= 1e-4
    old = [forward_logprobs(engine, PROMPT, t) for t, _, _ in draw(weights, "a")]
    for _ in range(3):
        train_step(engine)
    weights.save("b", [])
    for t, lp, stopped in draw(weights, "a"):  # the old weights' distribution, not the trainer's now
        assert not stopped and len(t) == 6
        mine = forward_logprobs(engine, PROMPT, t)
        assert not torch.allclose(mine, torch.tensor(lp), atol=1e-3)
    for (t, lp, _), before in zip(draw(weights, "a"), old):
        assert torch.allclose(before, torch.tensor(lp), atol=1e-5)
    for t, lp, _ in draw(weights, "b"):  # the new key: the trainer's weights now
        assert torch.allclose(forward_logprobs(engine, PROMPT, t), torch.tensor(lp), atol=1e-5)


def test_base_weights_are_the_ones_before_training(model_dir):
    engine, weights, _ = make(model_dir)
    before = [forward_logprobs(engine, PROMPT, t) for t, _, _ in draw(weights, None)]
    train_step(engine)
    weights.save("a", [])
    for (t, lp, _), b in zip(draw(weights, None), before):
        assert torch.allclose(b, torch.tensor(lp), atol=1e-5)
    lps = weights.prompt_logprobs(None, PROMPT + [7, 7])
    train_free = make(model_dir)[0]
    assert lps[0] is None and torch.allclose(torch.tensor(lps[1:]), forward_logprobs(train_free, PROMPT[:1],
                                                                                       PROMPT[1:] + [7, 7]), atol=1e-5)


def test_processed_logprobs_with_temperature_top_k_top_p(model_dir):
    engine, weights, _ = make(model_dir)
    weights.save("a", [])
    for t, lp, _ in draw(weights, "a", temperature=0.7, top_k=5):
        logits = forward_logits(engine, PROMPT, t)  # [n, V]: logits predicting each new token
        scaled = logits / 0.7
        kth = torch.topk(scaled, 5, dim=-1).values[:, -1:]
        processed = torch.log_softmax(scaled.masked_fill(scaled < kth, float("-inf")), -1)
        want = processed.gather(-1, torch.tensor(t)[:, None]).squeeze(-1)
        assert torch.allclose(want, torch.tensor(lp), atol=1e-5)
    for t, lp, _ in draw(weights, "a", temperature=1.3, top_p=0.5):
        assert all(x <= 0 for x in lp) and len(t) == 6
    greedy = draw(weights, "a", temperature=0.0, seed=1)
    assert greedy == draw(weights, "a", temperature=0.0, seed=2)  # greedy: the seed does not matter
    t = greedy[0][0]
    assert t == forward_logits(engine, PROMPT, t).argmax(-1).tolist()
    assert torch.allclose(forward_logprobs(engine, PROMPT, t), torch.tensor(greedy[0][1]), atol=1e-5)


def forward_logits(engine, prompt, tokens):
    b = batch_of([list(prompt) + list(tokens)])
    return engine.forward(b, logits=True).logits[0, len(prompt) - 1:-1]


def test_same_seed_same_samples_and_unseeded_calls_differ(model_dir):
    _, weights, _ = make(model_dir, seed=3)
    assert draw(weights, None, n=4) == draw(weights, None, n=4)
    assert draw(weights, None, n=4) != draw(weights, None, n=4, seed=12)
    assert draw(weights, None, seed=None) != draw(weights, None, seed=None)
    a, b = make(model_dir, seed=3)[1], make(model_dir, seed=3)[1]  # the k-th unseeded call: the same stream
    assert [draw(a, None, seed=None) for _ in range(2)] == [draw(b, None, seed=None) for _ in range(2)]


def test_stop_ids_and_stop_strings(model_dir):
    _, weights, tok = make(model_dir)
    rows = draw(weights, None, n=4, max_tokens=12)
    first = rows[0][0]
    stop = first[3]
    for t, lp, stopped in draw(weights, None, n=4, max_tokens=12, stop_ids=[stop]):
        assert len(t) == len(lp)
        assert (stopped and t[-1] == stop and stop not in t[:-1]) or (not stopped and len(t) == 12 and stop not in t)
    text = tok.decode(first)
    n = next(n for n in range(1, len(first) + 1) if tok.decode(first[:n]).strip())  # the first visible text
    s = tok.decode(first[:n]).strip()[-1]
    cut = next(n for n in range(1, len(first) + 1) if s in tok.decode(first[:n]))
    t, lp, stopped = draw(weights, None, n=4, max_tokens=12, stop_strings=["\x00never", s])[0]
    assert s in text and stopped and t == first[:cut] and lp == rows[0][1][:cut]
    assert draw(weights, None, n=4, max_tokens=12, stop_strings=["\x00never"])[0] == (first, rows[0][1], False)


def test_a_lora_snapshot_holds_the_adapters_only_and_samples_as_the_trainer(model_dir):
    engine, weights, _ = make(model_dir, lora=True)
    assert weights.names and all("lora_A" in n or "lora_B" in n for n in weights.names)
    train_step(engine)
    train_step(engine)
    metrics = weights.save("a", [[3, 9, 27, 81, 4, 12]])
    assert set(weights.snapshot("a")) == weights.names and metrics["sync/logprob_diff"] <= 1e-4
    for t, lp, _ in draw(weights, "a"):
        assert torch.allclose(forward_logprobs(engine, PROMPT, t), torch.tensor(lp), atol=1e-5)
    base = [lp for _, lp, _ in draw(weights, None)]
    assert base != [lp for _, lp, _ in draw(weights, "a")]


def test_a_load_that_skips_a_tensor_fails_the_check_naming_it(model_dir, monkeypatch):
    engine, weights, _ = make(model_dir)
    weights.save("a", [])
    train_step(engine)
    skipped = sorted(weights.names)[3]

    def skipping(params, snap):
        with torch.no_grad():
            for name, tensor in snap.items():
                if name != skipped:
                    params[name].copy_(tensor)

    monkeypatch.setattr(sampling, "copy_into", skipping)
    with pytest.raises(SyncError, match=skipped.replace(".", r"\.")):
        weights.save("b", [[3, 9, 27, 81, 4, 12]])
    with pytest.raises(MissingSnapshot, match="no sampler weights were saved as 'b'"):
        draw(weights, "b")


def test_eviction_keeps_the_newest_unnamed_and_every_named(model_dir):
    _, weights, _ = make(model_dir, keep=2)
    weights.save("named", [], named=True)
    for k in ("s0", "s1", "s2"):
        weights.save(k, [])
    assert weights.keys() == ["named", "s1", "s2"]
    with pytest.raises(MissingSnapshot, match="'s0' were evicted: only the newest 2"):
        draw(weights, "s0")
    with pytest.raises(MissingSnapshot, match="no sampler weights were saved as 'zz'"):
        weights.prompt_logprobs("zz", PROMPT)
    assert draw(weights, "named") == draw(weights, "s2")  # the weights did not move
    weights.forget("named")
    with pytest.raises(MissingSnapshot, match="deleted"):
        draw(weights, "named")


def test_write_read_round_trip(model_dir, tmp_path):
    engine, weights, _ = make(model_dir, lora=True)
    train_step(engine)
    weights.save("final", [], named=True)
    weights.write("final", tmp_path / "final")
    want = draw(weights, "final")
    engine2, restarted, _ = make(model_dir, lora=True)  # a new server: the trainer's weights are the base's
    restarted.read("final", tmp_path / "final")
    assert draw(restarted, "final") == want and draw(restarted, None) != want
    other = tmp_path / "full"
    make(model_dir)[1].write(None, other)
    with pytest.raises(Exception, match="not this model's sampler weights"):
        restarted.read("x", other)


def test_prompt_logprobs_equal_the_forward(model_dir):
    engine, weights, _ = make(model_dir)
    train_step(engine)
    weights.save("a", [])
    lps = weights.prompt_logprobs("a", PROMPT)
    assert lps[0] is None and len(lps) == len(PROMPT)
    assert torch.allclose(torch.tensor(lps[1:]), forward_logprobs(engine, PROMPT[:1], PROMPT[1:]), atol=1e-5)
    assert weights.prompt_logprobs("a", [5]) == [None]


def test_bad_requests_are_one_clear_error(model_dir):
    _, weights, _ = make(model_dir)
    with pytest.raises(ValueError, match="more than the model's context of 512"):
        draw(weights, None, max_tokens=600)
    with pytest.raises(ValueError, match="prompt: empty"):
        weights.sample(None, [], 1, max_tokens=2, temperature=1.0)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        weights.sample(None, [10**6], 1, max_tokens=2, temperature=1.0)
    with pytest.raises(ValueError, match="temperature"):
        draw(weights, None, temperature=-1.0)


def test_samples_in_other_threads_never_see_a_half_loaded_copy(model_dir):
    engine, weights, _ = make(model_dir)
    weights.save("a", [])
    want = draw(weights, "a", n=2)
    got: list = []
    reader = threading.Thread(target=lambda: got.extend(draw(weights, "a", n=2) for _ in range(4)))
    reader.start()
    for k in range(3):  # the trainer's thread: train, save (each save loads its snapshot into the copy)
        train_step(engine)
        weights.save(f"s{k}", [])
    reader.join()
    assert got == [want] * 4
