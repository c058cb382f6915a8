"""Exact resume for every training loop: interrupted (a real SIGINT) or killed between steps,
then resumed in a fresh engine, a run ends with the same weights, history and metric rows
as an uninterrupted one with the same seed."""

import os
import signal
import time

import pytest
import torch

from trajtune.algorithms.distill import DistillConfig, train_distill
from trajtune.algorithms.dpo import DPOConfig, train_dpo
from trajtune.algorithms.iw_sft import IWSFTConfig, train_iw_sft
from trajtune.algorithms.reward_model import RewardModelConfig, train_reward_model
from trajtune.algorithms.rft import RFTConfig, train_rft
from trajtune.algorithms.rl import RLConfig, train_rl
from trajtune.algorithms.sft import SFTConfig, train_sft
from trajtune.runs.loop import Run
from trajtune.metrics import MetricsLogger, read_metrics
from trajtune.runs.resume import Checkpointer, RunInterrupted, trajectories_from_json, trajectories_to_json

from trajtune.envs.base import SingleTurnEnv
from trajtune.sources.episodes import EpisodeSource

from trajtune.engine import make_engine
from trajtune.sources.sampler import Decoder, SamplerSettings

from test_algorithms import RENDER, TASKS, TOK, demo, engine

PAD = TOK.pad_id


def graded(task, reply):
    """A reward that differs between most samples, so every step has a gradient."""
    return sum(ord(c) % 3 for c in reply) / 4, {}


def collect_for(e):
    return EpisodeSource(Decoder(e.sample, SamplerSettings(max_new_tokens=2)), lambda: SingleTurnEnv(graded), RENDER,
                         max_turns=1, max_tokens=32)
PAIRS = [(demo("a"), demo(x)) for x in "bcdef"]


def make_pairs(e, g):
    """Pairs re-made from the current policy: the first of two samples per task is 'chosen'."""
    trajs = collect_for(e).run(TASKS, 2, g)
    return [(trajs[i], trajs[i + 1]) for i in range(0, len(trajs), 2)]


def teacher():
    t = engine(seed=1)
    train_sft(t, [demo("a")] * 8, SFTConfig(steps=5, batch_size=8), PAD)
    return make_engine(t.model, frozen=True)


def R(log, ck):
    return Run("loop", log, checkpointer=ck)


# name -> (engine kwargs, run(e, logger, checkpointer) -> history)
LOOPS = {
    "sft": ({}, lambda e, log, ck: train_sft(e, [demo(x) for x in "aabcaa"], SFTConfig(steps=6, batch_size=3, seed=2),
                                              PAD, R(log, ck))),
    "grpo_ppo_kl": ({}, lambda e, log, ck: train_rl(
        e, TASKS, collect_for(e), RLConfig(steps=6, tasks_per_step=2, group_size=4, advantage="grpo", surrogate="ppo",
                                           epochs=2, kl_coef=0.1, seed=1), PAD, R(log, ck))),
    "ppo_gae": ({"value_head": True}, lambda e, log, ck: train_rl(
        e, TASKS, collect_for(e), RLConfig(steps=5, tasks_per_step=2, group_size=2, advantage="gae", surrogate="ppo",
                                           kl_coef=0.05, kl_in_reward=True), PAD, R(log, ck))),
    "rft": ({}, lambda e, log, ck: train_rft(
        e, TASKS, collect_for(e), RFTConfig(rounds=3, samples_per_task=4, steps_per_round=3, batch_size=4,
                                            threshold=0.0, accumulate=True, dedup=True), PAD, R(log, ck))),
    "iw_sft": ({}, lambda e, log, ck: train_iw_sft(
        e, TASKS, collect_for(e), IWSFTConfig(rounds=3, samples_per_task=4, steps_per_round=3, batch_size=4,
                                              threshold=0.0, q_update_every=2), PAD, R(log, ck))),
    "dpo": ({}, lambda e, log, ck: train_dpo(e, PAIRS, DPOConfig(steps=6, batch_size=2, beta=0.5), PAD, R(log, ck))),
    "dpo_regenerate": ({}, lambda e, log, ck: train_dpo(
        e, [], DPOConfig(steps=6, batch_size=2, beta=0.5, regenerate_every=4), PAD, R(log, ck), make_pairs=make_pairs)),
    "reward_model": ({"value_head": True}, lambda e, log, ck: train_reward_model(
        e, PAIRS, RewardModelConfig(steps=6, batch_size=2), PAD, R(log, ck))),
    "distill": ({}, lambda e, log, ck: train_distill(
        e, teacher(), TASKS, collect_for(e), DistillConfig(steps=5, tasks_per_step=2, samples_per_task=2), PAD,
        R(log, ck))),
}


