"""The life of a Hugging Face run (`trajtune sft|rm|dpo|grpo|rft`): nothing is lost, training is
visible, every failure is one clear message.

    defaults never collide       a fresh runs/<command>-<time> per run, printed
    one run per directory        run_dir/.lock; a second run is refused naming the holder; a dead one never blocks
    rerun of the same command    finished: refused unless --overwrite; cut short: "resuming from step N of M";
                                 killed before any checkpoint: "starting again from step 0"; no step twice
    saves                        disk full / read-only: one message naming the file and the reason, exit 1,
                                 the previous checkpoint intact; 0755 / 0644; --save-total-limit
    all steps skipped            exit 1, not "done"
    visible                      a line every --logging-steps (a bar on a terminal), report.md with curves,
                                 --report-to tensorboard / wandb
    bad inputs                   a table: exit code, "error:", the file or option named, no traceback
"""

import errno
import io
import json
import os
import re
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from trajtune.runs import stages  # noqa: E402
from trajtune.checkpoint import CheckpointError, atomic_dir  # noqa: E402
from trajtune.cli import main  # noqa: E402
from trajtune.metrics import Console, MetricsLogger, check_tracker, make_tracker, read_metrics  # noqa: E402
from trajtune.models.hf_random import make_random_model  # noqa: E402
from trajtune.runs.metrics_report import write_run_report  # noqa: E402
from trajtune.runs.rundir import RunDir, RunDirBusy, run_lock  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("hfruns")
    make_random_model(d / "model", "qwen2", "tiny")
    with open(d / "chats.jsonl", "w") as f:
        for i in range(8):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"what is {i}+5?"},
                                             {"role": "assistant", "content": f"the answer is {i + 5}"}]}) + "\n")
    return d


def sft(work, out, *more):
    return ["sft", "--model", str(work / "model"), "--data", str(work / "chats.jsonl"), "--batch-size", "2",
            "--out", str(out), *more]


def cli(args, capsys):
    """(exit code, stdout, stderr) of `trajtune ARGS` in this process; an uncaught exception fails the test
    (it would be a traceback on the command line)."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:  # argparse
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def steps_of(run_dir, stage="sft"):
    return [r["step"] for r in read_metrics(run_dir) if r.get("stage") == stage]


# --- defaults never collide ------------------------------------------------------------------
def test_without_out_every_run_gets_a_fresh_directory_printed_at_start(work, tmp_path, monkeypatch, capsys):
    from trajtune.runs import rundir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(rundir.time, "strftime", lambda fmt, *a: "20260101-120000")
    no_out = [a for a in sft(work, "x", "--steps", "1") if a not in ("--out", "x")]
    code, out, _ = cli(no_out, capsys)
    assert code == 0
    assert "run directory runs/sft-20260101-120000 " in out.splitlines()[0]
    assert (tmp_path / "runs/sft-20260101-120000/model/config.json").exists()
    assert RunDir.fresh("sft").path == Path("runs/sft-20260101-120000-2")  # the same second: -2, -3 ...
    assert RunDir.fresh("sft", create=False).path == Path("runs/sft-20260101-120000-3")
    assert RunDir.fresh("sft").path == Path("runs/sft-20260101-120000-3")
    refused = [a if a != str(work / "model") else "nope" for a in no_out]
    assert cli(refused, capsys)[0] == 2
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [  # the refused run left no directory behind
        "sft-20260101-120000", "sft-20260101-120000-2", "sft-20260101-120000-3"]
    _at_step(monkeypatch, 0, lambda: os.kill(os.getpid(), signal.SIGINT))  # Ctrl-C: how to resume names the dir
    code, _, err = cli([*no_out, "--save-every", "0"], capsys)
    assert code == 130 and "run the same command with --out runs/sft-20260101-120000-4 to resume" in err


# --- one run per directory -----------------------------------------------------------------
HOLD = """
import sys, time
from trajtune.runs.rundir import run_lock
with run_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_run_is_refused_naming_the_holder_and_a_killed_holder_never_blocks(work, tmp_path, capsys):
    run_dir = tmp_path / "busy"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        code, _, err = cli(sft(work, run_dir, "--steps", "1"), capsys)
        assert code == 2 and "trajtune: error:" in err and "Traceback" not in err
        assert f"{run_dir} is in use by another run: pid {holder.pid}" in err and "-c" in err and "since" in err
        with pytest.raises(RunDirBusy, match=f"pid {holder.pid}"):  # every recipe: run_stages holds it
            stages.run_stages([stages.Stage("a", _noop)], None, run_dir, stages.StageOptions(workers=1))
        assert not (run_dir / "metrics.jsonl").exists()
    finally:
        holder.send_signal(signal.SIGKILL)  # kill -9: the lock file stays, the lock goes with the process
        holder.wait()
    assert (run_dir / ".lock").read_text()
    with run_lock(run_dir), run_lock(run_dir):  # free again; reentrant in one process
        assert json.loads((run_dir / ".lock").read_text())["pid"] == os.getpid()


