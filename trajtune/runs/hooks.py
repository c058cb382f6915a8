"""Hooks: what a run does at fixed points of every loop besides logging, evaluating and checkpointing.

A `Run` (trajtune/runs/loop.py) calls each of its hooks at these points, in order:

    on_start(engine, start)                       the loop starts after `start` completed steps (> 0: resumed)
    on_episodes(engine, step, trajs, batch, kept) a step (or round) sampled `trajs`; `batch`: its scored batch
                                                  (advantages, old log-probs in `batch.pg`); `kept`: RFT's selection
    on_save_point(engine, completed, allowed)     a step ended (`allowed`: the loop's state may be saved here)

Two ship with the library: `runs.recorder.EpisodeRecorder` (a few episodes per step for `trajtune view`;
every Run with a checkpointer has one) and the HF commands' `Snapshots` (an HF-format copy of the policy
every --save-every steps). A hook of your own overrides the methods it needs:

    class PrintReward(Hook):
        def on_episodes(self, engine, step, trajs, batch=None, kept=None, every=None):
            print(step, sum(t.reward for t in trajs) / len(trajs))

    train_rl(engine, tasks, source, config, pad_id, run=Run("rl", hooks=[PrintReward()]))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ..trajectory import Batch, Trajectory

if TYPE_CHECKING:
    from ..engine import Engine


class Hook:
    """A run's hook (module docstring): every method does nothing unless overridden. The one base class of runs/."""

    def on_start(self, engine: "Engine", start: int) -> None:
        """The loop starts after `start` completed steps (0: fresh; > 0: resumed from a checkpoint)."""

    def on_episodes(self, engine: "Engine", step: int, trajs: Sequence[Trajectory], batch: Batch | None = None,
                    kept: Sequence[Trajectory] | None = None, every: int | None = None) -> None:
        """Step (or round) `step` sampled `trajs` (`every`: the loop's own recording period, e.g. 1 for RFT's
        rounds)."""

    def on_save_point(self, engine: "Engine", completed: int, allowed: bool) -> None:
        """A step ended after `completed` steps; `allowed`: the loop's state can be saved consistently here."""
