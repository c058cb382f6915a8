"""KTO on unpaired thumbs-up / down rows (RLHF book ch.8.2, 11.5): mismatched pairs, the first step's hand-worked
loss, the loop moving desirable up and undesirable down, the data format, and `trajtune dpo --loss kto`."""

import json

import pytest
import torch

from trajtune.algorithms.dpo import DPOConfig, train_dpo
from trajtune.algorithms.kto import mismatched, train_kto
from trajtune.engine import OptimConfig, make_engine
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.text.render import Renderer
from trajtune.text.tokenizers import CharTokenizer
from trajtune.trajectory import Owner

TOK = CharTokenizer.from_corpus("Q: pickabcdef")
RENDER = Renderer(TOK)


def demo(prompt, reply):
    return RENDER.render([{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}])


def engine(seed=0, lr=1e-2):
    torch.manual_seed(seed)
    return make_engine(TinyTransformer(TinyConfig(TOK.vocab_size, dim=32, n_layers=1, n_heads=2, max_len=32)),
                       OptimConfig(lr=lr))


def test_mismatched_pairs_splice_prompt_i_with_completion_i_plus_1():
    rows = [demo("Q: a", "cc"), demo("Q: bb", "d"), demo("Q: e", "fff")]
    out = mismatched(rows)
    assert [o.ids for o in out] == [demo("Q: a", "d").ids, demo("Q: bb", "fff").ids, demo("Q: e", "cc").ids]
    assert [o.owners for o in out] == [demo("Q: a", "d").owners, demo("Q: bb", "fff").owners, demo("Q: e", "cc").owners]
    assert [o.info["completion_of"] for o in out] == [1, 2, 0]
    no_policy = RENDER.render([{"role": "user", "content": "Q: a"}])
    with pytest.raises(ValueError, match="episode 1 .* no POLICY token"):
        mismatched([rows[0], no_policy])


def test_first_step_loss_is_hand_worked_and_training_separates_the_labels():
    examples = [(demo("Q: pick", "a"), True), (demo("Q: pick", "b"), False),
                (demo("Q: pickc", "a"), True), (demo("Q: pickc", "b"), False)]
    cfg = DPOConfig(loss="kto", steps=25, beta=0.5, undesirable_weight=1.33)
    e = engine()
    hist = train_kto(e, examples, cfg, TOK.pad_id)
    # step 1: the policy is the reference, r = 0 and z0 = 0: each loss is w (1 - sigma(0)) = w / 2
    assert hist[0]["train/loss"] == pytest.approx((0.5 + 0.5 + 0.665 + 0.665) / 4, abs=1e-6)
    assert hist[0]["kto/kl"] == pytest.approx(0.0, abs=1e-6) and hist[0]["kto/z0"] == pytest.approx(0.0, abs=1e-6)
    assert hist[-1]["train/loss"] < hist[0]["train/loss"]
    assert hist[-1]["kto/desirable_reward"] > 0 > hist[-1]["kto/undesirable_reward"]
    # in two length buckets (parts holding one kind of row only): the same numbers, no NaN
    by_length = [(demo("Q: pick", "a"), True), (demo("Q: pick", "bbb"), False),
                 (demo("Q: pickc", "a"), True), (demo("Q: pickc", "bbb"), False)]  # buckets: desirable | undesirable
    split = train_kto(engine(), by_length, DPOConfig(loss="kto", steps=3, beta=0.5, length_buckets=2), TOK.pad_id)
    whole = train_kto(engine(), by_length, DPOConfig(loss="kto", steps=3, beta=0.5), TOK.pad_id)
    for key in ("train/loss", "kto/desirable_reward", "kto/undesirable_reward", "kto/z0"):
        assert [r[key] for r in split] == pytest.approx([r[key] for r in whole], abs=1e-5), key
    with pytest.raises(ValueError, match="train_kto"):
        train_dpo(engine(), [(examples[0][0], examples[1][0])], cfg, TOK.pad_id)
    with pytest.raises(ValueError, match="config.loss must be 'kto'"):
        train_kto(engine(), examples, DPOConfig(), TOK.pad_id)
    with pytest.raises(ValueError, match="regenerate_every must be 0"):
        DPOConfig(loss="kto", regenerate_every=2)


def test_kto_rows_and_the_dpo_command(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from trajtune.cli import main
    from trajtune.metrics import is_documented, read_metrics
    from trajtune.models.hf_random import make_random_model, train_tokenizer
    from trajtune.sources.data import DataError, Row
    from trajtune.sources.reward_data import kto_examples
    from trajtune.text.chat import ChatRenderer

    r = ChatRenderer(train_tokenizer())
    rows = [Row({"prompt": "2+2?", "completion": "4", "label": True}, "f.jsonl:1"),
            Row({"prompt": "2+2?", "completion": "5", "label": 0}, "f.jsonl:2"),
            Row({"prompt": "3+3?", "chosen": "6", "rejected": "7"}, "f.jsonl:3")]
    got = kto_examples(rows, r)
    assert [y for _, y in got] == [True, False, True, False]
    assert [r.tokenizer.decode([i for i, o in zip(t.ids, t.owners, strict=True) if o == Owner.POLICY])
            for t, _ in got] \
        == ["4<|im_end|>", "5<|im_end|>", "6<|im_end|>", "7<|im_end|>"]
    with pytest.raises(DataError, match="f.jsonl:9: missing field 'label'"):
        kto_examples([Row({"prompt": "a", "completion": "b"}, "f.jsonl:9")], r)
    with pytest.raises(DataError, match="f.jsonl:9: field 'label' must be 0, 1, true or false"):
        kto_examples([Row({"prompt": "a", "completion": "b", "label": "yes"}, "f.jsonl:9")], r)

    make_random_model(tmp_path / "model", "llama", "tiny")
    with open(tmp_path / "thumbs.jsonl", "w") as f:
        for i in range(6):
            f.write(json.dumps({"prompt": f"what is {i}+5?", "completion": f"{i + 5}", "label": True}) + "\n")
            f.write(json.dumps({"prompt": f"what is {i}+5?", "completion": "hello world", "label": False}) + "\n")
    out = tmp_path / "kto"
    assert main(["dpo", "--loss", "kto", "--model", str(tmp_path / "model"), "--data", str(tmp_path / "thumbs.jsonl"),
                 "--eval-data", str(tmp_path / "thumbs.jsonl"), "--steps", "4", "--batch-size", "6", "--lr", "3e-3",
                 "--beta", "0.5", "--out", str(out)]) == 0
    m = read_metrics(out)
    assert len(m) == 4 and "kto/z0" in m[0] and "eval/kto_loss" in m[-1]
    assert m[-1]["eval/kto_loss"] < 0.5 * (1 + 1) / 2 + 1e-6  # below the starting loss w / 2
    assert all(is_documented(k) for row in m for k in row if k not in ("step", "time", "stage"))
