"""`trajtune view` decodes each episode with the tokenizer of the policy that produced it (trajtune/runs/view.py):
the stage's own saved model, else the nearest upstream stage's through the stage graph, else the run's input model;
a guess or ids outside the vocabulary are said on the page and on stderr. Characters split across byte-level BPE
tokens are shown whole; stages come in run order; whitespace and side margins are kept.

The byte-level tokenizer is a tiny `tokenizers` ByteLevel BPE trained here on English (offline), so every Japanese
character (3 UTF-8 bytes) is split across tokens, as it is in SmolLM2's (tests/real_model/test_view_real.py)."""

import json
from html.parser import HTMLParser

import pytest
import torch

from trajtune.cli import main
from trajtune.runs.recorder import episode_row
from trajtune.runs.decoders import load_decoder
from trajtune.runs.view import write_view
from trajtune.text.tokenizers import CharTokenizer
from trajtune.trajectory import Owner, Trajectory

JAPANESE = "こんにちは、世界！"


class Spans(HTMLParser):
    """Per episode section: its stage and its token spans (class, title, text); the warnings and the stage filter."""

    def __init__(self):
        super().__init__()
        self.sections, self.warnings, self.stage_options = [], [], []
        self._span = self._warn = self._select = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section" and "episode" in a.get("class", ""):
            self.sections.append({"stage": a["data-stage"], "tokens": []})
        elif tag == "span" and a.get("class", "").startswith("t ") and self.sections:
            self._span = {"class": a["class"].split(), "title": a.get("title", ""), "text": ""}
        elif tag == "p" and a.get("class") == "warn":
            self._warn = ""
        elif tag == "select":
            self._select = a.get("id")
        elif tag == "option" and self._select == "f-stage" and a.get("value"):
            self.stage_options.append(a["value"])

    def handle_endtag(self, tag):
        if tag == "span" and self._span is not None:
            self.sections[-1]["tokens"].append(self._span)
            self._span = None
        elif tag == "p" and self._warn is not None:
            self.warnings.append(self._warn)
            self._warn = None
        elif tag == "select":
            self._select = None

    def handle_data(self, data):
        if self._span is not None:
            self._span["text"] += data
        if self._warn is not None:
            self._warn += data


