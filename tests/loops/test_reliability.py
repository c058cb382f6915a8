"""Reliability: exact resume after Ctrl-C, NaN guards, checkpoints never poisoned."""

import copy
import os
import signal

import pytest
import torch

from trajtune.algorithms.sft import SFTConfig, sft_loss_fn, train_sft
from trajtune.checkpoint import CheckpointError
from trajtune.models.tiny import load_model, save_model
from trajtune.engine import Loss, NonFiniteError, OptimConfig, make_engine
from trajtune.runs.loop import Run
from trajtune.metrics import MetricsLogger, read_metrics
from trajtune.runs.resume import Checkpointer, RunInterrupted
from trajtune.trajectory import Outcome, Owner, Trajectory, collate
from trajtune.sources.sampler import Decoder, SamplerSettings


def demos(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        t = Trajectory()
        t.append(torch.randint(3, 40, (4,), generator=g).tolist(), Owner.PROMPT, 0)
        t.append(torch.randint(3, 40, (2 + i % 3,), generator=g).tolist(), Owner.POLICY, 0)
        out.append(t)
    return out


def rows_without_time(path):
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/")} for r in read_metrics(path)]


def test_ctrl_c_saves_and_resume_is_exact(tiny_model, tmp_path):
    data, config = demos(), SFTConfig(steps=8, batch_size=4, seed=3)
    optim = OptimConfig(lr=1e-2, warmup_steps=2, decay_steps=6)
    # the uninterrupted run
    ref = make_engine(copy.deepcopy(tiny_model), optim)
    with MetricsLogger(tmp_path / "ref") as log:
        train_sft(ref, data, config, 0, Run("sft", log))
    # the same run, Ctrl-C (a real SIGINT) during step 4, then resumed in a fresh process state
    def interrupt(step):
        if step == 4:
            os.kill(os.getpid(), signal.SIGINT)
        return {}

    first = make_engine(copy.deepcopy(tiny_model), optim)
    with MetricsLogger(tmp_path / "run") as log, Checkpointer(tmp_path / "run" / "sft") as ckpt:
        with pytest.raises(RunInterrupted, match="after step 4"):
            train_sft(first, data, SFTConfig(steps=8, batch_size=4, seed=3, eval_every=1), 0,
                      Run("sft", log, evaluate=interrupt, checkpointer=ckpt))
    resumed = make_engine(copy.deepcopy(tiny_model), optim)  # fresh weights: everything comes from the checkpoint
    with MetricsLogger(tmp_path / "run") as log, Checkpointer(tmp_path / "run" / "sft") as ckpt:
        train_sft(resumed, data, config, 0, Run("sft", log, checkpointer=ckpt))
    for a, b in zip(ref.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)
    assert resumed.step == ref.step == 8
    got = [{k: v for k, v in r.items() if not k.startswith("eval")} for r in rows_without_time(tmp_path / "run")]
    assert got == rows_without_time(tmp_path / "ref")  # same metrics, no duplicated rows


def test_periodic_checkpoint_survives_a_kill_between_steps(tiny_model, tmp_path):
    data = demos()
    engine = make_engine(copy.deepcopy(tiny_model), OptimConfig(lr=1e-2))
    ckpt = Checkpointer(tmp_path / "sft", every=3)
    train_sft(engine, data, SFTConfig(steps=5, batch_size=4), 0, Run(checkpointer=ckpt))  # "killed" after step 5
    again = make_engine(copy.deepcopy(tiny_model), OptimConfig(lr=1e-2))
    assert Checkpointer(tmp_path / "sft").resume(again) == 3 and again.step == 3


def _nan_nll(out, batch):
    loss, metrics = sft_loss_fn()(out, batch)
    return loss * float("nan"), metrics


nan_loss = Loss(_nan_nll, normalizer="token")


def test_nan_loss_skips_the_step_and_leaves_weights_alone(tiny_model):
    engine = make_engine(copy.deepcopy(tiny_model), OptimConfig(lr=1e-2))
    before = [p.detach().clone() for p in engine.model.parameters()]
    batch = collate(demos(4), 0)
    engine.forward_backward(batch, nan_loss)
    out = engine.optim_step()
    assert out["skipped"] == 1.0 and engine.skipped_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, engine.model.parameters()))
    engine.forward_backward(batch, sft_loss_fn())  # the next good step trains normally
    assert engine.optim_step()["skipped"] == 0.0
    assert not all(torch.equal(a, b) for a, b in zip(before, engine.model.parameters()))
    stopper = make_engine(copy.deepcopy(tiny_model), OptimConfig(lr=1e-2, on_nonfinite="stop"))
    stopper.forward_backward(batch, nan_loss)
    with pytest.raises(NonFiniteError, match="step 1"):
        stopper.optim_step()


