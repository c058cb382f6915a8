"""The Tinker loops on the real model (smollm2-135m, LoRA rank 32) through trajtune's Tinker service: the re-stated
sl_loop and rl_loop (examples/tinker_sl_loop.py, examples/tinker_rl_loop.py) in-process, a few steps each, and
tinker-cookbook's own recipes against `trajtune tinker-serve` where the cookbook's venv is given (marker
tinker_cookbook too; tests/recipes/test_tinker_cookbook.py says how to make it). The margins are about half of what
was measured (beside each assertion)."""

from __future__ import annotations

import pytest

pytest.importorskip("tinker", reason="the tinker client is not installed (pip install -e '.[tinker]')")

MODEL = "smollm2-135m"


def test_sl_loop_example_on_the_real_model_the_held_out_loss_falls(tmp_path):
    from test_tinker_loops import in_process, load

    sl = load("tinker_sl_loop")
    out = sl.main(sl.Settings(model=MODEL, steps=8, lr=1e-4), in_process(tmp_path), verbose=False)  # ~35 s
    # measured (seed 0): held-out NLL 1.839 -> 1.281 (16 one-digit sums never trained on)
    assert out["after"] < out["before"] - 0.25


def test_rl_loop_example_on_the_real_model_the_reward_rises(tmp_path):
    from test_tinker_loops import in_process, load

    rl = load("tinker_rl_loop")
    out = rl.main(rl.Settings(model=MODEL, task="add", steps=6, lr=1e-4), in_process(tmp_path),
                  verbose=False)  # 1.5-2.5 min on 2 cores
    # measured: evaluation reward (8 sums x 8 samples, the last integer of the reply graded) 0.094 -> 0.578 (seed 0),
    # 0.094 -> 0.469 (seed 1)
    assert out["after"] > out["before"] + 0.15
    assert len(out["history"]) == 6 and all(row["datums"] > 0 for row in out["history"])


@pytest.mark.tinker_cookbook
def test_the_cookbook_recipes_run_on_the_real_model(real_model, tmp_path):
    from test_tinker_cookbook import cookbook_python, run_recipe
    from test_tinker_loops import tinker_serve

    python = cookbook_python()
    with tinker_serve(tmp_path / "home") as url:
        metrics, checkpoints = run_recipe(python, "sl", url, MODEL, real_model, tmp_path / "sl", "--steps", "6",
                                          "--batch-size", "8", "--lr", "1e-4")
        nll = [m["train_mean_nll"] for m in metrics]
        # measured: train NLL 3.56 3.20 2.95 2.78 2.65 2.54 (role_colon chats answered in \boxed{}; ~2 s a step)
        assert len(nll) == 6 and sum(nll[-2:]) / 2 < sum(nll[:2]) / 2 - 0.35
        rl, _ = run_recipe(python, "rl", url, MODEL, real_model, tmp_path / "rl", "--steps", "2", "--batch-size", "4",
                           "--group-size", "4", "--max-tokens", "32", "--lr", "4e-5",
                           "--resume-from", checkpoints[-1]["state_path"])
        # measured: rewards 0.062 (a group with signal: trained) and 0.0 (skipped), ~10 s a step
        assert [m["step"] for m in rl] == [0, 1] and all(0.0 <= m["reward/total"] <= 1.0 for m in rl)
