"""The Hugging Face adapter: same logits as the HF model, left padding + KV cache, LoRA reference
without a copy, saving in the HF format, the two generation backends, engine micro-batching."""

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from transformers import AutoModelForCausalLM  # noqa: E402

from trajtune.algorithms.sft import sft_loss_fn  # noqa: E402
from trajtune.engine import make_engine  # noqa: E402
from trajtune.models.hf import AdaptersOff, LoraSettings, ModelPathError, load_policy, load_tokenizer  # noqa: E402
from trajtune.models.hf_random import make_random_model  # noqa: E402
from trajtune.engine.decoding import sample  # noqa: E402
from trajtune.trajectory import Owner, Trajectory, collate, micro_batches, pair_batch  # noqa: E402


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_dir(request, tmp_path_factory):
    return make_random_model(tmp_path_factory.mktemp(request.param) / "m", request.param, "tiny")


def _traj(ids, n_prompt):
    t = Trajectory()
    t.append(ids[:n_prompt], Owner.PROMPT, 0)
    t.append(ids[n_prompt:], Owner.POLICY, 0)
    return t


def test_logits_match_hf_and_left_padding_and_cache_agree(model_dir):
    policy = load_policy(model_dir).eval()
    raw = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
    ids = torch.randint(5, 200, (2, 9))
    with torch.no_grad():
        assert torch.allclose(policy(ids), raw(input_ids=ids).logits, atol=1e-5)
        # right-padded row 1 (training batches) gives the same logits on its real tokens
        mask = torch.ones_like(ids, dtype=torch.bool)
        mask[1, 6:] = False
        assert torch.allclose(policy(ids, mask)[1, :6], policy(ids[1:, :6])[0], atol=1e-5)
    prompts = [ids[0, :7].tolist(), ids[1, :3].tolist()]  # different lengths: left padding in the sampler
    a = sample(policy, prompts, 6, torch.Generator().manual_seed(1))
    b = sample(policy, prompts, 6, torch.Generator().manual_seed(1), use_cache=False)
    assert a.tokens == b.tokens
    assert max(abs(x - y) for u, v in zip(a.logprobs, b.logprobs) for x, y in zip(u, v)) < 1e-4
    # the sampler's log-probs are the training forward's log-probs of the same tokens
    traj = _traj(prompts[1] + a.tokens[1], len(prompts[1]))
    out = make_engine(policy).forward(collate([traj], 0))
    assert torch.allclose(out.logprobs[0, -6:], torch.tensor(a.logprobs[1]), atol=1e-4)


def test_sampler_and_generate_backends_return_the_same_data(model_dir):
    tok = load_tokenizer(model_dir)
    engine = make_engine(load_policy(model_dir))
    prompts = [[1, 30, 40, 50], [1, 60]]
    kw = dict(greedy=True, stop_ids=(tok.eos_token_id,))
    s = engine.sample(prompts, 5, torch.Generator().manual_seed(0), **kw)
    g = engine.sample(prompts, 5, torch.Generator().manual_seed(0), backend="generate", pad_id=tok.pad_token_id, **kw)
    assert s.tokens == g.tokens and s.stopped == g.stopped
    assert max(abs(x - y) for u, v in zip(s.logprobs, g.logprobs) for x, y in zip(u, v)) < 1e-4
    g1 = engine.sample(prompts, 5, torch.Generator().manual_seed(3), backend="generate")
    g2 = engine.sample(prompts, 5, torch.Generator().manual_seed(3), backend="generate")
    assert g1.tokens == g2.tokens and engine.model.training  # seeded; the engine's train mode is restored


def test_lora_reference_is_the_base_without_a_copy_and_save_loads(model_dir, tmp_path):
    policy = load_policy(model_dir, lora=LoraSettings(r=4))
    trainable = policy.num_parameters(trainable=True)
    assert 0 < trainable < policy.num_parameters() // 2
    engine = make_engine(policy, micro_batch_size=2)
    ref = engine.reference_engine()
    assert isinstance(ref.model, AdaptersOff) and sum(p.numel() for p in ref.model.parameters()) == 0
    trajs = [_traj(list(range(5, 15)), 4), _traj(list(range(20, 28)), 3), _traj(list(range(30, 36)), 2)]
    batch = collate(trajs, 0)
    base_logp = ref.forward(batch).logprobs
    for _ in range(3):
        engine.forward_backward(batch, sft_loss_fn())
        engine.optim_step()
    mask = batch.action_mask
    assert not torch.allclose(engine.forward(batch).logprobs * mask, base_logp * mask)
    assert torch.allclose(ref.forward(batch).logprobs * mask, base_logp * mask)  # still the base weights
    assert not isinstance(engine.reference_engine().model, AdaptersOff)  # trained adapters: a real copy
    out = policy.save_pretrained(tmp_path / "out", load_tokenizer(model_dir))
    merged = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=batch.ids).logits, policy.eval()(batch.ids), atol=1e-4)
    assert (out / "adapter" / "adapter_config.json").exists()


def test_value_head_saved_and_restored(model_dir, tmp_path):
    policy = load_policy(model_dir, value_head=True)
    ids = torch.randint(5, 200, (2, 6))
    with torch.no_grad():
        v = policy.values(ids)
    assert v.shape == (2, 6)
    policy.save_pretrained(tmp_path / "rm")
    with torch.no_grad():
        assert torch.allclose(load_policy(tmp_path / "rm", value_head=True).values(ids), v, atol=1e-5)


