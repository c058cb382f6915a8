"""Importance-weighted SFT (iw-SFT paper §3.3-3.4): rejection sampling with a better weight.

Source: the policy's own samples, filtered by the verifier, as in expert iteration.
Weight: q(tau) / pi_ref(tau) where pi_ref is the policy that generated the round's
data and q is a time-lagged copy of the policy being trained (refreshed every
`q_update_every` steps), clipped per step or smoothed (objectives.importance).

    1. sample   with the current policy (= pi_ref of this round, `source.take`), keep accepted episodes
    2. ref      log pi_ref of every kept token, once
    3. train    steps of iw_sft_loss; q <- policy every q_update_every steps; `source.after_update`
    4. log
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

import torch

from ..config import check_choices
from ..engine import Engine, ForwardOutput, Loss
from ..runs.loop import Run
from ..objectives.importance import iw_sft_loss
from ..trajectory import Batch, Trajectory, collate
from ..sources.base import Draws, Source
from .common import check_selection, rollout_metrics, select_episodes, train_row
from .rft import kept_metrics
from .sft import batch_indices
from ..seeding import derive


@dataclass
class IWSFTConfig:
    rounds: int = 4
    """sample -> filter -> weighted-train rounds"""
    samples_per_task: int = 16
    """episodes sampled per task and round"""
    steps_per_round: int = 15
    """weighted SFT steps per round"""
    batch_size: int = 32
    """episodes per step"""
    threshold: float = 1.0
    """reward an episode needs to be kept"""
    variant: Literal["clip", "smooth"] = "clip"
    """per-step clipped ratios, or exp(k * sum of log-ratios) smoothing"""
    step_clip_low: float = 0.2
    """per-step ratio clip, lower end (paper: 1 - 0.8)"""
    step_clip_high: float = 1.8
    """per-step ratio clip, upper end (paper: 1 + 0.8)"""
    traj_clip_low: float = 0.0
    """clip of the whole-trajectory weight, lower end (0 with high 0: no clip)"""
    traj_clip_high: float = 0.0
    """clip of the whole-trajectory weight, upper end"""
    alpha: float = 1.0
    """smoothing strength k for variant='smooth'"""
    q_update_every: int = 5
    """refresh the lagged policy q every this many steps"""
    aggregation: Literal["token", "sequence", "constant"] = "token"
    """loss aggregation"""
    share_key: str = "family"
    """info key whose shares in the kept set are logged"""
    seed: int = 0
    """round r samples with a generator seeded from (seed, r)"""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.rounds < 0 or self.samples_per_task < 1 or self.steps_per_round < 0 or self.batch_size < 1:
            raise ValueError("IWSFTConfig: rounds >= 0, samples_per_task >= 1, steps_per_round >= 0, batch_size >= 1")
        if self.q_update_every < 1:
            raise ValueError("IWSFTConfig: q_update_every must be >= 1")
        check_selection(self, "IWSFTConfig")
        if not 0 <= self.step_clip_low <= self.step_clip_high:
            raise ValueError(f"IWSFTConfig: need 0 <= step_clip_low <= step_clip_high, got {self.step_clip_low}, "
                             f"{self.step_clip_high}")
        if self.traj_clip_high > 0 and not 0 <= self.traj_clip_low <= self.traj_clip_high:
            raise ValueError(f"IWSFTConfig: need 0 <= traj_clip_low <= traj_clip_high, got {self.traj_clip_low}, "
                             f"{self.traj_clip_high}")
        if not self.alpha >= 0:
            raise ValueError(f"IWSFTConfig: alpha must be >= 0, got {self.alpha}")

    @property
    def traj_clip(self) -> tuple[float, float] | None:
        return (self.traj_clip_low, self.traj_clip_high) if self.traj_clip_high > 0 else None


@dataclass
class IWSFTState:
    """Where iw-SFT stands between steps (saved with the engine; inside a round only where q = policy)."""

    round: int = 0
    """rounds finished"""
    inner: int = 0
    """weighted steps done in the current round"""
    row: dict | None = None
    """the current round's row so far (None: it has not sampled yet)"""
    kept: list[Trajectory] = field(default_factory=list)
    """the round's kept episodes"""
    ref_logp: torch.Tensor | None = None
    """[kept, T-1] log-probs of the round's data-generating policy pi_ref"""


def train_iw_sft(engine: Engine, tasks: Sequence, source: Source, config: IWSFTConfig, pad_id: int,
                 run: Run | None = None) -> list[dict]:
    """Importance-weighted SFT rounds; returns one row per round, logged (and evaluated) at the optimizer step.

    Resumes exactly with a checkpointer on `run`. Inside a round it checkpoints only where the
    lagged q is about to be refreshed (every `q_update_every` steps), so q is the policy itself
    there and needs no saving; the kept episodes and log pi_ref are saved (`IWSFTState`)."""
    run = run or Run("iw_sft")
    _, state = run.start(engine, IWSFTState(), source)
    loss = iw_sft_loss_fn(config)
    draws = Draws(tasks, config.samples_per_task, config.seed, config.rounds)
    for r in range(state.round, config.rounds):
        if r == state.round and state.row is not None:  # resumed inside round r
            row, done, kept, ref_logp = state.row, state.inner, state.kept, state.ref_logp
        else:
            # 1. sample and filter
            episodes = source.take(draws(r))
            trajs = episodes.trainable
            kept = select_episodes(trajs, "accepted", config.threshold)
            row = {"train/round": float(r + 1), **rollout_metrics(episodes.trajs), **episodes.metrics,
                   **kept_metrics(trajs, len(kept), kept, config.share_key)}
            done, ref_logp = 0, None
        if kept and config.steps_per_round:
            full = collate(kept, pad_id)
            # 2. the data-generating policy's log-probs, once
            if ref_logp is None:
                ref_logp = engine.forward(full).logprobs
            q = engine.reference_engine()  # a frozen copy, on the same device / processes as the policy
            # 3. weighted training with a lagged q
            for s in range(done, config.steps_per_round):
                if s and s % config.q_update_every == 0:
                    q.copy_weights_from(engine)  # q <- the policy, each rank its own part
                batch = full.select(batch_indices(full.size, config.batch_size, derive(config.seed, r), s))
                batch = batch.with_extras(q_logp=q.forward(batch).logprobs, ref_logp=ref_logp[batch.index])
                m = engine.forward_backward(batch, loss)
                o = engine.optim_step()
                if s + 1 < config.steps_per_round:
                    run.checkpoint(engine, engine.step, IWSFTState(r, s + 1, row, kept, ref_logp),
                                   allowed=(s + 1) % config.q_update_every == 0)
            row.update(train_row(m, o))
            row.update(source.after_update(engine))
        # 4. log, evaluate, checkpoint
        run.end_step(engine, engine.step, row, eval_now=True, state=IWSFTState(r + 1))
    return run.history


def iw_sft_loss_fn(config: IWSFTConfig) -> Loss:
    """The iw-SFT loss of a batch; reads q_logp and ref_logp [B, T-1] from `batch.extras`."""
    def weighted_nll(out: ForwardOutput, batch: Batch):
        x = batch.extras
        return iw_sft_loss(out.logprobs, x["q_logp"], x["ref_logp"], batch.action_mask, variant=config.variant,
                           step_clip=(config.step_clip_low, config.step_clip_high), traj_clip=config.traj_clip,
                           alpha=config.alpha, aggregation=config.aggregation)

    return Loss(weighted_nll, normalizer=config.aggregation)
