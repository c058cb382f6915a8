"""The agent experiment (experiments/agent/) on a reduced budget: every stage runs, checkpoints,
logs documented metrics and feeds the report; the diagnostics are exact; the CLI wiring works.

The full-budget run is the main job (`trajtune run`), not a test.
"""

import dataclasses
import json

import pytest

from trajtune.algorithms.dpo import DPOConfig
from trajtune.algorithms.rft import RFTConfig
from trajtune.algorithms.rl import RLConfig
from trajtune.algorithms.sft import SFTConfig
from trajtune.cli import DEFAULT_RECIPE, load_recipe, main, parse_seeds, resolve_recipe
from trajtune.config import ConfigError
from trajtune.engine import TorchEngine, make_engine
from trajtune.experiments import agent
from trajtune.experiments.agent import diagnostics as agent_diagnostics
from trajtune.experiments.agent.claims import rl_only_stability
from trajtune.experiments.agent.report import robustness, write_seeds_report
from trajtune.experiments.bugfix import Gym, new_model, scripted_play
from trajtune.metrics import is_documented, read_metrics
from trajtune.models.tiny import load_model
from trajtune.runs.stages import StageOptions

SMALL = agent.Config(
    runner=StageOptions(workers=1), weak=SFTConfig(steps=40, batch_size=16),
    oracle=SFTConfig(steps=6, batch_size=20, eval_every=3), cold_start_step=3,
    rft=RFTConfig(rounds=2, samples_per_task=2, steps_per_round=2, batch_size=8), hack_rounds=2,
    dpo=DPOConfig(steps=4, eval_every=2), pair_samples=4,
    rl=RLConfig(steps=6, tasks_per_step=2, group_size=4, eval_every=3),
    eval_samples=1, describe_samples=1, probe_group=2, coverage_samples=2,
)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("agent")
    report = agent.run(SMALL, run_dir)
    return run_dir, report


def test_every_stage_checkpoints_and_reports(small_run):
    run_dir, report = small_run
    for stage in agent.STAGE_NAMES:
        assert (run_dir / stage / "results.json").exists(), stage
        if stage not in ("diagnostics", "generalization"):  # the two measuring stages train nothing
            model, tok = load_model(run_dir / stage / "checkpoint")
            assert tok is not None and model.config.dim == SMALL.dim
    for step in (3, 6):  # oracle SFT snapshots at every evaluation
        assert (run_dir / "oracle_sft" / f"step-{step}" / "model.safetensors").exists()
    assert report == run_dir / "report.md"
    text = report.read_text()
    for i in range(1, 14):
        assert f"| A{i} |" in text
    for png in ("curves_train.png", "curves_heldout.png", "dpo_drift.png", "dpo_behaviour.png", "hacking.png"):
        assert (run_dir / png).stat().st_size > 1000 and png in text
    assert (run_dir / "report.html").exists() and json.loads((run_dir / "summary.json").read_text())["holds"]
    assert (run_dir / "view.html").stat().st_size > 1000 and "[view.html](view.html)" in text  # written first, linked
    probes = json.loads((run_dir / "generalization" / "results.json").read_text())
    for split in ("renamed", "novel"):
        assert set(probes[split]) == set(agent.GENERALIZATION) and all(0 <= v <= 1 for v in probes[split].values())
    # where each final policy's held-out passes come from
    assert set(probes["heldout_sources"]) == set(agent.GENERALIZATION)
    report = (run_dir / "report.md").read_text()
    assert "novel (unseen code)" in report and "four conclusions" in report
    held = sum(v is True for v in json.loads((run_dir / "summary.json").read_text())["holds"].values())
    assert f"**{held} of " in report.split("## Claims")[0]  # the count on the first screen
    for caption in ("*Evaluation points*: ", "*Final-policy evaluation*: "):  # each table says which evaluation
        assert caption in report
    assert "| oracle_sft |" in text.split("Unseen names, unseen code")[1]


