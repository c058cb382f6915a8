"""Stages: the steps of an experiment, run once each, in dependency order, resumable.

A stage is a name, a module-level function and the stages it needs:

    def sft(ctx: StageContext, data_name: str) -> dict:          # picklable: worker processes import it
        engine = ctx.engine(model, ctx.config.sft_optim)
        train_sft(engine, data, ctx.config.sft, pad_id, run=ctx.run(evaluate))
        ctx.save_model(engine.model, tok)                       # -> run_dir/sft/checkpoint
        return {"final_loss": ...}                              # JSON-able results

    run_stages([Stage("base", base), Stage("sft", sft, after=("base",), args=("narrow",))],
               config, run_dir, config.runner)

A stage reads what earlier stages left (their checkpoints) from `run_dir`. The layout:

    run_dir/metrics.jsonl          every stage's metric rows, each with its "stage"
    run_dir/<stage>/results.json   what the function returned, plus "time" (below): the stage is finished
    run_dir/<stage>/resume/        the checkpoint of a stage cut short (removed once it finishes)
    run_dir/<stage>/checkpoint/    `ctx.save_model(...)`, and whatever else the stage writes there

Resume: a finished stage is read back, not run (`StageOptions.rerun` names stages to run again;
such a rerun starts afresh and replaces the stage's metric rows). A stage cut short by Ctrl-C /
SIGTERM saved its loop in `<stage>/resume` (`ctx.checkpointer`, whose signal handlers the runner
installs around the stage call) and the next `run_stages` continues it; a stop that comes
outside a loop lets the stage finish, then stops the run (a second Ctrl-C leaves at once).
results["time"] is {"wall_s", "cpu_s", **ctx.counters}, summed over every run the stage took
(`StageClock`): keep `ctx.counters` current as the stage goes, it is saved when the stage is cut short.

One run at a time: `run_stages` holds `run_dir/.lock` (`run_lock`, POSIX flock, rank 0) while it
runs, and a second run on the same directory is refused at once (`RunDirBusy`, naming the holder:
pid, host, command, since when). The lock goes with its process, so a run killed with kill -9
never blocks the next one; `trajtune run` and the Hugging Face commands hold it around the whole
run (reentrant within a process). A fresh stage that finds metric rows of an earlier unfinished
run (killed before any checkpoint) says it starts again from step 0 and drops them.

Processes: independent stages run in `workers` spawned processes with `threads` torch threads
each; a stop signal sent to this process alone is passed on to them (`forward_to_children`).
A worker the next stages will need starts at once, while the first stages run (`_warm_up`).
Under torchrun every rank runs every stage in this process, in the same order; rank 0 writes
the results and prints, and every rank returns rank 0's results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from functools import cached_property
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import torch

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no run lock
    fcntl = None

from ..engine import distributed
from ..config import ConfigError, check_ranges
from .hooks import Hook
from .loop import Run
from ..metrics import Console, MetricsLogger
from ..processes import exit_with_parent
from .resume import Checkpointer, RunInterrupted, StageClock, forward_to_children

if TYPE_CHECKING:
    from ..engine import Engine, OptimConfig

RESULTS = "results.json"
LOCK = ".lock"


class RunDirBusy(ConfigError):
    """Another live process runs in this run directory (the message names it)."""


class RunFailed(RuntimeError):
    """A run that ended without doing what it is for (e.g. every optimizer step skipped): one
    message for the user, no traceback (the command line exits 1)."""


@dataclass
class StageOptions:
    """How an experiment's stages are run (experiments nest it as `runner: StageOptions`)."""

    workers: int = 2
    """processes for independent stages (1: every stage in this process; always 1 under torchrun)"""
    threads: int = 1
    """torch threads per stage process: tiny models on 2 cores are fastest as single-threaded processes,
    and OpenMP spin-waiting makes 2 threads many times slower whenever another process is busy"""
    checkpoint_every: int = 0
    """also checkpoint a stage's loop every this many steps (0: only on Ctrl-C / SIGTERM); a rerun resumes it"""
    rerun: list[str] = field(default_factory=list)
    """stages to run again even if they finished (from scratch; their metric rows are replaced)"""
    log_every: int = 0
    """print a progress line (loss, reward, KL, lr, tokens/s, ETA) every this many steps of a loop
    (0: none; a progress bar instead on a terminal); the Hugging Face commands' --logging-steps"""

    def __post_init__(self) -> None:
        check_ranges(self, "StageOptions", counts=("workers", "threads"),
                     non_negative=("checkpoint_every", "log_every"))
        if isinstance(self.rerun, str) or not all(isinstance(n, str) for n in self.rerun):
            raise ValueError(f"StageOptions: rerun must be a list of stage names, got {self.rerun!r}")


