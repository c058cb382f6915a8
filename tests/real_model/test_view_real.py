"""`trajtune view` on the real model's tokenizer (SmolLM2's byte-level BPE): a Japanese reply is shown character by
character, each whole on the token that completes it, never as U+FFFD (trajtune/runs/view.py, `Decoder.texts`).

The episode is built here from the model's own chat template (no sampling: the reply is fixed), in a run directory
laid out as `trajtune grpo` leaves one (RUN_DIR/config.json names the model, RUN_DIR/grpo/episodes.jsonl)."""

import json

import torch

from trajtune.runs.recorder import episode_row
from trajtune.runs.decoders import load_decoder
from trajtune.runs.view import write_view
from trajtune.trajectory import Owner, Trajectory

REPLY = "こんにちは、世界！日本語で答えます。"


def test_a_japanese_reply_reads_whole_on_the_real_tokenizer(real_model, tmp_path, capsys):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(real_model))
    prompt = hf.apply_chat_template([{"role": "user", "content": "日本語で挨拶して"}], add_generation_prompt=True,
                                    tokenize=True)
    prompt = list(prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt)
    reply = hf.encode(REPLY, add_special_tokens=False) + [hf.convert_tokens_to_ids("<|im_end|>")]
    alone = [hf.decode([i]) for i in reply]
    assert sum("\ufffd" in a for a in alone) >= 10  # decoded one by one (the page before): ten and more U+FFFD

    texts, completed_by = load_decoder(real_model).texts(prompt + reply)
    assert "".join(texts) == hf.decode(prompt + reply, skip_special_tokens=False)
    assert "".join(texts[len(prompt):]) == REPLY + "<|im_end|>" and "\ufffd" not in "".join(texts)
    shown = [t for t in texts[len(prompt):] if t]
    assert set(REPLY) <= set("".join(shown)) and all(len(t) <= 2 or t == "<|im_end|>" for t in shown)
    assert any(by is not None for by in completed_by)  # some characters were split, and completed later

    t = Trajectory(ids=prompt + reply, owners=[int(Owner.PROMPT)] * len(prompt) + [int(Owner.POLICY)] * len(reply),
                   turns=[0] * (len(prompt) + len(reply)), logprobs=[0.0] * len(prompt) + [-1.0] * len(reply))
    (tmp_path / "grpo").mkdir()
    (tmp_path / "config.json").write_text(json.dumps({"model": str(real_model)}))
    row = episode_row("grpo", 1, 0, t, torch.zeros(len(t) - 1), torch.tensor(1.0), None)
    (tmp_path / "grpo" / "episodes.jsonl").write_text(json.dumps(row) + "\n")
    page = write_view(tmp_path).read_text(encoding="utf-8")
    assert "\ufffd" not in page and "こ</span>" in page and "界</span>" in page
    assert "the run&#x27;s input model" in page and capsys.readouterr().err == ""  # no guess, nothing outside
