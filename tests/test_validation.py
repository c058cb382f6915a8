"""Validation before work: impossible options, recipes and dataset rows fail before any training starts,
naming the option / key, or the file, line and field."""

import json
import re

import pytest

from trajtune.cli import main
from trajtune.config import ConfigError, from_dict
from trajtune.engine import OptimConfig
from trajtune.hf_cli import HFConfig


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
        (RLConfig, {"tasks_per_step": 2, "group_size": 2, "minibatches": 5}, "a minibatch would be empty"),
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


# --- HF command line -------------------------------------------------------------------------
@pytest.mark.parametrize("changes, message", [
    ({"lr": -1.0}, r"--lr must be > 0, got -1.0"),
    ({"lr": 0.0}, r"--lr must be > 0, got 0.0"),
    ({"temperature": 0.0}, r"--temperature must be > 0"),
    ({"beta": -0.1}, r"--beta must be > 0, got -0.1"),
    ({"weight_decay": -0.01}, r"--weight-decay must be >= 0"),
    ({"warmup_steps": -1}, r"--warmup-steps must be >= 0"),
    ({"kl_coef": -0.5}, r"--kl-coef must be >= 0"),
    ({"micro_batch_size": -2}, r"--micro-batch-size must be >= 0"),
    ({"batch_size": 0}, r"--batch-size must be >= 1, got 0"),
    ({"epochs": 0}, r"--epochs must be >= 1"),
    ({"threshold": float("nan")}, r"--threshold must be a finite number"),
    ({"command": "grpo", "group_size": 1}, r"--group-size must be >= 2 with --advantage grpo"),
    ({"command": "grpo", "group_size": 1, "advantage": "rloo"}, r"--group-size must be >= 2 with --advantage rloo"),
    ({"command": "grpo", "max_new_tokens": 64, "max_length": 64}, r"--max-new-tokens 64 leaves no room for a prompt"),
])
def test_hf_config_names_the_option(changes, message):
    kw = {"model": "m", "data": "d.jsonl", "reward": "r:f", **changes}
    with pytest.raises(ValueError, match=message):
        HFConfig(**kw)


def test_hf_config_accepts_what_is_possible():
    HFConfig(command="grpo", model="m", data="d", reward="r:f", group_size=1, advantage="gae")  # PPO: no group baseline
    HFConfig(command="rft", model="m", data="d", reward="r:f", group_size=1, threshold=-2.0)


def test_hf_cli_fails_on_an_option_before_touching_the_model(tmp_path, capsys):
    # the model directory does not even exist: the option is checked first
    argv = ["grpo", "--model", str(tmp_path / "none"), "--data", str(tmp_path / "none.jsonl"), "--reward", "r:f"]
    assert main(argv + ["--group-size", "1"]) == 2
    assert "--group-size must be >= 2" in capsys.readouterr().err
    assert main(["sft", "--model", str(tmp_path / "none"), "--data", "x.jsonl", "--lr", "-1"]) == 2
    assert "--lr must be > 0, got -1.0" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


