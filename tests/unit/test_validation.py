"""Validation before work: impossible options, recipes and dataset rows fail before any training starts,
naming the option / key, or the file, line and field."""

import json
import re
from pathlib import Path

import pytest

from trajtune.cli import main
from trajtune.config import ConfigError, from_dict
from trajtune.engine import OptimConfig


# --- optimizer -------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value, message", [
    ("lr", -1e-3, r"lr must be positive and finite, got -0.001"),
    ("lr", 0.0, r"lr must be positive"),
    ("lr", float("nan"), r"lr must be positive"),
    ("weight_decay", -0.1, r"weight_decay must be >= 0, got -0.1"),
    ("grad_clip", -1.0, r"grad_clip must be >= 0, got -1.0"),
    ("warmup_steps", -5, r"warmup_steps must be >= 0, got -5"),
    ("decay_steps", -1, r"decay_steps must be >= 0, got -1"),
    ("beta1", 1.0, r"beta1 must be in \[0, 1\), got 1.0"),
    ("beta2", -0.5, r"beta2 must be in \[0, 1\), got -0.5"),
])
def test_optim_config_rejects_impossible_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        OptimConfig(**{field: value})


# --- algorithm configs -----------------------------------------------------------------------
def _algorithm_cases():
    from trajtune.algorithms.distill import DistillConfig
    from trajtune.algorithms.dpo import DPOConfig
    from trajtune.algorithms.iw_sft import IWSFTConfig
    from trajtune.algorithms.reward_model import RewardModelConfig
    from trajtune.algorithms.rft import RFTConfig
    from trajtune.algorithms.rl import RLConfig
    from trajtune.algorithms.sft import SFTConfig

    return [
        (SFTConfig, {"batch_size": 0}, "batch_size >= 1"),
        (SFTConfig, {"eval_every": -1}, "eval_every must be >= 0"),
        (RLConfig, {"advantage": "grpo", "group_size": 1}, "needs group_size >= 2"),
        (RLConfig, {"eps_high": -0.1}, "eps_high must be >= 0"),
        (RLConfig, {"kl_coef": float("nan")}, "kl_coef must be >= 0"),
        (RLConfig, {"lam": 1.5}, r"gamma and lam must be in \[0, 1\]"),
        (RLConfig, {"tasks_per_step": 2, "group_size": 2, "minibatches": 5, "surrogate": "ppo"},
         "a minibatch would be empty"),
        (RLConfig, {"epochs": 2}, "epochs 2 updates the policy more than once .* use surrogate ppo"),
        (RFTConfig, {"top_fraction": 1.5}, r"top_fraction must be in \(0, 1\]"),
        (RFTConfig, {"aggregation": "constant"}, "needs a constant"),
        (RFTConfig, {"threshold": float("nan")}, "threshold must be a finite number"),
        (IWSFTConfig, {"step_clip_low": 1.5, "step_clip_high": 1.2}, "step_clip_low <= step_clip_high"),
        (IWSFTConfig, {"samples_per_task": 0}, "samples_per_task >= 1"),
        (DPOConfig, {"beta": 0.0}, "beta must be > 0"),
        (DPOConfig, {"label_smoothing": 0.6}, r"label_smoothing must be in \[0, 0.5\)"),
        (RewardModelConfig, {"margin": -1.0}, "margin must be >= 0"),
        (DistillConfig, {"tasks_per_step": 0}, "tasks_per_step >= 1"),
    ]


@pytest.mark.parametrize("case", range(len(_algorithm_cases())))
def test_algorithm_configs_reject_impossible_values(case):
    cls, changes, message = _algorithm_cases()[case]
    with pytest.raises(ValueError, match=message):
        cls(**changes)


# --- HF command line: flags generated from the method configs, validated by the loop dataclasses ----------
def _hf_argv(tmp_path, command, *flags):
    argv = [command, "--model", str(tmp_path / "none"), "--data", str(tmp_path / "none.jsonl")]
    return argv + (["--reward", "r:f"] if command in ("grpo", "rft") else []) + list(flags)