def _noop(ctx):
    return {}


# --- a finished run, --overwrite, a run cut short, a run killed ----------------------------
def test_a_finished_run_is_refused_unless_overwrite_which_starts_afresh(work, tmp_path, capsys):
    run_dir = tmp_path / "done"
    assert cli(sft(work, run_dir, "--steps", "2", "--save-every", "1"), capsys)[0] == 0
    code, _, err = cli(sft(work, run_dir, "--steps", "2", "--save-every", "1"), capsys)
    assert code == 2 and f"{run_dir} holds a finished sft run (2 optimizer steps" in err and "--overwrite" in err
    code, out, _ = cli(sft(work, run_dir, "--steps", "3", "--overwrite"), capsys)
    assert code == 0 and "--overwrite: removed the earlier run's" in out and "checkpoints/" in out
    assert steps_of(run_dir) == [1, 2, 3]  # afresh: no row of the first run
    assert not (run_dir / "checkpoints").exists()
    assert json.loads((run_dir / "sft" / "results.json").read_text())["steps"] == 3


SLOW_SFT = """
import os, sys, time
import trajtune.algorithms.sft as S
step = S.sft_step
def slow(*a, **k):
    out = step(*a, **k)
    time.sleep(0.3)
    return out
S.sft_step = slow
from trajtune.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _kill_9_at(args, step: int) -> str:
    """Run `trajtune ARGS` (with --logging-steps 1) in a subprocess whose steps are slow; SIGKILL it once it
    printed the progress line of `step`; -> what it printed."""
    p = subprocess.Popen([sys.executable, "-c", SLOW_SFT, *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    seen = []
    for line in p.stdout:
        seen.append(line)
        if line.startswith(f"sft  step {step}/"):
            p.send_signal(signal.SIGKILL)
            break
    rest, _ = p.communicate(timeout=120)
    assert p.returncode == -signal.SIGKILL, "".join(seen) + rest
    return "".join(seen) + rest


def _at_step(monkeypatch, step: int, what) -> None:
    """Do `what()` inside the sft step of index `step` (0-based), after its update."""
    import trajtune.algorithms.sft as S

    real = S.sft_step

    def sft_step(engine, data, config, pad_id, k, loss):
        out = real(engine, data, config, pad_id, k, loss)
        if k == step:
            what()
        return out

    monkeypatch.setattr(S, "sft_step", sft_step)


def _crash():
    raise SystemError("the machine went down")


def test_kill_9_ctrl_c_and_resume_state_following_the_latest_save(work, tmp_path, monkeypatch, capsys):
    """A run killed (a real kill -9) before any checkpoint starts again from step 0 and says so; a Ctrl-C saves;
    the resumed run saves again past it and dies; the next rerun resumes from the newer save, not the Ctrl-C
    one; metrics never hold a step twice; the finished run is never resumed again."""
    run_dir = tmp_path / "life"
    args = sft(work, run_dir, "--steps", "8", "--logging-steps", "1")
    _kill_9_at(args, 2)
    assert steps_of(run_dir)[:2] == [1, 2] and not (run_dir / "sft" / "resume").exists()

    with monkeypatch.context() as m:
        _at_step(m, 2, lambda: os.kill(os.getpid(), signal.SIGINT))  # Ctrl-C during step 3
        code, out, err = cli(args, capsys)
    assert "no checkpoint of the earlier, unfinished run to resume from: starting again from step 0" in out
    assert "metric rows were discarded" in out
    assert code == 130 and "interrupted after step 3" in err
    assert steps_of(run_dir) == [1, 2, 3]

    with monkeypatch.context() as m:  # resumes, saves at 5 (--save-every), dies in step 7
        _at_step(m, 6, _crash)
        with pytest.raises(SystemError):
            main([str(a) for a in [*args, "--save-every", "5"]])
    assert f"resuming from step 3 of 8 (checkpoint {run_dir / 'sft' / 'resume' / 'state'})" in capsys.readouterr().out

    code, out, _ = cli([*args, "--save-every", "5"], capsys)
    assert code == 0 and "resuming from step 5 of 8" in out  # the latest save, not the Ctrl-C one
    assert steps_of(run_dir) == list(range(1, 9))
    assert not (run_dir / "sft" / "resume").exists()
    code, _, err = cli([*args, "--save-every", "5"], capsys)
    assert code == 2 and "holds a finished sft run (8 optimizer steps" in err  # never back to an old state


# --- saves: full disk, read-only, permissions, --save-total-limit -----------------------------
def test_saved_model_and_checkpoints_are_readable_by_others_and_only_the_newest_are_kept(work, tmp_path, capsys):
    old = os.umask(0o022)
    try:
        code, _, _ = cli(sft(work, tmp_path / "perm", "--steps", "6", "--save-every", "2", "--save-total-limit", "2"),
                         capsys)
    finally:
        os.umask(old)
    assert code == 0
    ckpts = tmp_path / "perm" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-4", "step-6"]
    for d in (tmp_path / "perm" / "model", ckpts / "step-6"):
        assert d.stat().st_mode & 0o777 == 0o755
        assert {f.stat().st_mode & 0o777 for f in d.iterdir() if f.is_file()} == {0o644}


def test_disk_full_during_a_periodic_save_keeps_the_previous_checkpoint(work, tmp_path, monkeypatch, capsys):
    import trajtune.engine.torch_engine as engine_module

    calls, save = [], engine_module.save_model_weights

    def fill_the_disk(model, file):
        calls.append(file)
        if len(calls) == 2:  # the second resume state (step 4)
            raise OSError(errno.ENOSPC, "No space left on device", str(file))
        save(model, file)

    monkeypatch.setattr(engine_module, "save_model_weights", fill_the_disk)
    run_dir = tmp_path / "full"
    code, _, err = cli(sft(work, run_dir, "--steps", "6", "--save-every", "2"), capsys)
    assert code == 1 and "Traceback" not in err
    assert "trajtune: error: cannot write" in err and "No space left on device" in err and "model.safetensors" in err
    state = run_dir / "sft" / "resume" / "state"
    assert json.loads((state / "engine.json").read_text())["extra"]["completed_steps"] == 2  # the previous one
    assert not list(state.parent.glob(".state.*"))  # no half-written directory left


def test_disk_full_at_the_final_model_save(work, tmp_path, monkeypatch, capsys):
    def fsync(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync)
    code, _, err = cli(sft(work, tmp_path / "final", "--steps", "1"), capsys)
    assert code == 1 and "Traceback" not in err
    assert f"cannot write {tmp_path / 'final' / 'model'}: No space left on device" in err
    assert not (tmp_path / "final" / "model").exists() and not (tmp_path / "final" / "sft" / "results.json").exists()


def read_only(path: Path, monkeypatch) -> None:
    """Make directory `path` read-only: chmod, or for root (who ignores permissions) chattr +i, or else a
    monkeypatched mkdir / mkdtemp refusing to write under it."""
    path.chmod(0o555)
    probe = path / ".probe"
    try:
        probe.mkdir()
    except OSError:
        return
    probe.rmdir()
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0:
        _immutable.append(path)  # undone after the test
        return
    import pathlib
    import tempfile

    mkdir, mkdtemp = pathlib.Path.mkdir, tempfile.mkdtemp

    def refuse(p):
        if str(p).startswith(str(path)):
            raise PermissionError(errno.EACCES, "Permission denied", str(p))

    monkeypatch.setattr(pathlib.Path, "mkdir", lambda self, *a, **k: refuse(self) or mkdir(self, *a, **k))
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, dir=None, **k: refuse(dir) or mkdtemp(*a, dir=dir, **k))


_immutable: list[Path] = []


@pytest.fixture(autouse=True)
def _writable_again():
    yield
    for p in _immutable:
        subprocess.run(["chattr", "-i", str(p)], capture_output=True)
    _immutable.clear()


def test_a_read_only_checkpoint_directory_keeps_the_previous_save(tmp_path, monkeypatch):
    target = tmp_path / "ro" / "state"
    with atomic_dir(target) as d:
        (d / "a.txt").write_text("old")
    read_only(tmp_path / "ro", monkeypatch)
    with pytest.raises(CheckpointError, match=r"cannot write .*state: .*(Permission denied|not permitted)"):
        with atomic_dir(target) as d:
            (d / "a.txt").write_text("new")
    assert (target / "a.txt").read_text() == "old"


# --- a run that trained nothing --------------------------------------------------------------
def test_a_run_whose_every_step_was_skipped_fails(work, tmp_path, capsys):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    broken = tmp_path / "nan-model"
    model = AutoModelForCausalLM.from_pretrained(work / "model")
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))  # every logit NaN: every step's loss is NaN
    model.save_pretrained(broken)
    AutoTokenizer.from_pretrained(work / "model").save_pretrained(broken)
    code, _, err = cli(["sft", "--model", broken, "--data", work / "chats.jsonl", "--steps", "2",
                        "--out", tmp_path / "nan"], capsys)
    assert code == 1 and "Traceback" not in err
    assert "every one of the 2 optimizer steps was skipped" in err and "no model was saved" in err
    assert not (tmp_path / "nan" / "model").exists()


# --- training is visible ---------------------------------------------------------------------
class FakeWandb(types.ModuleType):
    """A stand-in for the wandb package: records init's arguments and every logged dict."""

    def __init__(self):
        super().__init__("wandb")
        self.logged, self.inits, self.finished = [], [], 0

    def init(self, **kw):
        self.inits.append({**kw, "mode": os.environ.get("WANDB_MODE")})
        return types.SimpleNamespace(log=lambda d, step: self.logged.append((step, d)), finish=self._finish)

    def _finish(self):
        self.finished += 1