@dataclass(frozen=True)
class Stage:
    """One step of an experiment: `fn(ctx, *args) -> dict` once `after` have finished."""

    name: str
    """its directory under the run directory, and the key of its results"""
    fn: Callable[..., dict]
    """module-level (picklable) function fn(ctx: StageContext, *args) -> JSON-able dict"""
    after: tuple[str, ...] = ()
    """stages that must finish first (whose files it reads)"""
    args: tuple = ()
    """extra positional arguments after ctx"""

    def __post_init__(self) -> None:
        object.__setattr__(self, "after", (self.after,) if isinstance(self.after, str) else tuple(self.after))
        object.__setattr__(self, "args", tuple(self.args))


class StageContext:
    """What a stage function gets: its directory, logger, checkpointer, engine factory and counters."""

    def __init__(self, name: str, config: Any, run_dir: str | os.PathLike, options: StageOptions,
                 logger: MetricsLogger | None = None):
        self.name, self.config, self.options, self.logger = name, config, options, logger
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir / name
        """run_dir/<name>: where the stage writes its checkpoints and results"""
        self.counters: dict[str, float] = {}
        """this run's extra costs (e.g. "sampling_s"): add to them; results["time"] sums them over resumes"""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """One metrics row of this stage (a no-op without a logger: non-main ranks)."""
        if self.logger is not None:
            self.logger.log(step, metrics, stage=self.name)

    @cached_property
    def checkpointer(self) -> Checkpointer:
        """The stage's resume state, run_dir/<name>/resume (one checkpointed loop per stage)."""
        return Checkpointer(self.dir / "resume", self.options.checkpoint_every)

    @property
    def resuming(self) -> bool:
        """True when this run continues a stage cut short (e.g. skip a step-0 evaluation)."""
        return self.checkpointer.has_checkpoint

    def keep(self, name: str, obj: list | dict) -> list | dict:
        """Save `obj` (JSON-able) with every checkpoint; refilled in place when the loop resumes."""
        return self.checkpointer.keep(name, obj)

    def run(self, evaluate: Callable[[int], dict] | None = None, hooks: Sequence[Hook] = ()) -> Run:
        """The `Run` a loop takes: rows to metrics.jsonl under this stage, `evaluate`, checkpoints, `hooks` (besides
        the episode recorder), and the rows' time/*_s metrics added to this stage's counters."""
        every = self.options.log_every
        console = Console(self.name, every=every) if every and self.logger is not None else None
        return Run(stage=self.name, logger=self.logger, evaluate=evaluate, checkpointer=self.checkpointer,
                   console=console, hooks=hooks, counters=self.counters)

    def engine(self, model: torch.nn.Module, optim: OptimConfig | None = None, **kw) -> Engine:
        """`trajtune.engine.make_engine(model, optim, **kw)`: one process, or DDP / FSDP2 under torchrun."""
        from ..engine import make_engine

        return make_engine(model, optim, **kw)

    def save_model(self, model: torch.nn.Module, tokenizer=None, name: str = "checkpoint",
                   meta: dict | None = None) -> Path:
        """Write `model` to run_dir/<stage>/<name> (rank 0 writes, every rank waits): a Hugging Face
        adapter through its `save_pretrained`, a TinyTransformer in the trajtune format."""
        path = self.dir / name
        if any(type(p).__name__ == "DTensor" for p in model.parameters()):
            raise NotImplementedError("save_model: the parameters are FSDP shards; save a full copy")
        if distributed.is_main():
            meta = {"stage": self.name, **(meta or {})}
            if hasattr(model, "save_pretrained"):
                model.save_pretrained(path, tokenizer, meta=meta)
            else:
                from ..models.tiny import save_model

                save_model(path, model, tokenizer, meta=meta)
        distributed.barrier()
        return path