def test_missing_or_non_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelPathError, match="no such directory or file; a model is a local Hugging Face folder"):
        load_policy(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelPathError, match="not a Hugging Face model directory"):
        load_policy(tmp_path / "empty")


def test_a_model_directory_without_a_tokenizer_says_so(model_dir, tmp_path):
    import shutil
    from pathlib import Path

    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(Path(model_dir) / "config.json", bare)
    with pytest.raises(ModelPathError, match=r"bare: no tokenizer in the directory \(no tokenizer.json, .*"
                                             r"tokenizer.save_pretrained"):
        load_tokenizer(bare)  # was transformers' advice to install sentencepiece or tiktoken
    assert load_tokenizer(model_dir).pad_token_id is not None


def test_micro_batches_keep_pairs_and_match_the_full_batch_gradient(model_dir):
    trajs = [_traj(list(range(5 + i, 12 + 2 * i)), 3) for i in range(4)]
    assert ([c.tolist() for c in micro_batches(pair_batch(list(zip(trajs, trajs)), 0), 4)]
            == [[0, 1, 4, 5], [2, 3, 6, 7]])
    assert [c.tolist() for c in micro_batches(collate(trajs + trajs[:1], 0), 2)] == [[0, 1], [2, 3], [4]]
    grads = []
    for mbs in (0, 2):
        torch.manual_seed(0)
        engine = make_engine(load_policy(model_dir), micro_batch_size=mbs)
        m = engine.forward_backward(pair_batch(list(zip(trajs[:2], trajs[2:])), 0), sft_loss_fn("sequence"))
        grads.append(torch.cat([p.grad.flatten() for p in engine.model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)
    assert m["loss"] > 0


def test_bf16_autocast_and_gradient_checkpointing_train(model_dir):
    engine = make_engine(load_policy(model_dir, gradient_checkpointing=True), autocast="bf16")
    batch = collate([_traj(list(range(5, 15)), 4)] * 2, 0)
    first = engine.forward_backward(batch, sft_loss_fn())["loss"]
    engine.optim_step()
    assert torch.isfinite(torch.tensor(first))
    with pytest.raises(ValueError, match="autocast"):
        make_engine(load_policy(model_dir), autocast="int8")


def test_a_reward_model_loads_as_a_sequence_classifier_with_its_head(model_dir, tmp_path):
    """save_pretrained of a value-head policy: AutoModelForSequenceClassification loads the trained head (not a
    random one) and scores rows as trajtune's last_token_values does; AutoModelForCausalLM still loads it."""
    from transformers import AutoModelForSequenceClassification

    from trajtune.objectives.reward_model import last_token_values

    tok = load_tokenizer(model_dir)
    torch.manual_seed(1)
    policy = load_policy(model_dir, value_head=True, lora=LoraSettings(r=4))
    torch.nn.init.normal_(policy.value.weight)  # a trained head: far from any initialisation
    out = policy.save_pretrained(tmp_path / "rm", tok)
    trajs = [_traj(list(range(5, 15)), 4), _traj(list(range(20, 26)), 3), _traj(list(range(30, 38)), 2)]
    batch = collate(trajs, tok.pad_token_id)  # right-padded with the pad token
    with torch.no_grad():
        ours = last_token_values(policy.eval().values(batch.ids, batch.attention_mask), batch.attention_mask)
        classifier = AutoModelForSequenceClassification.from_pretrained(out, local_files_only=True).eval()
        theirs = classifier(input_ids=batch.ids, attention_mask=batch.attention_mask.long()).logits
    assert classifier.config.num_labels == 1 and theirs.shape == (3, 1)
    assert torch.allclose(theirs.squeeze(-1), ours, atol=1e-4)
    assert classifier.config.architectures[0].endswith("ForSequenceClassification")
    with torch.no_grad():  # the causal LM and trajtune's own loader read the same directory
        lm = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
        assert torch.allclose(lm(input_ids=batch.ids).logits, policy(batch.ids), atol=1e-4)
        again = load_policy(out, value_head=True).eval()
        assert torch.allclose(last_token_values(again.values(batch.ids, batch.attention_mask), batch.attention_mask),
                              ours, atol=1e-4)


def test_lora_defaults_are_trl_s_and_dropout_can_be_disabled(model_dir):
    """TRL's ModelConfig defaults: lora_dropout 0.05 and peft's target modules of the architecture
    (q_proj, v_proj for Llama / Qwen2); "all-linear" and named layers as asked; --disable-dropout zeroes them."""

    def adapted(policy):
        return {n.split(".")[-3] for n, _ in policy.model.named_modules() if n.endswith("lora_A.default")}

    def dropouts(policy):
        return {m.p for m in policy.modules() if isinstance(m, torch.nn.Dropout)}

    default = load_policy(model_dir, lora=LoraSettings(r=4))
    assert adapted(default) == {"q_proj", "v_proj"} and dropouts(default) == {0.05}
    assert adapted(load_policy(model_dir, lora=LoraSettings(r=4, target_modules="all-linear"))) == \
        {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    off = load_policy(model_dir, lora=LoraSettings(r=4, target_modules=["o_proj"]), disable_dropout=True)
    assert adapted(off) == {"o_proj"} and dropouts(off) == {0.0}
