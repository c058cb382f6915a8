"""iw-SFT experiments: the bandit (C1-C3) reproduces the paper's fixed points at a reduced
budget; the BugFix comparison (C4) runs end to end (slow: it trains the flagship's weak base)."""

from __future__ import annotations

import copy
import json

import pytest

from trajtune.algorithms.iw_sft import IWSFTConfig
from trajtune.algorithms.rft import RFTConfig
from trajtune.algorithms.sft import SFTConfig
from trajtune.cli import builtin_recipes, load_recipe
from trajtune.envs.bandit import TwoArmBandit
from trajtune.experiments.iw_sft import bandit as iw_sft_bandit
from trajtune.experiments.iw_sft import bugfix as iw_sft_bugfix
from trajtune.runs.stages import StageOptions


def small_bugfix(rounds: int, samples_per_task: int, steps_per_round: int, weak_steps: int, eval_samples: int,
                 **iw) -> iw_sft_bugfix.Config:
    """A reduced C4 config: the same budget for both methods, one process."""
    budget = dict(rounds=rounds, samples_per_task=samples_per_task, steps_per_round=steps_per_round)
    return iw_sft_bugfix.Config(runner=StageOptions(workers=1), rft=RFTConfig(**budget), iw=IWSFTConfig(**budget, **iw),
                                weak=SFTConfig(steps=weak_steps, batch_size=32, length_buckets=4),
                                eval_samples=eval_samples)


def test_bandit_fixed_points_and_report(tmp_path):
    config = iw_sft_bandit.Config(rounds=6, n_per_round=5000, alphas=[0.0, 0.5, 1.0, 2.0], c3_runs=40, c3_rounds=6)
    report = iw_sft_bandit.run(config, tmp_path)
    claims = (tmp_path / "claims.md").read_text()
    assert "| C1 |" in claims and "| C2 |" in claims and "| C3 |" in claims
    c1, c2 = (line for line in claims.splitlines() if line.startswith(("| C1", "| C2")))
    assert c1.endswith("| holds |") and c2.endswith("| holds |")
    held = sum(line.endswith("| holds |") for line in claims.splitlines() if line.startswith("| C"))
    assert f"**{held} of 3 claims hold**" in report.read_text().split("## Claims")[0]
    assert report.exists() and all((tmp_path / f"{p}.png").exists() for p in ("p_right", "reward", "c3_spread"))


def test_batched_runs_each_reach_their_fixed_point():
    """Runs batched in one [runs, 2] table are independent: each run's rows get its own
    gradient (weights rescaled by its kept-set size), so each reaches the paper's fixed point."""
    env, config = TwoArmBandit(), iw_sft_bandit.Config()
    sft = iw_sft_bandit.train_on_filtered(env, "sft", 0.0, config, n=20_000, rounds=6, runs=3, seed=0)
    assert sft[-1]["p_right"] == pytest.approx([2 / 3] * 3, abs=0.02)
    clip = iw_sft_bandit.train_on_filtered(env, "clip", 0.0, config, n=20_000, rounds=8, runs=2, seed=1)
    assert clip[0]["p_right"] == pytest.approx([2 / 3] * 2, abs=0.02)  # round 1: q = pi_ref, weights 1
    assert clip[-1]["p_right"] == pytest.approx([18 / 19] * 2, abs=0.02)


def test_rft_and_iw_must_spend_the_same_budget():
    with pytest.raises(ValueError, match="same budget; they differ in rounds"):
        iw_sft_bugfix.Config(rft=RFTConfig(rounds=2))


def test_recipes_validate():
    for name, module in (("iw_sft_bandit", iw_sft_bandit), ("iw_sft_bugfix", iw_sft_bugfix)):
        mod, config, raw = load_recipe(builtin_recipes()[name])
        assert mod is module and isinstance(config, module.Config) and raw["description"]


@pytest.mark.slow
def test_bugfix_comparison_runs(tmp_path):
    config = small_bugfix(rounds=1, samples_per_task=2, steps_per_round=2, weak_steps=5, eval_samples=1)
    report = iw_sft_bugfix.run(config, tmp_path)
    assert "| C4 |" in report.read_text() and (tmp_path / "pass_train.png").exists()


