"""Every practitioner command on the real model (SmolLM2-135M-Instruct; `real_model` fixture,
tests/real_model/conftest.py), through the command line (`trajtune.cli.main`, as tests/recipes/test_hf_cli.py):
each trains a few steps, its loss (or, for RL, its policy) moves, and the saved model loads and answers
(`trajtune chat` gives a reply). Small on purpose: batches of 2-4, at most 128 tokens, 2-4 steps, so the tier stays
within minutes on two shared CPU cores."""

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from test_hf_cli import _run  # noqa: E402 - main(args) == 0

from trajtune.cli import main  # noqa: E402
from trajtune.metrics import read_metrics  # noqa: E402
from trajtune.models.hf import load_tokenizer  # noqa: E402
from trajtune.sources.data import Row, sft_trajectories  # noqa: E402
from trajtune.text.chat import ChatRenderer  # noqa: E402
from trajtune.trajectory import Owner  # noqa: E402

# multi-turn, no system turn: the template adds its default one ("You are a helpful AI assistant named SmolLM")
CHATS = [
    [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "2 + 3 = 5."},
     {"role": "user", "content": "And 4+4?"}, {"role": "assistant", "content": "4 + 4 = 8."}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
     {"role": "user", "content": "Another one?"}, {"role": "assistant", "content": "Green."}],
]
SHORT = ["--max-length", "128"]


def _ids(encoded) -> list[int]:
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("real")
    (d / "chats.jsonl").write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS))
    (d / "pairs.jsonl").write_text("".join(
        json.dumps({"prompt": f"What is {i}+{i}?", "chosen": f"{i}+{i} = {2 * i}.",
                    "rejected": "I like turtles."}) + "\n"
        for i in range(1, 5)))
    return write_prompts(d)


def write_prompts(d):
    """GRPO's files in folder `d`: prompts.jsonl (4 sums) and rewards.py:near_20_chars, a reward that varies within
    every group (always a gradient) -> `d`."""
    (d / "prompts.jsonl").write_text("".join(
        json.dumps({"prompt": [{"role": "user", "content": f"What is {i}+{i}? Answer with a number."}],
                    "answer": str(2 * i)}) + "\n" for i in range(1, 5)))
    (d / "rewards.py").write_text(
        "def near_20_chars(prompts, completions, answer, **kw):  # varies within every group: always a gradient\n"
        "    return [-abs(len(c[-1]['content']) - 20) / 20 for c in completions]\n")
    return d


