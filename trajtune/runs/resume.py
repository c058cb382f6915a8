"""Exact resume: periodic checkpoints, Ctrl-C / SIGTERM saves, and restarting where a loop stopped.

Every loop's step `s` is a pure function of `(seed, s)` (its batch, its sampling
generator), so a run resumes exactly if the engine's state -- weights, AdamW
moments, learning-rate step -- is restored and the loop restarts at the saved
step. `Checkpointer` does the bookkeeping for one stage of one run:

    ckpt = Checkpointer(run_dir / "sft", every=50)
    start = ckpt.resume(engine)                 # 0 on a fresh run
    for step in range(start, steps):
        ...                                     # one optimizer step
        ckpt.step_done(engine, step + 1)        # saves every 50 steps, and at once on Ctrl-C

On SIGINT/SIGTERM the handler only sets a flag: the current step finishes, a
checkpoint is written (atomically: see checkpoint.atomic_dir), and
`RunInterrupted` is raised so the caller can exit cleanly. A second Ctrl-C
(a second or more after the first) exits at once without a new checkpoint (the
last complete one stays intact). A process that runs stages in workers wraps
them in `forward_to_children()`, so a stop signal sent to it alone reaches them.

The global torch generators (dropout) are saved and restored too (in a
distributed run, rank 0's). Under torch.distributed the ranks agree on an
interrupt at every step (one all-reduce of the flag), so a signal that reached
only some ranks still makes all of them save together.

A loop whose steps depend on more than (seed, step) saves that too, in the same
atomic checkpoint: `state` (JSON: its history, the round it is in, the episodes
it kept -- see `trajectories_to_json`) and `tensors` (e.g. the DPO reference
log-probs); after `resume` they are in `checkpointer.state` / `.tensors`. A loop
whose state is only consistent at some steps (iw-SFT between refreshes of its
lagged policy) passes `allowed=False` elsewhere: an interrupt waits for the next
allowed step. `reference(engine, start)` gives a stage's frozen reference --
its *starting* policy, saved once, so a resumed RL stage keeps the KL anchor it
started with. `keep(name, obj)` adds a caller's own JSON-able list or dict (an
experiment's evaluation curve) to every checkpoint and refills it on resume.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from ..checkpoint import load_tensors, recover_dir
from ..trajectory import Trajectory


class RunInterrupted(KeyboardInterrupt):
    """Raised after the checkpoint of an interrupted run has been written."""


class Checkpointer:
    """Periodic, signal-safe checkpoints of an engine for one stage.

    directory: where the state lives (`<directory>/state`, written atomically)
    every:     save after every `every` completed steps (0: only on interrupt / at the end)
    """

    def __init__(self, directory: str | os.PathLike, every: int = 0):
        self.directory = Path(directory)
        self.every = every
        self.stop_requested = False
        self._signalled_at = 0.0
        self.state: dict = {}
        """the loop state of the checkpoint `resume` loaded ({} on a fresh run)"""
        self.tensors: dict[str, torch.Tensor] = {}
        """the loop tensors of that checkpoint"""
        self._kept: dict[str, list | dict] = {}
        self._previous: dict[int, object] = {}

    @property
    def state_dir(self) -> Path:
        return self.directory / "state"

    @property
    def has_checkpoint(self) -> bool:
        """True when `resume` will continue an earlier run (e.g. skip a stage's step-0 evaluation)."""
        recover_dir(self.state_dir)  # a save cut between its two renames: the previous state is back
        return (self.state_dir / "engine.json").exists()

    def keep(self, name: str, obj: list | dict) -> list | dict:
        """Save the JSON-able list or dict `obj` with every checkpoint and refill it in place on
        `resume` -- state a caller keeps beside the loop (an evaluation curve, sampling costs)."""
        self._kept[name] = obj
        return obj

    def resume(self, engine) -> int:
        """Load the last checkpoint into `engine` if there is one; return the step to start at.

        The loop's own state and tensors land in `self.state` and `self.tensors`."""
        if not self.has_checkpoint:
            return 0
        extra = engine.load_state(self.state_dir)
        self.state = extra.get("loop", {})
        for name, saved in extra.get("kept", {}).items():
            if name in self._kept:
                obj = self._kept[name]
                obj.clear()
                obj.extend(saved) if isinstance(obj, list) else obj.update(saved)
        loop_file = self.state_dir / "loop.safetensors"
        self.tensors = load_tensors(loop_file) if loop_file.exists() else {}
        _set_rng_states({k: self.tensors.pop(k) for k in list(self.tensors) if k.startswith("rng.")})
        return int(extra.get("completed_steps", 0))

    def save(self, engine, completed_steps: int, state: dict | None = None,
             tensors: dict[str, torch.Tensor] | None = None) -> None:
        engine.save_state(self.state_dir, extra={"completed_steps": completed_steps, "loop": state or {},
                                                 "kept": self._kept},
                          tensors={**(tensors or {}), **_rng_states()})

    def step_done(self, engine, completed_steps: int, state: Callable[[], dict] | dict | None = None,
                  tensors: Callable[[], dict] | dict | None = None, allowed: bool = True) -> None:
        """Call after each optimizer step; saves when due, and on a pending interrupt saves and raises.

        state, tensors: the loop's state (or functions that build it, called only when saving).
        allowed: False where the loop's state cannot be saved consistently; a due save or
        a pending interrupt then waits for the next allowed step.
        """
        if not allowed:
            return
        if _distributed():  # every rank must take the same branch: a save is collective
            flag = torch.tensor([float(self.stop_requested)], device=getattr(engine, "device", "cpu"))
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            self.stop_requested = bool(flag.item())
        due = self.every and completed_steps % self.every == 0
        if due or self.stop_requested:
            self.save(engine, completed_steps, state() if callable(state) else state,
                      tensors() if callable(tensors) else tensors)
        if self.stop_requested:
            raise RunInterrupted(f"interrupted after step {completed_steps}; checkpoint in {self.state_dir}")

    def reference(self, engine, start: int):
        """The stage's frozen reference engine: the policy it started from, kept across resumes.

        The starting weights are written to `<directory>/reference` on a fresh start and
        read back on a resume (call after `resume`, which returned `start`). A reference
        without weights of its own (LoRA adapters switched off: `shares_policy_weights`)
        is only marked, and made again the same way on a resume.
        """
        path = self.directory / "reference"
        if start == 0:
            ref = engine.reference_engine()
            if getattr(ref.model, "shares_policy_weights", False):
                path.mkdir(parents=True, exist_ok=True)
                (path / "adapters_off").write_text("the reference is the policy with its adapters switched off\n")
            else:
                ref.save_state(path)
            return ref
        if (path / "adapters_off").exists():
            return engine.reference_engine(adapters_off=True)
        ref = engine.reference_engine()
        ref.load_state(path)
        return ref

    # --- signals -------------------------------------------------------------
    def __enter__(self) -> "Checkpointer":
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread: no handlers, periodic saves still work
                pass
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_signal(self, signum, frame) -> None:
        now = time.monotonic()
        if self.stop_requested:
            if now - self._signalled_at < DUPLICATE_WINDOW_S:  # the same request delivered twice (a process
                return                                          # group's signal plus a parent's forward)
            raise KeyboardInterrupt  # a second request: leave now, the last complete checkpoint stays
        self.stop_requested, self._signalled_at = True, now


DUPLICATE_WINDOW_S = 1.0
"""signals this close to the first count as one request (see `forward_to_children`)"""


@contextlib.contextmanager
def forward_to_children() -> Iterator[None]:
    """In a process that runs stages in worker processes: SIGINT / SIGTERM sent to this process
    alone (a container's stop signal, `kill PID`) are passed on to its child processes, whose
    Checkpointers save and stop, and raise KeyboardInterrupt here once they are on their way.

    A child that also got the signal directly (Ctrl-C in a terminal signals the whole process
    group) sees two signals within `DUPLICATE_WINDOW_S` and counts them as one. Main thread only;
    elsewhere a no-op.
    """
    def forward(signum, frame):
        for child in multiprocessing.active_children():
            try:
                os.kill(child.pid, signum)
            except ProcessLookupError:
                pass
        raise KeyboardInterrupt

    previous = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, forward)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)



