"""tinker-cookbook's own recipes -- `recipes/sl_loop.py` and `recipes/rl_loop.py` of tinker-cookbook 0.5.8,
unmodified -- against `trajtune tinker-serve` on the built-in tiny model (tiny-llama, LoRA rank 32).

The cookbook pins transformers<=5.5.4, so it lives in a venv of its own, whose Python `TRAJTUNE_COOKBOOK_PYTHON`
names (README, "Tests"; .ci/run makes it):

    python3 -m venv .venv-cookbook && .venv-cookbook/bin/pip install torch==2.13.0 'tinker-cookbook[math-rl]==0.5.8'
    TRAJTUNE_COOKBOOK_PYTHON=.venv-cookbook/bin/python .venv/bin/python -m pytest -q -m tinker_cookbook

tests/recipes/tinker_cookbook_runner.py runs a recipe's `main` offline: its tokenizer, renderer and dataset come
from local stand-ins (its docstring), nothing else is patched. sl_loop's loss falls; rl_loop resumes from sl_loop's
final state (the recipe's own resume path) and runs its GSM8K-style grading on one-digit sums. Its reward stays near
chance (about 1 in 7 after the SL warm start; 0 from the random base, where every group's advantages are 0 and
rl_loop skips every training step): a tiny model shows the loop runs, not that it learns."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.tinker_cookbook
ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).resolve().parent / "tinker_cookbook_runner.py"
MAKE_VENV = ("python3 -m venv .venv-cookbook && .venv-cookbook/bin/pip install torch==2.13.0 "
             "'tinker-cookbook[math-rl]==0.5.8'; then TRAJTUNE_COOKBOOK_PYTHON=.venv-cookbook/bin/python")


def cookbook_python() -> str:
    """The cookbook venv's Python, or a skip that says how to make it."""
    python = os.environ.get("TRAJTUNE_COOKBOOK_PYTHON")
    if not python:
        pytest.skip(f"TRAJTUNE_COOKBOOK_PYTHON is not set (tinker-cookbook needs its own venv: {MAKE_VENV})")
    check = subprocess.run([python, "-c", "import tinker_cookbook.recipes.sl_loop, tinker_cookbook.recipes.rl_loop"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        pytest.skip(f"TRAJTUNE_COOKBOOK_PYTHON={python} cannot import tinker_cookbook's sl_loop and rl_loop "
                    f"({check.stderr.strip().splitlines()[-1] if check.stderr.strip() else check.returncode}); "
                    f"make it with: {MAKE_VENV}")
    return python


def run_recipe(python: str, recipe: str, url: str, model: str, tokenizer: Path | None, log_path: Path,
               *args: str) -> tuple[list[dict], list[dict]]:
    """The runner with the cookbook's Python -> (the recipe's metrics.jsonl rows, its checkpoints.jsonl rows)."""
    cmd = [python, str(RUNNER), recipe, "--base-url", url, "--model", model, "--log-path", str(log_path), *args]
    if tokenizer is not None:
        cmd += ["--tokenizer", str(tokenizer)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TINKER_API_KEY": "tml-local", "TINKER_TELEMETRY": "0"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    rows = {"METRICS": [], "CHECKPOINTS": []}
    for line in done.stdout.splitlines():
        tag, _, rest = line.partition(" ")
        if tag in rows:
            rows[tag].append(json.loads(rest))
    return rows["METRICS"], rows["CHECKPOINTS"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(python, url, tokenizer folder): trajtune tinker-serve on a fresh home, tiny-llama made in it."""
    from test_tinker_loops import tinker_serve

    from trajtune.tinker.models import resolve_base

    python = cookbook_python()
    home = tmp_path_factory.mktemp("tinker-cookbook")
    tokenizer = resolve_base("tiny-llama", home)  # the cookbook loads the tokenizer before it creates the model
    with tinker_serve(home) as url:
        yield python, url, tokenizer


@pytest.fixture(scope="module")
def sl_run(server, tmp_path_factory):
    python, url, tokenizer = server
    return run_recipe(python, "sl", url, "tiny-llama", tokenizer, tmp_path_factory.mktemp("sl"),
                      "--steps", "60", "--batch-size", "8", "--lr", "5e-3")


def test_sl_loop_trains_and_its_loss_falls(sl_run):
    metrics, checkpoints = sl_run
    assert [m["step"] for m in metrics] == list(range(60))
    nll = [m["train_mean_nll"] for m in metrics]
    # measured, data seeds 0 / 1: mean of the first 5 steps 5.22 -> last 5 steps 0.31, 5.22 -> 0.29
    assert sum(nll[-5:]) / 5 < sum(nll[:5]) / 5 - 2.5
    assert all("grad_norm:mean" in m for m in metrics)  # optim_step's metrics reached the recipe's log
    final = checkpoints[-1]
    assert final["name"] == "final" and final["state_path"].endswith("/weights/final")
    assert final["sampler_path"].endswith("/sampler_weights/final")


def test_rl_loop_resumes_from_the_sl_state_and_runs_its_steps(server, sl_run, tmp_path):
    python, url, tokenizer = server
    state = sl_run[1][-1]["state_path"]
    metrics, checkpoints = run_recipe(python, "rl", url, "tiny-llama", tokenizer, tmp_path, "--steps", "8",
                                      "--batch-size", "8", "--group-size", "8", "--lr", "1e-3", "--max-tokens", "24",
                                      "--resume-from", state)
    assert [m["step"] for m in metrics] == list(range(8))
    rewards = [m["reward/total"] for m in metrics]
    assert all(0.0 <= r <= 1.0 for r in rewards)
    # measured, data seeds 0 / 1: rewards 0.02-0.11 (chance is 1/7); in both, all 8 steps had a group with signal and
    # trained (forward_backward importance_sampling + optim_step, whose grad_norm the recipe logs)
    assert sum("grad_norm:mean" in m for m in metrics) >= 4
    final = checkpoints[-1]
    assert final["name"] == "final" and final["state_path"] != state  # a new model, loaded from the SL state


def test_rl_loop_from_the_random_base_scores_zero_and_skips_every_step(server, tmp_path):
    python, url, tokenizer = server
    metrics, _ = run_recipe(python, "rl", url, "tiny-llama", tokenizer, tmp_path, "--steps", "2",
                            "--batch-size", "4", "--group-size", "4", "--max-tokens", "8")
    assert [m["reward/total"] for m in metrics] == [0.0, 0.0]  # no \boxed{} answer from a random model
    assert not any("grad_norm:mean" in m for m in metrics)  # rl_loop: all advantages zero, no training step