def test_progress_lines_report_and_wandb(work, tmp_path, monkeypatch, capsys):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run_dir = tmp_path / "seen"
    code, out, _ = cli(sft(work, run_dir, "--steps", "5", "--logging-steps", "2", "--report-to", "wandb"), capsys)
    assert code == 0
    lines = [ln for ln in out.splitlines() if ln.startswith("sft  step")]
    assert [ln.split()[2] for ln in lines] == ["2/5", "4/5", "5/5"]  # every 2 steps and the last
    assert re.search(r"loss \d\.\d+ +lr 1\.0e-05 +[\d,]+ tok/s +eta \d+s", lines[0]), lines[0]
    assert fake.inits[0]["mode"] == "offline" and fake.inits[0]["dir"] == str(run_dir) and fake.finished == 1
    assert [s for s, _ in fake.logged] == [1, 2, 3, 4, 5] and "sft/train/loss" in fake.logged[0][1]
    report = (run_dir / "report.md").read_text()
    assert "![training loss](report-loss.png)" in report and (run_dir / "report-loss.png").stat().st_size > 1000
    assert (run_dir / "report.html").exists()


def test_the_console_is_a_bar_on_a_terminal_and_sparse_rows_still_print():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    c = Console("dpo", every=10, total=4, stream=term)
    c.start(0, 4)
    for s in range(1, 5):
        c.update(s, {"train/loss": 0.5, "dpo/accuracy": 0.75, "train/lr": 1e-5})
    assert "dpo" in term.getvalue() and "acc 0.75" in term.getvalue() and "4/4" in term.getvalue()
    lines = io.StringIO()
    c = Console("rft", every=10, total=40, stream=lines)  # one row per round of 8 steps
    c.start(0)
    for s in (8, 16, 24, 32, 40):
        c.update(s, {"train/loss": 1.0, "rollout/reward": 0.5, "kl/k3": 0.01})
    steps = [ln.split()[2] for ln in lines.getvalue().splitlines()]
    assert steps == ["16/40", "24/40", "32/40", "40/40"] and "reward 0.5  kl 0.01" in lines.getvalue()


