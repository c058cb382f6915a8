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
exits at once without a new checkpoint (the last complete one stays intact).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path


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
        self._previous: dict[int, object] = {}

    @property
    def state_dir(self) -> Path:
        return self.directory / "state"

    def resume(self, engine) -> int:
        """Load the last checkpoint into `engine` if there is one; return the step to start at."""
        if not (self.state_dir / "engine.json").exists():
            return 0
        extra = engine.load_state(self.state_dir)
        return int(extra.get("completed_steps", 0))

    def save(self, engine, completed_steps: int, extra: dict | None = None) -> None:
        engine.save_state(self.state_dir, extra={"completed_steps": completed_steps, **(extra or {})})

    def step_done(self, engine, completed_steps: int, extra: dict | None = None) -> None:
        """Call after each optimizer step; saves when due, and on a pending interrupt saves and raises."""
        due = self.every and completed_steps % self.every == 0
        if due or self.stop_requested:
            self.save(engine, completed_steps, extra)
        if self.stop_requested:
            raise RunInterrupted(f"interrupted after step {completed_steps}; checkpoint in {self.state_dir}")

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
        if self.stop_requested:  # second signal: leave now, the last complete checkpoint stays
            raise KeyboardInterrupt
        self.stop_requested = True

