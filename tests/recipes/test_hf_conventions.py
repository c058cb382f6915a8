"""The TRL conventions of the Hugging Face commands: epochs instead of steps, a warm-up ratio and an
lr schedule, an evaluation set (eval/* metrics for sft, rm and dpo), TRL's flag names as aliases or
refused with the flag to use, and LoRA's target modules checked before the model loads."""

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from trajtune.cli import main  # noqa: E402
from trajtune.config import ConfigError, from_dict  # noqa: E402
from trajtune.experiments.hf.dpo import DPORun  # noqa: E402
from trajtune.experiments.hf.options import options, trl_names, trl_refusal  # noqa: E402
from trajtune.experiments.hf.schedule import resolve  # noqa: E402
from trajtune.experiments.hf.sft import SFTRun  # noqa: E402
from trajtune.metrics import is_documented, read_metrics  # noqa: E402
from trajtune.models.hf_random import make_random_model  # noqa: E402

BASE = {"model": {"path": "m"}, "data": "d.jsonl"}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("conventions")
    make_random_model(d / "model", "qwen2", "tiny")
    chats = [{"prompt": f"what is {i}+5?", "completion": f"the answer is {i + 5}"} for i in range(6)]
    pairs = [{"prompt": f"what is {i}+5?", "chosen": f"{i + 5}", "rejected": "hello world"} for i in range(6)]
    for name, rows in (("chats", chats), ("pairs", pairs)):
        (d / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
        (d / f"{name}.json").write_text(json.dumps(rows[4:]))  # the held-out rows, as a JSON array
    return d


def test_epochs_and_the_lr_schedule_resolve_against_the_data():
    config = from_dict(SFTRun, {**BASE, "sft": {"batch_size": 4}, "optim": {"lr": 1e-4},
                                "schedule": {"num_train_epochs": 2, "warmup_ratio": 0.2,
                                             "lr_scheduler_type": "cosine"}})
    sft, optim, line = resolve(config, "sft", rows=10, per_step=4, noun="samples")
    assert (sft.steps, optim.warmup_steps, optim.decay_steps) == (5, 1, 4)  # ceil(2*10/4); ceil(0.2*5); the rest
    assert line == ("2 epochs of 10 samples at --batch-size 4 = 5 steps; lr 0.0001: warm-up 1 steps, "
                    "then cosine to 0 over 4 steps")
    assert (optim.decay, optim.min_lr_ratio) == ("cosine", 0.0)  # transformers' cosine ends at 0
    # 0.5 (1 + cos pi t)
    assert [round(optim.lr_at(s) / 1e-4, 4) for s in range(6)] == [1.0, 1.0, 0.8536, 0.5, 0.1464, 0.0]
    plain = from_dict(DPORun, {**BASE, "dpo": {"steps": 30, "batch_size": 0}})
    dpo, optim, line = resolve(plain, "dpo", rows=12, per_step=0, noun="pairs")
    assert dpo.steps == 30 and optim == plain.optim
    assert line == "--steps 30 at full batch over 12 pairs = 30 epochs; lr 1e-05: constant"


@pytest.mark.parametrize("table, message", [
    ({"schedule": {"num_train_epochs": 2}, "sft": {"steps": 7}}, "--num-train-epochs and --steps are exclusive"),
    ({"schedule": {"warmup_ratio": 0.1}, "optim": {"warmup_steps": 3}},
     "--warmup-ratio and --warmup-steps are exclusive"),
    ({"schedule": {"lr_scheduler_type": "cosine"}, "optim": {"decay_steps": 9}},
     "--lr-scheduler-type and --decay-steps are exclusive"),
    ({"schedule": {"warmup_ratio": 1.0}}, r"--warmup-ratio must be in \[0, 1\), got 1.0"),
    ({"schedule": {"num_train_epochs": -1.0}}, "--num-train-epochs must be >= 0"),
    ({"schedule": {"lr_scheduler_type": "linear"}, "optim": {"decay_steps": 9}},
     "--lr-scheduler-type and --decay-steps are exclusive"),
    ({"schedule": {"lr_scheduler_type": "polynomial"}}, "'polynomial' is not one of"),
    ({"model": {"path": "m", "lora_dropout": 1.0}}, r"--lora-dropout must be in \[0, 1\)"),
    ({"model": {"path": "m", "lora_target_modules": ["all-linear", "q_proj"]}}, "all-linear stands alone"),
])
def test_options_that_say_the_same_thing_twice_are_refused(table, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(SFTRun, {**BASE, **table})


def test_flags_given_explicitly_are_exclusive_even_at_their_default():
    from trajtune.experiments.hf.schedule import check_given

    check_given({"schedule.num_train_epochs", "sft.batch_size", "optim.warmup_steps"})
    with pytest.raises(ConfigError, match="--num-train-epochs and --steps are exclusive"):
        check_given({"schedule.num_train_epochs", "sft.steps"})  # --steps 100 is the default: only the flags tell
    with pytest.raises(ConfigError, match="--warmup-ratio and --warmup-steps are exclusive"):
        check_given({"schedule.warmup_ratio", "optim.warmup_steps"})


def test_trl_names_are_aliases_or_refused_with_the_flag_to_use():
    flags = {o.path: (o.flag, o.aliases) for o in options(SFTRun)}
    assert flags["optim.lr"] == ("--lr", ("--learning-rate",))
    assert flags["sft.eval_every"] == ("--eval-every", ("--eval-steps",))
    for native in ("--num-train-epochs", "--warmup-ratio", "--lr-scheduler-type", "--eval-data", "--lora-dropout",
                   "--lora-target-modules", "--disable-dropout", "--gradient-checkpointing", "--warmup-steps"):
        assert native in {f for f, _ in flags.values()}, native
    assert "--learning-rate" not in trl_names(SFTRun) and "--per-device-train-batch-size" in trl_names(SFTRun)
    assert trl_refusal(SFTRun, "--per-device-train-batch-size").startswith(
        "--per-device-train-batch-size is TRL's name; here use --batch-size: the rows of one optimizer step over all")
    assert trl_refusal(DPORun, "--loss-type") == "--loss-type is TRL's name; here use --loss"
    assert trl_refusal(SFTRun, "--loss-type") == "--loss-type is TRL's name and not an option of this command"
    assert trl_refusal(SFTRun, "--bf16") == "--bf16 is TRL's name; here --precision bf16"


def test_lora_without_target_modules_needs_an_architecture_peft_knows(tmp_path, capsys):
    model = tmp_path / "odd"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "my_own_arch"}))
    (tmp_path / "d.jsonl").write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    argv = ["sft", "--model", str(model), "--data", str(tmp_path / "d.jsonl"), "--lora-r", "8",
            "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "peft has no default LoRA layers for model_type 'my_own_arch'" in capsys.readouterr().err
    assert main(argv + ["--lora-target-modules", "q_proj", "v_proj"]) == 2  # past that check: the model's own
    assert "peft has no default" not in capsys.readouterr().err


@pytest.mark.parametrize("command, data, keys", [
    ("sft", "chats", ["eval/loss"]),
    ("rm", "pairs", ["eval/pair_accuracy", "eval/rm_margin", "eval/rm_loss"]),
    ("dpo", "pairs", ["eval/dpo_loss", "eval/dpo_margin", "eval/dpo_accuracy"]),
])
def test_an_eval_set_is_logged_every_eval_steps_and_after_the_last(work, capsys, command, data, keys):
    out = work / f"eval-{command}"
    argv = [command, "--model", str(work / "model"), "--data", str(work / f"{data}.jsonl"), "--eval-data",
            str(work / f"{data}.json"), "--num-train-epochs", "2.5", "--batch-size", "2", "--eval-every", "2",
            "--lr", "3e-3", "--warmup-ratio", "0.5", "--out", str(out)]
    assert main(argv) == 0
    assert f"trajtune {command}: 2.5 epochs of 4 " in capsys.readouterr().out  # ceil(2.5 * 4 / 2) = 5 steps
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["step"] for r in rows if keys[0] in r] == [2, 4, 5]
    assert all(k in r for r in rows if keys[0] in r for k in keys)
    assert [r["train/lr"] for r in rows] == pytest.approx([1e-3, 2e-3, 3e-3, 3e-3, 3e-3])  # warm-up ceil(0.5 * 5) = 3
    assert all(is_documented(k) for r in rows for k in r if k not in ("step", "time", "stage"))
    first, last = (r for r in (rows[1], rows[-1]))
    better = {"eval/loss": -1, "eval/rm_loss": -1, "eval/dpo_loss": -1, "eval/rm_margin": 1, "eval/dpo_margin": 1}
    for k in keys:
        if k in better:
            assert (last[k] - first[k]) * better[k] > 0, (k, first[k], last[k])