def test_a_recipe_turns_the_console_on_with_runner_log_every_and_is_quiet_by_default(tmp_path, capsys):
    ctx = stages.StageContext("s", None, tmp_path, stages.StageOptions(workers=1),
                              logger=MetricsLogger(tmp_path))
    assert ctx.run().console is None
    ctx = stages.StageContext("s", None, tmp_path, stages.StageOptions(workers=1, log_every=5),
                              logger=MetricsLogger(tmp_path))
    assert ctx.run().console.every == 5


def test_write_run_report_plots_every_group_the_rows_have(tmp_path):
    with MetricsLogger(tmp_path) as log:
        for s in range(1, 5):
            log.log(s, {"train/loss": 1.0 / s, "train/lr": 1e-5, "rollout/reward": s / 4, "kl/k3": 0.01 * s,
                        **({"eval/pass_rate": s / 8} if s % 2 == 0 else {})}, stage="grpo")
        log.log(1, {"train/loss": float("nan"), "dpo/accuracy": 0.5}, stage="dpo")
    md = write_run_report(tmp_path, "a run").read_text()
    for stem in ("loss", "reward", "kl", "eval"):
        assert f"(report-{stem}.png)" in md and (tmp_path / f"report-{stem}.png").exists()
    assert "| grpo | eval/pass_rate | 2 | 0.25 | 0.5 |" in md
    # a group with one number per line is written, not drawn: a constant lr, a lone accuracy
    for stem in ("lr", "accuracy"):
        assert f"(report-{stem}.png)" not in md and not (tmp_path / f"report-{stem}.png").exists()
    assert "- learning rate: `grpo train/lr` 1e-05 (constant) at all 4 logged steps (1 to 4)" in md
    assert "- preference accuracy: `dpo dpo/accuracy` 0.5 at step 1" in md


