"""The HF pipeline (experiment hf_pipeline) on a reduced budget: every stage runs through its command's
code, each stage's model loads with AutoModelForCausalLM, no held-out problem is in any training file,
the report has the per-stage table, and the pipeline learns (held-out answer NLL falls)."""

import dataclasses
import json
import os
import shutil
import signal

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

from trajtune.config import from_dict, load_toml, to_dict  # noqa: E402
from trajtune.envs.arithmetic import heldout_tasks  # noqa: E402
from trajtune.experiments import hf_pipeline as P  # noqa: E402
from trajtune.experiments.hf_pipeline.config import MODEL_STAGES  # noqa: E402
from trajtune.experiments.hf_pipeline.report import TRAINED_ON  # noqa: E402
from trajtune.experiments.hf_pipeline.task import completion_prompt, question  # noqa: E402
from trajtune.metrics import read_metrics  # noqa: E402
from trajtune.recipes import __file__ as recipes_init  # noqa: E402

REDUCED = {
    "n_pretrain": 6000, "n_sft": 1000, "n_pair_prompts": 128, "n_grpo": 200, "n_eval": 64, "eval_samples": 2,
    "pretrain": {"steps": 250, "batch_size": 64}, "sft": {"steps": 80, "batch_size": 32},
    "dpo_schedule": {"num_train_epochs": 0.5}, "grpo": {"steps": 4, "tasks_per_step": 8, "group_size": 4},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("pipeline")
    config = from_dict(P.Config, REDUCED)
    report = P.run(config, run_dir)
    results = {s: json.loads((run_dir / s / "results.json").read_text()) for s in MODEL_STAGES + ("pairs",)}
    return run_dir, config, report, results


@pytest.mark.slow  # this and every test of the reduced pipeline (`run`): the slow tier (.ci/run)
def test_every_stage_ran_through_its_command_and_its_model_loads(run):
    run_dir, config, _, results = run
    rows = read_metrics(run_dir / "metrics.jsonl")
    for stage, steps in (("pretrain", 250), ("sft", 80), ("grpo", 4)):
        assert results[stage]["steps"] == steps
        assert [r["step"] for r in rows if r["stage"] == stage] == list(range(1, steps + 1))
    assert results["dpo"]["steps"] >= 1 and any(r["stage"] == "dpo" and "dpo/margin" in r for r in rows)
    assert any(r["stage"] == "grpo" and "rollout/reward" in r for r in rows)
    for stage in MODEL_STAGES:
        model = AutoModelForCausalLM.from_pretrained(run_dir / stage / "model", local_files_only=True)
        assert model.config.num_hidden_layers == config.llama.num_hidden_layers
    pairs = [json.loads(x) for x in (run_dir / "data" / "pairs.jsonl").read_text().splitlines()]
    assert len(pairs) == results["pairs"]["pairs"] > 0
    assert all(p["chosen"] != p["rejected"] for p in pairs)


@pytest.mark.slow
def test_no_held_out_problem_is_in_any_training_file(run):
    run_dir = run[0]
    held = {question(t) for t in heldout_tasks()} | {completion_prompt(t) for t in heldout_tasks()}
    for name in ("pretrain", "sft", "prompts", "pairs"):
        text = (run_dir / "data" / f"{name}.jsonl").read_text()
        assert not [q for q in held if q in text], name


@pytest.mark.slow
def test_the_report_has_the_table_and_the_plots(run):
    run_dir, config, report, results = run
    text = report.read_text()
    assert "| stage | trained on | steps | completion pass@1 (greedy) | chat pass@1 (greedy) |" in text
    for stage in MODEL_STAGES:
        assert f"| {stage} | {TRAINED_ON[stage]} |" in text
    verdicts = sum(text.count(f"({w})") for w in ("holds", "does not hold", "not distinguishable"))
    assert verdicts == 9  # pretrain 3 metrics, sft/dpo/grpo 2 each, each beside its ± 2 SE
    assert "its metrics vs the stage before (± 2 SE)" in text and "paired 64" in text
    for png in ("pipeline_pass_at_1.png", "pipeline_loss.png", "pipeline_reward.png"):
        assert (run_dir / png).stat().st_size > 1000 and png in text
    assert (run_dir / "report.html").exists()


def _results(levels: dict, n: int = 64) -> dict:
    """Constructed stage results: stage -> {metric: share}, each metric's first round(share * n) problems right."""
    def ev(shares):
        per = {m: [float(i < round(v * n)) for i in range(n)] for m, v in shares.items()}
        return {**shares, "chat_pass_at_k": shares["chat_sampled"], "per_problem": per}

    return {s: {"eval": ev(v)} for s, v in levels.items()}


def test_each_stage_claim_follows_its_gain_and_noise_not_its_headline():
    """A stage whose pass@1 'rose' by two problems of 64 is not distinguishable (the earlier verdict said rises);
    ten more problems right, none lost, holds; a clear fall does not hold."""
    from trajtune.experiments.hf_pipeline.report import stage_claims, stage_summary
    from trajtune.runs.verdicts import NOISE

    config = P.Config(n_eval=64)
    lvl = lambda c, g, s: {"completion_greedy": c, "chat_greedy": g, "chat_sampled": s}  # noqa: E731
    r = _results({"base": lvl(0, 0, 0), "pretrain": lvl(0.5, 0.3, 0.3), "sft": lvl(0.5, 0.6, 0.5),
                  "dpo": lvl(0.5, 0.63, 0.7), "grpo": lvl(0.2, 0.4, 0.7)})
    got = {c.id: c.holds for c in stage_claims(r, config)}
    assert got["pretrain.c"] is True and got["sft.g"] is True and got["sft.s"] is True
    assert got["dpo.g"] == NOISE and got["dpo.s"] is True  # +2 problems of 64; +13
    assert got["grpo.g"] is False and got["grpo.s"] == NOISE  # -15 problems; none moved
    text = stage_summary(r, config, stage_claims(r, config))
    assert "Not every stage raised the metrics it targets beyond the noise" in text
    assert "inside the noise: chat pass@1 (greedy) 60.0% -> 63.0%" in text
    assert "The pretraining format is forgotten" in text  # completion 50% -> 20%, paired


@pytest.mark.slow
def test_the_pipeline_learns(run):
    """Held-out answer NLL (the sums of problems never trained on, asked through the chat template) falls:
    pretraining takes it far below the random model's, and SFT lowers it further."""
    results = run[3]
    nll = {s: results[s]["eval"]["chat_answer_nll"] for s in MODEL_STAGES}
    print(nll)
    assert nll["pretrain"] < nll["base"] - 1.0, nll
    assert nll["sft"] < 0.98 * nll["pretrain"], nll


@pytest.mark.slow
def test_a_rerun_reads_every_finished_stage_back(run, capsys):
    run_dir, config, _, results = run
    P.run(config, run_dir)
    assert "  stage " not in capsys.readouterr().out  # nothing ran again
    assert json.loads((run_dir / "grpo" / "results.json").read_text()) == results["grpo"]


@pytest.mark.slow
def test_a_stage_cut_by_ctrl_c_resumes_to_the_same_model(run, tmp_path, monkeypatch):
    """GRPO run again in a copy of the finished run, cut by a real SIGINT after its step 2: the same command
    again continues it from step 2 and ends with the uninterrupted run's weights and metric rows."""
    from trajtune.experiments.hf import grpo

    run_dir, config = run[0], run[1]
    cut = tmp_path / "cut"
    shutil.copytree(run_dir, cut)
    again = dataclasses.replace(config, runner=dataclasses.replace(config.runner, rerun=["grpo"]))
    real, steps = grpo.train_rl, []

    def watched(stop_at):
        def train_rl(engine, tasks, collect, rl, pad_id, run, **kw):
            end_step = run.end_step

            def end(engine, step, row, **kw):
                steps.append(step)
                if step == stop_at:
                    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: the stage's checkpointer saves after this step
                return end_step(engine, step, row, **kw)

            run.end_step = end
            return real(engine, tasks, collect, rl, pad_id, run, **kw)

        return train_rl

    monkeypatch.setattr(grpo, "train_rl", watched(stop_at=2))
    with pytest.raises(KeyboardInterrupt):
        P.run(again, cut)
    assert steps == [1, 2] and (cut / "grpo" / "resume").exists() and not (cut / "grpo" / "results.json").exists()
    monkeypatch.setattr(grpo, "train_rl", watched(stop_at=None))
    P.run(again, cut)
    assert steps == [1, 2, 3, 4]  # continued from step 2, not from the start
    a, b = (AutoModelForCausalLM.from_pretrained(d / "grpo" / "model").state_dict() for d in (run_dir, cut))
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = lambda d: [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/")}  # noqa: E731
                      for r in read_metrics(d / "metrics.jsonl")]
    assert rows(cut) == rows(run_dir)


def test_the_recipe_is_the_default_config():
    from pathlib import Path

    raw = load_toml(Path(recipes_init).parent / "hf_pipeline.toml")
    assert raw["experiment"] == "hf_pipeline"
    assert to_dict(from_dict(P.Config, raw["config"])) == to_dict(P.Config())