@pytest.mark.parametrize("command, flags, message", [
    ("sft", ["--lr", "-1.0"], r"--lr must be positive and finite, got -1.0"),
    ("sft", ["--lr", "0.0"], r"--lr must be positive and finite, got 0.0"),
    ("grpo", ["--temperature", "0"], r"--temperature must be > 0"),
    ("dpo", ["--beta", "-0.1"], r"--beta must be > 0, got -0.1"),
    ("sft", ["--weight-decay", "-0.01"], r"--weight-decay must be >= 0"),
    ("sft", ["--warmup-steps", "-1"], r"--warmup-steps must be >= 0"),
    ("grpo", ["--kl-coef", "-0.5"], r"--kl-coef must be >= 0"),
    ("sft", ["--micro-batch-size", "-2"], r"--micro-batch-size must be >= 0"),
    ("sft", ["--batch-size", "0"], r"--batch-size >= 1 \(got 100, 0\)"),
    ("grpo", ["--epochs", "0"], r"--epochs and --minibatches >= 1"),
    ("rft", ["--threshold", "nan"], r"--threshold must be a finite number"),
    ("grpo", ["--group-size", "1"], r"--advantage='grpo' needs --group-size >= 2"),
    ("grpo", ["--group-size", "1", "--advantage", "rloo"], r"--advantage='rloo' needs --group-size >= 2"),
    ("grpo", ["--max-new-tokens", "64", "--max-length", "64"], r"--max-new-tokens 64 leaves no room for a prompt"),
    ("grpo", ["--length-buckets", "0"], r"--length-buckets must be >= 1, got 0"),
    ("grpo", ["--epochs", "2"], r"--epochs 2 updates the policy more than once .* use --surrogate ppo"),
    ("grpo", ["--minibatches", "2"], r"--minibatches 2 updates the policy more than once"),
    ("dpo", ["--regenerate-every", "5"], r"--regenerate-every needs a pair generator"),
    ("rft", ["--group-size", "0"], r"--samples-per-task >= 1"),  # --group-size: rft's alias of --samples-per-task
    ("sft", ["--save-every", "-1"], r"--save-every must be >= 0"),
])
def test_hf_option_errors_name_the_option(tmp_path, capsys, command, flags, message):
    assert main(_hf_argv(tmp_path, command, *flags)) == 2
    err = capsys.readouterr().err
    assert err.startswith("trajtune: error: ") and re.search(message, err), err
    assert "Traceback" not in err


def test_hf_config_accepts_what_is_possible():
    from trajtune.experiments.hf.grpo import GRPORun
    from trajtune.experiments.hf.rft import RFTRun

    base = {"model": {"path": "m"}, "data": "d", "reward": ["r:f"]}
    from_dict(GRPORun, {**base, "rl": {"group_size": 1, "advantage": "gae"}})  # PPO's value baseline: no group needed
    from_dict(GRPORun, {**base, "rl": {"epochs": 4, "surrogate": "ppo"}})
    from_dict(RFTRun, {**base, "rft": {"samples_per_task": 1, "threshold": -2.0}})


