"""Multi-turn data as TRL 1.16 trains it, on the same tiny model: assistant turns inside a conversational
`prompt` are context (never trained or scored); only the completion is. Each case is checked token-exactly
against `tokenizer.apply_chat_template` and against what TRL's own trainer builds from the same row (its
tokenized dataset, masks and log-probs), and the loss's gradient against TRL's loss's on the same weights.

The tests read the model from the `model_dir` fixture: tests/real_model/test_trl_parity_real.py collects the same
functions with its own `model_dir`, the real model."""

from dataclasses import replace

import pytest

pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

import torch  # noqa: E402

from trajtune.sources import data as D  # noqa: E402
from trajtune.algorithms.dpo import DPOConfig, preference_loss_fn, summed_logps, with_reference  # noqa: E402
from trajtune.algorithms.rl import RLConfig, rl_loss  # noqa: E402
from trajtune.algorithms.sft import sft_loss_fn  # noqa: E402
from trajtune.engine import make_engine  # noqa: E402
from trajtune.experiments.hf.sft import eval_loss  # noqa: E402
from trajtune.models.hf import load_policy, load_tokenizer  # noqa: E402
from trajtune.models.hf_random import make_random_model  # noqa: E402
from trajtune.objectives.inputs import PGInputs  # noqa: E402
from trajtune.text.chat import ChatRenderer  # noqa: E402
from trajtune.trajectory import Owner, Trajectory, collate, pair_batch  # noqa: E402

USER, ASSISTANT = "user", "assistant"
DPO_ROW = {"prompt": [{"role": USER, "content": "what is 10 + 3?"}, {"role": ASSISTANT, "content": "12"},
                      {"role": USER, "content": "no, it is not."}],
           "chosen": [{"role": ASSISTANT, "content": "the answer is 13."}],
           "rejected": [{"role": ASSISTANT, "content": "it is 12."}]}
SFT_ROW = {"prompt": DPO_ROW["prompt"], "completion": DPO_ROW["chosen"]}
GRPO_PROMPT = [{"role": USER, "content": "what is 2 + 3?"}, {"role": ASSISTANT, "content": "6"},
               {"role": USER, "content": "no, try again."}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_random_model(tmp_path_factory.mktemp("parity") / "m", "llama", "tiny")


@pytest.fixture(scope="module")
def tok(model_dir):
    return load_tokenizer(model_dir)


def _args(cls, tmp_path, **kw):
    return cls(output_dir=str(tmp_path), report_to=[], bf16=False, use_cpu=True, **kw)


def _policy_ids(traj):
    return [i for i, o in zip(traj.ids, traj.owners, strict=True) if o == Owner.POLICY]


def after_the_stop(ids: list[int], tok) -> int:
    """How many of a TRL completion's last tokens come after its final stop token (eos, <|im_end|>): the text the
    template writes after a turn ends ("\n" in SmolLM2's ChatML; none in the random models' template), which must be
    whitespace. TRL 1.16 trains them (a completion is everything after the generation prompt); trajtune does not:
    sampling ends at the stop token, so the model is never taught text it cannot write. The checks compare the two
    on the tokens both train."""
    last = max(i for i, t in enumerate(ids) if t == tok.eos_token_id)
    assert tok.decode(ids[last + 1:]).strip() == "", tok.decode(ids[last + 1:])
    return len(ids) - last - 1


GRAD_TOL = 1e-4
"""relative L2 distance between trajtune's and TRL's gradients of the same loss on the same weights (float32:
the two sum the same terms in other orders)"""


def _gradient(model) -> dict[str, torch.Tensor]:
    """A Hugging Face model's gradient, by parameter name (tied weights once); cleared after."""
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def assert_same_gradient(ours, theirs) -> None:
    """trajtune's policy (an `HFPolicy`: its Hugging Face model is `.model`) and TRL's model have gradients on the same
    parameters, equal to GRAD_TOL relative (L2) over the whole gradient; a zero gradient fails."""
    a, b = _gradient(ours.model), _gradient(theirs)
    assert a.keys() == b.keys() and b
    a, b = (torch.cat([g[k].flatten() for k in sorted(b)]) for g in (a, b))
    error = float((a - b).norm() / b.norm())
    assert float(b.norm()) > 0 and error < GRAD_TOL, error


def test_dpo_scores_the_completion_only_as_trl_does(model_dir, tok, tmp_path):
    from transformers import AutoModelForCausalLM

    (chosen, rejected), = D.preference_pairs(D.read_rows([DPO_ROW]), ChatRenderer(tok))
    for traj, side in ((chosen, "chosen"), (rejected, "rejected")):
        whole = tok.apply_chat_template(DPO_ROW["prompt"] + DPO_ROW[side], tokenize=True)
        assert traj.ids == list(whole["input_ids"] if hasattr(whole, "keys") else whole)
    assert tok.decode(_policy_ids(chosen)) == "the answer is 13.<|im_end|>"  # not the prompt's "12<|im_end|>"
    trainer = trl.DPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), args=_args(trl.DPOConfig, tmp_path),
                             train_dataset=datasets.Dataset.from_list([DPO_ROW]), processing_class=tok)
    ex = trainer.train_dataset[0]
    assert chosen.ids == ex["prompt_ids"] + ex["chosen_ids"] and rejected.ids == ex["prompt_ids"] + ex["rejected_ids"]
    trained = {side: ex[f"{side}_ids"][: len(ex[f"{side}_ids"]) - after_the_stop(ex[f"{side}_ids"], tok)]
               for side in ("chosen", "rejected")}
    assert _policy_ids(chosen) == trained["chosen"] and _policy_ids(rejected) == trained["rejected"]
    ex = {**ex, "chosen_ids": trained["chosen"], "rejected_ids": trained["rejected"]}  # TRL on the same tokens
    # the summed log-probs TRL's reference pass computes are trajtune's, on the same weights
    trl_chosen, trl_rejected = trainer.compute_ref_log_probs(trainer.model, trainer.data_collator([ex]))
    batch = pair_batch([(chosen, rejected)], tok.pad_token_id)
    engine = make_engine(load_policy(model_dir))
    ours = summed_logps(engine.forward(batch).logprobs, batch.action_mask)
    assert torch.allclose(ours, torch.cat([trl_chosen, trl_rejected]), atol=1e-4)
    # the sigmoid loss (beta 0.1, TRL's default) and its gradient, at the start (policy = reference)
    config = DPOConfig(beta=trainer.args.beta)
    m = engine.forward_backward(with_reference(engine, [(chosen, rejected)], tok.pad_token_id, config),
                                preference_loss_fn(config))
    trl_loss = trainer.compute_loss(trainer.model.train(), trainer.data_collator([ex]))
    trl_loss.backward()
    assert abs(m["loss"] - float(trl_loss.detach())) < 1e-5
    assert_same_gradient(engine.model, trainer.model)


