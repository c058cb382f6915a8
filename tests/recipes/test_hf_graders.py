"""trajtune grpo / rft with a judge and a rubric as reward sources (--reward-judge, --judge-template, --rubric):
the run trains, the judge's and rubric's counts reach the logged rows, and a wrong combination is one message."""

import json

import pytest

pytest.importorskip("transformers")

from trajtune.cli import main  # noqa: E402
from trajtune.metrics import read_metrics  # noqa: E402
from trajtune.models.hf_random import make_random_model  # noqa: E402


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("graders")
    make_random_model(d / "model", "llama", "tiny")
    (d / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"What is {i}+{i}?", "answer": str(2 * i)}) + "\n"
                                             for i in range(4)))
    (d / "checks.py").write_text("def short(completions, **kw):\n    return [len(c) < 40 for c in completions]\n\n\n"
                                 "def length(completions, **kw):\n    return [len(c) / 10 for c in completions]\n")
    (d / "rubric.json").write_text(json.dumps([
        {"title": "Short", "description": "Essential Criteria: the answer is short", "weight": 3,
         "check": str(d / "checks.py") + ":short"},
        {"title": "Polite", "description": "Important Criteria: the answer is polite", "weight": 2}]))
    (d / "checked.json").write_text(json.dumps([
        {"title": "Short", "description": "Essential Criteria: the answer is short", "weight": 3,
         "check": str(d / "checks.py") + ":short"}]))
    return d


def grpo(work, out, *more):
    return [str(a) for a in ["grpo", "--model", work / "model", "--data", work / "prompts.jsonl", "--steps", "2",
            "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "6", "--out", out, *more]]


def test_a_judge_and_a_rubric_as_rewards(work, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(grpo(work, out, "--reward", f"{work / 'checks.py'}:length", "--reward-judge", work / "model",
                   "--judge-max-new-tokens", "4", "--rubric", work / "rubric.json", "--reward-weights", "1", "1", "1"))
    assert rc == 0, capsys.readouterr().err
    rows = [r for r in read_metrics(out) if r.get("stage") == "grpo" and "reward/judge/unparseable" in r]
    assert len(rows) == 2
    # a random model's verdicts do not parse: counted, no reward from the judge; the rubric asks it too
    assert rows[0]["reward/judge/unparseable"] > 0
    assert "reward/rubric/pass/short" in rows[0] or any(k.startswith("reward/rubric/pass/") for k in rows[0])


def test_a_checked_rubric_alone(work, tmp_path, capsys):
    rc = main(grpo(work, tmp_path / "run", "--rubric", work / "checked.json"))
    assert rc == 0, capsys.readouterr().err
    rows = [r for r in read_metrics(tmp_path / "run") if r.get("stage") == "grpo" and "reward/rubric/mean" in r]
    assert rows and 0 <= rows[0]["reward/rubric/mean"] <= 1


@pytest.mark.parametrize("args, message", [
    (["--rubric", "{d}/rubric.json"], "have no 'check' verifier, so a judge must grade them"),
    (["--rubric", "{d}/nope.json"], "no such file"),
    (["--reward-judge", "{d}/nope"], "nope"),
    ([], "needs a reward source"),
    (["--rubric", "{d}/checked.json", "--reward-weights", "1", "2"], "2 numbers for 1 reward sources"),
])
def test_wrong_combinations_are_one_message(work, tmp_path, capsys, args, message):
    rc = main(grpo(work, tmp_path / "run", *[a.format(d=work) for a in args], "--dry-run"))
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err, err


def test_grpo_with_ppo_ptx(work, tmp_path, capsys):
    """PPO-ptx from the command line: --ptx-data's rows' NLL mixed into every update (--ptx-coef)."""
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"say {i}"},
                                                      {"role": "assistant", "content": str(i)}]}) + "\n"
                             for i in range(4)))
    out = tmp_path / "run"
    rc = main(grpo(work, out, "--reward", f"{work / 'checks.py'}:length", "--ptx-coef", "0.5", "--ptx-data", chats,
                   "--ptx-batch-size", "2"))
    assert rc == 0, capsys.readouterr().err
    rows = [r for r in read_metrics(out) if r.get("stage") == "grpo"]
    assert len(rows) == 2 and all(r["train/ptx_loss"] > 0 for r in rows)
    rc = main(grpo(work, tmp_path / "r2", "--reward", f"{work / 'checks.py'}:length", "--ptx-coef", "0.5", "--dry-run"))
    err = capsys.readouterr().err
    assert rc == 2 and "--ptx-coef and --ptx-data go together" in err