def test_hf_flags_cover_every_loop_field_and_keep_the_old_spellings(capsys):
    """Every leaf of every nested section (the loop's own dataclass, OptimConfig, the model and sampling
    sections) is a flag of its command, named after the field; the earlier command line's flags still parse."""
    import dataclasses
    import importlib

    from trajtune.algorithms.dpo import DPOConfig
    from trajtune.algorithms.reward_model import RewardModelConfig
    from trajtune.algorithms.rft import RFTConfig
    from trajtune.algorithms.rl import RLConfig
    from trajtune.algorithms.sft import SFTConfig
    from trajtune.cli import build_parser
    from trajtune.experiments.hf import METHODS
    from trajtune.experiments.hf.model import ModelConfig
    from trajtune.sources.sampling import SamplingConfig
    from trajtune.experiments.hf.options import options

    loops = {"sft": ("sft", SFTConfig), "rm": ("rm", RewardModelConfig), "dpo": ("dpo", DPOConfig),
             "grpo": ("rl", RLConfig), "rft": ("rft", RFTConfig)}
    for command, (section, loop) in loops.items():
        config = importlib.import_module(METHODS[command]).Config
        flags = {o.path: o.flag for o in options(config)}
        sections = [(section, loop), ("optim", OptimConfig), ("model", ModelConfig)]
        sections += [("sampling", SamplingConfig)] if command in ("grpo", "rft") else []
        for name, cls in sections:
            for f in dataclasses.fields(cls):
                assert f"{name}.{f.name}" in flags, (command, name, f.name)
        assert len(set(flags.values())) == len(flags)  # one flag per leaf
    with pytest.raises(SystemExit):
        main(["grpo", "--help"])
    help_text = capsys.readouterr().out
    for flag in ("--surrogate", "--kl-coef", "--length-buckets", "--epochs", "--advantage", "--prompts-per-step"):
        assert flag in help_text, flag
    old = {"sft": "--model m --data d --out o --steps 3 --batch-size 2 --lr 1e-4 --lora-r 4 --save-every 2 "
                  "--precision bf16 --gradient-checkpointing --micro-batch-size 1 --device cpu --drop-long "
                  "--max-length 64",
           "dpo": "--model m --data d --beta 0.2 --loss ipo",
           "grpo": "--model m --data d --reward r:f --group-size 4 --max-new-tokens 8 --prompts-per-step 2 "
                   "--backend generate --advantage rloo --epochs 1 --kl-coef 0.1 --temperature 0.7",
           "rft": "--model m --data d --reward r:f --rounds 2 --steps 3 --group-size 4 --threshold 0.5"}
    for command, line in old.items():
        build_parser().parse_args([command, *line.split()])
    with pytest.raises(SystemExit) as e:  # an option of another command is refused
        build_parser().parse_args(["sft", "--model", "m", "--data", "d", "--beta", "0.5"])
    assert e.value.code == 2 and "unrecognized arguments: --beta" in capsys.readouterr().err


def test_hf_cli_fails_on_an_option_before_touching_the_model(tmp_path, capsys):
    # the model directory does not even exist: the option is checked first
    argv = ["grpo", "--model", str(tmp_path / "none"), "--data", str(tmp_path / "none.jsonl"), "--reward", "r:f"]
    assert main(argv + ["--group-size", "1"]) == 2
    assert "needs --group-size >= 2" in capsys.readouterr().err
    assert main(["sft", "--model", str(tmp_path / "none"), "--data", "x.jsonl", "--lr", "-1"]) == 2
    assert "--lr must be positive and finite, got -1.0" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


# --- recipes and --set -------------------------------------------------------------------------
@pytest.mark.parametrize("recipe, assignment, message", [
    ("addition", "config.optim.lr=-1.0", r"\[config\].optim: lr must be positive"),
    ("addition", "config.optim.weight_decay=-0.1", r"weight_decay must be >= 0, got -0.1"),
    ("addition", "config.sft.batch_size=0", r"batch_size >= 1"),
    ("addition", "config.n_heads=5", r"dim=96 is not divisible by n_heads=5"),
    ("agent", "config.rl.group_size=1", r"needs group_size >= 2"),
    ("agent", "config.rl_optim.lr=0.0", r"lr must be positive"),
    ("agent", "config.positions=alibi", r"agent: positions='alibi' is not one of learned, rope, none"),
    ("agent", "config.n_heads=3", r"agent: dim=64 is not divisible by n_heads=3"),
    ("chapter13", "config.rl.group_size=1", r"advantage='grpo' needs group_size >= 2"),
    ("chapter13", "config.dpo_betas=[0.1, -1.0]", r"dpo_betas must be a non-empty list of betas > 0"),
    ("iw_sft_bandit", "config.p_right=1.5", r"p_right is a probability"),
    ("iw_sft_bugfix", "config.iw.step_clip_low=2.0", r"need 0 <= step_clip_low <= step_clip_high"),
    ("hf_sft", "config.optim.lr=-1.0", r"\[config\].optim: lr must be positive"),
])
def test_impossible_recipe_value_fails_before_training(tmp_path, capsys, recipe, assignment, message):
    run_dir = tmp_path / "run"
    for extra in (["--dry-run"], []):  # with and without --dry-run: the same error, nothing written
        assert main(["run", recipe, "--set", assignment, "--run-dir", str(run_dir)] + extra) == 2
        err = capsys.readouterr().err
        assert "trajtune: error:" in err and re.search(message, err), err
        assert not run_dir.exists()


