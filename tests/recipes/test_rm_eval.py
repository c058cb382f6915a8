"""`trajtune rm --objective ...`, `trajtune rm-eval`, several --reward-model as one ensemble, and a reward model
scoring finished completions only (RLHF book ch.5, ch.6 Implementation, ch.14.4; S5.3)."""

import json
import math

import pytest

from trajtune.experiments.hf.rm_eval import format_report, pair_report
from trajtune.sources.scoring import unfinished_scores


# --- pure functions, hand-worked ---------------------------------------------------------------------
def test_pair_report_by_hand():
    # pairs: (2 vs 1) right, (0 vs 1) wrong, (1 vs 1) a tie: wrong; margins 1, -1, 0
    r = pair_report([2.0, 0.0, 1.0], [1.0, 1.0, 1.0], ["math", "math", None])
    assert (r["n"], r["accuracy"], r["margin"]) == (3, pytest.approx(1 / 3), pytest.approx(0.0))
    assert r["categories"] == {"math": {"n": 2, "accuracy": 0.5, "margin": 0.0}}  # (1 + -1) / 2
    text = format_report(r)
    assert text.splitlines()[0] == "pairs 3  accuracy 0.333  mean margin 0.000" and "math" in text
    with pytest.raises(ValueError, match="need >= 1 pair"):
        pair_report([], [])


def test_unfinished_completions_get_the_penalty_not_the_model_score():
    scores, cut = [1.0, 3.0, None, 2.0], [False, True, True, False]
    # default: 1 below the lowest finished score (1.0) -> 0.0; a None (not scored) stays None
    assert unfinished_scores(scores, cut) == [1.0, 0.0, None, 2.0]
    assert unfinished_scores(scores, cut, -5.0) == [1.0, -5.0, None, 2.0]
    assert unfinished_scores([4.0, 5.0], [True, True]) == [0.0, 0.0]  # none finished: equal, no signal
    with pytest.raises(ValueError, match="2 scores for 1"):
        unfinished_scores([1.0, 2.0], [True])


