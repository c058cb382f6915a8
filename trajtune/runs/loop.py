"""The loop template every algorithm follows, and the one small object that carries its plumbing.

Every training loop in `trajtune.algorithms` has the same shape (spinningup's "every
algorithm laid out the same way"; CleanRL's region markers):

    def train_x(engine: Engine, <source>, config: XConfig, pad_id: int, run: Run | None = None) -> list[dict]:
        run = run or Run("x")
        start, state = run.start(engine, XState(), source)   # 0 and a fresh state, or where it stopped
        for step in run.steps(start, config.steps):          # a progress bar
            # 1. <source>: the step's trajectories (demonstrations, `source.take(draw)`, pairs)
            # 2. <weighting>: the step's weights (advantages, reference log-probs ...) onto the batch
            # 3. update: engine.forward_backward(batch, loss); engine.optim_step(); source.after_update(engine)
            # 4. log, evaluate, checkpoint
            run.end_step(engine, step + 1, row, eval_now=..., state=state)
        return run.history

<source> is what DESIGN.md calls the source (demonstrations, sampled episodes through a
`trajtune.sources.base.Source`, preference pairs) and <weighting> the loss from
`trajtune.objectives`. Everything else -- metrics rows, evaluation, periodic and Ctrl-C
checkpoints, exact resume, hooks -- is `Run`'s job, so what stays in a loop is the algorithm.

`Run` with nothing set (no logger, no evaluation, no checkpointer) just collects the
rows; a stage runner (`trajtune.runs.stages`) hands each loop a `Run` wired to its stage's
`metrics.jsonl`, evaluation, resume directory and time counters.

Resume state: step s of every loop is a pure function of (seed, s), so most loops
need nothing but the engine and the history. A loop that carries more across steps
(RFT's kept pool, DPO's reference sums) declares it as a small dataclass; `Run`
saves it with the engine (JSON fields in the checkpoint; `Trajectory` lists as JSON;
tensors in `loop.safetensors`) and `run.start` gives it back filled in. A source given to
`run.start` is saved too: the episodes it drew ahead (`Source.pending`, an overlapped
source's next step) are kept with every checkpoint and handed back on resume (`Source.restore`).

Hooks (`runs.hooks.Hook`) see the loop's start, every step's episodes (`record_episodes`) and
every save point: the episode recorder of `trajtune view` and the HF commands' snapshots are hooks.
Time counters: a row's `time/<name>_s` metrics (a source's sampling and reward time) are added
to `counters["<name>_s"]` (a stage's, reported with its wall time).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence, TypeVar

import torch

from ..engine.distributed import is_main
from ..metrics import Console, MetricsLogger, progress
from ..trajectory import Trajectory
from .hooks import Hook
from .recorder import FILE as EPISODES_FILE
from .recorder import EpisodeRecorder
from .resume import Checkpointer, trajectories_from_json, trajectories_to_json

if TYPE_CHECKING:
    from ..engine import Engine
    from ..sources.base import Source

S = TypeVar("S")

_TRAJS = "__trajectories__"
_SOURCE = "__source__"
"""the checkpoint's key (and tensor prefix) of the source's episodes drawn ahead"""


class Run:
    """Logging, evaluation, checkpoints and hooks of one loop run (each optional).

    stage:        the name in every metrics row (and the progress bar)
    logger:       a `MetricsLogger` (None: rows are only returned)
    evaluate:     `evaluate(step) -> metrics` at the steps the loop marks (`eval_now`)
    checkpointer: a `Checkpointer` for periodic / Ctrl-C saves and exact resume
    console:      a `metrics.Console` that shows the rows to a person (a line every N steps, or a
                  progress bar with their values); None: a plain progress bar (terminals only)
    hooks:        `runs.hooks.Hook`s (module docstring); a Run with a checkpointer (every stage's loop) also
                  records a few episodes per step into <checkpointer dir>/../episodes.jsonl for `trajtune view`
                  (an `EpisodeRecorder`, unless `hooks` holds one)
    counters:     where a row's time/<name>_s metrics add up (a stage's `ctx.counters`)
    eval_alarm:   an `EvalDropAlarm` or None (default: no check): after each evaluation, the row gets
                  `alarm/eval_drop` (the largest drop, in points, of a watched metric below its first evaluation
                  when it passes the alarm's threshold, else 0) and a warning names the metrics (book App. C)
    """

    def __init__(self, stage: str = "train", logger: MetricsLogger | None = None,
                 evaluate: Callable[[int], dict] | None = None, checkpointer: Checkpointer | None = None,
                 console: Console | None = None, hooks: Sequence[Hook] = (), counters: dict | None = None,
                 eval_alarm: EvalDropAlarm | None = None):
        self.stage, self.logger, self.evaluate, self.checkpointer = stage, logger, evaluate, checkpointer
        self.eval_alarm = eval_alarm
        self.console, self.hooks, self.counters = console, list(hooks), counters
        if checkpointer is not None and not any(isinstance(h, EpisodeRecorder) for h in self.hooks):
            self.hooks.insert(0, EpisodeRecorder(checkpointer.directory.parent / EPISODES_FILE, write=is_main(),
                                                 stage=stage))
        self.history: list[dict] = []
        self.source: Source | None = None

    # --- 0. where the loop starts
    def start(self, engine: Engine, state: S = None, source: Source | None = None) -> tuple[int, S]:
        """(completed steps, loop state): (0, `state` as given) on a fresh run; on a resume the engine is
        restored, `history` comes back from the checkpoint, the logger forgets the stage's rows after
        it (they are logged again), `state`'s fields are refilled from the checkpoint, and `source` gets back
        the episodes it had drawn ahead (`Source.restore`). Every checkpoint keeps `source.pending()`."""
        ck, self.source = self.checkpointer, source
        start = ck.resume(engine) if ck is not None else 0
        if self.console is not None:
            self.console.start(start)
        for hook in self.hooks:
            hook.on_start(engine, start)
        if not start:
            return 0, state
        if self.logger is not None:
            self.logger.drop_after(self.stage, start)
        saved = dict(ck.state)
        self.history = list(saved.pop("history", []))
        if state is not None:
            state = _state_from(state, saved, ck.tensors)
        if source is not None and saved.get(_SOURCE) is not None:
            source.restore(_episodes_from(saved[_SOURCE], ck.tensors))
        return start, state

    def steps(self, start: int, total: int) -> Iterable[int]:
        """range(start, total) with a progress bar named after the stage (the console's, if any)."""
        if self.console is not None:
            self.console.start(start, total)
            return range(start, total)
        return progress(range(start, total), desc=self.stage)

    def reference(self, engine: Engine, start: int) -> Engine:
        """The stage's frozen reference engine (its starting policy, kept across resumes)."""
        if self.checkpointer is not None:
            return self.checkpointer.reference(engine, start)
        return engine.reference_engine()

    def record_episodes(self, engine: Engine, step: int, trajs: list[Trajectory], batch=None, *, kept=None,
                        every: int | None = None) -> None:
        """Hand step `step`'s episodes to the hooks (the recorder saves a few, token by token, for `trajtune view`,
        when the step is due: step 1 and every `every` steps; `every` given by a loop, e.g. 1 for RFT's rounds).
        `batch`: the step's scored batch (advantages, old log-probs in `batch.pg`); `kept`: RFT's selection."""
        for hook in self.hooks:
            hook.on_episodes(engine, step, trajs, batch, kept=kept, every=every)

    # --- 4. the end of a step
    def end_step(self, engine: Engine, step: int, row: dict, *, eval_now: bool = False, state: Any = None,
                 save: bool = True) -> None:
        """Evaluate (if `eval_now`), log `row` at `step` (completed steps or the loop's own count),
        append it to `history`, add its time/*_s metrics to the counters, and checkpoint when due or
        interrupted (see `checkpoint`)."""
        if eval_now and self.evaluate is not None:
            row.update(self.evaluate(step))
            if self.eval_alarm is not None:
                row["alarm/eval_drop"] = self.eval_alarm.check([*self.history, row], self.stage, step)
        if self.logger is not None:
            self.logger.log(step, row, stage=self.stage)
        self.history.append({"step": step, **row})
        if self.counters is not None:
            for k, v in row.items():
                if k.startswith("time/") and k.endswith("_s"):
                    self.counters[k[5:]] = self.counters.get(k[5:], 0.0) + float(v)
        if self.console is not None:
            self.console.update(step, row)
        if save:
            self.checkpoint(engine, step, state)

    def checkpoint(self, engine: Engine, completed: int, state: Any = None, allowed: bool = True) -> None:
        """A save point: the hooks' `on_save_point`, then a checkpoint when due (every N) or interrupted (then raise
        `RunInterrupted`). `allowed=False` where the loop's state cannot be saved consistently: a pending save
        waits. `state` (a dataclass, or None) and the source's episodes drawn ahead are serialized only when a
        save happens."""
        for hook in self.hooks:
            hook.on_save_point(engine, completed, allowed)
        if self.checkpointer is None:
            return
        source = self.source

        def json_state() -> dict:
            out = {"history": self.history, **_state_json(state)}
            ahead = source.pending() if source is not None else []
            if ahead:
                out[_SOURCE] = [_episodes_json(episodes) for episodes in ahead]
            return out

        def tensors() -> dict[str, torch.Tensor]:
            out = _state_tensors(state)
            ahead = source.pending() if source is not None else []
            for i, episodes in enumerate(ahead):
                if episodes.generator is not None:
                    out[f"{_SOURCE}.{i}.generator"] = episodes.generator.get_state()
            return out

        self.checkpointer.step_done(engine, completed, json_state, tensors, allowed)


def eval_due(step: int, total: int, every: int) -> bool:
    """Evaluate after `step` completed steps: every `every` steps (0: never) and after the last."""
    return step == total or bool(every and step % every == 0)


# --- loop state <-> checkpoint ----------------------------------------------------------
def _state_json(state: Any) -> dict:
    if state is None:
        return {}
    out = {}
    for f in dataclasses.fields(state):
        v = getattr(state, f.name)
        if isinstance(v, torch.Tensor):
            continue
        if isinstance(v, list) and v and isinstance(v[0], Trajectory):
            v = {_TRAJS: trajectories_to_json(v)}
        elif isinstance(v, list) and v and isinstance(v[0], tuple) and isinstance(v[0][0], Trajectory):
            v = {_TRAJS: trajectories_to_json([t for pair in v for t in pair]), "tuple": len(v[0])}
        out[f.name] = v
    return out


def _state_tensors(state: Any) -> dict[str, torch.Tensor]:
    if state is None:
        return {}
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)
            if isinstance(getattr(state, f.name), torch.Tensor)}


