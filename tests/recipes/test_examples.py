"""The examples of docs/environments.md run, in reduced form, and learn; the full runs (-m slow)
reach the numbers their docstrings state."""

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_reverse_string_reduced():
    ex = load("reverse_string")
    out = ex.main(ex.Settings(steps=12, n_eval=16, eval_samples=2), verbose=False)
    before, after, history = out["before"], out["after"], out["history"]
    assert len(history) == 12 and len(after.per_task) == 16
    assert all(0.0 <= t.mean_reward <= 1.0 for t in after.per_task)
    assert {"eval/reward", "eval/pass@1", "rollout/reward", "train/loss"} <= set(history[-1])
    assert after.mean_reward > before.mean_reward + 0.02  # it learns, already in a few steps


@pytest.mark.slow  # the default run's longest test (~8% of it): the slow tier; reverse_string's stays
def test_guess_number_reduced():
    ex = load("guess_number")
    out = ex.main(ex.Settings(steps=6, eval_samples=2), verbose=False)
    history = out["history"]
    assert [t.name for t in out["after"].per_task] == [f"secret-{d}" for d in range(10)]
    # the first thing it learns is the action language: fewer invalid guesses per episode
    invalid = [row["rollout/invalid_per_episode"] for row in history]  # 2.95 2.55 2.84 | 2.53 2.20 2.58 (seed 0)
    assert sum(invalid[3:]) / 3 < sum(invalid[:3]) / 3 - 0.15


@pytest.mark.slow
def test_reverse_string_full_run_reaches_its_stated_number():
    ex = load("reverse_string")
    out = ex.main(ex.Settings(), verbose=False)
    assert out["after"].mean_reward >= 0.19


@pytest.mark.slow
def test_guess_number_full_run_reaches_its_stated_number():
    ex = load("guess_number")
    out = ex.main(ex.Settings(), verbose=False)
    assert out["after"].mean_reward >= 0.2


@pytest.mark.parametrize("name, argv, message", [
    ("reverse_string", ["--advantage", "grop"], "RLConfig.advantage: 'grop' is not one of"),
    ("reverse_string", ["--min-length", "5", "--max-length", "2"], "--min-length 5 --max-length 2: needs"),
    ("reverse_string", ["--max-length", "12"], "do not fit the model's 32 positions"),
    ("reverse_string", ["--n-eval", "1000"], "--n-eval 1000: needs 1 <= n-eval < 336"),  # used to hang: no tasks left
    ("reverse_string", ["--group-size", "1"], "needs group_size >= 2"),
    ("guess_number", ["--eval-samples", "0"], "--eval-samples 0: needs"),
    ("guess_number", ["--lr", "nan"], "lr must be positive and finite"),
])
def test_examples_refuse_a_bad_option_in_one_line(name, argv, message):
    import subprocess

    proc = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *argv], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_no_tasks_is_an_error_not_a_hang():
    import torch

    from trajtune.sources.base import pick_tasks

    with pytest.raises(ValueError, match="no tasks to draw 8 from"):
        pick_tasks([], 8, torch.Generator().manual_seed(0))
    assert pick_tasks([], 0, torch.Generator().manual_seed(0)) == []
