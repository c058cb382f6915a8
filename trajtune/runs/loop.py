"""The loop template every algorithm follows, and the one small object that carries its plumbing.

Every training loop in `trajtune.algorithms` has the same shape (spinningup's "every
algorithm laid out the same way"; CleanRL's region markers):

    def train_x(engine: Engine, <source>, config: XConfig, pad_id: int, run: Run | None = None) -> list[dict]:
        run = run or Run("x")
        start, state = run.start(engine, XState())        # 0 and a fresh state, or where it stopped
        for step in run.steps(start, config.steps):       # a progress bar
            # 1. <source>: the step's trajectories (a batch of demonstrations, fresh samples, pairs)
            # 2. <weighting>: the step's weights (advantages, reference log-probs ...) onto the batch
            # 3. update: engine.forward_backward(batch, loss); engine.optim_step()
            # 4. log, evaluate, checkpoint
            run.end_step(engine, step + 1, row, eval_now=..., state=state)
        return run.history

<source> is what DESIGN.md calls the source (demonstrations, sampled rollouts, preference
pairs) and <weighting> the loss from `trajtune.objectives`. Everything else -- metrics
rows, evaluation, periodic and Ctrl-C checkpoints, exact resume -- is `Run`'s job, so
what stays in a loop is the algorithm.

`Run` with nothing set (no logger, no evaluation, no checkpointer) just collects the
rows; a stage runner (`trajtune.runs.stages`) hands each loop a `Run` wired to its stage's
`metrics.jsonl`, evaluation and resume directory.

Resume state: step s of every loop is a pure function of (seed, s), so most loops
need nothing but the engine and the history. A loop that carries more across steps
(RFT's kept pool, DPO's reference sums) declares it as a small dataclass; `Run`
saves it with the engine (JSON fields in the checkpoint; `Trajectory` lists as JSON;
tensors in `loop.safetensors`) and `run.start` gives it back filled in.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, TypeVar

import torch

from ..engine.distributed import is_main
from .recorder import FILE as EPISODES_FILE
from .recorder import EpisodeRecorder
from ..metrics import Console, MetricsLogger, progress
from .resume import Checkpointer, trajectories_from_json, trajectories_to_json
from ..trajectory import Trajectory

S = TypeVar("S")

_TRAJS = "__trajectories__"


class Run:
    """Logging, evaluation and checkpoints of one loop run (each optional).

    stage:        the name in every metrics row (and the progress bar)
    logger:       a `MetricsLogger` (None: rows are only returned)
    evaluate:     `evaluate(step) -> metrics` at the steps the loop marks (`eval_now`)
    checkpointer: a `Checkpointer` for periodic / Ctrl-C saves and exact resume
    console:      a `metrics.Console` that shows the rows to a person (a line every N steps, or a
                  progress bar with their values); None: a plain progress bar (terminals only)
    episodes:     an `episodes.EpisodeRecorder` (`record_episodes`, what `trajtune view` shows); by default
                  a Run with a checkpointer (every stage's loop) records into the stage's directory,
                  <checkpointer dir>/../episodes.jsonl, and a bare Run records nothing
    """

    def __init__(self, stage: str = "train", logger: MetricsLogger | None = None,
                 evaluate: Callable[[int], dict] | None = None, checkpointer: Checkpointer | None = None,
                 console: Console | None = None, episodes: EpisodeRecorder | None = None):
        self.stage, self.logger, self.evaluate, self.checkpointer = stage, logger, evaluate, checkpointer
        self.console = console
        if episodes is None and checkpointer is not None:
            episodes = EpisodeRecorder(checkpointer.directory.parent / EPISODES_FILE, write=is_main())
        self.episodes = episodes
        self.history: list[dict] = []

    # --- 0. where the loop starts
    def start(self, engine, state: S = None) -> tuple[int, S]:
        """(completed steps, loop state): (0, `state` as given) on a fresh run; on a resume the engine is
        restored, `history` comes back from the checkpoint, the logger forgets the stage's rows after
        it (they are logged again), and `state`'s fields are refilled from the checkpoint."""
        ck = self.checkpointer
        start = ck.resume(engine) if ck is not None else 0
        if self.console is not None:
            self.console.start(start)
        if not start:
            return 0, state
        if self.logger is not None:
            self.logger.drop_after(self.stage, start)
        if self.episodes is not None:
            self.episodes.drop_after(start)
        saved = dict(ck.state)
        self.history = list(saved.pop("history", []))
        if state is not None:
            state = _state_from(state, saved, ck.tensors)
        return start, state

    def steps(self, start: int, total: int) -> Iterable[int]:
        """range(start, total) with a progress bar named after the stage (the console's, if any)."""
        if self.console is not None:
            self.console.start(start, total)
            return range(start, total)
        return progress(range(start, total), desc=self.stage)

    def reference(self, engine, start: int):
        """The stage's frozen reference engine (its starting policy, kept across resumes)."""
        if self.checkpointer is not None:
            return self.checkpointer.reference(engine, start)
        return engine.reference_engine()

    def record_episodes(self, engine, step: int, trajs: list[Trajectory], batch=None, *, kept=None,
                        every: int | None = None) -> None:
        """Save a few of the step's episodes, token by token, for `trajtune view` (when the step is due:
        step 1 and every `episodes.every` steps, or `every` given by the loop, e.g. 1 for RFT's rounds).
        `batch`: the step's scored batch (advantages, old log-probs in extras); `kept`: RFT's selection.
        See trajtune/runs/recorder.py; a no-op without a recorder."""
        if self.episodes is not None:
            self.episodes.record(engine, self.stage, step, trajs, batch, kept=kept, every=every)

    # --- 4. the end of a step
    def end_step(self, engine, step: int, row: dict, *, eval_now: bool = False, state: Any = None,
                 save: bool = True) -> None:
        """Evaluate (if `eval_now`), log `row` at `step` (completed steps or the loop's own count),
        append it to `history`, and checkpoint when due or interrupted (see `checkpoint`)."""
        if eval_now and self.evaluate is not None:
            row.update(self.evaluate(step))
        if self.logger is not None:
            self.logger.log(step, row, stage=self.stage)
        self.history.append({"step": step, **row})
        if self.console is not None:
            self.console.update(step, row)
        if save:
            self.checkpoint(engine, step, state)

    def checkpoint(self, engine, completed: int, state: Any = None, allowed: bool = True) -> None:
        """A save point: checkpoint when due (every N) or interrupted (then raise `RunInterrupted`).
        `allowed=False` where the loop's state cannot be saved consistently: a pending save waits.
        `state` (a dataclass, or None) is serialized only when a save happens."""
        if self.checkpointer is None:
            return
        self.checkpointer.step_done(engine, completed, lambda: {"history": self.history, **_state_json(state)},
                                    lambda: _state_tensors(state), allowed)


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