def _state_from(state: S, saved: dict, tensors: dict[str, torch.Tensor]) -> S:
    values = {}
    for f in dataclasses.fields(state):
        if f.name in tensors:
            values[f.name] = tensors[f.name]
        elif f.name in saved:
            v = saved[f.name]
            if isinstance(v, dict) and _TRAJS in v:
                trajs = trajectories_from_json(v[_TRAJS])
                n = v.get("tuple")
                v = trajs if not n else [tuple(trajs[i : i + n]) for i in range(0, len(trajs), n)]
            values[f.name] = v
    return dataclasses.replace(state, **values)


def _episodes_json(episodes) -> dict:
    """A source's episodes drawn ahead, as JSON (their generator's state goes to the tensors)."""
    return {"step": episodes.step, "behind": episodes.behind, "metrics": episodes.metrics,
            _TRAJS: trajectories_to_json(episodes.trajs), "generator": episodes.generator is not None}


def _episodes_from(saved: list[dict] | dict, tensors: dict[str, torch.Tensor]) -> list:
    """Inverse of `_episodes_json` over a checkpoint's list of episodes drawn ahead (one dict: a checkpoint written
    before sources drew more than one step ahead, its generator under the old name)."""
    from ..sources.base import Episodes

    out = []
    for i, one in enumerate([saved] if isinstance(saved, dict) else saved):
        generator = None
        if one.get("generator"):
            generator = torch.Generator()
            old = isinstance(saved, dict)
            generator.set_state(tensors[f"{_SOURCE}.generator" if old else f"{_SOURCE}.{i}.generator"])
        out.append(Episodes(trajectories_from_json(one[_TRAJS]), dict(one["metrics"]), generator,
                            int(one["step"]), int(one["behind"])))
    return out