def test_dpo_evaluation_keeps_its_reference_across_a_resume(work, monkeypatch):
    """The held-out pairs' reference log-probs are the starting policy's, taken once and kept with the checkpoint:
    a run cut after step 2 and resumed logs the uninterrupted run's eval/* numbers."""
    from trajtune.runs.resume import Checkpointer

    argv = ["dpo", "--model", str(work / "model"), "--data", str(work / "pairs.jsonl"), "--eval-data",
            str(work / "pairs.json"), "--steps", "4", "--batch-size", "2", "--eval-every", "1", "--lr", "3e-3"]
    assert main(argv + ["--out", str(work / "whole")]) == 0
    step_done = Checkpointer.step_done

    def cut_after_two(self, engine, completed, *a, **kw):
        self.stop_requested = self.stop_requested or completed == 2
        return step_done(self, engine, completed, *a, **kw)

    monkeypatch.setattr(Checkpointer, "step_done", cut_after_two)
    assert main(argv + ["--out", str(work / "cut")]) == 130
    monkeypatch.setattr(Checkpointer, "step_done", step_done)
    assert main(argv + ["--out", str(work / "cut")]) == 0
    evals = lambda d: [{k: v for k, v in r.items() if k.startswith("eval/")} for r in read_metrics(d)]  # noqa: E731
    whole, cut = evals(work / "whole"), evals(work / "cut")
    assert whole[-1]["eval/dpo_margin"] > whole[0]["eval/dpo_margin"] and cut == whole  # exact: the same numbers


def test_the_linear_and_cosine_decays_of_optim_config():
    from trajtune.engine import OptimConfig

    lin = OptimConfig(lr=1.0, warmup_steps=2, decay_steps=4, decay="linear", min_lr_ratio=0.0)
    assert [lin.lr_at(s) for s in range(7)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    cos = OptimConfig(lr=1.0, decay_steps=2)  # the library's default: cosine to lr / 10
    assert [round(cos.lr_at(s), 12) for s in range(3)] == [1.0, 0.55, 0.1]