def test_tensorboard_and_missing_trackers(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # the optional extra not installed
    with pytest.raises(Exception, match=r"pip install 'trajtune\[tensorboard\]'"):
        check_tracker("tensorboard")
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(Exception, match="pip install wandb"):
        check_tracker("wandb")
    monkeypatch.undo()
    pytest.importorskip("tensorboard")
    with MetricsLogger(tmp_path, trackers=[make_tracker("tensorboard", tmp_path)]) as log:
        log.log(1, {"train/loss": 1.0}, stage="sft")
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


# --- every failure a clear message -------------------------------------------------------------
def _inputs(d: Path) -> None:
    (d / "notds").mkdir()
    (d / "notds" / "x.txt").write_text("hi")
    (d / "latin.jsonl").write_bytes(b'{"messages": [{"role": "user", "content": "hi"}, '
                                    b'{"role": "assistant", "content": "ok"}]}\n{"messages": "caf\xe9"}\n')
    (d / "array.json").write_text('[{"messages": "hello"}]')
    (d / "hello.jsonl").write_text('{"messages": "hello"}\n')
    (d / "prompts.jsonl").write_text('{"prompt": "what is 1+1?", "answer": "2"}\n')
    (d / "bad_reward.py").write_text("def f(prompts, completions:\n    return 1\n")


def _model_copy(work, d, name, damage):
    import shutil

    shutil.copytree(work / "model", d / name)
    damage(d / name)
    return d / name


def _truncate(model):
    data = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(data[:1000])


def _break_config(model):
    (model / "config.json").write_text('{"model_type": ')


MISSING = "owned by data helper: "
CASES = [
    # id, args (after the command; M = the model, D = the run's directory, C = chats.jsonl), code, named, owner gap
    ("data-is-a-directory", ["--data", "notds"], 2, ["notds", "not a dataset"], None),
    ("non-utf8", ["--data", "latin.jsonl"], 2, ["latin.jsonl:2", "UTF-8"], None),
    ("json-array-of-bad-rows", ["--data", "array.json"], 2, ["array.json:1", "'messages' is a string"], None),
    ("messages-a-string", ["--data", "hello.jsonl"], 2, ["hello.jsonl:1", "'messages' is a string"], None),
    ("truncated-weights", ["--model", "TRUNC"], 2, ["model.safetensors", "truncated or corrupted"], None),
    ("broken-config-json", ["--model", "BADCFG"], 2, ["config.json"], None),
    ("cuda-without-cuda", ["--device", "cuda"], 2, ["--device cuda", "CUDA is not available"], "cuda"),
    ("invalid-device", ["--device", "gpu"], 2, ["--device 'gpu'", "not a device"], None),
    ("read-only-out", ["--out", "RO/run"], 2, ["cannot write to the run directory", "RO"], None),
    ("reward-syntax-error", ["grpo", "--data", "prompts.jsonl", "--reward", "bad_reward.py:f"], 2,
     ["bad_reward.py", "line 1", "SyntaxError"], None),
    ("unknown-tracker", ["--report-to", "mlflow"], 2, ["--report-to", "tensorboard, wandb"], None),
    ("missing-model", ["--model", "nope"], 2, ["nope", "no such directory"], None),
    ("unknown-flag", ["--no-such-flag", "1"], 2, ["unrecognized arguments: --no-such-flag"], None),
    ("steps-0", ["--steps", "0"], 0, ["warning", "--steps 0", "nothing will be trained"], None),
    ("batch-larger-than-data", ["--batch-size", "64", "--steps", "1"], 0,
     ["warning", "--batch-size 64 is larger than the 8 samples", "chats.jsonl"], None),
]


@pytest.fixture(scope="module")
def bad(work, tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    _inputs(d)
    _model_copy(work, d, "trunc", _truncate)
    _model_copy(work, d, "badcfg", _break_config)
    (d / "ro").mkdir()
    return d


@pytest.mark.parametrize("route", ["command", "recipe"])
@pytest.mark.parametrize("case", [pytest.param(c, id=c[0]) for c in CASES])
def test_every_bad_input_is_one_clear_message(case, route, work, bad, monkeypatch, capsys, tmp_path, request):
    name, args, code, named, gap = case
    if gap == "cuda":
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    elif gap:
        request.applymarker(pytest.mark.xfail(strict=True, reason=gap))
    if route == "recipe" and name in ("unknown-flag", "read-only-out"):
        pytest.skip("a command-line matter")
    monkeypatch.chdir(bad)
    if name == "read-only-out":
        read_only(bad / "ro", monkeypatch)
    subs = {"TRUNC": "trunc", "BADCFG": "badcfg", "RO": str(bad / "ro")}
    args = [subs.get(a, a.replace("RO", str(bad / "ro"))) for a in args]
    command = args.pop(0) if args and args[0] == "grpo" else "sft"
    options = {"--model": str(work / "model"), "--data": str(work / "chats.jsonl"), "--out": str(tmp_path / "o")}
    rest = []
    while args:
        flag, value = args.pop(0), (args.pop(0) if args else None)
        if flag in options:
            options[flag] = value
        else:
            rest += [flag, value]
    if route == "command":
        argv = [command, *(x for kv in options.items() for x in kv), *rest]
    else:
        argv = ["run", f"hf_{command}", "--run-dir", options["--out"],
                "--set", f"config.model.path='{options['--model']}'", "--set", f"config.data='{options['--data']}'",
                *(x for f, v in zip(rest[::2], rest[1::2]) for x in ("--set", _recipe_key(command, f, v)))]
    got, out, err = cli(argv, capsys)
    assert got == code, (got, err)
    assert "Traceback" not in err
    if code:
        assert re.search(r"trajtune( \w+)?: error:", err), err
    for text in named:
        text = text.replace("RO", str(bad / "ro"))
        assert text in err, (text, err)


def _recipe_key(command: str, flag: str, value: str) -> str:
    """The recipe's --set for a command-line flag: config.<its path>=<a TOML value>."""
    import importlib
    import typing

    from trajtune.experiments.hf import METHODS
    from trajtune.experiments.hf.options import options

    o = next(o for o in options(importlib.import_module(METHODS[command]).Config) if o.flag == flag)
    literal = value if value.lstrip("-").isdigit() else f"'{value}'"
    return f"config.{o.path}=" + (f"[{literal}]" if typing.get_origin(o.type) is list else literal)


def test_dry_run_checks_paths_and_rows_and_stops(work, tmp_path, capsys):
    code, out, _ = cli(sft(work, tmp_path / "dry", "--dry-run"), capsys)
    assert code == 0 and "dry run: the 8 training items from" in out and "nothing trained" in out
    assert f"{tmp_path / 'dry'}: a new run" in out and not (tmp_path / "dry").exists()
    code, _, err = cli(["sft", "--model", tmp_path / "nope", "--data", work / "chats.jsonl", "--dry-run"], capsys)
    assert code == 2 and "nope: no such directory" in err


def test_dry_run_and_overwrite_of_a_finished_run(work, tmp_path, capsys):
    """--dry-run says a finished run would be refused, and what --overwrite would do, touching nothing;
    --overwrite removes the earlier run only once the new run's checks pass."""
    run_dir = tmp_path / "done"
    assert cli(sft(work, run_dir, "--steps", "2"), capsys)[0] == 0
    files = lambda: {p: p.read_bytes() for p in sorted(run_dir.rglob("*"))  # noqa: E731
                     if p.is_file() and p.name != ".lock"}
    before = files()
    code, _, err = cli(sft(work, run_dir, "--steps", "2", "--dry-run"), capsys)
    assert code == 2 and f"{run_dir} holds a finished sft run (2 optimizer steps" in err
    code, out, _ = cli(sft(work, run_dir, "--steps", "3", "--dry-run", "--overwrite"), capsys)
    assert (code == 0 and "--overwrite: the earlier run's outputs are removed" in out
            and "3 optimizer steps would run" in out)
    bad = [a if a != str(work / "chats.jsonl") else str(tmp_path / "missing.jsonl")
           for a in sft(work, run_dir, "--steps", "3")]
    code, out, err = cli([*bad, "--overwrite"], capsys)
    assert code == 2 and "missing.jsonl" in err and "removed" not in out
    assert files() == before  # a refused --overwrite deleted nothing


def _recipe(tmp_path, experiment, **config):
    """A recipe file: experiment = ..., [config] with `config` (strings and lists of strings)."""
    path, model = tmp_path / f"{experiment}.toml", config.pop("model")
    path.write_text(f'experiment = "{experiment}"\n[config]\n'
                    + "".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items())
                    + f'[config.model]\npath = "{model}"\n')
    return path


@pytest.mark.parametrize("case", ["sft-missing-data", "grpo-missing-data", "grpo-reward-does-not-import", "valid"])
def test_trajtune_run_dry_run_checks_the_files_a_recipe_names(case, work, tmp_path, capsys):
    """`trajtune run RECIPE --dry-run` on an HF recipe: its data file, model directory and reward functions exist
    and parse (the method's `dry_run` hook: every check before the model loads), one line naming a bad file;
    a valid recipe passes and writes nothing."""
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "what is 1+1?", "answer": "2"}\n')
    (tmp_path / "broken_reward.py").write_text("import no_such_module_here\n\ndef f(prompts, completions, **kw):\n"
                                               "    return [1.0] * len(prompts)\n")
    (tmp_path / "ok_reward.py").write_text("def f(prompts, completions, **kw):\n    return [1.0] * len(prompts)\n")
    model = str(work / "model")
    experiment, config, named = {
        "sft-missing-data": ("hf_sft", {"data": str(tmp_path / "nope.jsonl")}, "nope.jsonl"),
        "grpo-missing-data": ("hf_grpo", {"data": str(tmp_path / "gone.jsonl"),
                                          "reward": [f"{tmp_path / 'ok_reward.py'}:f"]}, "gone.jsonl"),
        "grpo-reward-does-not-import": ("hf_grpo", {"data": str(tmp_path / "prompts.jsonl"),
                                                    "reward": [f"{tmp_path / 'broken_reward.py'}:f"]},
                                        "broken_reward.py"),
        "valid": ("hf_grpo", {"data": str(tmp_path / "prompts.jsonl"), "reward": [f"{tmp_path / 'ok_reward.py'}:f"]},
                  None),
    }[case]
    recipe = _recipe(tmp_path, experiment, model=model, **config)
    run_dir = tmp_path / "run"
    code, out, err = cli(["run", recipe, "--run-dir", run_dir, "--dry-run"], capsys)
    assert not run_dir.exists()  # nothing written, not even the directory
    if named is None:
        assert code == 0 and "dry run: the recipe is valid" in out and "the 1 training items" in out, (out, err)
        run_dir.mkdir()
        assert cli(["run", recipe, "--run-dir", run_dir, "--dry-run"], capsys)[0] == 0
        assert list(run_dir.iterdir()) == []
        return
    first = err.splitlines()[0]
    assert code == 2 and first.startswith("trajtune: error:") and named in first, err
    # (a reward file's own traceback may follow)
    assert err.count("error:") == 1 and str(ROOT / "trajtune") not in err, err


