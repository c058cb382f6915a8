"""`trajtune grpo --difficulty-filter LOW HIGH` (RLHF book ch.7.3, issue 31): the starting policy's solve rate decides
which prompts are trained on; the counts are printed, logged and written to the run."""

import json

import pytest

pytest.importorskip("transformers")

from trajtune.cli import main  # noqa: E402
from trajtune.metrics import read_metrics  # noqa: E402
from trajtune.models.hf_random import make_random_model  # noqa: E402

KINDS = ["always", "never", "half", "half", "always", "half"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("difficulty")
    make_random_model(d / "model", "qwen2", "tiny")
    with open(d / "prompts.jsonl", "w") as f:
        for i, kind in enumerate(KINDS):
            f.write(json.dumps({"prompt": f"what is {i}+5?", "kind": kind}) + "\n")
    (d / "rewards.py").write_text(  # solved always, never, or by about half of the completions (by their text)
        "import zlib\n"
        "def by_kind(prompts, completions, kind, **kw):\n"
        "    def one(k, text):\n"
        "        return 1.0 if k == 'always' else 0.0 if k == 'never' else float(zlib.crc32(text.encode()) % 2)\n"
        "    return [one(k, c) for k, c in zip(kind, completions)]\n")  # string prompts: string completions (TRL)
    return d


def grpo(work, out, *extra):
    return main(["grpo", "--model", str(work / "model"), "--data", str(work / "prompts.jsonl"),
                 "--reward", f"{work / 'rewards.py'}:by_kind", "--steps", "1", "--prompts-per-step", "2",
                 "--group-size", "2", "--max-new-tokens", "4", "--out", str(out), *extra])


def test_the_filter_keeps_the_prompts_solved_sometimes(work, capsys):
    out = work / "kept"
    assert grpo(work, out, "--difficulty-filter", "0.2", "0.8", "--difficulty-samples", "8") == 0
    said = capsys.readouterr().out
    half = [f"{work / 'prompts.jsonl'}:{i + 1}" for i, k in enumerate(KINDS) if k == "half"]
    report = json.loads((out / "grpo" / "difficulty.json").read_text())
    assert report["kept_prompts"] == half and report["kept"] == 3 and report["dropped"] == 3
    assert (report["rates"][f"{work / 'prompts.jsonl'}:1"] == 1.0
            and report["rates"][f"{work / 'prompts.jsonl'}:2"] == 0.0)
    assert all(0.2 <= report["rates"][w] <= 0.8 for w in half)
    assert "--difficulty-filter 0.2 0.8: kept 3 of 6 prompts" in said
    rows = read_metrics(out)
    assert rows[0]["step"] == 0 and rows[0]["difficulty/kept"] == 3 and rows[0]["difficulty/dropped"] == 3
    assert rows[-1]["step"] == 1 and "rollout/reward" in rows[-1]
    assert json.loads((out / "config.json").read_text())["difficulty_filter"] == [0.2, 0.8]


def test_bad_ranges_and_an_empty_result_are_one_line_errors(work, capsys):
    assert grpo(work, work / "bad", "--difficulty-filter", "0.8", "0.2") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--difficulty-filter takes two solve rates LOW HIGH" in err
    assert grpo(work, work / "none", "--difficulty-filter", "0.4", "0.45", "--difficulty-samples", "2") == 1
    err = capsys.readouterr().err
    assert "kept 0 of 6 prompts" in err and "no prompt left to train on" in err and "Traceback" not in err