def test_recipe_value_of_the_wrong_type_or_unknown_key(tmp_path, capsys):
    assert main(["run", "addition", "--set", "config.sft.steps='many'", "--dry-run"]) == 2
    assert "[config].sft.steps: expected an integer, got 'many'" in capsys.readouterr().err
    assert main(["run", "hf_sft", "--set", "config.model.drop_lng=true", "--dry-run"]) == 2
    assert "did you mean 'drop_long'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="lr must be positive"):
        from_dict(OptimConfig, {"lr": -2})


# --- datasets: prompt rows (no tokenizer needed) -------------------------------------------------
def test_empty_prompt_rows_name_file_line_and_field(tmp_path):
    from trajtune.sources import data as D

    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "2+3?"}) + "\n\n" + json.dumps({"prompt": "   "}) + "\n")
    with pytest.raises(D.DataError, match=r"p\.jsonl:3: field 'prompt' is empty"):
        D.prompt_tasks(D.read_rows(path))
    path.write_text(json.dumps({"prompt": [{"role": "system", "content": ""}, {"role": "user", "content": ""}]}) + "\n")
    with pytest.raises(D.DataError, match=r"p\.jsonl:1: field 'prompt'\[1\]\.content is empty .*empty user message"):
        D.prompt_tasks(D.read_rows(path))
    path.write_text(json.dumps({"prompt": "2+3?", "answer": "5"}) + "\n")
    (task,) = D.prompt_tasks(D.read_rows(path))
    assert task.where == f"{path}:1" and task.columns == {"answer": "5"}


# --- datasets: lengths against --max-length / the model's context, before the model loads -----------
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    from trajtune.models.hf_random import make_random_model

    d = tmp_path_factory.mktemp("validate")
    make_random_model(d / "model", "qwen2", "tiny", max_positions=96)
    long = "word " * 60
    rows = {
        "chats.jsonl": [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
                        {"messages": [{"role": "user", "content": long}, {"role": "assistant", "content": "ok"}]},
                        {"prompt": "hi", "completion": long}],
        "pairs.jsonl": [{"prompt": "hi", "chosen": "hello", "rejected": "go"},
                        {"prompt": "hi", "chosen": "yes", "rejected": long}],
        "prompts.jsonl": [{"prompt": "2+3?"}, {"prompt": long}, {"prompt": [{"role": "user", "content": long}]}],
        "assistant_prompt.jsonl": [{"prompt": [{"role": "user", "content": "hi"},
                                               {"role": "assistant", "content": "x"}]}],
    }
    for name, rs in rows.items():
        (d / name).write_text("".join(json.dumps(r) + "\n" for r in rs))
    (d / "rewards.py").write_text("def one(prompts, completions, **kw):\n    return [1.0 for _ in completions]\n")
    return d


class ModelLoaded(Exception):
    pass


@pytest.fixture
def no_model(monkeypatch):
    """Loading the model raises ModelLoaded: a test sees whether validation let the run get that far."""
    import trajtune.models.hf as hfmod

    def load_policy(*a, **k):
        raise ModelLoaded

    monkeypatch.setattr(hfmod, "load_policy", load_policy)


