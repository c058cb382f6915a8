"""Stages: the steps of an experiment, run once each, in dependency order, resumable.

A stage is a name, a module-level function and the stages it needs:

    def sft(ctx: StageContext, data_name: str) -> dict:          # picklable: worker processes import it
        engine = ctx.engine(model, ctx.config.sft_optim)
        train_sft(engine, data, ctx.config.sft, pad_id, run=ctx.run(evaluate))
        ctx.save_model(engine.model, tok)                       # -> run_dir/sft/checkpoint
        return {"final_loss": ...}                              # JSON-able results

    run_stages([Stage("base", base, reads=("base",)),
                Stage("sft", sft, after=("base",), args=("narrow",), reads=("sft", "sft_optim"))],
               config, run_dir, config.runner)

A stage reads what earlier stages left (their checkpoints) from `run_dir`. The layout:

    run_dir/metrics.jsonl          every stage's metric rows, each with its "stage"
    run_dir/config.json            the config of the run (`trajtune.runs.rundir.RunDir.begin`)
    run_dir/<stage>/results.json   what the function returned, plus "time" (below) and "inputs": the config
                                   fields it reads (`Stage.reads`) and the stages it waited for; it finished
    run_dir/<stage>/resume/        the checkpoint of a stage cut short (removed once it finishes)
    run_dir/<stage>/checkpoint/    `ctx.save_model(...)`, and whatever else the stage writes there

Resume: a finished stage is read back, not run (`StageOptions.rerun` names stages to run again;
such a rerun starts afresh and replaces the stage's metric rows). A stage cut short by Ctrl-C /
SIGTERM saved its loop in `<stage>/resume` (`ctx.checkpointer`, whose signal handlers the runner
installs around the stage call) and the next `run_stages` continues it; a stop that comes
outside a loop lets the stage finish, then stops the run (a second Ctrl-C leaves at once).
results["time"] is {"wall_s", "cpu_s", **ctx.counters}, summed over every run the stage took
(`StageClock`): keep `ctx.counters` current as the stage goes, it is saved when the stage is cut short.

The run directory (`trajtune.runs.rundir`): `run_stages` holds its lock while it runs (a second run
there is refused at once, naming the holder; `trajtune run` and the Hugging Face commands hold it
around the whole run) and begins through `RunDir.begin` before any stage runs: a config that differs
from the directory's config.json is refused where it changes a finished stage (naming the keys, the
stages and the `rerun` to pass), and the stages named to run again are forgotten first; then
config.json is written. What a stage reads is declared: `Stage.reads` names the top-level config fields
(the sections) its function reads, also through a helper it passes the config to (None: the whole config),
and its results.json keeps them beside its `after` (results["inputs"]); a declaration is known before
the stage runs, so a stage killed (`kill -9`) and resumed keeps it. A fresh stage that finds metric rows
of an earlier unfinished run (killed before any checkpoint) says it starts again from step 0 and
drops them.

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
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from functools import cached_property
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

import torch

from ..engine import distributed
from ..config import check_ranges
from .hooks import Hook
from .loop import Run
from ..metrics import Console, MetricsLogger
from ..processes import exit_with_parent
from .resume import Checkpointer, RunInterrupted, StageClock, forward_to_children
from ..checkpoint import write_json
from .rundir import INPUTS, RESULTS, RunDir, run_lock

if TYPE_CHECKING:
    from ..engine import Engine, OptimConfig

class RunFailed(RuntimeError):
    """A run that ended without doing what it is for (e.g. every optimizer step skipped): one
    message for the user, no traceback (the command line exits 1)."""


@dataclass
class StageOptions:
    """How an experiment's stages are run (experiments nest it as `runner: StageOptions`)."""

    NO_EFFECT: ClassVar[tuple[str, ...]] = ("workers", "rerun", "checkpoint_every", "log_every")
    """fields that never change a stage's results: a changed one never makes a run directory's stages stale"""
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
    reads: tuple[str, ...] | None = None
    """the config's top-level fields (sections) `fn` reads, directly or through what it calls (None: every field):
    its results' record (`inputs.config`, with the runner's field), which the run directory's policy compares a
    changed config with (`trajtune.runs.rundir`). A stage that reads a field it does not declare is not rerun
    when that field changes: declare every one"""

    def __post_init__(self) -> None:
        object.__setattr__(self, "after", (self.after,) if isinstance(self.after, str) else tuple(self.after))
        object.__setattr__(self, "args", tuple(self.args))
        if self.reads is not None:
            if isinstance(self.reads, str):
                raise ValueError(f"stage {self.name!r}: reads must be a tuple of config fields, got {self.reads!r}")
            object.__setattr__(self, "reads", tuple(self.reads))