# --- the runner ---------------------------------------------------------------------------
def run_stages(stages: Sequence[Stage], config: Any, run_dir: str | os.PathLike, options: StageOptions,
               log: Callable[[str], None] = print, meanwhile: Callable[[], Any] | None = None) -> dict[str, dict]:
    """Run the unfinished `stages` (listed in priority order) -> {name: results}, in list order.

    Results are as read back from results.json, whether the stage ran now or before. `meanwhile`: work
    for this process while worker processes run the stages (e.g. importing the report's plotting), in
    a thread started once the workers exist (a worker forked beside a running thread could inherit a
    lock it holds); with one worker, or under torchrun, it is not called."""
    run_dir = Path(run_dir)
    _check_graph(stages, options.rerun)
    if distributed.launched_distributed():
        distributed.init_distributed()
    with run_lock(run_dir):
        return _run_all(stages, config, run_dir, options, log, meanwhile)


def _run_all(stages: Sequence[Stage], config: Any, run_dir: Path, options: StageOptions,
             log: Callable[[str], None], meanwhile: Callable[[], Any] | None = None) -> dict[str, dict]:
    main = distributed.is_main()
    results = distributed.broadcast_object(_finished(stages, run_dir, options.rerun) if main else None)
    pending = [s for s in stages if s.name not in results]

    def announce(name: str, out: dict) -> None:
        results[name] = out
        if main:
            log(_announcement(name, out["time"]))
            sys.stdout.flush()

    if distributed.launched_distributed() or options.workers == 1:
        while pending:
            s = next(s for s in pending if all(a in results for a in s.after))
            pending.remove(s)
            announce(s.name, _run_stage(s, config, run_dir, options))
    else:
        with forward_to_children(), \
                ProcessPoolExecutor(options.workers, mp_context=_worker_context(), initializer=_worker_start) as pool:
            pool.submit(int).result()  # the workers exist now (all of them, forked at the first submit)
            if meanwhile is not None:
                threading.Thread(target=meanwhile, daemon=True).start()
            running = {}
            # workers the next stages will need but with nothing to run now: start them while a core is free
            ready = [s for s in pending if all(a in results for a in s.after)]
            soon = {s.name for s in ready} | set(results)
            wave = [s for s in pending if s not in ready and all(a in soon for a in s.after)]
            for _ in range(min(options.workers, len(wave)) - min(options.workers, len(ready))):
                pool.submit(_warm_up, [s.fn for s in pending])
            while pending or running:
                for s in [s for s in pending if all(a in results for a in s.after)][: options.workers - len(running)]:
                    pending.remove(s)
                    running[pool.submit(_run_stage, s, config, run_dir, options)] = s
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    announce(running.pop(future).name, future.result())
    return {s.name: results[s.name] for s in stages}


def _worker_context():
    """fork on Linux when this process runs no other thread: the workers start with torch and the stage
    modules already imported, where a spawned worker imports them again (~3 s before the first stage
    starts, on the run's critical path). spawn otherwise: macOS's frameworks are not fork-safe, a fork
    beside a running thread can inherit a lock it holds, and a forked child cannot use a CUDA context
    its parent opened."""
    fork = sys.platform.startswith("linux") and threading.active_count() == 1 and not torch.cuda.is_initialized()
    return get_context("fork" if fork else "spawn")


