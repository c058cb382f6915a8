"""Decontamination (RLHF book ch.16 "Contamination"): 8-grams of words, 50-character substrings, the command."""

import json
import random
import time

import pytest

from trajtune.cli import main
from trajtune.decontamination import find_contamination, normalize_chars, words

EIGHT = "the quick brown fox jumps over the lazy"  # 8 words


def test_normalization_is_the_stated_one():
    assert words("Q: 23+45\nA: ") == ["q", "23", "45", "a"]
    assert words("The  QUICK, brown—fox_x") == ["the", "quick", "brown", "fox", "x"]
    assert words("ﬁne") == ["fine"]  # NFKC: the ligature is two letters
    assert normalize_chars("  A\tB\n\nc ") == "a b c"


def test_eight_words_flag_seven_do_not():
    ev = [f"Question: {EIGHT} dog?", "an unrelated question about something else entirely here ok"]
    # case, punctuation and spacing differ; the 8 words are the same
    hit = find_contamination(["THE quick, brown fox -- jumps over the LAZY cat"], ev, ngram=8, chars=0)
    assert hit.contaminated == [0]
    m = hit.matches[0]
    assert (m.eval_row, m.train_row, m.rule, m.text) == (0, 0, "ngram", EIGHT)
    seven = find_contamination(["the quick brown fox jumps over the sleepy dog"], ev, ngram=8, chars=0)
    assert seven.contaminated == []  # 'the quick brown fox jumps over the' is 7 words, then 'sleepy' != 'lazy'
    assert find_contamination(["quick brown fox jumps over the lazy dog"], ev, ngram=7, chars=0).contaminated == [0]


def test_fifty_characters_flag_forty_nine_do_not():
    shared = "abcdefghij" * 5  # 50 characters
    ev = ["<" + shared + ">" + "z" * 30]
    assert find_contamination(["((" + shared + "))"], ev, ngram=0, chars=50).matches[0].text == shared
    assert find_contamination(["((" + shared[:49] + "))"], ev, ngram=0, chars=50).contaminated == []
    # whitespace runs count as one space, case is ignored, punctuation counts
    assert find_contamination([(" " + shared.upper()).replace("J", "J \n ")], ["x " + shared.replace("j", "j ")],
                              ngram=0, chars=50).contaminated == [0]


def test_any_stride_finds_the_same_rows_as_every_offset():
    rng = random.Random(0)
    alphabet = "ab "  # a small alphabet: many partial overlaps of every length
    train = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120))) for _ in range(60)]
    ev = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))) for _ in range(40)]
    for chars in (5, 12, 20):
        brute = sorted(i for i, e in enumerate(ev)
                       if any(normalize_chars(e)[k:k + min(chars, len(normalize_chars(e)))] in normalize_chars(t)
                              for t in train for k in range(max(1, len(normalize_chars(e)) - chars + 1))))
        for stride in (1, 3, chars):
            got = find_contamination(train, ev, ngram=0, chars=chars, stride=stride).contaminated
            assert got == brute, (chars, stride)


def test_short_rows_are_matched_whole_and_labelled():
    ev = ["Q: 23+45\nA: ", "Q: 11+11\nA: "]  # 4 words, 11 characters: shorter than either rule
    clean = find_contamination(["Q: 12+45\nA: ", "Q: 23+46\nA: "], ev)
    assert clean.contaminated == [] and clean.share == 0.0
    dirty = find_contamination(["Q: 12+45\nA: ", "Q: 23+45\nA: 68"], ev)
    assert dirty.contaminated == [0]
    assert ((dirty.matches[0].rule, dirty.matches[0].text, dirty.matches[0].train_row)
            == ("ngram_whole_row", "q 23 45 a", 1))
    with pytest.raises(ValueError, match="one of them > 0"):
        find_contamination([], ev, ngram=0, chars=0)


