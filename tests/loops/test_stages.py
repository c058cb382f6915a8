"""The stage runner (trajtune.runs.stages): order, processes, read-back, reruns, resume, clocks, errors.

The toy stage functions live at module level: spawned worker processes import them from here
(pytest puts tests/ on sys.path, and spawn hands sys.path to its children).
"""

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from trajtune.metrics import read_metrics
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.runs.resume import RunInterrupted
from trajtune.runs.stages import Stage, StageContext, StageOptions, run_stages

# --- toy stages -------------------------------------------------------------------------
def add_stage(ctx: StageContext, value: int, reads: tuple = (), meet: str | None = None) -> dict:
    """total = value + the totals of the stages it `reads` (their results.json must exist: order).
    Counts its calls in a file; `meet`: wait until that sibling has started too (proves concurrency)."""
    ctx.dir.mkdir(parents=True, exist_ok=True)
    calls = ctx.dir / "calls"
    n = int(calls.read_text()) + 1 if calls.exists() else 1
    calls.write_text(str(n))
    (ctx.dir / "started").touch()
    if meet is not None:
        deadline = time.monotonic() + 30
        while not (ctx.run_dir / meet / "started").exists():
            assert time.monotonic() < deadline, f"{ctx.name}: {meet} never ran alongside"
            time.sleep(0.02)
    total = value + sum(json.loads((ctx.run_dir / r / "results.json").read_text())["total"] for r in reads)
    ctx.counters["sampling_s"] = 0.0
    ctx.log(1, {"train/loss": float(n)})
    return {"total": total, "calls": n, "pair": (1, 2), "pid": os.getpid(), "threads": torch.get_num_threads()}


def sibling_stage(ctx: StageContext) -> dict:
    """Wait (up to 30 s) until the runner has a second worker process: with one stage ready and more to come,
    the runner starts every worker at once. Linux: the runner's children from /proc."""
    parent, deadline = os.getppid(), time.monotonic() + 30
    runner = Path(f"/proc/{parent}/cmdline").read_bytes()

    def workers() -> set[int]:
        out = set()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat, cmd = Path(f"/proc/{pid}/stat").read_text(), Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            # a worker: spawned (its command line runs spawn_main) or forked (the runner's command line)
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent and (b"spawn_main" in cmd or cmd == runner):
                out.add(int(pid))
        return out

    while len(workers()) < 2:
        assert time.monotonic() < deadline, "the second worker was not started while the first stage ran"
        time.sleep(0.05)
    return {"pid": os.getpid()}


def failing_stage(ctx: StageContext) -> dict:
    raise LookupError("boom")


def not_a_dict_stage(ctx: StageContext) -> dict:
    return [1, 2]


def stop_after_stage(ctx: StageContext) -> dict:
    ctx.checkpointer.stop_requested = True  # a Ctrl-C that came after the stage's last loop step
    return {"done": True}


class FakeEngine:
    """What a Checkpointer needs of an engine: save_state / load_state (the step count is the weights)."""

    def __init__(self):
        self.step = 0

    def save_state(self, path, extra=None, tensors=None):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "engine.json").write_text(json.dumps({"step": self.step, "extra": extra}))

    def load_state(self, path):
        saved = json.loads((Path(path) / "engine.json").read_text())
        self.step = saved["step"]
        return saved["extra"]


def looping_stage(ctx: StageContext, steps: int, pause: float, stop_at: int, how: str) -> dict:
    """A loop through ctx.run() that is stopped after step `stop_at` of its first run: by a SIGINT to
    itself (`how="self"`), or by a SIGTERM to the runner process that started it (`how="parent"`)."""
    engine, seen = FakeEngine(), ctx.keep("seen", [])
    run = ctx.run()
    start, _ = run.start(engine)
    for step in run.steps(start, steps):
        time.sleep(pause)
        engine.step += 1
        seen.append(step)
        ctx.counters["sampling_s"] = ctx.counters.get("sampling_s", 0.0) + 0.5
        if step == stop_at and not start:
            if how == "self":
                assert signal.getsignal(signal.SIGINT) == ctx.checkpointer._on_signal, "no Ctrl-C handler"
                os.kill(os.getpid(), signal.SIGINT)
            else:  # a container's stop signal, `kill PID`: to the runner process alone
                os.kill(os.getppid(), signal.SIGTERM)
            deadline = time.monotonic() + 30
            while not ctx.checkpointer.stop_requested:
                assert time.monotonic() < deadline, "the stop signal never reached the stage"
                time.sleep(0.02)
        run.end_step(engine, step + 1, {"train/loss": float(step)})
    return {"seen": seen, "resumed_at": start, "engine_step": engine.step}