class StageClock:
    """Wall and CPU seconds of a stage summed over the runs it took (a stage cut short by Ctrl-C
    and resumed): `save(...)` on an interrupt writes the time so far to `<resume_dir>/elapsed.json`,
    `totals(...)` adds it to this run's. Extra counters (e.g. sampling seconds) are summed too."""

    def __init__(self, resume_dir: str | os.PathLike):
        self.file = Path(resume_dir) / "elapsed.json"
        self.before = json.loads(self.file.read_text()) if self.file.exists() else {}
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def totals(self, **extra: float) -> dict[str, float]:
        now = {"wall_s": time.perf_counter() - self._wall, "cpu_s": time.process_time() - self._cpu, **extra}
        return {k: v + self.before.get(k, 0.0) for k, v in now.items()}

    def save(self, **extra: float) -> None:
        if self.file.parent.exists():  # only when the stage left a checkpoint to resume from
            self.file.write_text(json.dumps(self.totals(**extra)))


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _rng_states() -> dict[str, torch.Tensor]:
    """torch's global generators (dropout and anything else that does not take a generator)."""
    out = {"rng.cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        out.update({f"rng.cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    return out


def _set_rng_states(states: dict[str, torch.Tensor]) -> None:
    if "rng.cpu" in states:
        torch.set_rng_state(states["rng.cpu"])
    cuda = [states[f"rng.cuda.{i}"] for i in range(torch.cuda.device_count()) if f"rng.cuda.{i}" in states]
    if cuda and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


# --- a loop's episodes, as JSON ------------------------------------------------------
def trajectories_to_json(trajs: Sequence[Trajectory]) -> list[dict[str, Any]]:
    """Trajectories as JSON-able dicts, every field (`versions` included: a partial rollout pending at a checkpoint
    resumes with the version of each of its tokens); info values JSON cannot hold are stored as their repr."""
    return [json.loads(json.dumps(dataclasses.asdict(t), default=repr)) for t in trajs]


def trajectories_from_json(rows: Sequence[dict[str, Any]]) -> list[Trajectory]:
    """Inverse of `trajectories_to_json`."""
    return [Trajectory(**row) for row in rows]
