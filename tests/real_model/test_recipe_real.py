"""The smollm2 recipe reduced on the real model (SmolLM2-135M-Instruct; the tier's `real_model` fixture,
tests/real_model/conftest.py, skips where it is not fetched): the base model answers in prose (no integer
reply: what leaves RL alone without signal), a short SFT warm start teaches the number-alone format, GRPO runs
from it, every model loads, and the report has its verdict. The full recipe's claim (the gain against its
seed-to-seed spread) is `trajtune run smollm2 --seeds 0,1,2`, docs/smollm2.md."""

import json

import pytest

pytest.importorskip("transformers")

from trajtune.config import from_dict  # noqa: E402
from trajtune.experiments.smollm2 import Config, run  # noqa: E402
from trajtune.metrics import read_metrics  # noqa: E402

REDUCED = {"n_sft": 200, "n_grpo": 16, "n_eval": 16, "eval_samples": 1, "n_examples": 4,
           "sft": {"steps": 12, "batch_size": 4}, "sft_optim": {"lr": 5e-5, "warmup_steps": 2},
           "grpo": {"steps": 2, "tasks_per_step": 2, "group_size": 4}}


def test_recipe_on_the_real_model(real_model, tmp_path):
    config = from_dict(Config, {**REDUCED, "model": {"path": str(real_model), "max_length": 64}})
    report = run(config, tmp_path).read_text()
    ev = {s: json.loads((tmp_path / s / "results.json").read_text())["eval"] for s in ("base", "sft", "grpo")}
    assert ev["base"]["greedy_format"] <= 0.25, ev["base"]["examples"]  # prose, not the number alone
    assert ev["sft"]["greedy_format"] >= ev["base"]["greedy_format"] + 0.5, ev["sft"]["examples"]
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows if r["stage"] == "grpo" and "rollout/reward" in r] == [1, 2]
    assert "accuracy (greedy)" in report  # the held-out table
    assert "difference ± 2 SE" in report and "standard error" in report  # each gain beside the noise that decides it