# --- recipes and --set -------------------------------------------------------------------------
@pytest.mark.parametrize("recipe, assignment, message", [
    ("addition", "config.optim.lr=-1.0", r"\[config\].optim: lr must be positive"),
    ("addition", "config.optim.weight_decay=-0.1", r"weight_decay must be >= 0, got -0.1"),
    ("addition", "config.sft.batch_size=0", r"batch_size >= 1"),
    ("addition", "config.n_heads=5", r"dim=96 is not divisible by n_heads=5"),
    ("agent", "config.rl.group_size=1", r"needs group_size >= 2"),
    ("agent", "config.rl_lr=0.0", r"rl_lr must be > 0"),
    ("chapter13", "config.grpo_group=1", r"grpo_group must be >= 2"),
    ("chapter13", "config.dpo_betas=[0.1, -1.0]", r"dpo_betas must be a non-empty list of betas > 0"),
    ("iw_sft_bandit", "config.p_right=1.5", r"p_right is a probability"),
    ("iw_sft_bugfix", "config.step_clip_low=2.0", r"need 0 <= step_clip_low <= step_clip_high"),
    ("hf_sft", "config.lr=-1.0", r"--lr must be > 0, got -1.0"),
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
    assert main(["run", "hf_sft", "--set", "config.drop_lng=true", "--dry-run"]) == 2
    assert "did you mean 'drop_long'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="lr must be positive"):
        from_dict(OptimConfig, {"lr": -2})


# --- datasets: prompt rows (no tokenizer needed) -------------------------------------------------
def test_empty_prompt_rows_name_file_line_and_field(tmp_path):
    from trajtune import data as D

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
        "assistant_prompt.jsonl": [{"prompt": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]}],
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
    extra = {"reward": f"{hf / 'rewards.py'}:one"} if command in ("grpo", "rft") else {}
    return HFConfig(command=command, model=str(hf / "model"), data=str(hf / data), out=str(hf / "out" / command),
                    **extra, **kw)


def test_long_samples_are_an_error_naming_line_field_and_lengths(hf, no_model):
    from trajtune.data import DataError
    from trajtune.hf_cli import run_hf

    with pytest.raises(DataError) as e:
        run_hf(_config(hf, "sft", "chats.jsonl", max_length=48))
    msg = str(e.value)
    assert msg.startswith("2 of 3 samples do not fit --max-length 48:")
    assert "chats.jsonl:2: field 'messages': " in msg and "chats.jsonl:3: field 'prompt+completion': " in msg
    assert "chats.jsonl:1" not in msg and "--drop-long" in msg
    with pytest.raises(DataError, match=r"1 of 2 samples do not fit --max-length 48:\n  .*pairs\.jsonl:2: field "
                                        r"'rejected': \d+ tokens \(chosen \d+, rejected \d+"):
        run_hf(_config(hf, "dpo", "pairs.jsonl", max_length=48))
    assert not (hf / "out").exists()  # nothing written before validation passes


def test_prompt_plus_generation_budget_and_the_model_context(hf, no_model):
    from trajtune.data import DataError
    from trajtune.hf_cli import run_hf

    with pytest.raises(DataError) as e:
        run_hf(_config(hf, "grpo", "prompts.jsonl", group_size=2, max_new_tokens=16, max_length=64))
    msg = str(e.value)
    assert msg.startswith("2 of 3 prompts do not fit --max-length 64:")
    assert "prompts.jsonl:2: field 'prompt': " in msg and "+ --max-new-tokens 16 = " in msg and "prompts.jsonl:3" in msg
    # --max-length above the model's context (96 positions): the context is the budget
    with pytest.raises(DataError, match=r"do not fit the model's context \(96 tokens, max_position_embeddings; "
                                        r"--max-length 2048\)"):
        run_hf(_config(hf, "rft", "prompts.jsonl", max_new_tokens=16))
    with pytest.raises(DataError, match=r"assistant_prompt\.jsonl:1: field 'prompt': start: message 1 has role 'assistant'"):
        run_hf(_config(hf, "grpo", "assistant_prompt.jsonl", group_size=2))


def test_drop_long_skips_them_with_a_count(hf, no_model, capsys):
    from trajtune.data import DataError
    from trajtune.hf_cli import run_hf

    with pytest.raises(ModelLoaded):  # validation passed: the run went on to load the model
        run_hf(_config(hf, "sft", "chats.jsonl", max_length=48, drop_long=True))
    assert "skipped 2 of 3 samples longer than --max-length 48 (--drop-long)" in capsys.readouterr().err
    with pytest.raises(ModelLoaded):
        run_hf(_config(hf, "grpo", "prompts.jsonl", group_size=2, max_new_tokens=16, max_length=64, drop_long=True))
    assert "skipped 2 of 3 prompts" in capsys.readouterr().err
    with pytest.raises(DataError, match="no sample fits --max-length 8"):
        run_hf(_config(hf, "sft", "chats.jsonl", max_length=8, drop_long=True))


def test_long_samples_via_the_command_line(hf, no_model, capsys):
    argv = ["sft", "--model", str(hf / "model"), "--data", str(hf / "chats.jsonl"), "--max-length", "48",
            "--out", str(hf / "out" / "cli")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "trajtune: error: 2 of 3 samples do not fit --max-length 48" in err and "chats.jsonl:2: field 'messages'" in err
    with pytest.raises(ModelLoaded):
        main(argv + ["--drop-long"])