def context_stage(ctx: StageContext) -> dict:
    torch.manual_seed(0)
    engine = ctx.engine(TinyTransformer(TinyConfig(vocab_size=16, dim=8, n_layers=1, n_heads=2, max_len=8)))
    path = ctx.save_model(engine.model, meta={"note": 1})
    run = ctx.run()
    return {"path": str(path), "meta": json.loads((path / "config.json").read_text())["meta"],
            "run": [run.stage, run.logger is ctx.logger, run.checkpointer is ctx.checkpointer],
            "resuming": ctx.resuming, "resume_dir": str(ctx.checkpointer.directory)}


def graph(meet: bool = False) -> list[Stage]:
    return [Stage("a", add_stage, args=(1, (), "b" if meet else None)),
            Stage("b", add_stage, args=(10, (), "a" if meet else None)),
            Stage("c", add_stage, after=("a", "b"), args=(100, ("a", "b"))),
            Stage("d", add_stage, after=("c",), args=(1000, ("c",)))]


def _without(results: dict, *keys: str) -> dict:
    return {name: {k: v for k, v in r.items() if k not in keys} for name, r in results.items()}


# --- tests -------------------------------------------------------------------------------
def test_dependency_order_and_workers_give_the_same_results(tmp_path):
    serial = run_stages(graph(), None, tmp_path / "serial", StageOptions(workers=1), log=lambda s: None)
    assert list(serial) == ["a", "b", "c", "d"]
    assert serial["d"]["total"] == 1111  # each stage read its dependencies' results.json
    assert {r["pid"] for r in serial.values()} == {os.getpid()}

    lines = []
    parallel = run_stages(graph(meet=True), None, tmp_path / "parallel", StageOptions(workers=2, threads=1),
                          log=lines.append)
    assert _without(parallel, "pid", "time") == _without(serial, "pid", "time")
    assert os.getpid() not in {r["pid"] for r in parallel.values()}  # spawned processes, a and b at once
    assert {r["threads"] for r in parallel.values()} == {1}
    assert sorted(line.split()[1] for line in lines) == ["a", "b", "c", "d"]


def test_a_finished_stage_is_read_back_and_a_rerun_replaces_its_rows(tmp_path):
    first = run_stages(graph(), None, tmp_path, StageOptions(workers=1), log=lambda s: None)
    assert first["a"]["pair"] == [1, 2]  # as read back from JSON, also when it ran now
    lines = []
    again = run_stages(graph(), None, tmp_path, StageOptions(workers=1), log=lines.append)
    assert again == first and lines == []  # nothing ran: same results, times included
    assert all((tmp_path / n / "calls").read_text() == "1" for n in "abcd")

    rerun = run_stages(graph(), None, tmp_path, StageOptions(workers=1, rerun=["c"]), log=lines.append)
    assert [line.split()[1] for line in lines] == ["c"]
    assert rerun["c"]["calls"] == 2 and rerun["d"] == first["d"] and rerun["a"] == first["a"]
    assert json.loads((tmp_path / "c" / "results.json").read_text())["calls"] == 2
    rows = [r for r in read_metrics(tmp_path) if r["stage"] == "c"]
    assert [r["train/loss"] for r in rows] == [2.0]  # the first run's row is gone
    assert sorted(r["stage"] for r in read_metrics(tmp_path)) == ["a", "b", "c", "d"]


def test_time_layout_and_announcement(tmp_path):
    lines = []
    out = run_stages([Stage("a", add_stage, args=(1,))], None, tmp_path, StageOptions(workers=1), log=lines.append)
    assert set(out["a"]["time"]) == {"wall_s", "cpu_s", "sampling_s"}
    assert re.fullmatch(r"  stage a\s+\d+\.\ds wall,\s+\d+\.\ds CPU,\s+\d+% sampling", lines[0]), lines