# --- bad-job detection: a static evaluation that drops (book App. C, checklist C.5) ------------------------------
log = logging.getLogger("trajtune.runs.loop")


def eval_drops(rows: Sequence[dict], keys: Sequence[str], threshold: float = 10.0,
               points: float = 100.0) -> dict[str, float]:
    """The watched evaluation metrics whose latest value is more than `threshold` points below their first
    (RLHF book App. C "bad-job detection": a stable static eval, e.g. MMLU, dropping 10-20 points means the
    setup is broken). rows: metrics rows in step order (a loop's history); a metric counts in the rows that
    have it. keys: the metrics to watch (higher is better; accuracies, pass rates). points: the factor from a
    value to points (100 for a share in [0, 1], 1 for a score already in points).
    returns {key: drop in points} for each key that dropped by more than `threshold` (empty: all is well)."""
    if threshold < 0:
        raise ValueError(f"eval_drops: threshold must be >= 0 points, got {threshold}")
    out = {}
    for key in keys:
        seen = [float(r[key]) for r in rows if key in r and r[key] is not None]
        if len(seen) >= 2 and (drop := (seen[0] - seen[-1]) * points) > threshold:
            out[key] = drop
    return out


@dataclasses.dataclass(frozen=True)
class EvalDropAlarm:
    """`Run(eval_alarm=...)`: watch static evaluations for a drop of more than `threshold` points (`eval_drops`)."""

    keys: tuple[str, ...]
    """the evaluation metrics to watch, e.g. ("eval/accuracy",): stable ones, where a drop means a broken job"""
    threshold: float = 10.0
    """points below the first evaluation that raise the alarm (the book: 10-20)"""
    points: float = 100.0
    """the factor from a metric's value to points (100: the metric is a share in [0, 1])"""

    def check(self, rows: Sequence[dict], stage: str, step: int) -> float:
        """The largest drop past the threshold, in points (0.0: none), with a warning naming each metric."""
        drops = eval_drops(rows, self.keys, self.threshold, self.points)
        for key, drop in drops.items():
            log.warning("%s step %d: %s dropped %.1f points below its first evaluation (alarm at %.1f): "
                        "a broken job? (RLHF book App. C)", stage, step, key, drop, self.threshold)
        return max(drops.values(), default=0.0)
