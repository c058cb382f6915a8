"""tinker-cookbook's sl_loop and rl_loop re-stated with the `tinker` client alone (examples/tinker_sl_loop.py,
examples/tinker_rl_loop.py) against trajtune's Tinker service on the built-in tiny model: in-process, over HTTP, and
as a user runs them (the scripts against `trajtune tinker-serve`). The loss falls and the reward rises by margins
of about half what was measured (the numbers are beside each assertion; docs/tinker.md has them too).

The learning runs are in the slow tier (`pytest -m slow tests/recipes/test_tinker_loops.py`: about 1.5 min on 2
cores); the settings checks run by default."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

tinker = pytest.importorskip("tinker", reason="the tinker client is not installed (pip install -e '.[tinker]'; "
                                              "it installs from PyPI on Python >= 3.11)")

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def tinker_serve(home: Path):
    """`trajtune tinker-serve --home HOME --port 0` in its own process, as a user starts it -> its URL."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "trajtune", "tinker-serve", "--home", str(home), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        first = proc.stdout.readline()
        url = re.search(r"http://[\d.]+:\d+", first)
        assert url, f"tinker-serve did not print its address: {first}"
        yield url.group(0)
    finally:
        proc.terminate()  # SIGTERM: a background job of a non-interactive shell (CI) ignores SIGINT
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def in_process(home: Path):
    from trajtune.tinker.local import service_client

    return service_client(home)


@pytest.mark.parametrize("name, kw, message", [
    ("tinker_sl_loop", {"steps": 0}, "--steps 0: needs at least 1"),
    ("tinker_sl_loop", {"rank": -1}, "--rank -1: needs 0"),
    ("tinker_sl_loop", {"n_eval": 81}, "--n-eval 81: needs fewer than the 81 problems"),
    ("tinker_rl_loop", {"task": "gsm8k"}, "--task 'gsm8k': not one of sevens, add"),
    ("tinker_rl_loop", {"group_size": 1}, "--group-size 1: needs 2 or more"),
    ("tinker_rl_loop", {"lr": 0.0}, "--lr 0.0: needs a positive learning rate"),
])
def test_the_examples_refuse_bad_settings_naming_the_option(name, kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load(name).Settings(**kw)


@pytest.mark.slow
def test_sl_loop_in_process_the_held_out_loss_falls(tmp_path):
    sl = load("tinker_sl_loop")
    out = sl.main(sl.Settings(), in_process(tmp_path), verbose=False)  # tiny-llama, LoRA 32, 30 steps, lr 2e-3
    # measured, seeds 0 / 1 / 2: held-out NLL 6.03 -> 2.88, 6.01 -> 2.93, 5.95 -> 2.83 (16 rows never trained on)
    assert out["after"] < out["before"] - 1.5
    train = [row["train_mean_nll"] for row in out["history"]]
    assert sum(train[-5:]) / 5 < sum(train[:5]) / 5 - 1.5  # seed 0: 5.68 -> 2.85
    assert out["state_path"].endswith("/weights/final") and out["sampler_path"].endswith("/sampler_weights/final")


@pytest.mark.slow
def test_sl_loop_over_http_gives_the_in_process_numbers(tmp_path):
    from trajtune.tinker.server import TinkerServer
    from trajtune.tinker.service import TinkerService

    sl = load("tinker_sl_loop")
    settings = sl.Settings(steps=8)
    reference = sl.main(settings, in_process(tmp_path / "local"), verbose=False)
    with TinkerServer(TinkerService(tmp_path / "http"), "127.0.0.1", 0) as server:
        client = tinker.ServiceClient(base_url=server.url, api_key="tml-local")
        over_http = sl.main(settings, client, verbose=False)
    # the same model, seed and data through two transports: the same losses, step by step
    assert [r["train_mean_nll"] for r in over_http["history"]] == pytest.approx(
        [r["train_mean_nll"] for r in reference["history"]], abs=1e-4)
    assert over_http["after"] == pytest.approx(reference["after"], abs=1e-4)


@pytest.mark.slow
def test_rl_loop_in_process_the_reward_rises(tmp_path):
    rl = load("tinker_rl_loop")
    out = rl.main(rl.Settings(), in_process(tmp_path), verbose=False)  # tiny-llama, sevens, 30 steps, lr 3e-3
    # measured, seeds 0 / 1 / 2: evaluation reward 0.004 -> 0.957, 0.004 -> 0.990, 0.004 -> 0.990
    assert out["after"] > out["before"] + 0.5
    history = out["history"]
    assert len(history) == 30 and sum(row["datums"] > 0 for row in history) >= 15  # groups with signal get trained
    assert all("loss:sum" in row for row in history if row["datums"])


@pytest.mark.slow
def test_the_scripts_pass_against_trajtune_tinker_serve(tmp_path):
    """What docs/tinker.md tells a user to run: the server, then each script with --base-url; exit 0 means PASS."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TINKER_API_KEY": "tml-local"}
    with tinker_serve(tmp_path / "home") as url:
        for script, extra in (("tinker_sl_loop.py", ["--steps", "20"]), ("tinker_rl_loop.py", [])):
            done = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--base-url", url, *extra],
                                  capture_output=True, text=True, env=env, timeout=600)
            assert done.returncode == 0 and "PASS" in done.stdout, (script, done.stdout[-2000:], done.stderr[-2000:])