def test_sft_prompt_completion_trains_the_completion_only_as_trl_does(model_dir, tok, tmp_path):
    from transformers import AutoModelForCausalLM

    (traj,) = D.sft_trajectories(D.read_rows([SFT_ROW]), ChatRenderer(tok))
    whole = tok.apply_chat_template(SFT_ROW["prompt"] + SFT_ROW["completion"], tokenize=True)
    assert traj.ids == list(whole["input_ids"] if hasattr(whole, "keys") else whole)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    trainer = trl.SFTTrainer(model=model, args=_args(trl.SFTConfig, tmp_path),
                             train_dataset=datasets.Dataset.from_list([SFT_ROW]), processing_class=tok)
    ex = trainer.train_dataset[0]
    assert traj.ids == ex["input_ids"]
    tail = after_the_stop(ex["input_ids"], tok)
    ex = {**ex, "labels": ex["labels"][: len(ex["labels"]) - tail] + [-100] * tail}  # TRL on the same tokens
    assert [o == Owner.POLICY for o in traj.owners] == [label != -100 for label in ex["labels"]]
    # TRL's loss on the row (mean NLL over its labels) is trajtune's eval/loss on it
    inputs = trainer.data_collator([ex])
    trl_loss = trainer.compute_loss(model.train(), inputs)
    trl_loss.backward()
    engine = make_engine(load_policy(model_dir))
    ours = eval_loss(engine, [traj], tok.pad_token_id, 8)["eval/loss"]
    assert abs(ours - float(trl_loss.detach())) < 1e-4
    m = engine.forward_backward(collate([traj], tok.pad_token_id), sft_loss_fn("token"))
    assert abs(m["loss"] - float(trl_loss.detach())) < 1e-4
    assert_same_gradient(engine.model, model)


def test_grpo_prompt_with_an_assistant_turn_renders_as_trl_does(model_dir, tok, tmp_path):
    from transformers import AutoModelForCausalLM

    renderer = ChatRenderer(tok)
    transcript = renderer.start(GRPO_PROMPT)  # refused before: an assistant turn in the prompt
    ids = renderer.prompt_ids(transcript)
    reference = tok.apply_chat_template(GRPO_PROMPT, tokenize=True, add_generation_prompt=True)
    assert ids == list(reference["input_ids"] if hasattr(reference, "keys") else reference)
    assert Owner.POLICY not in transcript.traj.owners  # the earlier "6" is context
    trainer = trl.GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir),
                              reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                              args=_args(trl.GRPOConfig, tmp_path, per_device_train_batch_size=2, num_generations=2),
                              train_dataset=datasets.Dataset.from_list([{"prompt": GRPO_PROMPT}]), processing_class=tok)
    (trl_ids,), _, _ = trainer._tokenize_prompts([GRPO_PROMPT])
    assert ids == list(trl_ids)
    # the clipped-ratio loss of two completions of that prompt with advantages +1 / -1, on-policy (old log-probs =
    # the current ones, detached: ratio 1), token mean over the batch (TRL's loss_type 'bnpo', trajtune's aggregation
    # 'token'), and its gradient
    completions = [tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
                   for text in ("5", "it is 6, I think.")]
    trajs = [Trajectory(ids + c, [int(Owner.PROMPT)] * len(ids) + [int(Owner.POLICY)] * len(c),
                        [0] * (len(ids) + len(c))) for c in completions]
    advantages = torch.tensor([1.0, -1.0])
    engine = make_engine(load_policy(model_dir))
    config = RLConfig(advantage="grpo", aggregation="token", surrogate="ppo")
    batch = collate(trajs, tok.pad_token_id)
    batch = replace(batch, pg=PGInputs(advantages, old_logp=engine.forward(batch).logprobs.detach()))
    m = engine.forward_backward(batch, rl_loss(config, use_old=True))
    width = max(len(c) for c in completions)
    completion_ids = torch.tensor([c + [tok.pad_token_id] * (width - len(c)) for c in completions])
    trainer.loss_type, trainer.current_gradient_accumulation_steps = "bnpo", 1  # (set by its training loop)
    trl_loss = trainer._compute_loss(trainer.model.train(), {
        "prompt_ids": torch.tensor([ids, ids]), "prompt_mask": torch.ones(2, len(ids), dtype=torch.long),
        "completion_ids": completion_ids, "advantages": advantages,
        "completion_mask": torch.tensor([[int(i < len(c)) for i in range(width)] for c in completions])})
    trl_loss.backward()
    assert abs(m["loss"] - float(trl_loss.detach())) < 1e-5
    assert_same_gradient(engine.model, trainer.model)