def _worker_start() -> None:
    """A worker's first act. Between stages it ignores SIGINT / SIGTERM: a stage installs its Checkpointer's
    handlers (save and stop) and restores these after it, and the runner ends idle workers itself (an idle
    worker killed by a signal while it waits for work can die holding the pool's queue lock, and the
    runner then hangs in its shutdown). It ends when the runner is gone (`exit_with_parent`), since it no
    longer dies of a stop signal. A forked worker would otherwise inherit the runner's handlers."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    exit_with_parent()


def _warm_up(fns: Sequence[Callable[..., dict]]) -> None:
    """A worker's start-up, done before it has a stage to run (the first stages wait for others): unpickling
    `fns` imports the stage modules, and `torch._dynamo` is what the process's first torch optimizer imports
    (~2.5 CPU-s). The stages after the first ones need this worker anyway, so starting it early costs no CPU
    and takes its start (~5 s: torch, the stage modules, dynamo) off the wall time while a core is idle."""
    import torch._dynamo  # noqa: F401


def run_per_seed(run_one: Callable[[Any, Path], Path], config: Any, run_dir: str | os.PathLike,
                 seeds: Sequence[int]) -> dict[int, Path]:
    """`run_one(config with seed=s, run_dir/seed-<s>)` for every seed -> {seed: what it returned}."""
    out = {}
    for s in seeds:
        out[s] = run_one(dataclasses.replace(config, seed=s), Path(run_dir) / f"seed-{s}")
    return out


def _check_graph(stages: Sequence[Stage], rerun: Sequence[str]) -> None:
    """Unique names, known dependencies and rerun names, and no cycle -- before anything runs."""
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise ValueError(f"stage names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    for s in stages:
        missing = [a for a in s.after if a not in names]
        if missing:
            raise ValueError(f"stage {s.name!r} waits for unknown stages {missing}; known: {', '.join(names)}")
    unknown = [n for n in rerun if n not in names]
    if unknown:
        raise ValueError(f"rerun: unknown stages {unknown}; known: {', '.join(names)}")
    done: set[str] = set()
    left = list(stages)
    while left:
        ready = [s for s in left if set(s.after) <= done]
        if not ready:
            raise ValueError(f"stages wait on each other (a cycle): {[s.name for s in left]}")
        done |= {s.name for s in ready}
        left = [s for s in left if s.name not in done]


def _finished(stages: Sequence[Stage], run_dir: Path, rerun: Sequence[str]) -> dict[str, dict]:
    out = {}
    for s in stages:
        f = run_dir / s.name / RESULTS
        if f.exists() and s.name not in rerun:
            out[s.name] = json.loads(f.read_text())
    return out


def _run_stage(stage: Stage, config: Any, run_dir: Path, options: StageOptions) -> dict:
    """Run one stage in this process (a worker's entry point) -> its results, as read back."""
    previous = torch.get_num_threads()
    torch.set_num_threads(options.threads)
    logger = MetricsLogger(run_dir) if distributed.is_main() else None
    try:
        return _call(stage, StageContext(stage.name, config, run_dir, options, logger))
    finally:
        torch.set_num_threads(previous)
        if logger is not None:
            logger.close()


def _call(stage: Stage, ctx: StageContext) -> dict:
    main = distributed.is_main()
    if main:
        (ctx.dir / RESULTS).unlink(missing_ok=True)  # a rerun cut short is not a finished stage
        if not ctx.resuming:  # a fresh (re)run: no time or reference from an earlier try, no old rows
            shutil.rmtree(ctx.dir / "resume", ignore_errors=True)
            dropped = ctx.logger.drop_after(stage.name, -1)
            if dropped and stage.name not in ctx.options.rerun:  # killed (kill -9) before any checkpoint
                print(f"  stage {stage.name}: no checkpoint of the earlier, unfinished run to resume from: "
                      f"starting again from step 0 (its {dropped} metric rows were discarded)", flush=True)
    distributed.barrier()
    clock = StageClock(ctx.dir / "resume")  # times add up over a stage cut short and resumed
    try:
        with ctx.checkpointer:  # Ctrl-C / SIGTERM: the loop saves at its next step and stops
            out = stage.fn(ctx, *stage.args)
        if not isinstance(out, dict):
            raise TypeError(f"a stage function returns a dict, got {type(out).__name__}")
        out = {**out, "time": clock.totals(**_counters(ctx, clock))}
        text = json.dumps(out, indent=1)
    except BaseException as e:
        if main:
            with contextlib.suppress(OSError):  # a full disk must not hide the error that stopped the stage
                clock.save(**_counters(ctx, clock))  # only where a checkpoint to resume from exists
        if not isinstance(e, KeyboardInterrupt):
            e.add_note(f"in stage {stage.name!r} ({ctx.dir})")
        raise
    stop = _any_rank(ctx.checkpointer.stop_requested)  # a stop that came after the loop's last step
    distributed.barrier()
    if main:
        ctx.dir.mkdir(parents=True, exist_ok=True)
        tmp = ctx.dir / (RESULTS + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, ctx.dir / RESULTS)
        shutil.rmtree(ctx.dir / "resume", ignore_errors=True)  # finished: a forced rerun starts afresh
    out = distributed.broadcast_object(json.loads(text) if main else None)
    if stop:
        raise RunInterrupted(f"stopped after stage {stage.name!r} finished")
    return out


# --- one run per directory ----------------------------------------------------------------
_held: dict[Path, list] = {}
"""run directory (resolved) -> [its open lock file, depth]: the locks this process holds"""


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike) -> Iterator[None]:
    """Hold `run_dir/.lock` for the body (rank 0; every rank hears a refusal): an exclusive POSIX
    flock, released with the process however it ends, holding {pid, host, command, since}.

    Another process holding it: `RunDirBusy` at once, naming it. Reentrant within a process (the
    command line holds it around a whole run, `run_stages` inside). A directory that cannot be
    created or written is a `ConfigError` naming it and the OS reason."""
    message, key = None, None
    if distributed.is_main() and fcntl is not None:
        try:
            key = _acquire(Path(run_dir))
        except ConfigError as e:
            message = (isinstance(e, RunDirBusy), str(e))
    message = distributed.broadcast_object(message)
    if message is not None:
        raise (RunDirBusy if message[0] else ConfigError)(message[1])
    try:
        yield
    finally:
        if key is not None:
            _release(key)


