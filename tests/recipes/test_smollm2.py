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
from trajtune.experiments.smollm2.report import gain_claims, write_seeds_report  # noqa: E402
from trajtune.runs.verdicts import NOISE  # noqa: E402
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
    for text in ("accuracy (greedy)", "format (sampled)", "difference ± 2 SE", "grpo: greedy / sampled",
                 "sft_loss.png", "grpo_reward.png", "What is "):
        assert text in one, text
    summary = json.loads((per_seed[0] / "summary.json").read_text())
    assert set(summary["eval"]) == set(MODEL_STAGES) and len(summary["examples"]["grpo"]) == 3
    report = seeds_report(config, root, per_seed).read_text()
    assert "seed 0" in report and "seed 1" in report and "sd over seeds" in report and "over 2 seeds" in report
    assert f"paired {config.n_eval} problems" in one  # the evaluation kept each problem's score: the gains are paired
    assert ("**It learned**" in report) != ("**It did not learn measurably**" in report)
    assert (root / "grpo_reward.png").is_file() and (root / "report.html").is_file()


def _seed(s, base, sft, grpo, per_problem=False):
    """One seed's summary.json: greedy and sampled accuracy equal, format 100%."""
    def ev(v):
        out = {"greedy_accuracy": v[0], "sampled_accuracy": v[1], "greedy_format": 1.0, "sampled_format": 1.0,
               "per_op": {"+": v[0]}}
        if per_problem:  # 128 problems, the first round(v * 128) right
            out["per_problem"] = {kind: [float(i < round(x * 128)) for i in range(128)] for kind, x in
                                  zip(("greedy", "sampled"), v, strict=True)}
        return out

    return {"seed": s, "eval": {m: ev(v if isinstance(v, tuple) else (v, v))
                                for m, v in (("base", base), ("sft", sft), ("grpo", grpo))},
            "examples": {m: [["What is 1+2?", "3", "3", "3"]] for m in MODEL_STAGES},
            "wall_s": dict.fromkeys(MODEL_STAGES, 1.0)}


def _verdicts(per_seed):
    return {c.id: c.holds for c in gain_claims(per_seed, Config())}


def test_gains_are_judged_by_the_shared_helper_with_their_noise():
    # docs/smollm2.md, seeds 0-2: warm start -> RL sampled +5.1 / +4.7 / +4.7 points (spread 0.4: the old verdict
    # said "rises"), greedy +4.7 / -1.6 / -6.2; base -> RL greedy +35.9 / +33.6 / +30.5
    docs = {0: _seed(0, 0.0, (0.312, 0.254), (0.359, 0.305)), 1: _seed(1, 0.0, (0.352, 0.285), (0.336, 0.332)),
            2: _seed(2, 0.0, (0.367, 0.215), (0.305, 0.262))}
    got = _verdicts(docs)
    assert got["RL.s"] == NOISE  # +4.8 pooled, 2 SE 6.3 points (binomial over 128 problems a seed)
    assert got["RL.g"] == NOISE and got["L.g"] is True and got["L.s"] is True
    assert got["W.g"] is True and got["W.s"] is True
    # a clear fall is "does not hold", not "within the spread"
    assert _verdicts({s: _seed(s, 0.0, 0.60, 0.30) for s in range(3)})["RL.g"] is False
    # one seed: the held-out set's binomial noise alone
    assert _verdicts({0: _seed(0, 0.0, 0.30, 0.34)})["RL.g"] == NOISE
    assert _verdicts({0: _seed(0, 0.0, 0.30, 0.50)})["RL.g"] is True


def test_paired_per_problem_scores_decide_when_the_evaluations_kept_them():
    # +4 points on 128 problems: unpaired that is noise; paired (the same 5 problems newly right, none lost) it is
    # still a handful of problems -- 2 SE of the paired mean is 3.5 points, so it clears it
    seed = {0: _seed(0, 0.0, 0.30, 0.34, per_problem=True)}
    claims = {c.id: c for c in gain_claims(seed, Config())}
    assert "paired 128 problems" in claims["RL.g"].evidence and claims["RL.g"].holds is True


def test_seeds_report_headline_follows_the_verdicts(tmp_path):
    config = Config()
    (tmp_path / "a").mkdir()
    text = write_seeds_report(tmp_path / "a", config, {s: _seed(s, 0.0, 0.30 + s / 100, 0.45 + s / 100)
                                                       for s in range(3)}).read_text()
    assert "**It learned**" in text and "RL adds to the warm start beyond the noise" in text
    (tmp_path / "b").mkdir()
    text = write_seeds_report(tmp_path / "b", config, {0: _seed(0, 0.0, 0.30, 0.31), 1: _seed(1, 0.0, 0.30, 0.02),
                                                       2: _seed(2, 0.0, 0.05, 0.0)}).read_text()
    assert "**It did not learn measurably**" in text and "not distinguishable" in text


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