def test_hundred_thousand_training_rows_take_seconds():
    rng = random.Random(1)
    vocab = [f"w{i}" for i in range(3000)]
    train = [" ".join(rng.choice(vocab) for _ in range(20)) for _ in range(100_000)]
    ev = [" ".join(rng.choice(vocab) for _ in range(20)) for _ in range(300)] + [train[77_777]]
    t0 = time.time()
    result = find_contamination(train, ev)
    assert result.contaminated == [300] and result.matches[0].train_row == 77_777
    assert time.time() - t0 < 30  # ~3 s here


# --- the command ----------------------------------------------------------------------------------------------
def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_command_exit_codes_and_report(tmp_path, capsys):
    ev = write_jsonl(tmp_path / "ev.jsonl", [{"prompt": f"Tell me: {EIGHT} dog?"}, {"prompt": "something else"}])
    clean = write_jsonl(tmp_path / "clean.jsonl", [{"prompt": "nothing in common with the test"}])
    dirty = write_jsonl(tmp_path / "dirty.jsonl", [{"prompt": "a"}, {"prompt": f"so {EIGHT} cat"}])
    assert main(["decontaminate", "--train", clean, "--eval", ev]) == 0
    assert "0 of 2 rows" in capsys.readouterr().out
    out = tmp_path / "found.jsonl"
    assert main(["decontaminate", "--train", clean, "--train", dirty, "--eval", ev, "--out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "1 of 2 rows (50.0%)" in text and f"{ev}:1  <-  {dirty}:2  ngram: '{EIGHT}'" in text
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {"eval": f"{ev}:1", "train": f"{dirty}:2", "rule": "ngram", "text": EIGHT}]
    # a plain text file: one row per non-empty line
    txt = tmp_path / "corpus.txt"
    txt.write_text(f"first line\n\n{EIGHT} and more\n")
    assert main(["decontaminate", "--train", str(txt), "--eval", ev]) == 1
    assert f"{txt}:3" in capsys.readouterr().out


def test_command_fields_messages_and_parquet(tmp_path, capsys):
    ev = write_jsonl(tmp_path / "ev.jsonl", [{"question": f"{EIGHT}?"}])
    chat = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                               {"role": "assistant", "content": EIGHT}]}])
    assert main(["decontaminate", "--train", chat, "--eval", ev]) == 1  # defaults: messages / question
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"problem": ["unrelated", f"x {EIGHT}"]}), tmp_path / "t.parquet")
    assert main(["decontaminate", "--train", str(tmp_path / "t.parquet"), "--eval", ev, "--field", "problem",
                 "--eval-field", "question"]) == 1
    assert "t.parquet row 1" in capsys.readouterr().out


def test_command_errors_name_the_file_line_and_field(tmp_path, capsys):
    ev = write_jsonl(tmp_path / "ev.jsonl", [{"prompt": "p"}, {"text": "no prompt here"}])
    tr = write_jsonl(tmp_path / "tr.jsonl", [{"prompt": "x"}])

    def error(*argv):
        assert main(["decontaminate", *argv]) == 2
        return capsys.readouterr().err

    assert f"--train {tmp_path}/missing.jsonl: no such file" in error("--train", str(tmp_path / "missing.jsonl"),
                                                                        "--eval", ev)
    assert f"--eval {ev}:2: no field 'prompt'; the row has text" in error("--train", tr, "--eval", ev)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": \n')
    assert f"{bad}:2: not valid JSON" in error("--train", str(bad), "--eval", tr)
    assert "none of the fields prompt, messages" in error("--train", write_jsonl(tmp_path / "o.jsonl", [{"x": 1}]),
                                                          "--eval", tr)
    wrong = write_jsonl(tmp_path / "w.jsonl", [{"prompt": {"a": 1}}])
    assert f"{wrong}:1: field 'prompt' is dict" in error("--train", wrong, "--eval", tr)
    assert "one of them > 0" in error("--train", tr, "--eval", tr, "--ngram", "0", "--chars", "0")