def test_graph_and_option_errors(tmp_path):
    opts = StageOptions(workers=1)
    with pytest.raises(ValueError, match="cycle"):
        run_stages([Stage("a", add_stage, after=("b",)), Stage("b", add_stage, after=("a",))], None, tmp_path, opts)
    with pytest.raises(ValueError, match="unknown stages \\['nope'\\]"):
        run_stages([Stage("a", add_stage, after=("nope",))], None, tmp_path, opts)
    with pytest.raises(ValueError, match="rerun: unknown stages \\['x'\\]; known: a, b"):
        run_stages(graph()[:2], None, tmp_path, StageOptions(workers=1, rerun=["x"]))
    with pytest.raises(ValueError, match="repeat"):
        run_stages([Stage("a", add_stage), Stage("a", add_stage)], None, tmp_path, opts)
    assert not any(tmp_path.iterdir())  # checked before anything ran
    with pytest.raises(ValueError, match="workers must be >= 1"):
        StageOptions(workers=0)
    with pytest.raises(ValueError, match="list of stage names"):
        StageOptions(rerun="a")
    assert Stage("b", add_stage, after="a").after == ("a",)


def test_an_error_names_its_stage_and_keeps_its_type(tmp_path):
    with pytest.raises(LookupError, match="boom") as e:
        run_stages([Stage("a", add_stage, args=(1,)), Stage("bad", failing_stage, after=("a",))], None, tmp_path,
                   StageOptions(workers=1))
    assert any("'bad'" in note for note in e.value.__notes__)
    assert (tmp_path / "a" / "results.json").exists() and not (tmp_path / "bad" / "results.json").exists()
    with pytest.raises(TypeError, match="returns a dict") as e:
        run_stages([Stage("odd", not_a_dict_stage)], None, tmp_path, StageOptions(workers=1))
    assert any("'odd'" in note for note in e.value.__notes__)


def test_a_stop_after_the_last_step_finishes_the_stage_and_stops(tmp_path):
    stages = [Stage("a", stop_after_stage), Stage("b", add_stage, after=("a",), args=(1,))]
    with pytest.raises(RunInterrupted):
        run_stages(stages, None, tmp_path, StageOptions(workers=1), log=lambda s: None)
    assert (tmp_path / "a" / "results.json").exists() and not (tmp_path / "b").exists()
    out = run_stages(stages, None, tmp_path, StageOptions(workers=1), log=lambda s: None)
    assert out["a"]["done"] and out["b"]["calls"] == 1


def _check_resumed(run_dir: Path, out: dict, steps: int, pause: float) -> None:
    assert out["seen"] == list(range(steps)) and out["engine_step"] == steps  # every step once, in order
    assert out["resumed_at"] == 2
    t = out["time"]
    assert t["sampling_s"] == 0.5 * steps  # counters of both runs
    assert t["wall_s"] >= steps * pause  # the first run's wall time counts too (StageClock)
    assert [r["step"] for r in read_metrics(run_dir) if r["stage"] == "loop"] == list(range(1, steps + 1))
    assert not (run_dir / "loop" / "resume").exists()


def test_a_stage_cut_short_by_ctrl_c_resumes_and_its_clock_adds_up(tmp_path):
    stages = [Stage("loop", looping_stage, args=(4, 0.1, 1, "self"))]
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN under a shell's background job
    with pytest.raises(RunInterrupted):
        run_stages(stages, None, tmp_path, StageOptions(workers=1), log=lambda s: None)
    assert (tmp_path / "loop" / "resume" / "elapsed.json").exists()
    assert not (tmp_path / "loop" / "results.json").exists()
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored
    out = run_stages(stages, None, tmp_path, StageOptions(workers=1), log=lambda s: None)["loop"]
    _check_resumed(tmp_path, out, 4, 0.1)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the runner's children from /proc")
def test_workers_start_while_the_first_stage_runs_alone(tmp_path):
    # one stage ready, more waiting on it: the idle worker starts (and imports) now, not when they are ready
    stages = [Stage("first", sibling_stage), Stage("b", add_stage, after=("first",), args=(1, (), "c")),
              Stage("c", add_stage, after=("first",), args=(2, (), "b"))]
    out = run_stages(stages, None, tmp_path, StageOptions(workers=2), log=lambda s: None)
    assert out["b"]["pid"] != out["c"]["pid"] and (out["b"]["total"], out["c"]["total"]) == (1, 2)