def page_of(path):
    p = Spans()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def write_episode(folder, stage, ids, owners=None):
    """RUN_DIR/<stage>/episodes.jsonl holding one episode of `ids` (the first token a prompt, the rest the policy's)."""
    owners = owners or [int(Owner.PROMPT)] + [int(Owner.POLICY)] * (len(ids) - 1)
    t = Trajectory(ids=list(ids), owners=owners, turns=[0] * len(ids), logprobs=[0.0] + [-1.0] * (len(ids) - 1))
    row = episode_row(stage, 1, 0, t, torch.zeros(len(ids) - 1), torch.tensor(0.5), None)
    (folder / stage).mkdir(parents=True, exist_ok=True)
    with open(folder / stage / "episodes.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def finish(folder, stage, after=None):
    """The stage's results.json; `after`: its record of the stages it waited for (None: an older run, no record)."""
    (folder / stage).mkdir(parents=True, exist_ok=True)
    results = {"time": {}} if after is None else {"time": {}, "inputs": {"config": [], "stages": list(after)}}
    (folder / stage / "results.json").write_text(json.dumps(results))


def save_tok(tok, folder):
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(folder / "tokenizer.json")


# --- the tokenizer of the policy that produced the episodes ---------------------------------------------------------
def graph_run(tmp_path, record=True):
    """A run like graders: `coldstart` (alphabetically first) saved tokenizer A; `sft_narrow` saved tokenizer B;
    `rm` (a reward model from sft_narrow) saved B under model/; `overopt` sampled sft_narrow's policy, waited for
    `rm` and saved no model. Its episode reads 'Love and gold.' in B and is out of A's vocabulary."""
    a, b = CharTokenizer.from_corpus("0+="), CharTokenizer.from_corpus("Love and gold.")
    save_tok(a, tmp_path / "coldstart" / "checkpoint")
    save_tok(b, tmp_path / "sft_narrow" / "checkpoint")
    save_tok(b, tmp_path / "rm" / "model")
    finish(tmp_path, "coldstart", [] if record else None)
    finish(tmp_path, "sft_narrow", [] if record else None)
    finish(tmp_path, "rm", ["sft_narrow"] if record else None)
    finish(tmp_path, "overopt", ["rm"] if record else None)
    ids = b.encode("Love and gold.")
    assert max(ids) >= a.vocab_size  # A cannot decode it: the old page showed ids past A's vocabulary as '#n'
    write_episode(tmp_path, "overopt", ids)
    return ids


def test_a_stage_that_saves_no_model_is_decoded_by_the_model_upstream_of_it(tmp_path, capsys):
    graph_run(tmp_path)
    page = page_of(write_view(tmp_path))
    assert "".join(t["text"] for t in page.sections[0]["tokens"]) == "Love and gold."
    assert page.warnings == [] and capsys.readouterr().err == ""
    text = (tmp_path / "view.html").read_text()
    assert "overopt: rm/model/tokenizer.json, saved by rm, upstream of overopt in the stage graph<" in text


def test_upstream_stages_with_different_tokenizers_are_said_to_make_it_a_guess(tmp_path, capsys):
    graph_run(tmp_path)
    finish(tmp_path, "overopt", ["rm", "coldstart"])  # it waited for coldstart too, whose tokenizer is another
    page = page_of(write_view(tmp_path))
    assert "".join(t["text"] for t in page.sections[0]["tokens"]) == "Love and gold."  # the nearest: rm's
    assert len(page.warnings) == 1 and "the nearest of 2 different tokenizers upstream" in page.warnings[0]
    assert "it may not be the policy's" in capsys.readouterr().err


def test_an_old_run_without_the_record_falls_back_and_says_so(tmp_path, capsys):
    graph_run(tmp_path, record=False)
    page = page_of(write_view(tmp_path))
    # no record: the first of the run's tokenizers whose vocabulary holds the ids (not coldstart's, alphabetically
    # first), said to be a guess on the page and on stderr
    assert "".join(t["text"] for t in page.sections[0]["tokens"]) == "Love and gold."
    assert len(page.warnings) == 1 and "stage overopt" in page.warnings[0]
    assert "rm/model/tokenizer.json, the first of the run's 2 saved tokenizers whose vocabulary holds its ids (1 do)" \
        in page.warnings[0] and "may be another model's" in page.warnings[0]
    assert capsys.readouterr().err.startswith("trajtune view: warning: stage overopt:")
    # --tokenizer decides, and nothing is guessed
    write_view(tmp_path, tokenizer=str(tmp_path / "sft_narrow" / "checkpoint"))
    assert capsys.readouterr().err == ""
    # the one tokenizer left cannot decode it: the ids outside its vocabulary are said, on the page and on stderr
    for stage in ("rm", "sft_narrow"):
        for f in (tmp_path / stage).rglob("tokenizer.json"):
            f.unlink()
    page = page_of(write_view(tmp_path))
    tokens = "".join(t["text"] for t in page.sections[0]["tokens"])
    assert tokens != "Love and gold." and "#" in tokens
    assert len(page.warnings) == 1 and "fall outside the vocabulary" in page.warnings[0]
    assert "coldstart/checkpoint/tokenizer.json" in page.warnings[0]
    assert "outside the vocabulary" in capsys.readouterr().err


def test_stages_come_in_run_order_and_each_with_its_own_tokenizer(tmp_path):
    tok = CharTokenizer.from_corpus("abc")
    for stage in ("zeta", "alpha", "mid"):
        save_tok(tok, tmp_path / stage / "checkpoint")
        write_episode(tmp_path, stage, tok.encode("abc"))
    rows = [{"step": 1, "stage": s, "x": 0.0} for s in ("zeta", "mid", "zeta", "alpha")]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = page_of(write_view(tmp_path))
    assert [s["stage"] for s in page.sections] == ["zeta", "mid", "alpha"]  # as they ran, not alphabetically
    assert page.stage_options == ["zeta", "mid", "alpha"]


def test_code_keeps_its_indentation_and_the_page_its_margins(tmp_path):
    code = "def f(x):\n    if x:\n\treturn 1\n"
    tok = CharTokenizer.from_corpus(code)
    save_tok(tok, tmp_path / "rl" / "checkpoint")
    write_episode(tmp_path, "rl", tok.encode(code))
    out = write_view(tmp_path)
    spans = page_of(out).sections[0]["tokens"]
    assert "".join(s["text"] for s in spans) == code
    text = out.read_text()
    css = text[text.index("<style>") + 7:text.index("</style>")]
    rules = dict((sel.strip(), body) for sel, body in (r.split("{", 1) for r in css.split("}") if "{" in r))
    assert "white-space:pre" in rules[".t"] and "white-space:pre-wrap" in rules[".tokens"]  # spaces, tabs shown
    assert "padding:8px 16px" in rules["main"] and "padding:8px 16px" in rules["header"]  # margins at every width
    assert "white-space:pre-wrap" in rules["pre"] and "overflow-x:auto" in rules["details"]  # nothing wider than it
    assert 'name="viewport"' in text and "a later token completes" not in text  # no split character: no legend


def test_a_word_level_tokenizer_is_said_to_carry_no_indentation(tmp_path):
    from trajtune.text.tokenizers import WordTokenizer

    tok = WordTokenizer.from_corpus("def f ( x ):\n return x")
    save_tok(tok, tmp_path / "rl" / "checkpoint")
    write_episode(tmp_path, "rl", tok.encode("def f(x):\n    return x"))
    assert "word-level: its tokens hold no spaces or indentation" in write_view(tmp_path).read_text()


# --- characters split across byte-level tokens -------------------------------------------------------------------
@pytest.fixture(scope="module")
def byte_bpe(tmp_path_factory):
    """A 300-token ByteLevel BPE trained on English, saved as a Hugging Face tokenizer folder."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|end|>"], show_progress=False)
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 50 + ["def f(x):\n    return x"] * 20,
                            trainer)
    folder = tmp_path_factory.mktemp("bpe")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>").save_pretrained(folder)
    return folder


def check_whole_characters(decoder, hf, text):
    """Each character of `text` whole in the span of the token that completes it; the tokens before it marked."""
    ids = hf.encode(text, add_special_tokens=False)
    alone = [hf.decode([i]) for i in ids]
    # decoded alone (the page before), the tokens of a character are broken byte sequences: U+FFFD
    assert sum("\ufffd" in a for a in alone) >= 2 * sum(ord(c) > 127 for c in text)
    texts, completed_by = decoder.texts(ids)
    assert "".join(texts) == text and "\ufffd" not in "".join(texts)
    for i, (t, by) in enumerate(zip(texts, completed_by, strict=True)):
        assert (t == "") == (by is not None) and (by is None or by > i and texts[by] != "")
    return ids, texts, completed_by


def test_a_character_split_across_byte_level_tokens_is_shown_whole(tmp_path, byte_bpe):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(byte_bpe))
    decoder = load_decoder(byte_bpe)
    ids, texts, completed_by = check_whole_characters(decoder, hf, JAPANESE)
    assert [t for t in texts if t] == list(JAPANESE)  # 3 bytes each, one byte per token: every character split
    # ASCII and code around it: nothing is held back, whitespace as the tokens carry it
    mixed = "def f(x):\n    return 'こんにちは'"
    check_whole_characters(decoder, hf, mixed)
    # on the page: the completing token shows the character; the ones before it are marked and name it
    run = tmp_path / "run"
    (run / "grpo").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"model": str(byte_bpe)}))  # an HF command's input model
    prompt = hf.encode("Q: hi", add_special_tokens=False)
    write_episode(run, "grpo", prompt + ids, owners=[int(Owner.PROMPT)] * len(prompt) + [int(Owner.POLICY)] * len(ids))
    spans = page_of(write_view(run)).sections[0]["tokens"]
    assert "".join(s["text"] for s in spans) == "Q: hi" + JAPANESE
    assert "a later token completes" in (run / "view.html").read_text()  # the legend explains the mark
    shift = len(spans) - len(ids)
    for i, by in enumerate(completed_by):
        span = spans[shift + i]
        assert ("part" in span["class"]) == (by is not None)
        if by is not None:
            assert span["text"] == "" and f"token {shift + by} completes" in span["title"]
    (run / "config.json").write_text(json.dumps({"model": {"path": str(byte_bpe)}}))  # as `trajtune grpo` writes it
    assert "".join(s["text"] for s in page_of(write_view(run)).sections[0]["tokens"]) == "Q: hi" + JAPANESE


def test_tokens_that_complete_one_character_and_start_the_next_wait_as_a_chain(tmp_path):
    """A BPE trained on Japanese merges bytes across characters ("93 e3": the end of こ, the start of ん), so a token
    can end inside one character after completing another; a chain of them waits for the one that ends cleanly."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["こんにちは世界のみなさん"] * 50 + ["the fox"] * 20, trainers.BpeTrainer(
        vocab_size=290, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(tmp_path)
    hf, decoder = PreTrainedTokenizerFast.from_pretrained(str(tmp_path)), load_decoder(tmp_path)
    for text in ("ちは世界の", "みなさんこんにちは", "the fox: こんにちは"):
        ids = hf.encode(text)
        texts, completed_by = decoder.texts(ids)
        assert "".join(texts) == text and "\ufffd" not in "".join(texts), (text, texts)
        assert all((t == "") == (by is not None) for t, by in zip(texts, completed_by, strict=True))
    texts, completed_by = decoder.texts(hf.encode("ちは世界の"))
    assert texts == ["", "", "", "", "ちは世界の"] and completed_by[:4] == [4] * 4  # a chain of four waits


def test_a_reply_cut_inside_a_character_and_an_id_outside_the_vocabulary(byte_bpe):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(byte_bpe))
    decoder = load_decoder(byte_bpe)
    ids = hf.encode("日本", add_special_tokens=False)
    texts, completed_by = decoder.texts(ids[:-1])  # cut at the token budget inside 本: its bytes show as U+FFFD
    assert texts[0] == "" and texts[1] == "" and texts[2] == "日" and texts[-1].endswith("\ufffd")
    texts, _ = decoder.texts(ids[:4] + [10**6] + ids[4:])  # an id past the vocabulary interrupts the stream
    assert texts[4] == "#1000000" and "日" in "".join(texts) and decoder.outside([10**6, 0, -1]) == 2


def test_view_cli_prints_the_page_and_warns_on_stderr(tmp_path, capsys):
    graph_run(tmp_path, record=False)  # no record of overopt's model: a guess
    assert main(["view", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(tmp_path / "view.html")
    assert "trajtune view: warning: stage overopt:" in captured.err
