"""Record and replay (trajtune.sources.record, `trajtune replay`): a run records the episodes it trained on, a
replay of them with the same training settings ends with the same weights bit for bit and the same rows, a
training-side change trains on the same rollouts, a resumed recording run appends, and a recording that lacks a
step or was drawn differently stops the replay in one line."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from trajtune.algorithms.rl import RLConfig, train_rl
from trajtune.envs.base import SingleTurnEnv
from trajtune.metrics import MetricsLogger
from trajtune.runs.resume import Checkpointer, RunInterrupted
from trajtune.sources.base import Draw, Episodes
from trajtune.sources.build import episode_source
from trajtune.sources.overlap import overlapped
from trajtune.sources.record import Recording, Replayed, file_name, recorded_steps
from trajtune.sources.sampler import Decoder
from trajtune.sources.sampling import SamplingConfig, check_sampling
from trajtune.trajectory import Trajectory

from test_algorithms import RENDER, TASKS, TOK, engine, verifier
from test_async_rl import SETTINGS, graded_source
from test_async_rl import one_thread  # noqa: F401 - autouse: one torch thread
from test_torchrun_recipes import hf_work  # noqa: F401 - a tiny random Qwen2, prompts, a digit reward
from test_resume import R, graded, interrupt_at, rows, same_weights, untimed

PAD = TOK.pad_id
CFG = RLConfig(steps=4, tasks_per_step=2, group_size=4, advantage="grpo", surrogate="ppo", epochs=2, tis_cap=2.0,
               seed=3)
"""a reduced RL loop: 4 steps of 2 tasks x 4 episodes, two PPO epochs (minibatches shuffled with the draw's
generator: a replay must hand it back in its recorded state)"""



def recorded_run(tmp_path, cfg=CFG, source=None, e=None):
    """The reduced run on the graded task, recording into tmp_path/rec -> (engine, history)."""
    e = e if e is not None else engine()
    with Recording(source if source is not None else graded_source(e), tmp_path / "rec") as s:
        return e, train_rl(e, TASKS, s, cfg, PAD)


def replay(tmp_path, cfg=CFG, e=None):
    e = e if e is not None else engine()
    with Replayed(tmp_path / "rec") as s:
        return e, train_rl(e, TASKS, s, cfg, PAD)


@pytest.mark.parametrize("tries", [0, 3], ids=["plain", "refilling"])
def test_a_replay_ends_with_the_recorded_weights_bit_for_bit(tries, tmp_path):
    """With DAPO's refills a step takes several draws (a pass/fail reward: most groups have no signal), each a file
    of its own, replayed in order."""
    cfg = replace(CFG, dynamic_sampling_tries=tries)
    e = engine()
    source = graded_source(e, make_env=lambda: SingleTurnEnv(verifier if tries else graded))
    recorded, expected = recorded_run(tmp_path, cfg, source, e)
    files = sorted(p.name for p in (tmp_path / "rec").iterdir())
    assert recorded_steps(tmp_path / "rec") == [0, 1, 2, 3] and "step-000000.json" in files
    if tries:
        assert any("-" in f.removeprefix("step-") for f in files), "some step refilled (a second draw)"
        assert sum(r["rollout/dynamic_draws"] for r in expected) == len(files)
    saved = json.loads((tmp_path / "rec" / "step-000001.json").read_text())  # plain JSON, every field
    assert saved["step"] == 1 and saved["n"] == 4 and len(saved["trajs"]) == 8
    assert {"ids", "owners", "logprobs", "reward", "group", "versions", "outcome"} <= set(saved["trajs"][0])
    e, got = replay(tmp_path, cfg)
    assert same_weights(e, recorded) and e.step == recorded.step
    assert untimed(got) == untimed(expected)  # every reward, loss, gradient norm and count


def test_a_training_side_change_trains_on_the_same_rollouts(tmp_path):
    recorded, expected = recorded_run(tmp_path)
    e, got = replay(tmp_path, replace(CFG, surrogate="cispo"), engine(lr=3e-2))
    assert not same_weights(e, recorded)
    same = ["rollout/reward", "rollout/policy_tokens"]  # the episodes: recorded, not sampled by the new policy
    assert [[r[k] for k in same] for r in got] == [[r[k] for k in same] for r in expected]
    assert [r["train/loss"] for r in got] != [r["train/loss"] for r in expected]


def test_a_replay_of_a_recording_that_lacks_a_step_fails_in_one_line(tmp_path):
    recorded_run(tmp_path)
    (tmp_path / "rec" / "step-000002.json").unlink()
    with pytest.raises(ValueError) as e:
        replay(tmp_path)
    assert "step-000002.json is missing" in str(e.value) and "\n" not in str(e.value)


def test_a_replay_asked_for_other_draws_fails_in_one_line(tmp_path):
    """Another seed picks other tasks; another group size asks for other episodes."""
    recorded_run(tmp_path)
    for cfg in (replace(CFG, seed=4), replace(CFG, group_size=2)):
        with pytest.raises(ValueError, match=r"step-000000\.json holds step 0: 4 episode\(s\) of \[") as e:
            replay(tmp_path, cfg)
        assert "\n" not in str(e.value)


def test_an_overlapped_run_replays_bit_for_bit_one_update_behind(tmp_path):
    """max_staleness 1: the recorded episodes were sampled one update behind (behind = 1, the loop's importance
    weight against the sampler's log-probs); the replay trains on them in one process and ends the same."""
    e = engine()
    source = overlapped(e, SamplingConfig(max_staleness=1), lambda p: graded_source(e, p), Decoder(e.sample, SETTINGS))
    recorded, expected = recorded_run(tmp_path, source=source, e=e)
    assert json.loads((tmp_path / "rec" / "step-000002.json").read_text())["behind"] == 1
    replayed, got = replay(tmp_path)
    assert same_weights(replayed, recorded)
    assert untimed(got) == [{k: v for k, v in r.items() if not k.startswith("sync/")} for r in untimed(expected)]


def test_a_resumed_recording_run_appends_and_replays_exactly(tmp_path):
    """Interrupted at step 3 after a checkpoint, resumed: the steps it takes again are recorded again, the earlier
    files kept; the recording replays to the uninterrupted run's weights."""
    ref, _ = recorded_run(tmp_path / "ref")
    first = engine()
    interrupt_at(first, 3)
    with MetricsLogger(tmp_path / "run") as log, Checkpointer(tmp_path / "run" / "loop") as ck:
        with Recording(graded_source(first), tmp_path / "rec") as s, pytest.raises(RunInterrupted):
            train_rl(first, TASKS, s, CFG, PAD, R(log, ck))
    kept = (tmp_path / "rec" / "step-000000.json").read_bytes()
    resumed = engine()
    with MetricsLogger(tmp_path / "run") as log, Checkpointer(tmp_path / "run" / "loop") as ck:
        with Recording(graded_source(resumed), tmp_path / "rec") as s:
            train_rl(resumed, TASKS, s, CFG, PAD, R(log, ck))
    assert same_weights(resumed, ref)
    assert (tmp_path / "rec" / "step-000000.json").read_bytes() == kept
    for step in range(4):
        a, b = (json.loads((d / "rec" / file_name(step)).read_text()) for d in (tmp_path, tmp_path / "ref"))
        assert a["trajs"] == b["trajs"] and a["generator"] == b["generator"]
    e, _ = replay(tmp_path)
    assert same_weights(e, ref)


class Constant:
    """The same two episodes every step (sources/base.py's example)."""

    def __init__(self):
        self.trajs = [Trajectory([1, 2], [1, 2], [0, 0], [0.0, -0.5], reward=1.0, group=0)]

    def take(self, draw, ahead=None):
        return Episodes([Trajectory(**t.__dict__) for t in self.trajs], {"time/x_s": 1.0, "reward/x": 2.0},
                        draw.generator, draw.step)

    def after_update(self, engine):
        return {}

    def pending(self):
        return None

    def restore(self, episodes):
        pass

    def close(self):
        pass


def test_a_resumed_recording_removes_the_files_of_the_steps_it_takes_again(tmp_path):
    def draw(step):
        return Draw(TASKS[:1], 1, torch.Generator().manual_seed(step), step)

    first = Recording(Constant(), tmp_path)
    for step in range(4):
        first.take(draw(step))
    (tmp_path / "note.txt").write_text("not a step")
    again = Recording(Constant(), tmp_path)
    again.take(draw(2))  # resumed after step 2: step 3's file was the interrupted part's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["note.txt", *(file_name(s) for s in range(3))]
    got = Replayed(tmp_path).take(draw(0))
    assert got.metrics == {"reward/x": 2.0}  # time/* dropped: the replay did not spend it
    assert got.trajs[0].logprobs == [0.0, -0.5] and got.trajs[0].reward == 1.0


def test_the_sampling_section_rules(tmp_path):
    rec = tmp_path / "rec"
    rec.mkdir()
    for section, message in [(SamplingConfig(replay=str(rec), record=True), "set one of them"),
                             (SamplingConfig(replay=str(rec), max_staleness=1), "without sampling"),
                             (SamplingConfig(replay=str(rec), backend="vllm"), "without sampling"),
                             (SamplingConfig(replay=str(tmp_path / "none")), "no such directory")]:
        with pytest.raises(ValueError, match=message) as e:
            check_sampling(section, "grpo", name=lambda n: f"--{n.replace('_', '-')}")
        assert str(e.value).startswith("grpo: --") and "\n" not in str(e.value)
    e = engine()
    with pytest.raises(ValueError, match="no stage directory to record into"):
        episode_source(SamplingConfig(record=True), e, lambda: SingleTurnEnv(graded), RENDER, "x", sharded=False)
    with pytest.raises(ValueError, match="replay: no recording in"):
        episode_source(SamplingConfig(replay=str(rec)), e, lambda: SingleTurnEnv(graded), RENDER, "x")


def test_the_builder_records_into_the_stage_and_replays_a_run_directory(tmp_path):
    """sampling.record writes <stage dir>/recording; sampling.replay of the run directory reads the same stage's."""
    cfg = replace(CFG, steps=2)

    def run(section):
        e = engine()
        with episode_source(section, e, lambda: SingleTurnEnv(graded), RENDER, "x", max_turns=1, max_tokens=32,
                            sharded=False, stage_dir=tmp_path / "run" / "stage") as s:
            return e, train_rl(e, TASKS, s, cfg, PAD)

    recorded, _ = run(SamplingConfig(max_new_tokens=2, record=True))
    assert recorded_steps(tmp_path / "run" / "stage" / "recording") == [0, 1]
    e, _ = run(SamplingConfig(max_new_tokens=2, replay=str(tmp_path / "run")))
    assert same_weights(e, recorded) and not same_weights(e, engine())  # (the run trained)


# --- the command -------------------------------------------------------------------------
def weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model" / "model.safetensors"))


def test_trajtune_replay_reruns_a_recorded_grpo_run_bit_for_bit(hf_work, tmp_path, capsys):  # noqa: F811
    from trajtune.cli import main

    d = hf_work
    assert main(["grpo", "--model", str(d / "model"), "--data", str(d / "prompts.jsonl"), "--reward",
                 f"{d / 'rewards.py'}:digits", "--prompts-per-step", "3", "--group-size", "3", "--max-new-tokens", "6",
                 "--surrogate", "ppo", "--epochs", "2", "--steps", "3", "--lr", "3e-3", "--out",
                 str(tmp_path / "run"), "--record"]) == 0
    assert recorded_steps(tmp_path / "run" / "grpo" / "recording") == [0, 1, 2]
    assert main(["replay", str(tmp_path / "run"), "--out", str(tmp_path / "replay")]) == 0
    a, b = weights(tmp_path / "run"), weights(tmp_path / "replay")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert rows(tmp_path / "replay") == rows(tmp_path / "run")
    replayed = json.loads((tmp_path / "replay" / "config.json").read_text())["sampling"]
    assert replayed["replay"] == str((tmp_path / "run").resolve()) and replayed["record"] is False

    assert main(["replay", str(tmp_path / "run"), "--out", str(tmp_path / "lr"), "--set", "optim.lr=1e-2"]) == 0
    c = weights(tmp_path / "lr")
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert [r["rollout/reward"] for r in rows(tmp_path / "lr")] == [r["rollout/reward"] for r in rows(tmp_path / "run")]

    capsys.readouterr()
    for args, message in [([str(tmp_path / "nothing")], "not a run directory (no config.json)"),
                          ([str(tmp_path / "replay")], "the run recorded nothing"),
                          ([str(tmp_path / "run"), "--out", str(tmp_path / "run")], "that is the recorded run")]:
        assert main(["replay", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err
    base = ["grpo", "--model", str(d / "model"), "--data", str(d / "prompts.jsonl"), "--reward",
            f"{d / 'rewards.py'}:digits", "--out", str(tmp_path / "x")]
    for args, message in [(["--replay", str(tmp_path / "nothing")], "--replay " + str(tmp_path / "nothing") + ": no "
                           "such directory"),
                          (["--replay", str(tmp_path / "run"), "--record"], "--replay trains on a recording and "
                           "--record makes one"),
                          (["--replay", str(tmp_path / "run"), "--max-staleness", "1", "--tis-cap", "2"],
                           "--replay trains on recorded episodes without sampling")]:
        assert main([*base, *args]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err


def test_trajtune_replay_reruns_a_recorded_recipe_with_multi_turn_episodes(tmp_path):
    """`trajtune run textarena` (a multi-turn game, held-out evaluations sampled live) with
    config.sampling.record, replayed: the same checkpoint, tensor for tensor, and the same rows (evaluations
    included: the same weights sample the same held-out episodes)."""
    pytest.importorskip("textarena")
    from trajtune.cli import main

    overrides = ["config.n_train=4", "config.n_eval=2", "config.eval_samples=2", "config.dim=16", "config.n_layers=1",
                 "config.max_turns=3", "config.rl.steps=3", "config.rl.tasks_per_step=2", "config.rl.group_size=2",
                 "config.rl.eval_every=2", "config.sampling.record=true"]
    assert main(["run", "textarena", "--run-dir", str(tmp_path / "run")]
                + [a for o in overrides for a in ("--set", o)]) == 0
    assert recorded_steps(tmp_path / "run" / "rl" / "recording") == [0, 1, 2]
    assert main(["replay", str(tmp_path / "run"), "--out", str(tmp_path / "replay")]) == 0
    from safetensors.torch import load_file

    a, b = (load_file(str(tmp_path / d / "rl" / "checkpoint" / "model.safetensors")) for d in ("run", "replay"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert rows(tmp_path / "replay") == rows(tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "rl" / "recording" / "step-000000.json").read_text())
    assert any(3 in t["owners"] for t in saved["trajs"])  # Owner.TOOL: the game's replies, recorded as they came