def _config(hf, command, data, **kw):
    """The method config of `command`; `kw` by leaf name (max_length=48 sets model.max_length)."""
    import importlib

    from trajtune.experiments.hf import METHODS
    from trajtune.experiments.hf.options import options

    module = importlib.import_module(METHODS[command])
    table = {"model": {"path": str(hf / "model")}, "data": str(hf / data)}
    if command in ("grpo", "rft"):
        table["reward"] = [f"{hf / 'rewards.py'}:one"]
    paths = {o.path.rsplit(".", 1)[-1]: o.path for o in options(module.Config)}
    for name, value in kw.items():
        *sections, leaf = paths[name].split(".")
        node = table
        for sec in sections:
            node = node.setdefault(sec, {})
        node[leaf] = value
    return from_dict(module.Config, table)


def check(config):
    """Everything the method checks before the model loads (raises DataError naming rows)."""
    import importlib

    from trajtune.experiments.hf import METHODS

    return importlib.import_module(METHODS[config.METHOD]).prepare(config, _out(config))


def run_hf(config):
    import importlib

    from trajtune.experiments.hf import METHODS

    return importlib.import_module(METHODS[config.METHOD]).run(config, _out(config))


def _out(config):
    return Path(config.model.path).parent / "out" / config.METHOD


def test_long_samples_are_an_error_naming_line_field_and_lengths(hf, no_model):
    from trajtune.sources.data import DataError

    with pytest.raises(DataError) as e:
        check(_config(hf, "sft", "chats.jsonl", max_length=48))
    msg = str(e.value)
    assert msg.startswith("2 of 3 samples do not fit --max-length 48:")
    assert "chats.jsonl:2: field 'messages': " in msg and "chats.jsonl:3: field 'prompt+completion': " in msg
    assert "chats.jsonl:1" not in msg and "--drop-long" in msg
    with pytest.raises(DataError, match=r"1 of 2 samples do not fit --max-length 48:\n  .*pairs\.jsonl:2: field "
                                        r"'rejected': \d+ tokens \(chosen \d+, rejected \d+"):
        check(_config(hf, "dpo", "pairs.jsonl", max_length=48))
    assert not (hf / "out").exists()  # nothing written before validation passes


def test_prompt_plus_generation_budget_and_the_model_context(hf, no_model):
    from trajtune.sources.data import DataError

    with pytest.raises(DataError) as e:
        check(_config(hf, "grpo", "prompts.jsonl", group_size=2, max_new_tokens=16, max_length=64))
    msg = str(e.value)
    assert msg.startswith("2 of 3 prompts do not fit --max-length 64:")
    assert "prompts.jsonl:2: field 'prompt': " in msg and "+ --max-new-tokens 16 = " in msg and "prompts.jsonl:3" in msg
    # --max-length above the model's context (96 positions): the context is the budget
    with pytest.raises(DataError, match=r"do not fit the model's context \(96 tokens, max_position_embeddings; "
                                        r"--max-length 2048\)"):
        check(_config(hf, "rft", "prompts.jsonl", max_new_tokens=16))
    with pytest.raises(DataError, match=r"assistant_prompt\.jsonl:1: field 'prompt': start: the prompt ends with an "
                                        r"assistant turn \(message 1\).*end the prompt with a user"):
        check(_config(hf, "grpo", "assistant_prompt.jsonl", group_size=2))


def test_drop_long_skips_them_with_a_count(hf, no_model, capsys):
    from trajtune.sources.data import DataError

    with pytest.raises(ModelLoaded):  # validation passed: the run went on to load the model
        run_hf(_config(hf, "sft", "chats.jsonl", max_length=48, drop_long=True))
    assert "skipped 2 of 3 samples longer than --max-length 48 (--drop-long)" in capsys.readouterr().err
    with pytest.raises(ModelLoaded):
        run_hf(_config(hf, "grpo", "prompts.jsonl", group_size=2, max_new_tokens=16, max_length=64, drop_long=True))
    assert "skipped 2 of 3 prompts" in capsys.readouterr().err
    with pytest.raises(DataError, match="no sample fits --max-length 8"):
        check(_config(hf, "sft", "chats.jsonl", max_length=8, drop_long=True))


