"""The run directory's one owner (trajtune.runs.rundir): naming, the lock, config.json, and what a run
does with an earlier one there -- which stages a changed config affects is what they recorded reading.

The toy stages live at module level (a worker process imports them from here, as in test_stages.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest

from trajtune.cli import main
from trajtune.config import ConfigError, to_dict
from trajtune.runs import rundir as R
from trajtune.runs.resume import RunInterrupted
from trajtune.runs.rundir import RunDir, RunDirBusy, run_seeds
from trajtune.runs.stages import Stage, StageContext, StageOptions, run_stages

ROOT = Path(__file__).resolve().parents[2]


# --- a toy experiment ----------------------------------------------------------------------------
@dataclass
class Section:
    steps: int = 2
    lr: float = 0.1


@dataclass
class Toy:
    RESUMABLE: ClassVar[tuple[str, ...]] = ("sec.steps",)
    seed: int = 0
    x: int = 1
    y: int = 10
    z: int = 100
    unread: int = 0
    sec: Section = field(default_factory=Section)
    runner: StageOptions = field(default_factory=lambda: StageOptions(workers=1))


def _count(ctx: StageContext) -> int:
    ctx.dir.mkdir(parents=True, exist_ok=True)
    calls = ctx.dir / "calls"
    n = int(calls.read_text()) + 1 if calls.exists() else 1
    calls.write_text(str(n))
    return n


def _total(ctx: StageContext, stage: str) -> int:
    return json.loads((ctx.run_dir / stage / "results.json").read_text())["total"]


def helper(config) -> int:
    """A helper the whole config is passed to: its reads count too."""
    return config.y + config.sec.steps


def stage_a(ctx):
    return {"total": ctx.config.x, "calls": _count(ctx)}


def stage_b(ctx):
    return {"total": helper(ctx.config), "calls": _count(ctx)}


def stage_c(ctx):
    return {"total": ctx.config.z + _total(ctx, "a"), "calls": _count(ctx)}


def stage_d(ctx):
    return {"total": _total(ctx, "b"), "calls": _count(ctx)}


def stage_given(ctx, config):
    """Given the config itself as an argument (as the HF methods' stages are)."""
    return {"total": config.unread, "calls": _count(ctx)}


GRAPH = [Stage("a", stage_a, reads=("x",)), Stage("b", stage_b, reads=("y", "sec")),
         Stage("c", stage_c, after=("a",), reads=("z",)), Stage("d", stage_d, after=("b",), reads=())]


def run(config: Toy, run_dir: Path, graph=GRAPH) -> dict:
    return run_stages(graph, config, run_dir, config.runner, log=lambda s: None)


def calls(run_dir: Path) -> dict[str, int]:
    return {p.parent.name: int(p.read_text()) for p in sorted(run_dir.glob("*/calls"))}


def snapshot(d: Path) -> dict:
    """Every file under `d`: (bytes, mtime) -- to show a refused run changed nothing."""
    return {p.relative_to(d): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(d.rglob("*"))
            if p.is_file() and p.name not in R.LOCKS}  # a run holds the lock before it is refused


def rerun(config: Toy, *names: str) -> Toy:
    return dataclasses.replace(config, runner=StageOptions(workers=1, rerun=list(names)))


# --- what a stage reads is declared ------------------------------------------------------------------
def test_a_declared_field_the_config_lacks_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match=r"stage 'a' declares it reads \['nope'\], which Toy does not have"):
        run(Toy(), tmp_path, [Stage("a", stage_a, reads=("x", "nope"))])
    with pytest.raises(ValueError, match="reads must be a tuple"):
        Stage("a", stage_a, reads="x")
    assert not (tmp_path / "a").exists()


def test_a_stage_reading_a_field_it_does_not_declare_fails_naming_it(tmp_path):
    """The declaration cannot fall behind the code: the stage's view of the config refuses an undeclared field."""
    with pytest.raises(AttributeError, match=r"stage 'a' reads config\.x, which its Stage\(\.\.\., reads=\.\.\.\) "
                                             r"does not declare"):
        run(Toy(), tmp_path, [Stage("a", stage_a, reads=("y",))])
    assert not (tmp_path / "a" / "results.json").exists()