def _acquire(run_dir: Path) -> Path:
    key = run_dir.resolve()
    if key in _held:
        _held[key][1] += 1
        return key
    if key.exists() and not key.is_dir():
        raise ConfigError(f"the run directory {run_dir} is a file, not a directory; choose another one")
    try:
        key.mkdir(parents=True, exist_ok=True)
        fh = open(key / LOCK, "a+", encoding="utf-8")
    except OSError as e:
        where = f" ({e.filename})" if e.filename and Path(e.filename) != run_dir else ""
        raise ConfigError(f"cannot write to the run directory {run_dir}: {e.strerror or e}{where}; "
                          "choose a writable directory") from None
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        holder = fh.read()
        fh.close()
        raise RunDirBusy(_busy(run_dir, holder)) from None
    fh.seek(0)
    fh.truncate()
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                         "since": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
    fh.flush()
    _held[key] = [fh, 1]
    return key


def _release(key: Path) -> None:
    held = _held[key]
    held[1] -= 1
    if held[1] == 0:
        del _held[key]
        fh = held[0]
        with contextlib.suppress(OSError):
            fh.truncate(0)  # no holder any more
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        fh.close()


def _busy(run_dir: Path, holder: str) -> str:
    """The refusal of a second run: who holds the directory, and what to do."""
    try:
        h = json.loads(holder)
        who = f"pid {h['pid']} on {h['host']} (`{h['command']}`, since {h['since']})"
    except (ValueError, KeyError, TypeError):
        who = "another process (it has not written its details yet)"
    return (f"{run_dir} is in use by another run: {who}. Two runs in one directory would mix their metrics "
            f"and checkpoints; wait for it to finish, stop it, or choose another run directory")


def _counters(ctx: StageContext, clock: StageClock) -> dict[str, float]:
    """This run's counters, plus zeros for those only an earlier run of the stage had."""
    return {**{k: 0.0 for k in clock.before if k not in ("wall_s", "cpu_s")}, **ctx.counters}


def _any_rank(flag: bool) -> bool:
    if not distributed.is_distributed():
        return flag
    flags = [False] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(flags, flag)
    return any(flags)


def _announcement(name: str, time: dict[str, float]) -> str:
    """'  stage NAME   W.Ws wall,  C.Cs CPU' plus each *_s counter's share of the wall time."""
    wall = time["wall_s"]
    shares = "".join(f", {v / max(wall, 1e-9):4.0%} {k[:-2]}" for k, v in time.items()
                     if k.endswith("_s") and k not in ("wall_s", "cpu_s"))
    return f"  stage {name:<18} {wall:6.1f}s wall, {time['cpu_s']:6.1f}s CPU{shares}"
