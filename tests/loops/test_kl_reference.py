"""Issue 38: the KL that is always logged costs no resident copy of a full model with kl_coef 0. The default
(log_kl "auto" -> `StartingWeights`) writes the starting weights to disk once and swaps them into the policy for one
forward at the logging steps: the same KL as a resident copy's at those steps, no copy ever made, and every trained
number the same as with the log off."""

import pytest

from trajtune.algorithms.reference import StartingWeights
from trajtune.algorithms.rl import RLConfig, train_rl
from trajtune.engine.torch_engine import TorchEngine
from trajtune.metrics import MetricsLogger
from trajtune.runs.loop import Run
from trajtune.runs.resume import Checkpointer, RunInterrupted

from test_algorithms import TASKS, TOK, collect_for, engine
from test_resume import interrupt_at, same_weights, untimed

STEPS, EVERY = 6, 2


def run(log_kl, run_=None, e=None, **kw):
    e = e or engine(seed=0)
    cfg = RLConfig(steps=STEPS, tasks_per_step=4, group_size=8, log_kl=log_kl, log_kl_every=EVERY, **kw)
    return e, train_rl(e, TASKS, collect_for(e), cfg, TOK.pad_id, run_)


def no_copies(monkeypatch):
    """Any frozen copy of the policy (the reference engine of "copy" and kl_coef > 0) fails the test."""
    def refuse(self, **kw):
        raise AssertionError("a resident copy of the policy was made")
    monkeypatch.setattr(TorchEngine, "reference_engine", refuse)


def test_the_default_holds_no_copy_and_logs_the_copys_kl_at_its_logging_steps(monkeypatch):
    _, copied = run("copy")
    e_off, off = run("off")
    no_copies(monkeypatch)
    e, disk = run("auto")
    assert [("kl/k3" in h) for h in disk] == [s % EVERY == 0 for s in range(1, STEPS + 1)]  # 2, 4, 6 (the last)
    for a, b in zip(copied, disk, strict=True):
        if "kl/k3" in b:  # the same module with the starting weights swapped in: the copy's numbers
            assert b["kl/k3"] == pytest.approx(a["kl/k3"], rel=1e-5, abs=1e-9)
            assert b["kl/sequence"] == pytest.approx(a["kl/sequence"], rel=1e-5, abs=1e-9)
    assert disk[-1]["kl/k3"] > 1e-4  # the policy has left its start: a number that can differ
    for a, b in zip(off, disk, strict=True):  # the log changes nothing else: no random numbers, weights swapped back
        assert {k: v for k, v in a.items() if not k.startswith("time/")} == \
            {k: v for k, v in b.items() if not k.startswith(("time/", "kl/"))}
    assert same_weights(e, e_off)


def test_kl_coef_still_keeps_the_copy_the_loss_needs():
    _, hist = run("auto", kl_coef=0.05)
    assert all("kl/k3" in h for h in hist)  # every step: the loss reads it


def test_the_starting_weights_survive_a_resume(tmp_path):
    e_whole, expected = run("auto")
    first = engine(seed=0)
    interrupt_at(first, 3)
    with MetricsLogger(tmp_path / "run") as log, Checkpointer(tmp_path / "run" / "rl") as ck:
        with pytest.raises(RunInterrupted):
            run("auto", Run("rl", log, checkpointer=ck), first)
    assert (tmp_path / "run" / "rl" / "reference" / StartingWeights.FILE).exists()
    resumed = engine(seed=0)
    with MetricsLogger(tmp_path / "run") as log, Checkpointer(tmp_path / "run" / "rl") as ck:
        _, got = run("auto", Run("rl", log, checkpointer=ck), resumed)
    # step 4's and 6's KL against the start, not the resumed policy
    assert same_weights(resumed, e_whole) and untimed(got) == untimed(expected)


def test_log_kl_every_is_checked():
    with pytest.raises(ValueError, match="log_kl_every must be >= 1"):
        RLConfig(log_kl_every=0)
