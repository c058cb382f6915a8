"""The smollm2 recipe (experiment smollm2) reduced to a tiny random HF Llama: its stages run through the sft and
grpo commands' code, every model loads from its folder, no held-out problem is in a training file, the reports
(one seed, over seeds) have their tables, replies and verdicts; and the verdict logic on constructed numbers
gives each of its verdicts."""

import json

import pytest

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

from trajtune.config import ConfigError, from_dict, load_toml  # noqa: E402
from trajtune.experiments import get_experiment  # noqa: E402
from trajtune.experiments.smollm2 import Config, run, seeds_report  # noqa: E402
from trajtune.experiments.smollm2.config import MODEL_STAGES  # noqa: E402
from trajtune.experiments.smollm2.report import verdict, write_seeds_report  # noqa: E402
from trajtune.experiments.smollm2.stages import resolve  # noqa: E402
from trajtune.experiments.smollm2.task import Problem, heldout, is_number, training  # noqa: E402
from trajtune.metrics import read_metrics  # noqa: E402
from trajtune.models.hf_random import make_random_model  # noqa: E402
from trajtune.recipes import __file__ as recipes_init  # noqa: E402

REDUCED = {"n_sft": 64, "n_grpo": 32, "n_eval": 8, "eval_samples": 2, "n_examples": 3,
           "sft": {"steps": 3, "batch_size": 4}, "grpo": {"steps": 2, "tasks_per_step": 2, "group_size": 4},
           "sampling": {"max_new_tokens": 4}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    model = make_random_model(tmp_path_factory.mktemp("tiny") / "model")
    root = tmp_path_factory.mktemp("smollm2")
    config = from_dict(Config, {**REDUCED, "model": {"path": str(model), "max_length": 64}})
    per_seed = {}
    for s in (0, 1):
        per_seed[s] = root / f"seed-{s}"
        run(from_dict(Config, {**REDUCED, "seed": s, "model": {"path": str(model), "max_length": 64}}), per_seed[s])
    return root, config, per_seed


def test_every_stage_ran_through_its_command_and_its_model_loads(runs):
    root, _, per_seed = runs
    d = per_seed[0]
    rows = read_metrics(d / "metrics.jsonl")
    assert [r["step"] for r in rows if r["stage"] == "sft" and "train/loss" in r] == [1, 2, 3]
    assert [r["step"] for r in rows if r["stage"] == "grpo" and "rollout/reward" in r] == [1, 2]
    for stage in ("sft", "grpo"):
        assert AutoModelForCausalLM.from_pretrained(d / stage / "model", local_files_only=True) is not None
        assert set(json.loads((d / stage / "results.json").read_text())["eval"]) >= {
            "greedy_accuracy", "sampled_accuracy", "greedy_format", "sampled_format", "examples"}


def test_no_held_out_problem_is_in_any_training_file(runs):
    d = runs[0] / "seed-0"
    held = {json.dumps(r["prompt"]) for r in map(json.loads, (d / "data" / "heldout.jsonl").read_text().splitlines())}
    assert len(held) >= 7  # 8 draws, duplicates possible
    prompts = [json.dumps(json.loads(x)["prompt"]) for x in (d / "data" / "prompts.jsonl").read_text().splitlines()]
    sft = [json.dumps(json.loads(x)["messages"][:2]) for x in (d / "data" / "sft.jsonl").read_text().splitlines()]
    assert len(prompts) == 32 and len(sft) == 64 and not held & (set(prompts) | set(sft))


def test_the_reports_have_the_table_the_replies_the_curves_and_a_verdict(runs):
    root, config, per_seed = runs
    one = (per_seed[0] / "report.md").read_text()
    for text in ("accuracy (greedy)", "format (sampled)", "standard errors", "grpo: greedy / sampled",
                 "sft_loss.png", "grpo_reward.png", "What is "):
        assert text in one, text
    summary = json.loads((per_seed[0] / "summary.json").read_text())
    assert set(summary["eval"]) == set(MODEL_STAGES) and len(summary["examples"]["grpo"]) == 3
    report = seeds_report(config, root, per_seed).read_text()
    assert "seed 0" in report and "seed 1" in report and "spread (max - min)" in report
    assert ("**It learned**" in report) != ("**It did not learn measurably**" in report)
    assert (root / "grpo_reward.png").is_file() and (root / "report.html").is_file()


def test_verdict_on_constructed_gains():
    assert verdict([0.30, 0.25, 0.35]) == "rises"  # mean 0.30 > spread 0.10
    assert verdict([0.05, 0.20, 0.02]) == "within the seed spread"  # mean 0.09 < spread 0.18
    assert verdict([0.10, -0.01, 0.12]) == "within the seed spread"  # a seed that fell
    assert verdict([-0.30, -0.25, -0.35]) == "falls"
    assert verdict([-0.05, -0.20, -0.02]) == "within the seed spread"
    assert verdict([0.0, 0.0, 0.0]) == "within the seed spread"
    assert verdict([0.4]) == "one seed, no spread"


def test_seeds_report_headline_follows_the_verdicts(tmp_path):
    config = Config()

    def seed(s, base, sft, grpo):
        ev = {m: {"greedy_accuracy": v, "sampled_accuracy": v, "greedy_format": 1.0, "sampled_format": 1.0,
                  "per_op": {"+": v}} for m, v in (("base", base), ("sft", sft), ("grpo", grpo))}
        return {"seed": s, "eval": ev, "examples": {m: [["What is 1+2?", "3", "3", "3"]] for m in MODEL_STAGES},
                "wall_s": dict.fromkeys(MODEL_STAGES, 1.0)}

    (tmp_path / "a").mkdir()
    text = write_seeds_report(tmp_path / "a", config, {s: seed(s, 0.0, 0.30 + s / 100, 0.40 + s / 100)
                                                       for s in range(3)}).read_text()
    assert "**It learned**" in text and "RL adds to the warm start beyond the spread" in text
    (tmp_path / "b").mkdir()
    text = write_seeds_report(tmp_path / "b", config, {0: seed(0, 0.0, 0.30, 0.31), 1: seed(1, 0.0, 0.30, 0.20),
                                                       2: seed(2, 0.0, 0.05, 0.02)}).read_text()
    assert "**It did not learn measurably**" in text and "within the seed spread" in text


def test_task_and_recipe():
    assert Problem(47, "*", 6).answer == "282" and Problem(50, "-", 13).answer == "37"
    assert is_number(" 282 ") and is_number("-3") and not is_number("282.") and not is_number("The answer is 2")
    ops = ("+", "-", "*")
    assert heldout(16, ops) == heldout(16, ops) and not set(heldout(16, ops)) & set(training(500, 3, ops, 16))
    assert all(p.a >= p.b for p in training(200, 0, ("-",), 16))
    raw = load_toml(__import__("pathlib").Path(recipes_init).parent / "smollm2.toml")
    assert get_experiment(raw["experiment"]).Config is Config
    c = from_dict(Config, raw["config"])
    assert c.model.path == "smollm2-135m" and c.grpo.group_size == 8
    with pytest.raises(ValueError, match="ops"):
        Config(ops=["/"])
    with pytest.raises(ConfigError, match="model.path: /nonexistent: no such directory"):
        resolve("/nonexistent")