def test_metrics_name_their_stage_and_are_documented(small_run):
    rows = read_metrics(small_run[0])
    stages = {r["stage"] for r in rows}
    assert stages >= set(agent.STAGE_NAMES) - {"diagnostics", "generalization"}
    assert all(is_documented(k) for r in rows for k in r if "/" in k)
    weak = [r["train/loss"] for r in rows if r["stage"] == "weak_base"]
    assert len(weak) == SMALL.weak.steps and weak[-1] < 0.5 * weak[0]  # SFT on play learns the format
    rl = [r for r in rows if r["stage"] == "sft_rl" and "eval/pass_rate" in r]
    assert [r["step"] for r in rl] == [0, 3]  # SFT -> RL: 3 RL steps after the step-3 snapshot


def test_curves_costs_and_exact_diagnostics(small_run):
    run_dir, _ = small_run
    res = agent.stage_results(SMALL, run_dir)  # everything is read back, nothing reruns
    assert [p["step"] for p in res["oracle_sft"]["curve"]] == [0, 3, 6]
    assert set(res["oracle_sft"]["probes"]) == {"0", "3", "6"}
    assert res["rl_only"]["costs"]["sampled"] == 6 * 2 * 4
    assert res["rft"]["costs"]["sampled"] == 2 * 20 * 2 and len(res["rft"]["rounds"]) == 2
    a6 = res["diagnostics"]["a6"]
    assert [round(v, 4) for v in a6.values()] == [0.6931, 0.1269, 2.1269]
    a1 = res["diagnostics"]["a1"]
    assert a1["owners"]["policy"] < a1["owners"]["tool"] and abs(a1["masked_loss"] - a1["log_vocab"]) < 0.5


def test_gradient_identity_on_a_mixed_batch():
    """A4 on scripted episodes (oracle wins, blind mostly loses): the identity holds for any 0/1 batch."""
    gym = Gym()
    trajs = scripted_play(gym, "oracle", [0], gym.train[:4]) + scripted_play(gym, "blind", [0, 1], gym.train[:4])
    engine = make_engine(new_model(SMALL.seed, gym, SMALL.dim, SMALL.n_layers, SMALL.n_heads))
    out = agent_diagnostics.gradient_identity(engine, trajs, gym.pad_id)
    assert 0 < out["kept"] < out["episodes"]
    assert out["max_abs_diff"] <= 1e-5 * out["max_abs_grad"]
    assert 0 < out["cosine_baseline"] < 1


def test_rerunning_one_stage(small_run, tmp_path):
    run_dir, _ = small_run
    before = json.loads((run_dir / "dpo" / "results.json").read_text())
    res = agent.stage_results(dataclasses.replace(SMALL, runner=StageOptions(workers=1, rerun=["dpo"])), run_dir)
    assert res["dpo"]["curve"] == before["curve"]  # same seed, same numbers


def _small_sets(**more) -> list[str]:
    """`--set`s that make the default recipe SMALL (and `more`, dotted keys)."""
    from trajtune.config import to_dict
    from trajtune.config import flatten

    small, default = flatten(to_dict(SMALL)), flatten(to_dict(agent.Config()))
    small.update(more)
    return [x for k, v in small.items() if default.get(k) != v for x in ("--set", f"config.{k}={json.dumps(v)}")]