def test_each_stage_records_the_fields_it_declares_and_its_after(tmp_path):
    out = run(Toy(runner=StageOptions(workers=2)), tmp_path)
    inputs = {n: r["inputs"] for n, r in out.items()}
    # "runner" is every stage's (its threads); run in worker processes, the record came back in results.json
    assert inputs == {"a": {"config": ["runner", "x"], "stages": []},
                      "b": {"config": ["runner", "sec", "y"], "stages": []},
                      "c": {"config": ["runner", "z"], "stages": ["a"]}, "d": {"config": ["runner"], "stages": ["b"]}}
    assert json.loads((tmp_path / "c" / "results.json").read_text())["inputs"] == inputs["c"]
    assert json.loads((tmp_path / "config.json").read_text()) == to_dict(Toy(runner=StageOptions(workers=2)))

    config = Toy(unread=5)
    given = run(config, tmp_path / "given", [Stage("e", stage_given, args=(config,), reads=("unread",))])["e"]
    assert given["total"] == 5 and given["inputs"]["config"] == ["runner", "unread"]  # the config as an argument
    whole = run(config, tmp_path / "whole", [Stage("e", stage_given, args=(config,))])["e"]  # none declared: all
    assert whole["inputs"]["config"] == sorted(f.name for f in dataclasses.fields(Toy))


