"""Multi-turn data as TRL 1.16 trains it, on the same tiny model: assistant turns inside a conversational
`prompt` are context (never trained or scored); only the completion is. Each case is checked token-exactly
against `tokenizer.apply_chat_template` and against what TRL's own trainer builds from the same row (its
tokenized dataset, masks and log-probs)."""

import pytest

pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

import torch  # noqa: E402

from trajtune.sources import data as D  # noqa: E402
from trajtune.algorithms.dpo import summed_logps  # noqa: E402
from trajtune.engine import make_engine  # noqa: E402
from trajtune.experiments.hf.sft import eval_loss  # noqa: E402
from trajtune.models.hf import load_policy, load_tokenizer  # noqa: E402
from trajtune.models.hf_random import make_random_model  # noqa: E402
from trajtune.text.chat import ChatRenderer  # noqa: E402
from trajtune.trajectory import Owner, pair_batch  # noqa: E402

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
    assert _policy_ids(chosen) == ex["chosen_ids"] and _policy_ids(rejected) == ex["rejected_ids"]
    # the summed log-probs TRL's reference pass computes are trajtune's, on the same weights
    trl_chosen, trl_rejected = trainer.compute_ref_log_probs(trainer.model, trainer.data_collator([ex]))
    batch = pair_batch([(chosen, rejected)], tok.pad_token_id)
    ours = summed_logps(make_engine(load_policy(model_dir)).forward(batch).logprobs, batch.action_mask)
    assert torch.allclose(ours, torch.cat([trl_chosen, trl_rejected]), atol=1e-4)


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
    assert [o == Owner.POLICY for o in traj.owners] == [label != -100 for label in ex["labels"]]
    # TRL's loss on the row (mean NLL over its labels) is trajtune's eval/loss on it
    inputs = trainer.data_collator([ex])
    with torch.no_grad():
        trl_loss = model.eval()(input_ids=inputs["input_ids"], labels=inputs["labels"]).loss
    ours = eval_loss(make_engine(load_policy(model_dir)), [traj], tok.pad_token_id, 8)["eval/loss"]
    assert abs(ours - float(trl_loss)) < 1e-4


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