def test_a_changed_config_on_a_finished_run_is_refused_then_reruns_exactly_the_stages_it_affects(small_run, tmp_path,
                                                                                                   capsys):
    """As a user would: `trajtune run agent --run-dir X --set config.rl.steps=8` on a finished X is refused, naming
    rl.steps, the stages that read it and the one after them, and the option; with that option exactly those run
    again (from their checkpoints' inputs), and config.json says the new config."""
    import shutil

    run_dir = tmp_path / "x"
    shutil.copytree(small_run[0], run_dir)
    results = {p.parent.name: p.read_bytes() for p in run_dir.glob("*/results.json")}
    config = (run_dir / "config.json").read_bytes()
    argv = ["run", "agent", "--run-dir", str(run_dir), *_small_sets(**{"rl.steps": 8})]
    assert main(argv) == 2
    err = capsys.readouterr().err
    option = """--set 'config.runner.rerun=["rl_only","sft_rl","generalization"]'"""
    assert err.count("\n") == 1 and "rl.steps 6 -> 8" in err and option in err, err
    assert "rl_only (it read rl), sft_rl (it read rl), generalization (after " in err
    assert {p.parent.name: p.read_bytes() for p in run_dir.glob("*/results.json")} == results  # nothing changed
    assert (run_dir / "config.json").read_bytes() == config

    assert main([*argv, "--set", 'config.runner.rerun=["rl_only","sft_rl","generalization"]']) == 0
    out = capsys.readouterr().out
    ran = sorted(line.split()[1] for line in out.splitlines() if line.startswith("  stage "))
    assert ran == ["generalization", "rl_only", "sft_rl"], out
    assert {n: b for n, b in results.items() if n not in ran} == {
        p.parent.name: p.read_bytes() for p in run_dir.glob("*/results.json") if p.parent.name not in ran}
    rl = [r["step"] for r in read_metrics(run_dir) if r["stage"] == "rl_only" and "eval/pass_rate" in r]
    assert rl == [0, 3, 6, 8] and json.loads((run_dir / "config.json").read_text())["rl"]["steps"] == 8


def test_seeds_report_and_cli_wiring(small_run, tmp_path, capsys):
    summary = json.loads((small_run[0] / "summary.json").read_text())
    report = write_seeds_report(tmp_path, {0: summary, 1: summary})
    text = report.read_text()
    assert "± 0.00" in text and "| A6 | 2/2 |" in text
    assert "[seed 0](seed-0/report.html), [seed 1](seed-1/report.html)" in text and "seed-<s>" not in text
    assert "| oracle_sft |" in text.split("Unseen names, unseen code (mean ± sd)")[1]
    assert "four conclusions" in text and "/2 |" in text.split("four conclusions (§15.5), per seed")[1]
    assert parse_seeds("0,1,2") == [0, 1, 2]
    with pytest.raises(ConfigError):
        parse_seeds("0,x")
    assert DEFAULT_RECIPE == "agent"
    module, config, _ = load_recipe(resolve_recipe(None))
    assert module is agent and config.rl.steps == 60 and config.cold_start_step == 20
    assert main(["run", "--dry-run", "--run-dir", str(tmp_path / "x")]) == 0
    capsys.readouterr()
    for argv in (["--seeds", "0,x"], ["--seeds", ","], ["--seeds", "0,x", "--dry-run"],
                 ["addition", "--seeds", "0,1", "--dry-run"]):  # refused before the run directory exists
        assert main(["run", *argv, "--run-dir", str(tmp_path / "bad")]) == 2
        out, err = capsys.readouterr()
        assert "--seeds" in err and "Traceback" not in err and "running" not in out
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="unknown stages"):
        agent.Config(runner=StageOptions(rerun=["nope"]))


def test_the_weak_base_has_its_blind_spot_and_its_coverage(small_run):
    w = json.loads((small_run[0] / "weak_base" / "results.json").read_text())
    assert SMALL.weak_blind_spot == "init" and w["coverage_samples"] == SMALL.coverage_samples
    assert not any(t.startswith("init/") for t in w["coverage"])  # the base never sees `init` solved
    with pytest.raises(ValueError, match="weak_blind_spot"):
        agent.Config(weak_blind_spot="nope")


def test_a_collapsed_rl_only_run_is_named_on_the_first_screen(small_run, tmp_path):
    results = {"rl_only": {"curve": [{"eval/invalid_per_episode": 0.1, "eval/pass_rate": 0.2},
                                     {"eval/invalid_per_episode": 0.6, "eval/pass_rate": 0.2}]}}
    assert rl_only_stability(results)[0]  # + 0.5 exactly, pass not below: the bar is met
    results["rl_only"]["curve"][-1]["eval/invalid_per_episode"] = 5.5
    ok, text = rl_only_stability(results)
    assert not ok and text == "malformed calls 0.10 -> 5.50 per episode, train pass 0.20 -> 0.20"
    summary = json.loads((small_run[0] / "summary.json").read_text())
    bad = json.loads(json.dumps(summary))
    bad["numbers"]["RL only invalid/ep, last eval"] = bad["numbers"]["RL only invalid/ep, first eval"] + 3
    first = write_seeds_report(tmp_path, {0: summary, 1: bad}).read_text().split("## ")[0]
    assert "RL only collapsed on seed(s) 1 (malformed calls" in first


