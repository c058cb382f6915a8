"""Bad-job detection (book App. C, checklist C.5): a static evaluation that drops past a threshold."""

import logging

import pytest

from trajtune.runs.loop import EvalDropAlarm, Run, eval_drops

ROWS = [{"step": 0, "eval/accuracy": 0.62, "eval/pass_rate": 0.30}, {"step": 5, "train/loss": 1.0},
        {"step": 10, "eval/accuracy": 0.58, "eval/pass_rate": 0.10}, {"step": 20, "eval/accuracy": 0.47}]


def test_eval_drops_by_hand():
    # accuracy 0.62 -> 0.47: 15 points; pass rate 0.30 -> 0.10: 20 points (its last row is step 10)
    assert eval_drops(ROWS, ["eval/accuracy", "eval/pass_rate"]) == pytest.approx(
        {"eval/accuracy": 15.0, "eval/pass_rate": 20.0})
    assert eval_drops(ROWS, ["eval/accuracy", "eval/pass_rate"], threshold=18.0) == pytest.approx(
        {"eval/pass_rate": 20.0})
    assert eval_drops(ROWS[:3], ["eval/accuracy"]) == {}  # 4 points: within the noise
    assert eval_drops(ROWS[:1], ["eval/accuracy"]) == {}  # one evaluation: nothing to compare
    assert eval_drops([{"mmlu": 61.0}, {"mmlu": 49.0}], ["mmlu"], points=1.0) == {"mmlu": 12.0}  # already points
    assert eval_drops([{"a": 0.2}, {"a": 0.9}], ["a"]) == {}  # a rise is no alarm
    with pytest.raises(ValueError, match="threshold"):
        eval_drops(ROWS, ["eval/accuracy"], threshold=-1)


def test_run_with_an_alarm_marks_the_row_and_warns(caplog):
    scores = iter([0.62, 0.58, 0.47])
    run = Run("sft", evaluate=lambda step: {"eval/accuracy": next(scores)},
              eval_alarm=EvalDropAlarm(("eval/accuracy",), threshold=10.0))
    with caplog.at_level(logging.WARNING, logger="trajtune.runs.loop"):
        for step in (1, 2, 3):
            run.end_step(None, step, {"train/loss": 1.0}, eval_now=True)
    assert [r["alarm/eval_drop"] for r in run.history] == pytest.approx([0.0, 0.0, 15.0])
    assert "eval/accuracy dropped 15.0 points" in caplog.text and "sft step 3" in caplog.text
    plain = Run("sft", evaluate=lambda step: {"eval/accuracy": 0.1})  # the default: no alarm, no extra key
    plain.end_step(None, 1, {}, eval_now=True)
    assert "alarm/eval_drop" not in plain.history[0]