def test_a_stop_signal_to_the_runner_alone_reaches_its_workers(tmp_path):
    def not_forwarded(signum, frame):
        raise AssertionError("the runner did not catch the signal to pass it on")

    stages = [Stage("loop", looping_stage, args=(4, 0.05, 1, "parent"))]
    previous = signal.signal(signal.SIGTERM, not_forwarded)  # a failure fails the test, not pytest
    try:
        with pytest.raises(KeyboardInterrupt):  # the worker sends SIGTERM to this process only
            run_stages(stages, None, tmp_path, StageOptions(workers=2), log=lambda s: None)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (tmp_path / "loop" / "resume" / "state" / "engine.json").exists()  # the worker saved and stopped
    assert not (tmp_path / "loop" / "results.json").exists()
    out = run_stages(stages, None, tmp_path, StageOptions(workers=1), log=lambda s: None)["loop"]
    _check_resumed(tmp_path, out, 4, 0.05)


def test_context_engine_save_model_and_run(tmp_path):
    out = run_stages([Stage("save", context_stage)], None, tmp_path, StageOptions(workers=1, checkpoint_every=3),
                     log=lambda s: None)["save"]
    assert out["path"] == str(tmp_path / "save" / "checkpoint")
    assert out["meta"] == {"stage": "save", "note": 1}
    assert out["run"] == ["save", True, True] and out["resuming"] is False
    assert out["resume_dir"] == str(tmp_path / "save" / "resume")


def test_a_stage_killed_before_any_checkpoint_starts_again_says_so_and_drops_its_rows(tmp_path, capsys):
    """A kill -9 leaves rows of an unfinished stage and no resume state: the rerun starts from step 0, says so,
    and metrics.jsonl never holds a step twice; a forced rerun (`rerun`) drops them silently."""
    from trajtune.metrics import MetricsLogger

    with MetricsLogger(tmp_path) as log:
        log.log(1, {"train/loss": 9.0}, stage="a")  # the rows of a run that died
        log.log(1, {"train/loss": 9.0}, stage="b")
    run_stages([Stage("a", add_stage, args=(1,))], None, tmp_path, StageOptions(workers=1), log=lambda s: None)
    assert "stage a: no checkpoint of the earlier, unfinished run to resume from: starting again from step 0 " \
           "(its 1 metric rows were discarded)" in capsys.readouterr().out
    assert [(r["stage"], r["train/loss"]) for r in read_metrics(tmp_path)] == [("b", 9.0), ("a", 1.0)]
    run_stages([Stage("a", add_stage, args=(1,))], None, tmp_path, StageOptions(workers=1, rerun=["a"]),
               log=lambda s: None)
    assert "discarded" not in capsys.readouterr().out


def test_run_stages_holds_the_run_directory_for_its_whole_life(tmp_path):
    """While a stage runs, the directory's lock is held (by this process: another would be refused)."""
    from trajtune.runs import lock

    seen = run_stages([Stage("a", lock_holder_stage)], None, tmp_path, StageOptions(workers=1), log=lambda s: None)
    assert seen["a"]["pid"] == os.getpid()
    assert not lock._held and (tmp_path / ".lock").read_text() == ""  # released, no holder left


def lock_holder_stage(ctx: StageContext) -> dict:
    return {"pid": json.loads((ctx.run_dir / ".lock").read_text())["pid"]}


def handlers_stage(ctx: StageContext) -> dict:
    """What this worker process is: forked (it sees the runner's module state) and its handlers in a stage."""
    return {"pid": os.getpid(), "forked": FORK_MARK == ["set by the runner"],
            "in_stage": signal.getsignal(signal.SIGTERM) == ctx.checkpointer._on_signal}


FORK_MARK: list = []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers fork on Linux only")
def test_workers_fork_when_no_other_thread_runs_and_spawn_beside_one(tmp_path):
    import threading

    from trajtune.runs.stages import _worker_context

    from tqdm._monitor import TMonitor

    for t in threading.enumerate():  # an earlier test's progress bar left a tqdm monitor thread running
        if isinstance(t, TMonitor):
            t.exit()
    assert _worker_context().get_start_method() == "fork", threading.enumerate()
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert _worker_context().get_start_method() == "spawn"  # a fork could inherit a lock the thread holds
    finally:
        stop.set()
        other.join()
    FORK_MARK.append("set by the runner")
    ran = []
    try:
        out = run_stages([Stage("h", handlers_stage)], None, tmp_path, StageOptions(workers=2), log=lambda s: None,
                         meanwhile=lambda: ran.append(threading.current_thread().name))
    finally:
        FORK_MARK.clear()
    assert out["h"]["forked"] and out["h"]["in_stage"] and out["h"]["pid"] != os.getpid()
    assert len(ran) == 1 and ran[0] != threading.current_thread().name  # `meanwhile` ran, in a thread of its own