def test_robustness_names_the_verdicts_that_flip_with_the_float_path(small_run, tmp_path):
    summary = json.loads((small_run[0] / "summary.json").read_text())
    flipped = json.loads(json.dumps(summary))
    flipped["holds"]["A6"] = not summary["holds"]["A6"]
    paths = {"avx512": {0: summary, 1: summary}, "avx2": {0: summary, 1: flipped}}
    line, table = robustness(paths)
    assert "(4 runs)" in line and "flip with the float path alone: A6 (seed 1)" in line
    assert "| A6 | " in table and "seed 1, avx2" in table
    text = write_seeds_report(tmp_path, {0: summary, 1: summary}, paths).read_text()
    assert line in text and "## Robustness" in text
    assert "no verdict flips" in robustness({"avx512": {0: summary}, "avx2": {0: summary}})[0]


def test_kernels_needs_seeds_and_a_report_with_float_paths(tmp_path, capsys):
    """--kernels is the agent experiment's own option (`agent/kernels.py`); another experiment refuses it."""
    from trajtune.experiments.agent.kernels import cpu_kernels

    here = cpu_kernels()
    for argv, says in ((["--kernels", f"{here},default"], "give --seeds too"),
                       (["--seeds", "0", "--kernels", here], "two or more"),
                       (["--seeds", "0", "--kernels", f"{here},sse9"], "two or more distinct CPU kernel sets"),
                       (["--seeds", "0", "--kernels", f"default,{here}"] if here != "default" else
                        (["--seeds", "0", "--kernels", "avx2,default"]), "this machine's own"),
                       (["chapter13", "--seeds", "0", "--kernels", f"{here},default"], "does not support --kernels")):
        assert main(["run", *argv, "--run-dir", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("stage, at", [("oracle_sft", 4), ("rl_only", 3), ("rft", 3), ("dpo", 3)])
def test_an_interrupted_stage_resumes_to_the_same_results(small_run, tmp_path, monkeypatch, stage, at):
    """Ctrl-C (a real SIGINT) during optimizer step `at` of one stage: the stage saves and stops;
    rerunning the experiment resumes it and ends with the results and metric rows of the uninterrupted run."""
    import os
    import shutil
    import signal

    from trajtune.runs.resume import RunInterrupted

    run_dir = tmp_path / "run"
    shutil.copytree(small_run[0], run_dir)
    shutil.rmtree(run_dir / stage)
    rows = lambda d: [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/")}  # noqa: E731
                      for r in read_metrics(d) if r["stage"] == stage]
    expected_rows = rows(run_dir)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in read_metrics(run_dir)
                                                   if r["stage"] != stage))
    step = TorchEngine.optim_step

    def interrupting(self):
        if self.step + 1 == at and self.model.training:
            os.kill(os.getpid(), signal.SIGINT)
        return step(self)

    monkeypatch.setattr(TorchEngine, "optim_step", interrupting)
    with pytest.raises(RunInterrupted):
        agent.stage_results(SMALL, run_dir)  # only `stage` is unfinished
    assert (run_dir / stage / "resume" / "state" / "engine.json").exists()
    monkeypatch.setattr(TorchEngine, "optim_step", step)
    cut_at = json.loads((run_dir / stage / "resume" / "elapsed.json").read_text())["wall_s"]
    got = agent.stage_results(SMALL, run_dir)[stage]
    want = json.loads((small_run[0] / stage / "results.json").read_text())
    assert got["time"]["wall_s"] > cut_at > 0  # the stage's time counts both runs
    got.pop("time"), want.pop("time")
    assert got == want
    assert rows(run_dir) == expected_rows
    assert not (run_dir / stage / "resume").exists()