def untimed(history):
    """Rows without their wall-clock numbers ("time", time/* metrics): what two runs of the same loop share."""
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/")} for r in history]


def rows(path):
    return untimed(read_metrics(path))


def same_weights(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))


def interrupt_at(e, step):
    """Deliver a real SIGINT while optimizer step `step` runs (the loop saves at its next save point)."""
    inner = e.optim_step

    def optim_step():
        if e.step + 1 == step:
            os.kill(os.getpid(), signal.SIGINT)
        return inner()

    e.optim_step = optim_step


def uninterrupted(name, tmp_path):
    """The reference run of loop `name`: (its final engine, its history); metrics in tmp_path/ref."""
    kwargs, run = LOOPS[name]
    ref = engine(**kwargs)
    with MetricsLogger(tmp_path / "ref") as log:
        return ref, run(ref, log, None)


def check_resume(name, tmp_path, ref, expected, every=0):
    """Resume loop `name` in a fresh engine from tmp_path/run; it must end exactly like `ref`."""
    kwargs, run = LOOPS[name]
    resumed = engine(**kwargs)  # fresh weights and optimizer: all state comes from the checkpoint
    with MetricsLogger(tmp_path / "run") as log, Checkpointer(tmp_path / "run" / name, every=every) as ck:
        got = run(resumed, log, ck)
    assert same_weights(resumed, ref) and resumed.step == ref.step
    assert untimed(got) == untimed(expected)
    assert rows(tmp_path / "run") == rows(tmp_path / "ref")  # same rows, none repeated


@pytest.mark.parametrize("name", list(LOOPS))
def test_interrupted_and_resumed_run_equals_an_uninterrupted_one(name, tmp_path):
    ref, expected = uninterrupted(name, tmp_path)
    kwargs, run = LOOPS[name]
    first = engine(**kwargs)
    interrupt_at(first, 3)
    with MetricsLogger(tmp_path / "run") as log, Checkpointer(tmp_path / "run" / name) as ck:
        with pytest.raises(RunInterrupted):
            run(first, log, ck)
    assert first.step < ref.step, "the run was interrupted before its end"
    check_resume(name, tmp_path, ref, expected)


@pytest.mark.parametrize("name", ["grpo_ppo_kl", "rft", "dpo_regenerate"])
def test_a_run_killed_after_a_periodic_checkpoint_resumes_exactly(name, tmp_path):
    ref, expected = uninterrupted(name, tmp_path)
    kwargs, run = LOOPS[name]
    # the whole run, saving every 2 steps: the process is "killed" after its end, so the
    # last checkpoint is behind the last logged row
    with MetricsLogger(tmp_path / "run") as log:
        run(engine(**kwargs), log, Checkpointer(tmp_path / "run" / name, every=2))
    check_resume(name, tmp_path, ref, expected, every=2)


def test_iw_sft_defers_an_interrupt_to_the_next_refresh_of_q(tmp_path):
    """Inside a round iw-SFT saves only where its lagged q equals the policy (every q_update_every steps)."""
    kwargs, run = LOOPS["iw_sft"]
    e = engine(**kwargs)
    interrupt_at(e, 4)  # round 2, inner step 1: not a refresh point
    with MetricsLogger(tmp_path) as log, Checkpointer(tmp_path / "iw") as ck:
        with pytest.raises(RunInterrupted, match="after step 5"):
            run(e, log, ck)
    assert Checkpointer(tmp_path / "iw").resume(engine(**kwargs)) == 5


def test_rl_reference_is_the_stage_start_after_a_resume(tmp_path):
    kwargs, run = LOOPS["grpo_ppo_kl"]
    start = engine(**kwargs)
    e = engine(**kwargs)
    interrupt_at(e, 2)
    with Checkpointer(tmp_path / "rl") as ck, pytest.raises(RunInterrupted):
        run(e, None, ck)
    ck = Checkpointer(tmp_path / "rl")
    again = engine(seed=5, **kwargs)  # other weights: both the policy and the reference come from disk
    at = ck.resume(again)
    assert at == 1 and same_weights(again, e)  # epochs=2: optimizer step 2 ends loop step 1
    assert same_weights(ck.reference(again, at), start)


def test_trajectories_round_trip_through_json():
    trajs = collect_for(engine()).run(TASKS, 2, torch.Generator().manual_seed(0))
    back = trajectories_from_json(trajectories_to_json(trajs))
    assert back == trajs