# --- the commands on a tiny random model ------------------------------------------------------------------
@pytest.fixture(scope="module")
def work(tmp_path_factory):
    pytest.importorskip("transformers")
    from trajtune.models.hf_random import make_random_model

    d = tmp_path_factory.mktemp("rm")
    make_random_model(d / "model", "qwen2", "tiny")

    def write(name, rows):
        (d / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    write("pairs.jsonl", [{"prompt": f"what is {i}+5?", "chosen": f"{i + 5}", "rejected": "hello world",
                           "category": "math" if i % 2 else "chat", "margin": 1} for i in range(4)])
    write("labelled.jsonl", [{"prompt": f"what is {i}+5?", "completion": c, "label": c == f"{i + 5}"}
                             for i in range(3) for c in (f"{i + 5}", "no")])
    write("steps.jsonl", [{"prompt": f"what is {i}+5+1?", "completions": [f"{i}+5={i + 5}", f"{i + 5}+1={i + 6}"],
                           "labels": [True, i % 2 == 0]} for i in range(4)])
    write("ranked.jsonl", [{"prompt": f"what is {i}+5?", "completions": ["hi", f"{i + 5}", "x"], "scores": [1, 3, 0]}
                           for i in range(4)])
    write("prompts.jsonl", [{"prompt": [{"role": "user", "content": f"what is {i}+5?"}]} for i in range(2)])
    return d


def _rm(work, out, data, *flags):
    from trajtune.cli import main

    return main(["rm", "--model", str(work / "model"), "--data", str(work / data), "--steps", "2", "--batch-size", "4",
                 "--lr", "1e-2", "--out", str(out), *flags])


def test_orm_and_prm_save_their_kind_and_score_as_saved(work, tmp_path, capsys):
    from trajtune.cli import main
    from trajtune.metrics import read_metrics

    assert _rm(work, tmp_path / "orm", "labelled.jsonl", "--objective", "orm", "--aggregate", "min",
               "--eval-split", "0.5", "--split-seed", "1") == 0
    assert json.loads((tmp_path / "orm" / "model" / "reward_model.json").read_text()) == {
        "objective": "orm", "aggregate": "min", "step_separator": "\n"}
    rows = read_metrics(tmp_path / "orm")
    assert "orm/accuracy" in rows[-1] and "eval/token_accuracy" in rows[-1]
    assert _rm(work, tmp_path / "prm", "steps.jsonl", "--objective", "prm") == 0
    assert read_metrics(tmp_path / "prm")[-1]["prm/steps"] > 0
    # as a reward source, the PRM cuts a sampled completion into steps at its separator and scores each step
    from trajtune.engine import make_engine
    from trajtune.experiments.hf.model import ModelConfig
    from trajtune.experiments.hf.graders import reward_model
    from trajtune.sources.rewards import RewardBatch

    class Ctx:
        engine = staticmethod(lambda model, optim=None, **kw: make_engine(model, optim, **kw))

    prm = reward_model(Ctx(), str(tmp_path / "prm" / "model"), ModelConfig(path=str(tmp_path / "prm" / "model")))
    assert (prm.kind.objective, prm.kind.aggregate) == ("prm", "mean")
    assert len(prm.render("what is 1+5+1?", "1+5=6\n6+1=7").info["step_ends"]) == 2
    batch = RewardBatch(["what is 1+5+1?"] * 2, ["1+5=6\n6+1=7", "1+5=6"], [[1], [1]], {}, ["p:1", "p:2"])
    assert all(0.0 < s < 1.0 for s in prm(batch))  # the mean of the steps' probabilities
    capsys.readouterr()
    assert main(["rm-eval", "--model", str(tmp_path / "orm" / "model"), "--data", str(work / "pairs.jsonl"),
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n"] == 4 and set(report["categories"]) == {"chat", "math"}
    assert all(0.0 <= v["accuracy"] <= 1.0 for v in report["categories"].values())


def test_ranked_rows_and_the_eval_split_halves(work, tmp_path):
    from trajtune.metrics import read_metrics

    for objective in ("plackett-luce", "bt"):  # bt on ranked rows: all C(3,2) pairs of a prompt in its batch
        assert _rm(work, tmp_path / objective, "ranked.jsonl", "--objective", objective, "--eval-split", "0.5") == 0
        row = read_metrics(tmp_path / objective)[-1]
        assert "rm/top1_accuracy" in row and "eval/pair_accuracy" in row
    # a proxy and a gold model on disjoint halves: --split-swap trains on the other half
    from trajtune.experiments.hf.prepare import split_rows

    train, held = split_rows(list(range(10)), 0.5, seed=3)
    swapped, rest = split_rows(list(range(10)), 0.5, seed=3, swap=True)
    assert sorted(train + held) == list(range(10)) and (swapped, rest) == (held, train)


def test_rm_eval_messages(work, tmp_path, capsys):
    from trajtune.cli import main

    assert _rm(work, tmp_path / "bt", "pairs.jsonl") == 0  # the 'margin' column: Llama 2's margin per pair
    capsys.readouterr()
    assert main(["rm-eval", "--model", str(tmp_path / "bt" / "model"), "--data", str(work / "pairs.jsonl")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pairs 4  accuracy") and "category" in out and "math" in out
    cases = [(["--model", str(work / "model"), "--data", str(work / "pairs.jsonl")], "not a reward model saved by"),
             (["--model", str(tmp_path / "bt" / "model"), "--data", str(tmp_path / "none.jsonl")], "no such file"),
             (["--model", str(tmp_path / "bt" / "model"), "--data", str(work / "labelled.jsonl")],
              "labelled.jsonl:1: a 'completion' row, but this command needs 'preference' rows")]
    for flags, says in cases:
        assert main(["rm-eval", *flags]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, err


def test_several_reward_models_are_one_ensemble_source(work, tmp_path):
    from trajtune.cli import main
    from trajtune.metrics import read_metrics

    assert _rm(work, tmp_path / "a", "pairs.jsonl") == 0
    assert _rm(work, tmp_path / "b", "labelled.jsonl", "--objective", "orm") == 0
    assert main(["grpo", "--model", str(work / "model"), "--data", str(work / "prompts.jsonl"), "--steps", "1",
                 "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "4", "--out", str(tmp_path / "g"),
                 "--reward-model", str(tmp_path / "a" / "model"), str(tmp_path / "b" / "model"),
                 "--reward-model-combine", "min", "--score-unfinished"]) == 0
    (row,) = read_metrics(tmp_path / "g")
    assert row["reward/reward_ensemble/member_std"] > 0 and row["reward/reward_ensemble/mean"] != 0
    assert math.isclose(row["rollout/reward"], row["reward/reward_ensemble/mean"], rel_tol=1e-6)
    # 4 new tokens are too few for a random model to end an answer: every completion is unfinished, counted; by
    # default they all get the same penalty (none finished: 0), not the models' scores
    assert row["reward/unfinished"] == 4.0
    assert main(["grpo", "--model", str(work / "model"), "--data", str(work / "prompts.jsonl"), "--steps", "1",
                 "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "4", "--out", str(tmp_path / "h"),
                 "--reward-model", str(tmp_path / "a" / "model")]) == 0
    (row,) = read_metrics(tmp_path / "h")
    assert row["reward/reward_model/mean"] == 0.0 and row["reward/reward_model/std"] == 0.0


def test_margins_apply_to_pairs_only(work, tmp_path, capsys):
    (tmp_path / "mixed.jsonl").write_text(
        json.dumps({"prompt": "1+5?", "completions": ["6", "7"]}) + "\n"
        + json.dumps({"prompt": "2+5?", "chosen": "7", "rejected": "8", "margin": 2}) + "\n")
    assert _rm(work, tmp_path / "a", tmp_path / "mixed.jsonl") == 2
    assert "mixed.jsonl:2: field 'margin': a per-pair margin applies to pairs" in capsys.readouterr().err
    assert _rm(work, tmp_path / "b", "labelled.jsonl", "--objective", "orm", "--margin", "1") == 2
    assert "--margin 1.0: the Bradley-Terry margin applies to pairs" in capsys.readouterr().err