def test_long_samples_via_the_command_line(hf, no_model, capsys):
    argv = ["sft", "--model", str(hf / "model"), "--data", str(hf / "chats.jsonl"), "--max-length", "48",
            "--out", str(hf / "out" / "cli")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert ("trajtune: error: 2 of 3 samples do not fit --max-length 48" in err
            and "chats.jsonl:2: field 'messages'" in err)
    with pytest.raises(ModelLoaded):
        main(argv + ["--drop-long"])


def test_pairs_with_identical_sides_are_counted_on_stderr(hf, no_model, capsys):
    from trajtune.sources.data import DataError

    rows = [{"prompt": "hi", "chosen": "same", "rejected": "same"}, {"prompt": "hi", "chosen": "yes", "rejected": "no"},
            {"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}],
             "rejected": [{"role": "assistant", "content": "a"}]}]
    (hf / "same.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for command in ("dpo", "rm"):
        with pytest.raises(ModelLoaded):  # a warning, not an error: the run goes on
            run_hf(_config(hf, command, "same.jsonl"))
        err = capsys.readouterr().err
        assert "warning: 2 of 3 pairs have identical 'chosen' and 'rejected' (" in err
        assert "same.jsonl:1, " in err and "same.jsonl:3)" in err and "same.jsonl:2" not in err
    with pytest.raises(ModelLoaded):
        run_hf(_config(hf, "dpo", "pairs.jsonl", drop_long=True))
    assert "identical" not in capsys.readouterr().err
    implicit = {"chosen": rows[2]["prompt"] + rows[2]["chosen"], "rejected": rows[2]["prompt"] + rows[2]["rejected"]}
    (hf / "same_implicit.jsonl").write_text(json.dumps(implicit) + "\n")
    with pytest.raises(DataError, match=r"same_implicit\.jsonl:1: 'chosen' and 'rejected' are the same conversation"):
        check(_config(hf, "dpo", "same_implicit.jsonl"))


def _config_classes_with_choices():
    """Every dataclass of the package with a field typed by a Literal (an optional or a list of one)."""
    import dataclasses
    import importlib
    import pkgutil

    import trajtune
    from trajtune.config import _choice_fields

    found = []
    for info in pkgutil.walk_packages(trajtune.__path__, "trajtune."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == module.__name__
                    and _choice_fields(value)):
                found.append(value)
    return found


def test_every_config_refuses_a_value_outside_its_choices_when_built_in_python():
    """A Literal field is checked at construction (config.check_choices), not only in a recipe: a misspelt
    RLConfig(advantage="grop") used to be a KeyError in the first step."""
    import dataclasses
    import typing

    from trajtune.config import _choice_fields
    from trajtune.engine import Loss

    classes = _config_classes_with_choices()
    names = {c.__name__ for c in classes}
    assert {"RLConfig", "SFTConfig", "DPOConfig", "OptimConfig", "SamplingConfig", "Loss"} <= names, names
    checked = 0
    for cls in classes:
        required = {f.name: None for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        base = {"fn": lambda out, batch: None, "normalizer": "token"} if cls is Loss else {}
        if set(required) - set(base):
            continue  # fields with no default (a path, a model): built elsewhere in the tests
        for name, tp in _choice_fields(cls):
            bad = ["no-such-choice"] if typing.get_origin(tp) in (list, tuple) else "no-such-choice"
            with pytest.raises(ValueError, match=rf"{cls.__name__}\.{name}(\[0\])?: 'no-such-choice' is not one of"):
                cls(**{**base, name: bad})
            checked += 1
    assert checked >= 15, checked