def test_bugfix_comparison_resumes_a_stage_cut_short(tmp_path, monkeypatch):
    import json
    import shutil

    from test_experiment_ch13 import _interrupting, _same_result

    from trajtune.engine import TorchEngine
    from trajtune.runs.resume import RunInterrupted

    config = small_bugfix(rounds=2, samples_per_task=4, steps_per_round=4, q_update_every=2, weak_steps=40,
                          eval_samples=1)  # a weak base that passes some tasks: rounds train
    iw_sft_bugfix.run(config, tmp_path / "whole")
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    for stage in ("rft", "iw_sft"):
        shutil.rmtree(tmp_path / "cut" / stage)
    monkeypatch.setattr(TorchEngine, "optim_step", _interrupting(3))  # rft's round 1: saved after its step 3
    with pytest.raises(RunInterrupted, match="after step 3"):
        iw_sft_bugfix.run(config, tmp_path / "cut")
    monkeypatch.undo()
    iw_sft_bugfix.run(config, tmp_path / "cut")
    for stage in ("rft", "iw_sft"):
        assert _same_result(tmp_path / "whole", tmp_path / "cut", stage), stage
    assert json.loads((tmp_path / "cut" / "rft" / "results.json").read_text())["curve"][0]["step"] == 0


# --- C1-C3 verdicts on constructed results: the paper's numbers pass, each failure fails its check ---
def _bandit_case():
    from trajtune.envs.bandit import TwoArmBandit
    from trajtune.experiments.iw_sft.bandit import Config as BanditConfig, variants

    config = BanditConfig()
    env = TwoArmBandit((config.p_left, config.p_right))
    curves = {name: [{"p_right": 0.9, "reward": 0.95}] for name in variants(config)}
    curves["SFT"] = [{"p_right": 2 / 3, "reward": 5 / 6}]
    spread = {name: {"mean": 0.9, "sd": 0.05, "wrong_arm": 0.0, "reward": 0.95} for name in variants(config)}
    spread[f"iw-SFT smooth a={max(config.alphas):g}"] = {"mean": 0.7, "sd": 0.3, "wrong_arm": 0.2, "reward": 0.8}
    spread["SFT"] = {"mean": 0.67, "sd": 0.06, "wrong_arm": 0.01, "reward": 0.83}
    return config, env, curves, spread


def _verdicts(config, env, curves, spread):
    from trajtune.experiments.iw_sft.bandit import bandit_claims

    return {c.id: c.holds for c in bandit_claims(config, env, curves, spread)}


def test_bandit_checks_pass_the_papers_numbers_and_fail_constructed_failures():
    config, env, curves, spread = _bandit_case()
    assert _verdicts(config, env, curves, spread) == {"C1": True, "C2": True, "C3": True}
    peak = f"iw-SFT smooth a={max(config.alphas):g}"
    failures = {
        "C1": lambda c, s: c["SFT"][-1].update(p_right=0.75),
        "C2": lambda c, s: c["iw-SFT clip"][-1].update(reward=0.84),
        # peaked weights no wider than plain SFT's: the spread is not the weights' doing
        "C3": lambda c, s: s["SFT"].update(sd=0.2),
        "C3 wrong arm": lambda c, s: s["SFT"].update(wrong_arm=0.25),
        "C3 clip": lambda c, s: s["iw-SFT clip"].update(sd=0.35),
    }
    for case, mutate in failures.items():
        c, s = copy.deepcopy(curves), copy.deepcopy(spread)
        mutate(c, s)
        got = _verdicts(config, env, c, s)
        assert got[case.split()[0]] is False, (case, got)
    assert spread[peak]["sd"] >= 2 * spread["SFT"]["sd"]


def test_bugfix_seeds_report_links_each_seed(tmp_path):
    for s, (rft, iw) in enumerate(((0.5, 0.6), (0.4, 0.3))):
        (tmp_path / f"seed-{s}").mkdir()
        (tmp_path / f"seed-{s}" / "summary.json").write_text(json.dumps(
            {"rft": {"eval/pass_rate": rft, "eval/heldout_pass_rate": 0.1},
             "iw_sft": {"eval/pass_rate": iw, "eval/heldout_pass_rate": 0.2}}))
    text = iw_sft_bugfix.seeds_report(None, tmp_path, {s: tmp_path / f"seed-{s}" for s in (0, 1)}).read_text()
    assert "train pass on 1 of 2 seeds" in text
    assert "[seed 0](seed-0/report.html), [seed 1](seed-1/report.html)" in text
