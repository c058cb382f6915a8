import dataclasses
import json

import pytest

from trajtune.cli import DEFAULT_RECIPE, builtin_recipes, load_recipe, main
from trajtune.config import ConfigError, from_dict
from trajtune.engine import OptimConfig
from trajtune.experiments import EXPERIMENTS, get_experiment
from trajtune.metrics import MetricsLogger, is_documented, read_metrics


def write(tmp_path, text):
    p = tmp_path / "r.toml"
    p.write_text(text)
    return p


def test_unknown_key_names_file_key_and_suggestion(tmp_path):
    p = write(tmp_path, 'experiment = "addition_sft"\n[config.sft]\nstepz = 3\n')
    with pytest.raises(ConfigError, match=r"r\.toml.*unknown key 'stepz'; did you mean 'steps'"):
        load_recipe(p)
    p = write(tmp_path, 'experimnt = "addition_sft"\n')
    with pytest.raises(ConfigError, match="did you mean 'experiment'"):
        load_recipe(p)
    p = write(tmp_path, 'experiment = "addition_sf"\n')
    with pytest.raises(ConfigError, match="did you mean 'addition_sft'"):
        load_recipe(p)
    p = write(tmp_path, 'experiment = "addition_sft"\n')  # a key the override brought: the message says so
    with pytest.raises(ConfigError, match=r"r\.toml with --set config\.sft\.stepz=3: \[config\]\.sft: unknown key"):
        load_recipe(p, ["config.sft.stepz=3"])


def test_wrong_type_and_impossible_value(tmp_path):
    with pytest.raises(ConfigError, match=r"\.lr: expected a number"):
        load_recipe(write(tmp_path, 'experiment = "addition_sft"\n[config.optim]\nlr = "fast"\n'))
    with pytest.raises(ConfigError, match="lr must be positive"):
        load_recipe(write(tmp_path, 'experiment = "addition_sft"\n[config.optim]\nlr = -1.0\n'))
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_recipe(write(tmp_path, "experiment = \n"))
    assert from_dict(OptimConfig, {"lr": 1}).lr == 1.0  # ints widen to float


def test_every_builtin_recipe_validates_and_lists(capsys):
    assert "addition" in builtin_recipes()
    for path in builtin_recipes().values():
        load_recipe(path)
    assert main(["list"]) == 0
    assert f"{DEFAULT_RECIPE} (default)" in capsys.readouterr().out
    for name in EXPERIMENTS:
        assert dataclasses.is_dataclass(get_experiment(name).Config)


def test_cli_error_exit_code(tmp_path, capsys):
    assert main(["run", str(write(tmp_path, 'experiment = "x"\n'))]) == 2
    assert "unknown experiment 'x'" in capsys.readouterr().err


def test_tiny_run_writes_metrics_report_and_checkpoint(tmp_path, capsys):
    run_dir = tmp_path / "run"
    overrides = ["config.sft.steps=4", "config.sft.eval_every=2", "config.n_train=64", "config.n_eval=8",
                 "config.dim=16", "config.n_layers=1", "config.optim.decay_steps=0"]
    args = ["run", "addition", "--run-dir", str(run_dir)]
    for o in overrides:
        args += ["--set", o]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].endswith("report.md")
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert "eval/accuracy" in rows[1] and "eval/accuracy" not in rows[0]
    for r in rows:
        assert all(is_documented(k) for k in r if "/" in k), r
    # the stage "sft" (trajtune.runs.stages layout)
    assert (run_dir / "sft" / "checkpoint" / "model.safetensors").exists()
    assert json.loads((run_dir / "config.json").read_text())["sft"]["steps"] == 4


def test_metrics_logger_is_strict_about_keys(tmp_path):
    with MetricsLogger(tmp_path, strict=True) as log:
        log.log(1, {"train/loss": 1.0})
        with pytest.raises(KeyError, match="not documented"):
            log.log(2, {"train/made_up": 1.0})
        with pytest.raises(ValueError, match="namespaced"):
            log.log(2, {"loss": 1.0})
    assert read_metrics(tmp_path)[0]["train/loss"] == 1.0


def test_a_run_directory_that_cannot_be_written_is_one_message(tmp_path, capsys):
    (tmp_path / "a-file").write_text("not a directory")
    run_dir = tmp_path / "a-file" / "run"
    assert main(["run", "addition", "--run-dir", str(run_dir), "--set", "config.sft.steps=1"]) == 2
    err = capsys.readouterr().err
    assert f"trajtune: error: cannot write to the run directory {run_dir}: Not a directory" in err


def test_graders_and_rlhf_book_hold_only_what_they_read_and_refuse_chapter13s_other_keys():
    """The recipes on chapter 13's models compose its settings by field (the upstream stages' and the few their parts
    reuse), not by subclassing its Config: chapter 13's other keys are refused in one line naming them."""
    for name, chosen in (("graders", "demos"), ("rlhf_book", "chapters")):
        path = builtin_recipes()[name]
        _, config, _ = load_recipe(path, ["config.dim=48"])
        assert config.dim == 48 and not hasattr(config, "rl") and not hasattr(config, "parts")
        with pytest.raises(ConfigError, match=r"unknown key 'rl'"):
            load_recipe(path, ["config.rl.steps=3"])
        with pytest.raises(ConfigError, match=rf"key 'parts' is now '{chosen}'"):
            load_recipe(path, ['config.parts=["rlvr"]'])


def test_the_recipes_on_chapter13s_models_keep_its_upstream_settings():
    """graders and rlhf_book hold chapter 13's settings for the upstream stages (and the few their parts reuse) as
    their own fields: the same defaults as chapter 13's, and exactly the fields those stages declare they read."""
    from trajtune.experiments import chapter13, graders, rlhf_book
    from trajtune.experiments.shared.recipe import UPSTREAM, UPSTREAM_FIELDS

    assert {n for s in UPSTREAM.values() for n in s.reads or ()} == set(UPSTREAM_FIELDS)
    ch13 = chapter13.Config()
    for m in (graders, rlhf_book):
        c = m.Config()
        shared = [f.name for f in dataclasses.fields(c) if hasattr(ch13, f.name) and f.name != "runner"]
        assert set(UPSTREAM_FIELDS) <= set(shared)
        assert {n: getattr(c, n) for n in shared} == {n: getattr(ch13, n) for n in shared}, m.__name__