# --- a changed config -------------------------------------------------------------------------
def test_a_changed_config_is_refused_naming_keys_stages_and_the_option(tmp_path):
    run(Toy(), tmp_path)
    before = snapshot(tmp_path)
    changed = Toy(x=2)
    with pytest.raises(ConfigError) as e:
        run(changed, tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "x 1 -> 2" in msg
    assert "a (it read x), c (after a)" in msg and " b " not in msg and " d " not in msg
    assert """--set 'config.runner.rerun=["a","c"]'""" in msg and "choose another --run-dir" in msg
    assert snapshot(tmp_path) == before  # nothing deleted or rewritten
    with pytest.raises(ConfigError, match=r'rerun=\["a","c"\]'):  # naming only some of them is not enough
        run(rerun(changed, "a"), tmp_path)
    assert snapshot(tmp_path) == before

    out = run(rerun(changed, "a", "c"), tmp_path)  # the rerun the refusal named: exactly those run again
    assert calls(tmp_path) == {"a": 2, "b": 1, "c": 2, "d": 1}
    assert out["c"]["total"] == 102 and json.loads((tmp_path / "config.json").read_text())["x"] == 2
    run(changed, tmp_path)  # now the directory's config: read back, nothing runs
    assert calls(tmp_path) == {"a": 2, "b": 1, "c": 2, "d": 1}


def test_a_key_a_later_version_added_at_its_default_is_no_change_and_at_another_value_is_one(tmp_path):
    """A run saved before a config key existed (config.json lacks it) resumes under the version that added it while
    the key holds its default; set to something else, it is a change like any other."""
    run(Toy(), tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["z"], saved["sec"]["lr"]  # as an older trajtune wrote it
    (tmp_path / "config.json").write_text(json.dumps(saved))
    run(Toy(), tmp_path)  # nothing changed: nothing runs again
    assert calls(tmp_path) == {"a": 1, "b": 1, "c": 1, "d": 1}
    with pytest.raises(ConfigError, match="z None -> 101"):
        run(Toy(z=101), tmp_path)


def test_begin_forgets_the_results_of_the_stages_to_rerun_before_any_runs(tmp_path):
    """So that a run cut short after config.json says the new config never reads back a stale result."""
    run(Toy(), tmp_path)
    with R.run_lock(tmp_path):
        plan = RunDir(tmp_path).begin(Toy(x=2), rerun=["a", "c"])
    assert plan.rerun == ["a", "c"] and plan.changed == {"x": (1, 2)}
    assert sorted(p.parent.name for p in tmp_path.glob("*/results.json")) == ["b", "d"]
    assert json.loads((tmp_path / "config.json").read_text())["x"] == 2


def test_stages_of_an_earlier_config_that_this_run_does_not_have_are_not_its_concern(tmp_path):
    run(Toy(), tmp_path)
    run(Toy(z=5), tmp_path, GRAPH[:2])  # c read z, but this run's stages are a and b: c is not read back
    assert calls(tmp_path) == {"a": 1, "b": 1, "c": 1, "d": 1}
    with pytest.raises(ConfigError, match=r"c \(it read z\)"):  # not knowing the stages (the command line's check)
        RunDir(tmp_path).check(Toy(z=6))


def test_a_nested_key_affects_the_stage_that_read_its_section_and_those_after_it(tmp_path):
    run(Toy(), tmp_path)
    with pytest.raises(ConfigError, match=r"sec\.lr 0\.1 -> 0\.2\), which changes stages it holds: b \(it read sec\), "
                                          r"d \(after b\);"):
        run(Toy(sec=Section(lr=0.2)), tmp_path)


def test_what_no_stage_read_or_no_result_depends_on_is_accepted(tmp_path, capsys):
    run(Toy(), tmp_path)
    run(Toy(unread=7), tmp_path)  # no stage read it: nothing is stale, nothing runs
    assert calls(tmp_path) == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert json.loads((tmp_path / "config.json").read_text())["unread"] == 7
    assert "the config changed (unread 0 -> 7); nothing read back depends on it" in capsys.readouterr().out
    quiet = Toy(unread=7, runner=StageOptions(workers=2, checkpoint_every=5, log_every=3))  # StageOptions.NO_EFFECT
    run(quiet, tmp_path)
    assert calls(tmp_path) == {"a": 1, "b": 1, "c": 1, "d": 1} and "changed" not in capsys.readouterr().out
    assert json.loads((tmp_path / "config.json").read_text())["runner"]["workers"] == 2  # still the latest config
    with pytest.raises(ConfigError, match=r"runner\.threads 1 -> 2\), which changes stages it holds: "
                                          r"a \(it read runner\), b \(it read runner\), c \(it read runner\), "
                                          r"d \(it read runner\)"):
        run(dataclasses.replace(quiet, runner=StageOptions(workers=2, threads=2)), tmp_path)  # every stage's threads


def test_a_stage_without_a_record_counts_as_affected_by_any_change(tmp_path):
    run(Toy(), tmp_path)
    f = tmp_path / "b" / "results.json"
    older = {k: v for k, v in json.loads(f.read_text()).items() if k != "inputs"}  # an older version's results
    f.write_text(json.dumps(older))
    with pytest.raises(ConfigError, match=r"b \(no record of what it read\), d \(after b\)"):
        run(Toy(unread=1), tmp_path)


def test_unreadable_config_json_beside_finished_stages_is_refused(tmp_path):
    run(Toy(), tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ConfigError, match="holds a finished run .* but no readable config.json"):
        run(Toy(), tmp_path)


# --- a stage cut short ----------------------------------------------------------------------------
from test_stages import FakeEngine  # noqa: E402  (what a Checkpointer needs of an engine)


def looping_stage(ctx: StageContext) -> dict:
    """4 steps through ctx.run(); reads `x` only on its first run (before a Ctrl-C at step 1), `y` always."""
    engine, run_ = FakeEngine(), ctx.run()
    start, _ = run_.start(engine)
    if not start:
        assert ctx.config.x is not None
    for step in run_.steps(start, 4):
        engine.step += 1
        if step == 1 and not start and not (ctx.dir / "no-stop").exists():
            os.kill(os.getpid(), signal.SIGINT)
            deadline = time.monotonic() + 30
            while not ctx.checkpointer.stop_requested:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        run_.end_step(engine, step + 1, {"train/loss": float(ctx.config.y)})
    return {"resumed_at": start}


LOOP = [Stage("loop", looping_stage, reads=("x", "y"))]


def test_a_resumed_stage_keeps_what_it_reads(tmp_path):
    with pytest.raises(RunInterrupted):
        run(Toy(), tmp_path, LOOP)
    out = run(Toy(), tmp_path, LOOP)["loop"]
    assert out["resumed_at"] == 2 and out["inputs"]["config"] == ["runner", "x", "y"]  # x: read before the cut only


def killed_stage(ctx: StageContext) -> dict:
    """4 steps through ctx.run(), a checkpoint after each (checkpoint_every 1); on its first run the process dies at
    step 2 with SIGKILL (`kill -9`: no handler runs, nothing is saved but the periodic checkpoint)."""
    engine, run_ = FakeEngine(), ctx.run()
    start, _ = run_.start(engine)
    for step in run_.steps(start, 4):
        engine.step += 1
        if step == 2 and not start:
            os.kill(os.getpid(), signal.SIGKILL)
        run_.end_step(engine, step + 1, {"train/loss": float(ctx.config.y)})
    return {"resumed_at": start}


def test_a_stage_killed_between_clean_stops_keeps_its_record_of_what_it_reads(tmp_path):
    """kill -9 after a periodic checkpoint: the rerun resumes the stage, and its results still say which config
    fields it reads (a record lost with the process would be `null`, and a later change to y could not be
    attributed to it)."""
    from concurrent.futures.process import BrokenProcessPool

    config = Toy(runner=StageOptions(workers=2, checkpoint_every=1))  # the stage runs in a worker: it dies, not pytest
    graph = [Stage("killed", killed_stage, reads=("y",))]
    with pytest.raises(BrokenProcessPool):
        run(config, tmp_path, graph)
    out = run(config, tmp_path, graph)["killed"]
    assert out["resumed_at"] == 2 and out["inputs"]["config"] == ["runner", "y"]


def test_a_stage_cut_short_resumes_with_a_resumable_change_and_reruns_afresh_on_another(tmp_path):
    with pytest.raises(RunInterrupted):
        run(Toy(), tmp_path, LOOP)
    (tmp_path / "loop" / "no-stop").touch()
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match=r"z 100 -> 101\), which changes stages it holds: loop \(cut short: its "
                                          r"checkpoint is of the saved config\)"):
        run(Toy(z=101), tmp_path, LOOP)  # it never read z, but its checkpoint has no record yet
    assert snapshot(tmp_path) == before
    out = run(rerun(Toy(z=101), "loop"), tmp_path, LOOP)["loop"]
    assert out["resumed_at"] == 0  # afresh: the checkpoint of the other config was forgotten

    shutil_dir = tmp_path / "again"
    with pytest.raises(RunInterrupted):
        run(Toy(), shutil_dir, LOOP)
    (shutil_dir / "loop" / "no-stop").touch()
    out = run(Toy(sec=Section(steps=9)), shutil_dir, LOOP)["loop"]  # Toy.RESUMABLE: resumes with it
    assert out["resumed_at"] == 2


# --- the Hugging Face commands' policy --------------------------------------------------------
def test_refuse_policy_and_overwrite_after_the_checks(tmp_path):
    run(Toy(), tmp_path)
    hf = dict(if_finished="refuse", overwrite=False, command="sft", option="--out")
    with pytest.raises(ConfigError,
                       match=f"{tmp_path} holds a finished sft run .*Pass --overwrite .*choose another --out"):
        RunDir(tmp_path, **hf).check(Toy())  # the same config: still refused
    (tmp_path / "model").mkdir()
    d = RunDir(tmp_path, **{**hf, "overwrite": True}, outputs=("model",))
    plan = d.check(Toy(x=5))
    assert plan.clear and "--overwrite" in plan.describe()
    assert (tmp_path / "a" / "results.json").exists()  # check: reads only
    with R.run_lock(tmp_path):
        d.begin(Toy(x=5))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", ".metrics.lock", "config.json"]
    assert json.loads((tmp_path / "config.json").read_text())["x"] == 5


# --- naming, the lock, the per-seed loop ----------------------------------------------------------
def test_fresh_names_never_collide_and_a_dry_run_makes_none(tmp_path, monkeypatch):
    monkeypatch.setattr(R.time, "strftime", lambda fmt, *a: "20260101-120000")
    first, second = RunDir.fresh("agent", root=tmp_path), RunDir.fresh("agent", root=tmp_path)
    assert (first.path.name, second.path.name) == ("agent-20260101-120000", "agent-20260101-120000-2")
    assert first.path.is_dir() and first.created
    dry = RunDir.fresh("agent", create=False, root=tmp_path)
    assert dry.path.name == "agent-20260101-120000-3" and not dry.path.exists() and not dry.created
    with pytest.raises(ConfigError):  # a failed run in a fresh directory leaves none behind
        with first.hold():
            raise ConfigError("refused")
    assert not first.path.exists()


HOLD = """
import sys, time
from trajtune.runs.rundir import run_lock
with run_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_directory_in_use_is_refused_by_a_run_and_a_dry_run_naming_the_holder(tmp_path, capsys):
    run_dir = tmp_path / "busy"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(run_dir)
        with pytest.raises(RunDirBusy, match=f"pid {holder.pid}"):
            RunDir(run_dir).check_free()  # what --dry-run asks: takes nothing
        for extra in ([], ["--dry-run"]):
            code = main(["run", "addition", "--run-dir", str(run_dir), "--set", "config.sft.steps=1", *extra])
            err = capsys.readouterr().err
            assert code == 2 and f"{run_dir} is in use by another run: pid {holder.pid}" in err, err
        assert snapshot(run_dir) == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    RunDir(run_dir).check_free()  # a killed holder never blocks


def seeded_run(config: Toy, run_dir: Path) -> Path:
    run(config, run_dir, [Stage("a", stage_a)])
    return run_dir / "report.md"


def test_run_seeds_one_run_directory_per_seed_all_checked_before_the_first_runs(tmp_path, capsys):
    out = run_seeds(seeded_run, Toy(x=3), tmp_path, [3, 7])
    assert out == {3: tmp_path / "seed-3", 7: tmp_path / "seed-7"}
    assert [json.loads((d / "config.json").read_text())["seed"] for d in out.values()] == [3, 7]
    assert json.loads((tmp_path / "seed-7" / "a" / "results.json").read_text())["total"] == 3
    assert str(tmp_path / "seed-3" / "report.md") in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"seed-7 holds a run of another config \(x 3 -> 4\)"):
        run_seeds(seeded_run, Toy(x=4), tmp_path, [5, 7])
    assert not (tmp_path / "seed-5").exists()  # refused before seed 5 ran


# --- trajtune run, as a user would ------------------------------------------------------------
def test_trajtune_run_a_changed_config_on_a_finished_directory(tmp_path, capsys):
    run_dir = tmp_path / "run"
    base = ["run", "addition", "--run-dir", str(run_dir), "--set", "config.sft.steps=3", "--set", "config.n_eval=20"]
    assert main(base) == 0
    before, _ = snapshot(run_dir), capsys.readouterr()
    for extra in ([], ["--dry-run"]):
        assert main([*base, "--set", "config.sft.steps=4", *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("trajtune: error: ") and "sft.steps 3 -> 4" in err, err
        assert "sft (it read sft)" in err and """--set 'config.runner.rerun=["sft"]'""" in err
    assert snapshot(run_dir) == before
    assert main([*base, "--set", "config.sft.steps=4", "--set", 'config.runner.rerun=["sft"]']) == 0
    assert "running sft again" in capsys.readouterr().out
    assert json.loads((run_dir / "sft" / "results.json").read_text())["curve"][-1][0] == 4
    assert json.loads((run_dir / "config.json").read_text())["sft"]["steps"] == 4


def test_trajtune_run_dry_run_writes_nothing_and_says_what_a_run_would_do(tmp_path, capsys):
    fresh = tmp_path / "fresh"
    assert main(["run", "addition", "--run-dir", str(fresh), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run: the recipe is valid" in out and f"{fresh}: a new run" in out and not fresh.exists()
    run_dir = tmp_path / "run"
    base = ["run", "addition", "--run-dir", str(run_dir), "--set", "config.sft.steps=2", "--set", "config.n_eval=20"]
    assert main(base) == 0
    before, _ = snapshot(run_dir), capsys.readouterr()
    assert main([*base, "--dry-run", "--set", "config.runner.workers=1"]) == 0
    assert "finished stages read back: sft" in capsys.readouterr().out
    assert main([*base, "--dry-run", "--set", 'config.runner.rerun=["sft"]']) == 0
    out = capsys.readouterr().out
    assert "run again, as runner.rerun asks: sft" in out and "read back: sft" not in out
    assert snapshot(run_dir) == before