class StageContext:
    """What a stage function gets: its directory, logger, checkpointer, engine factory and counters."""

    def __init__(self, name: str, config: Any, run_dir: str | os.PathLike, options: StageOptions,
                 logger: MetricsLogger | None = None, reads: Sequence[str] | None = None):
        self.name, self.options, self.logger = name, options, logger
        self.config = config if reads is None else Declared(config, name, reads, options)
        """the experiment's config: where the stage declares what it reads (`Stage.reads`), a view that reads those
        fields through and refuses the config's other fields (`Declared`), so a declaration cannot fall behind"""
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


class Declared:
    """A stage's view of its config (`StageContext.config` where `Stage.reads` is declared): the declared fields and
    the runner's read through, like every attribute that is not a field (methods, class constants); reading another
    field raises an AttributeError naming the stage and the field, so a stage cannot read what its record omits."""

    __slots__ = ("_config", "_stage", "_refused")

    def __init__(self, config: Any, stage: str, reads: Sequence[str], options: StageOptions):
        fields = {f.name for f in dataclasses.fields(config)} if dataclasses.is_dataclass(config) else set()
        self._config, self._stage = config, stage
        self._refused = frozenset(n for n in fields if n not in reads and getattr(config, n) is not options)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_config", "_stage", "_refused"):  # copy/pickle probes, unset slots
            raise AttributeError(name)
        if name in self._refused:
            raise AttributeError(f"stage {self._stage!r} reads config.{name}, which its Stage(..., reads=...) does not "
                                 "declare: add it there (the record a changed config is compared with)")
        return getattr(self._config, name)

    def __repr__(self) -> str:
        return f"Declared({self._stage!r}, {type(self._config).__name__})"


# --- the runner ---------------------------------------------------------------------------
def run_stages(stages: Sequence[Stage], config: Any, run_dir: str | os.PathLike, options: StageOptions,
               log: Callable[[str], None] = print, meanwhile: Callable[[], Any] | None = None) -> dict[str, dict]:
    """Run the unfinished `stages` (listed in priority order) -> {name: results}, in list order.

    Results are as read back from results.json, whether the stage ran now or before. `meanwhile`: work
    for this process while worker processes run the stages (e.g. importing the report's plotting), in
    a thread started once the workers exist (a worker forked beside a running thread could inherit a
    lock it holds); with one worker, or under torchrun, it is not called.

    Before any stage runs, the run directory's policy (`RunDir.begin`): a changed config is refused
    where it changes a finished stage, unless `options.rerun` names every such stage; config.json."""
    run_dir = Path(run_dir)
    _check_graph(stages, options.rerun)
    _check_reads(stages, config)
    if distributed.launched_distributed():
        distributed.init_distributed()
    with run_lock(run_dir):
        RunDir(run_dir).begin(config, [s.name for s in stages], options.rerun)
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


def _check_reads(stages: Sequence[Stage], config: Any) -> None:
    """Every field a stage declares it reads is a field of the config -- before anything runs."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        return
    names = {f.name for f in dataclasses.fields(config)}
    for s in stages:
        unknown = [n for n in s.reads or () if n not in names]
        if unknown:
            raise ValueError(f"stage {s.name!r} declares it reads {unknown}, which {type(config).__name__} does not "
                             f"have; its fields: {', '.join(sorted(names))}")


def read_results(stages: Sequence[Stage], run_dir: str | os.PathLike) -> dict[str, dict]:
    """{name: results} of the finished `stages` in `run_dir` (as `run_stages` returns them, unfinished left out)."""
    return _finished(stages, Path(run_dir), ())


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
        return _call(stage, StageContext(stage.name, config, run_dir, options, logger, stage.reads))
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
        out = {**out, "time": clock.totals(**_counters(ctx, clock)), INPUTS: _inputs(stage, ctx)}
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
        write_json(ctx.dir / RESULTS, out)
        shutil.rmtree(ctx.dir / "resume", ignore_errors=True)  # finished: a forced rerun starts afresh
    out = distributed.broadcast_object(json.loads(text) if main else None)
    if stop:
        raise RunInterrupted(f"stopped after stage {stage.name!r} finished")
    return out


def _inputs(stage: Stage, ctx: StageContext) -> dict:
    """results["inputs"]: the top-level config fields the stage reads (`Stage.reads`; every field where it declares
    none; None for a config that is not a dataclass instance), and its `after`. The config's field holding the
    runner's options counts as read by every stage: its threads are every stage's (and the fields of it that change
    no result are `StageOptions.NO_EFFECT`)."""
    config, reads = ctx.config._config if isinstance(ctx.config, Declared) else ctx.config, None
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        names = [f.name for f in dataclasses.fields(config)]
        runner = {n for n in names if getattr(config, n) is ctx.options}
        reads = sorted(set(names if stage.reads is None else stage.reads) | runner)
    return {"config": reads, "stages": list(stage.after)}


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