def test_format_measures_count_malformed_tokens_and_the_turn_gap():
    from trajtune.envs.bugfix import BugFixEnv
    from trajtune.envs.bugfix_tasks import make_tasks
    from trajtune.envs.scripted import bugfix_policy
    from trajtune.experiments.bugfix import format_measures
    from trajtune.sources.rollout import scripted_rollout

    class Script:
        def __init__(self, actions):
            self.actions = list(actions)

        def act(self, messages):
            return self.actions.pop(0)

    gym, task = Gym(), make_tasks("train")[0]
    good = scripted_rollout(bugfix_policy("oracle"), BugFixEnv(), task, gym.renderer)  # read, edit, submit: passes
    bad = scripted_rollout(Script(["read", "edit submit", "submit"]), BugFixEnv(), task, gym.renderer)  # one invalid
    assert good.reward == 1.0 and bad.reward == 0.0 and bad.info["n_invalid"] == 1
    for t in (good, bad):
        t.group = 0
    owners = [o for t in (good, bad) for o in t.owners]
    policy = sum(o == 2 for o in owners)  # Owner.POLICY
    bad_tokens = sum(1 for o, tu in zip(bad.owners, bad.turns) if o == 2 and tu == sorted(
        {u for p, u in zip(bad.owners, bad.turns) if p == 2})[1])
    m = format_measures([good, bad])
    assert m["rollout/malformed_token_share"] == pytest.approx(bad_tokens / policy) and bad_tokens > 0
    assert m["rollout/turns_gap"] == 0.0  # three turns each
    longer = scripted_rollout(Script(["read", "read read", "submit submit", "submit"]), BugFixEnv(), task, gym.renderer)
    longer.group = 0
    assert format_measures([good, longer])["rollout/turns_gap"] == 1.0
    assert format_measures([good])["rollout/turns_gap"] == 0.0  # no group with both outcomes


def test_a_kernels_child_stopped_by_ctrl_c_is_an_interruption_not_a_failure(tmp_path, monkeypatch):
    import subprocess
    import types

    from trajtune.experiments.agent.kernels import run_under_kernels
    from trajtune.runs.stages import RunFailed

    monkeypatch.setattr(subprocess, "run", lambda argv, env: types.SimpleNamespace(returncode=130))
    with pytest.raises(KeyboardInterrupt, match="saved its stages"):
        run_under_kernels("avx2", tmp_path / "r.toml", [], tmp_path / "kernels-avx2", [0])
    monkeypatch.setattr(subprocess, "run", lambda argv, env: types.SimpleNamespace(returncode=1))
    with pytest.raises(RunFailed, match="exit code 1"):
        run_under_kernels("avx2", tmp_path / "r.toml", [], tmp_path / "kernels-avx2", [0])


def test_pass_sources_tell_blind_guesses_stacked_edits_and_reads_apart():
    """Where held-out passes come from (A5's mechanism): the oracle reads before it edits, blind play guesses one
    op; an episode that edits twice before reading stacks its guesses (another family's op is a no-op)."""
    from trajtune.envs.bugfix import BugFixEnv
    from trajtune.experiments.bugfix import pass_sources

    gym = Gym()
    oracle = pass_sources(scripted_play(gym, "oracle", [0], gym.heldout))
    assert oracle["passes"] == 10 and oracle["after_read"] == 1.0 and oracle["first_read"] == 1.0
    blind = pass_sources(scripted_play(gym, "blind", range(8), gym.heldout))
    assert blind["passes"] > 0 and blind["blind_one"] == 1.0 and blind["first_read"] == 0.0
    task = next(t for t in gym.heldout if t.family == "compare")
    env = BugFixEnv()
    env.reset(task)
    for action in ("edit fix_range_end", "edit fix_compare", "read", "submit"):
        result = env.step(action)
    stacked = dataclasses.replace(scripted_play(gym, "oracle", [0], [task])[0], reward=result.reward, info=result.info)
    assert pass_sources([stacked]) == {"passes": 1, "blind_one": 0.0, "blind_stacked": 1.0, "after_read": 0.0,
                                       "first_read": 0.0}
