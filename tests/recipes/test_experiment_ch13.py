"""The chapter13 recipe (REPRODUCE part B) at a reduced budget: it runs end to end, writes its
report with every claim row and plot, resumes from finished stages, and runs over seeds (B8)."""

from __future__ import annotations

import json

import pytest

from dataclasses import replace

from trajtune.cli import builtin_recipes, load_recipe
from trajtune.experiments import get_experiment
from trajtune.experiments.chapter13 import Config, run, seeds_report, stages
from trajtune.metrics import is_documented, read_metrics
from trajtune.runs.rundir import run_seeds


def tiny(**kw) -> Config:
    """The recipe at a budget of seconds: every stage, a few steps each."""
    d = Config()
    return Config(**{**dict(
        runner=replace(d.runner, workers=1), dim=32, n_layers=1, pretrain=replace(d.pretrain, steps=15), val_windows=16,
        sft=replace(d.sft, steps=8), adherence_samples=1, max_reply=16, reward_model=replace(d.reward_model, steps=4),
        bon_ns=[2, 4], bon_repeats=1, eval_per_word=1, dpo_betas=[1.0, 0.1], dpo=replace(d.dpo, steps=2), calc_dim=32,
        calc_layers=1, coldstart=replace(d.coldstart, steps=10),
        rl=replace(d.rl, steps=3, tasks_per_step=4, group_size=4), control=replace(d.control, steps=3),
        pass_k=4), **kw})


def test_stage_graph_and_validation():
    assert [s.name for s in stages(Config(parts=["rlvr"]))] == ["coldstart", "grpo", "sft_control"]
    names = [s.name for s in stages(Config())]
    assert set(names) == {"pretrain", "coldstart", "sft_narrow", "sft_broad", "grpo", "sft_control", "reward_model",
                          "dpo_beta1", "dpo_beta0.3", "dpo_beta0.1"}
    with pytest.raises(ValueError, match="instruct"):
        Config(parts=["preference"])


def test_loop_seeds_come_from_the_one_seed():
    c = Config(seed=3)
    assert {c.pretrain.seed, c.sft.seed, c.reward_model.seed, c.dpo.seed, c.coldstart.seed, c.rl.seed} == {3}
    assert c.control.seed == 4
    assert replace(c, seed=5).rl.seed == 5 and c.rl.seed == 3  # the seeds loop's replace re-derives, shares nothing
    assert (c.rl.advantage, c.rl.aggregation, c.rl.group_size) == ("grpo", "token", 8)


def test_recipes_validate():
    for name in ("chapter13", "chapter13_rlvr"):
        module, config, raw = load_recipe(builtin_recipes()[name])
        assert module is get_experiment("chapter13") and isinstance(config, Config) and raw["description"]
        assert hasattr(module, "seeds_report")
        assert config == replace(Config(), parts=config.parts)  # the recipes restate the defaults: same numbers


def test_chapter13_end_to_end_and_resume(tmp_path, capsys):
    report = run(tiny(), tmp_path)
    text = report.read_text()
    for cid in ("B1", "B2a", "B2b", "B2c", "B3", "B4", "B5a", "B5b", "B6a", "B6b", "B6c", "B7"):
        assert f"| {cid} |" in text, cid
    for png in ("pretrain_loss", "adherence", "frontier", "frontier_format", "pass_at_k", "grpo"):
        assert (tmp_path / f"{png}.png").stat().st_size > 1000
    assert (tmp_path / "report.html").exists()
    rows = [line for line in (tmp_path / "claims.md").read_text().splitlines() if line.startswith("| B")]
    held, judged = sum(line.endswith("| holds |") for line in rows), sum(not line.endswith("| n/a |") for line in rows)
    assert f"**{held} of {judged} claims hold**" in text.split("## Claims")[0]  # from the verdicts, up front
    res = json.loads((tmp_path / "reward_model" / "results.json").read_text())
    assert set(res["best_of_n"]) == {"2", "4"} and 0 <= res["rm_accuracy"] <= 1
    grpo = json.loads((tmp_path / "grpo" / "results.json").read_text())
    assert len(grpo["curve"]) == 3 and all(0 <= c[2] <= 1 for c in grpo["curve"])
    rows = read_metrics(tmp_path)  # one metrics.jsonl: every row names its stage, every key is documented
    assert {r["stage"] for r in rows} == {s.name for s in stages(tiny())}
    assert all(is_documented(k) for r in rows for k in r if "/" in k)
    assert sum(r["stage"] == "grpo" and "rollout/no_signal_share" in r for r in rows) == 3
    claims = (tmp_path / "claims.md").read_text()
    capsys.readouterr()
    run(tiny(), tmp_path)  # every stage finished: read back, same claims
    assert (tmp_path / "claims.md").read_text() == claims
    assert "stage pretrain" not in capsys.readouterr().out


def test_run_seeds_writes_the_three_seed_table(tmp_path):
    config = tiny(parts=["rlvr"])
    per_seed = run_seeds(run, config, tmp_path, [0, 1])  # what `trajtune run chapter13 --seeds 0,1` runs
    assert [json.loads((d / "config.json").read_text())["rl"]["seed"] for d in per_seed.values()] == [0, 1]
    report = seeds_report(config, tmp_path, per_seed)
    table = (tmp_path / "seed_table.md").read_text()
    assert "Before RL: pass@1" in table and "±" in table and "Best-of-8" not in table
    assert report == tmp_path / "report.md" and (tmp_path / "seed-1" / "report.md").exists()
    assert "[seed 0](seed-0/report.html), [seed 1](seed-1/report.html)" in report.read_text()


def _interrupting(at):
    """TorchEngine.optim_step that sends a real SIGINT during training step `at` (of any engine)."""
    import os
    import signal

    from trajtune.engine import TorchEngine

    step = TorchEngine.optim_step

    def optim_step(self):
        if self.step + 1 == at and self.model.training:
            os.kill(os.getpid(), signal.SIGINT)
        return step(self)

    return optim_step


def _same_result(a, b, stage, name="results.json"):
    strip = lambda d: {k: v for k, v in d.items() if k != "time" and not k.startswith("time/")}  # noqa: E731
    return strip(json.loads((a / stage / name).read_text())) == strip(json.loads((b / stage / name).read_text()))


def test_a_stage_cut_short_resumes_inside_its_loop(tmp_path, monkeypatch):
    import shutil

    from trajtune.engine import TorchEngine
    from trajtune.runs.resume import RunInterrupted

    config = tiny(parts=["rlvr"])
    run(config, tmp_path / "whole")
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    shutil.rmtree(tmp_path / "cut" / "grpo")
    shutil.rmtree(tmp_path / "cut" / "sft_control")
    monkeypatch.setattr(TorchEngine, "optim_step", _interrupting(2))
    with pytest.raises(RunInterrupted, match="after step 2"):
        run(config, tmp_path / "cut")
    assert (tmp_path / "cut" / "grpo" / "resume" / "state" / "engine.json").exists()
    monkeypatch.undo()
    run(config, tmp_path / "cut")
    assert _same_result(tmp_path / "whole", tmp_path / "cut", "grpo")
    grpo_rows = lambda d: [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/")}  # noqa: E731
                           for r in read_metrics(d) if r["stage"] == "grpo"]
    assert grpo_rows(tmp_path / "whole") == grpo_rows(tmp_path / "cut")
    assert not (tmp_path / "cut" / "grpo" / "resume").exists()