def test_global_torch_generator_is_saved_and_restored(tmp_path):
    """Dropout draws from torch's global generator: a resumed run continues its stream."""
    e = engine()
    torch.manual_seed(7)
    Checkpointer(tmp_path / "c", every=1).step_done(e, 1)
    expected = torch.rand(3)
    torch.manual_seed(123)
    Checkpointer(tmp_path / "c").resume(engine())
    assert torch.equal(torch.rand(3), expected)


def test_state_kept_beside_the_loop_comes_back_in_place(tmp_path):
    e = engine()
    ck = Checkpointer(tmp_path / "c", every=1)
    curve, costs = ck.keep("curve", [{"step": 0, "x": 1.5}]), ck.keep("costs", {"sampled": 8})
    ck.step_done(e, 1)
    curve.append({"step": 1}), costs.update(sampled=16)  # after the checkpoint: lost with the process
    again = Checkpointer(tmp_path / "c")
    curve2, costs2 = again.keep("curve", []), again.keep("costs", {})
    assert not Checkpointer(tmp_path / "other").has_checkpoint and again.has_checkpoint
    assert again.resume(engine()) == 1 and curve2 == [{"step": 0, "x": 1.5}] and costs2 == {"sampled": 8}


def test_a_save_cut_between_its_two_renames_leaves_the_previous_checkpoint_usable(tmp_path, monkeypatch):
    """atomic_dir moves the old state aside, then renames the new one in: a crash in between
    loses neither (the Checkpointer puts the old one back)."""
    import trajtune.checkpoint as C

    e = engine()
    ck = Checkpointer(tmp_path / "c", every=1)
    ck.step_done(e, 1)
    calls, replace = [], C.os.replace

    def crash_on_the_second_rename(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise SystemExit("killed")  # the process dies here
        return replace(src, dst)

    monkeypatch.setattr(C.os, "replace", crash_on_the_second_rename)
    with pytest.raises(SystemExit):
        ck.step_done(e, 2)
    monkeypatch.setattr(C.os, "replace", replace)
    assert not ck.state_dir.exists()
    assert Checkpointer(tmp_path / "c").resume(engine()) == 1


def test_a_truncated_state_is_a_clear_error_naming_the_file(tmp_path):
    from trajtune.checkpoint import CheckpointError

    e = engine()
    ck = Checkpointer(tmp_path / "c", every=1)
    ck.step_done(e, 1)
    meta = ck.state_dir / "engine.json"
    meta.write_text(meta.read_text()[:40])  # cut mid-file
    with pytest.raises(CheckpointError, match="engine.json: unreadable checkpoint metadata"):
        Checkpointer(tmp_path / "c").resume(engine())
    ck.step_done(e, 2)  # a fresh save replaces the broken state
    (ck.state_dir / "loop.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="loop.safetensors"):
        Checkpointer(tmp_path / "c").resume(engine())


def _stage_process(directory, ready):
    """A worker-process stage: steps until interrupted (its Checkpointer saves, then it exits)."""
    e = engine()
    with Checkpointer(directory) as ck:
        open(ready, "w").close()
        for step in range(1, 100_000):
            time.sleep(0.01)
            ck.step_done(e, step)


def test_a_stop_signal_sent_to_the_parent_alone_reaches_its_stage_processes(tmp_path):
    """A container's SIGTERM goes to the parent only: forward_to_children passes it on, every
    stage process saves and stops, and the parent gets KeyboardInterrupt."""
    import multiprocessing

    from trajtune.runs.resume import forward_to_children

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_stage_process, args=(str(tmp_path / f"s{k}"), str(tmp_path / f"ready{k}")))
             for k in range(2)]
    with pytest.raises(KeyboardInterrupt), forward_to_children():
        for p in procs:
            p.start()
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready{k}").exists() for k in range(2)) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the forwarding handler raises before this ends
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [1, 1]  # RunInterrupted after their save
    assert all(Checkpointer(tmp_path / f"s{k}").resume(engine()) > 0 for k in range(2))


def test_one_request_delivered_twice_still_saves(tmp_path):
    """Ctrl-C in a terminal reaches a stage process directly and through its parent: one request."""
    e = engine()
    with Checkpointer(tmp_path / "c") as ck:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # the forwarded copy, within the duplicate window
        with pytest.raises(RunInterrupted, match="after step 1"):
            ck.step_done(e, 1)
    assert Checkpointer(tmp_path / "c").resume(engine()) == 1