def test_a_gpu_that_is_not_there_is_named(monkeypatch):
    import torch

    from trajtune.config import ConfigError
    from trajtune.experiments.hf.recipe import check_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_device("cuda:1")
    with pytest.raises(ConfigError, match=r"--device cuda:2: there are 2 GPUs \(cuda:0 \.\. cuda:1\)"):
        check_device("cuda:2")
    with pytest.raises(ConfigError, match="trajtune trains on cpu, cuda or mps"):
        check_device("meta")


def test_weight_change_measures_the_saved_model_against_its_input(tmp_path):
    """What says 'the saved model is its input, unchanged': the tensors both folders have, by name, bytes equal or
    not; the L2 norm of the change; another dtype with the same values is no change; nothing in common: None."""
    import torch
    from safetensors.torch import save_file

    from trajtune.experiments.hf.common import weight_change

    w = {"a": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([0.5, -0.25]), "c": torch.zeros(0)}
    for name, tensors in {"in": w, "same": {k: v.clone() for k, v in w.items()},
                          "moved": {**w, "b": torch.tensor([0.5, 0.75]), "extra": torch.ones(3)},
                          "bf16": {k: v.to(torch.bfloat16) for k, v in w.items()},
                          "other": {"z": torch.ones(1)}}.items():
        (tmp_path / name).mkdir()
        save_file(tensors, str(tmp_path / name / "model.safetensors"))
    norm = float(torch.cat([w["a"].flatten(), w["b"]]).norm())
    same = weight_change(tmp_path / "in", tmp_path / "same")
    assert (same["tensors"], same["changed"], same["l2"]) == (3, 0, 0.0) and same["relative"] == 0.0
    moved = weight_change(tmp_path / "in", tmp_path / "moved")
    assert (moved["tensors"], moved["changed"]) == (3, 1) and moved["l2"] == pytest.approx(1.0)  # |0.75 - -0.25|
    assert moved["relative"] == pytest.approx(1.0 / norm)
    assert weight_change(tmp_path / "in", tmp_path / "bf16")["changed"] == 0  # these values are exact in bf16
    assert weight_change(tmp_path / "in", tmp_path / "other") is None
    assert weight_change(tmp_path / "in", tmp_path / "missing") is None