class NanOnToken(torch.nn.Module):
    """A model whose logits are NaN in rows that contain token 2 (a bad input for a real model)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, attention_mask=None, **kw):
        logits = self.model(ids, attention_mask=attention_mask)
        return torch.where((ids == 2).any(-1)[:, None, None], torch.full_like(logits, float("nan")), logits)


def test_a_skipped_step_names_the_rows_that_caused_it(tiny_model, caplog):
    data = demos(6)
    for i, t in enumerate(data):
        t.info["source"] = f"chats.jsonl:{i + 1}"
    data[4].ids[2] = 2  # row 4's prompt holds the token the model cannot take
    engine = make_engine(NanOnToken(copy.deepcopy(tiny_model)), OptimConfig(lr=1e-2))
    with caplog.at_level("WARNING", logger="trajtune.engine"):
        engine.forward_backward(collate(data, 0), sft_loss_fn())
        assert engine.optim_step()["skipped"] == 1.0
    assert "non-finite log-probs in 1 row(s): chats.jsonl:5" in caplog.text and "step skipped" in caplog.text
    stopper = make_engine(copy.deepcopy(tiny_model), OptimConfig(lr=1e-2, on_nonfinite="stop"))
    stopper.forward_backward(collate(data[:2], 0), nan_loss)  # finite log-probs: the whole batch is named
    with pytest.raises(NonFiniteError,
                       match="non-finite loss on a batch of 2 row\\(s\\): chats.jsonl:1, chats.jsonl:2"):
        stopper.optim_step()


def test_nan_weights_are_never_written(tiny_model, tmp_path):
    save_model(tmp_path / "ck", tiny_model)
    bad = copy.deepcopy(tiny_model)
    with torch.no_grad():
        next(bad.parameters())[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match="non-finite"):
        save_model(tmp_path / "ck", bad)
    model, _ = load_model(tmp_path / "ck")  # the previous checkpoint is intact
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_reward_function_that_raises_fails_its_episode_not_the_run(caplog):
    from dataclasses import dataclass
    from functools import partial

    from trajtune.envs.base import SingleTurnEnv
    from trajtune.sources.episodes import EpisodeSource
    from trajtune.sources.faults import TooManyFaults
    from trajtune.engine.decoding import sample
    from trajtune.text.render import Renderer
    from trajtune.text.tokenizers import CharTokenizer

    tok = CharTokenizer.from_corpus("abc Q:")

    @dataclass(frozen=True)
    class Task:
        name: str
        prompt: str = "Q: a"

    def reward(task, reply):
        if task.name == "bad":
            raise ZeroDivisionError("user reward function bug")
        return 1.0, {}

    torch.manual_seed(0)
    from trajtune.models.tiny import TinyConfig, TinyTransformer

    model = TinyTransformer(TinyConfig(tok.vocab_size, dim=16, n_layers=1, n_heads=2, max_len=32)).eval()
    collect = EpisodeSource(Decoder(partial(sample, model), SamplerSettings(max_new_tokens=3)),
                            lambda: SingleTurnEnv(reward), Renderer(tok),
                           max_turns=1, max_tokens=32)
    with caplog.at_level("WARNING", logger="trajtune.sources.rollout"):
        trajs = collect.run([Task("good"), Task("bad")], 2, torch.Generator().manual_seed(0))
    bad = [t for t in trajs if t.info["task"] == "bad"]
    assert [t.reward for t in trajs if t.info["task"] == "good"] == [1.0, 1.0]
    assert all(t.reward == 0.0 and "ZeroDivisionError: user reward function bug" in t.info["env_error"] for t in bad)
    assert all(t.info["stop_reason"] == "env_error" and t.outcome is Outcome.ENV_ERROR and not t.trainable for t in bad)
    assert all(t.trainable for t in trajs if t.info["task"] == "good")
    assert "task bad" in caplog.text and "ZeroDivisionError" in caplog.text
    strict = EpisodeSource(Decoder(partial(sample, model), SamplerSettings(max_new_tokens=3)),
                           lambda: SingleTurnEnv(reward), Renderer(tok),
                          max_turns=1, max_tokens=32, max_fault_share=0.25)
    with pytest.raises(TooManyFaults, match=r"2 of 4 episodes failed.*bad: ZeroDivisionError"):
        strict.run([Task("good"), Task("bad")], 2, torch.Generator().manual_seed(0))


def _log_rows(run_dir, stage, n):
    with MetricsLogger(run_dir) as log:
        for i in range(n):
            log.log(i, {"train/loss": float(i)}, stage=stage)


def test_parallel_stages_logging_to_one_file_lose_no_row_when_one_drops_its_rows(tmp_path):
    """Stages in other processes append while one stage replaces the file (resume / rerun)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with MetricsLogger(tmp_path) as log:
        for i in range(50):
            log.log(i, {"train/loss": 0.0}, stage="old")
        procs = [ctx.Process(target=_log_rows, args=(tmp_path, f"w{k}", 400)) for k in range(2)]
        for p in procs:
            p.start()
        while any(p.is_alive() for p in procs):
            log.drop_after("old", -1)
            log.log(0, {"train/loss": 0.0}, stage="old")
        for p in procs:
            p.join()
        assert all(p.exitcode == 0 for p in procs)
    rows = read_metrics(tmp_path)
    for k in range(2):
        assert [r["step"] for r in rows if r["stage"] == f"w{k}"] == list(range(400))
    assert len([r for r in rows if r["stage"] == "old"]) == 1