def answers(model_dir, capsys, prompt="What is the capital of France?") -> str:
    """`trajtune chat --model DIR --prompt ...` (greedy, 12 new tokens): the model's one reply, asserted non-empty."""
    capsys.readouterr()  # what the training command printed
    assert main(["chat", "--model", str(model_dir), "--prompt", prompt, "--temperature", "0",
                 "--max-new-tokens", "12", "--jsonl"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    reply = json.loads(line)["reply"]
    assert reply.strip(), f"{model_dir} gave an empty reply"
    return reply


def loss_falls(out, key="train/loss") -> list[dict]:
    rows = [r for r in read_metrics(out) if key in r]
    assert len(rows) >= 2 and rows[-1][key] < rows[0][key], [r[key] for r in rows]
    return rows


def test_chat_answers_in_the_models_template(real_model, capsys):
    """Greedy through the model's own ChatML template and its <|im_end|> stop: the pretrained model's answer."""
    assert "Paris" in answers(real_model, capsys)


def test_sft_multi_turn_chats_owners_token_exact_and_trains(real_model, work, capsys):
    """The rendered ids are `apply_chat_template`'s (its default system turn included), and exactly each assistant
    turn's content + <|im_end|> is POLICY: the span between the template's generation prompt for turn k and the end of
    turn k (its trailing newline is the template's)."""
    tok = load_tokenizer(real_model)
    renderer = ChatRenderer(tok)
    for i, conv in enumerate(CHATS):
        (traj,) = sft_trajectories([Row({"messages": conv}, f"chats.jsonl:{i + 1}")], renderer)
        whole = _ids(tok.apply_chat_template(conv, tokenize=True))
        assert traj.ids == whole
        assert tok.decode(whole).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
        trained = set()
        for k, m in enumerate(conv):
            if m["role"] == "assistant":
                start = len(_ids(tok.apply_chat_template(conv[:k], tokenize=True, add_generation_prompt=True)))
                end = len(_ids(tok.apply_chat_template(conv[: k + 1], tokenize=True))) - 1  # without the "\n"
                assert tok.decode(whole[start:end]) == m["content"] + "<|im_end|>"
                trained |= set(range(start, end))
        assert {t for t, o in enumerate(traj.owners) if o == Owner.POLICY} == trained
    out = work / "sft"
    _run("sft", "--model", str(real_model), "--data", str(work / "chats.jsonl"), "--steps", "3", "--batch-size", "2",
         "--lr", "1e-4", *SHORT, "--out", str(out))
    loss_falls(out)
    answers(out / "model", capsys)


def test_rm_then_rm_eval(real_model, work, capsys):
    out = work / "rm"
    _run("rm", "--model", str(real_model), "--data", str(work / "pairs.jsonl"), "--steps", "3", "--batch-size", "4",
         "--lr", "1e-4", "--lora-r", "8", *SHORT, "--out", str(out))
    loss_falls(out)
    capsys.readouterr()
    assert main(["rm-eval", "--model", str(out / "model"), "--data", str(work / "pairs.jsonl"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n"] == 4 and report["accuracy"] == 1.0 and report["margin"] > 0, report


@pytest.mark.parametrize("lora", [[], ["--lora-r", "8"]], ids=["full", "lora"])
def test_dpo(real_model, work, capsys, lora):
    out = work / f"dpo{'-lora' if lora else ''}"
    _run("dpo", "--model", str(real_model), "--data", str(work / "pairs.jsonl"), "--steps", "3", "--batch-size", "4",
         "--lr", "1e-4" if lora else "1e-5", *lora, *SHORT, "--out", str(out))
    rows = loss_falls(out)
    assert rows[-1]["dpo/margin"] > rows[0]["dpo/margin"]
    assert (out / "model" / "adapter" / "adapter_config.json").exists() == bool(lora)
    answers(out / "model", capsys)


@pytest.mark.parametrize("backend", ["sampler", "generate"])
def test_grpo(real_model, work, capsys, backend):
    """The own sampler and HF generate: every group has reward variance (a length reward), so each step has a
    gradient, and the policy moves away from the start (kl/k3 > 0 at the second step, against the first weights)."""
    out = work / f"grpo-{backend}"
    _run("grpo", "--model", str(real_model), "--data", str(work / "prompts.jsonl"), "--backend", backend,
         "--reward", f"{work / 'rewards.py'}:near_20_chars", "--steps", "2", "--prompts-per-step", "2",
         "--group-size", "4", "--max-new-tokens", "16", "--lr", "1e-4", "--lora-r", "8", *SHORT, "--out", str(out))
    rows = [r for r in read_metrics(out) if "rollout/reward" in r]
    assert len(rows) == 2 and all(r["rollout/no_signal_share"] < 1 and r["train/grad_norm"] > 0 for r in rows), rows
    assert rows[-1]["kl/k3"] > 0
    answers(out / "model", capsys)


def test_rft(real_model, work, capsys):
    """One round: 4 prompts x 2 samples, every sample above the threshold kept, 3 SFT steps on them. RFT logs one row
    per round (the last step's loss), so "the loss moves" is read as: the saved weights moved from the start."""
    from safetensors.torch import load_file

    out = work / "rft"
    _run("rft", "--model", str(real_model), "--data", str(work / "prompts.jsonl"),
         "--reward", f"{work / 'rewards.py'}:near_20_chars", "--rounds", "1", "--steps", "3", "--group-size", "2",
         "--max-new-tokens", "16", "--threshold", "-1", "--lr", "1e-4", *SHORT, "--out", str(out))
    (row,) = read_metrics(out)
    assert row["rft/sampled"] == 8 and row["rft/kept"] > 0 and row["train/loss"] > 0, row
    base, trained = (load_file(str(real_model / "model.safetensors")),
                     load_file(str(out / "model" / "model.safetensors")))
    assert max(float((base[k] - trained[k]).abs().max()) for k in base) > 1e-5
    answers(out / "model", capsys)


def test_the_model_as_a_judge_reward(real_model, work, capsys):
    """--reward-judge with the real model: asked by its template, greedy; every completion's verdict is either a
    parsed score or counted as unparseable."""
    out = work / "judged"
    _run("grpo", "--model", str(real_model), "--data", str(work / "prompts.jsonl"),
         "--reward", f"{work / 'rewards.py'}:near_20_chars", "--reward-judge", str(real_model),
         "--judge-max-new-tokens", "8", "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
         "--max-new-tokens", "12", "--lr", "1e-4", "--lora-r", "8", *SHORT, "--out", str(out))
    (row,) = [r for r in read_metrics(out) if "reward/judge/unparseable" in r]
    print({k: v for k, v in row.items() if k.startswith("reward/")})
    assert row["reward/judge/unparseable"] < 4, "no verdict of the real model parsed"
    answers(out / "model", capsys)


def test_merge(real_model, work, capsys):
    """The base and the SFT run's model, averaged: every tensor the mean of the two, and the soup answers."""
    from safetensors.torch import load_file

    sft = work / "sft" / "model"
    if not sft.exists():
        pytest.skip("needs test_sft_multi_turn_chats_owners_token_exact_and_trains's model")
    out = work / "soup"
    _run("merge", str(real_model), str(sft), "--out", str(out))
    a, b, m = (load_file(str(p / "model.safetensors")) for p in (real_model, sft, out))
    assert a.keys() == m.keys()
    for k in a:
        assert torch.allclose(m[k].float(), (a[k].float() + b[k].float()) / 2, atol=1e-6), k
    answers(out, capsys)
