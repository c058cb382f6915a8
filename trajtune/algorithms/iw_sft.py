"""Importance-weighted SFT (iw-SFT paper §3.3-3.4): rejection sampling with a better weight.

Source: the policy's own samples, filtered by the verifier, as in expert iteration.
Weight: q(tau) / pi_ref(tau) where pi_ref is the policy that generated the round's
data and q is a time-lagged copy of the policy being trained (refreshed every
`q_update_every` steps), clipped per step or smoothed (objectives.importance).

    1. sample   with the current policy (= pi_ref of this round), keep accepted episodes
    2. ref      log pi_ref of every kept token, once
    3. train    steps of iw_sft_loss; q <- policy every q_update_every steps
    4. log
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import torch

from ..engine import ForwardOutput, LocalEngine
from ..metrics import MetricsLogger
from ..objectives.importance import iw_sft_loss
from ..trajectory import Batch, collate
from ..resume import Checkpointer, trajectories_from_json, trajectories_to_json
from .common import Collect, check_selection, rollout_metrics, save_point, select_episodes, start_from, train_row
from .rft import kept_metrics
from .sft import batch_indices


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
        if self.rounds < 0 or self.samples_per_task < 1 or self.steps_per_round < 0 or self.batch_size < 1:
            raise ValueError("IWSFTConfig: rounds >= 0, samples_per_task >= 1, steps_per_round >= 0, batch_size >= 1")
        if self.q_update_every < 1:
            raise ValueError("IWSFTConfig: q_update_every must be >= 1")
        check_selection(self, "IWSFTConfig")
        if not 0 <= self.step_clip_low <= self.step_clip_high:
            raise ValueError(f"IWSFTConfig: need 0 <= step_clip_low <= step_clip_high, got {self.step_clip_low}, {self.step_clip_high}")
        if self.traj_clip_high > 0 and not 0 <= self.traj_clip_low <= self.traj_clip_high:
            raise ValueError(f"IWSFTConfig: need 0 <= traj_clip_low <= traj_clip_high, got {self.traj_clip_low}, {self.traj_clip_high}")
        if not self.alpha >= 0:
            raise ValueError(f"IWSFTConfig: alpha must be >= 0, got {self.alpha}")

    @property
    def traj_clip(self) -> tuple[float, float] | None:
        return (self.traj_clip_low, self.traj_clip_high) if self.traj_clip_high > 0 else None


def train_iw_sft(
    engine: LocalEngine,
    tasks: Sequence,
    collect: Collect,
    config: IWSFTConfig,
    pad_id: int,
    logger: MetricsLogger | None = None,
    evaluate: Callable[[int], dict] | None = None,
    stage: str = "iw_sft",
    checkpointer: Checkpointer | None = None,
) -> list[dict]:
    """Importance-weighted SFT rounds; returns one row per round, logged at the optimizer step.

    With a `checkpointer` the loop resumes exactly. Inside a round it checkpoints only
    where the lagged q is about to be refreshed (every `q_update_every` steps), so q is
    the policy itself there and needs no saving; the kept episodes and log pi_ref are saved."""
    start, history, state = start_from(checkpointer, engine, logger, stage)
    first = state.get("round", 0)
    for r in range(first, config.rounds):
        if r == first and "row" in state:  # resumed inside round r
            row, done = state["row"], state["inner"]
            kept, ref_logp = trajectories_from_json(state["kept"]), checkpointer.tensors["ref_logp"]
        else:
            g = torch.Generator().manual_seed(config.seed * 1_000_003 + r)
            # 1. sample and filter
            trajs = collect(list(tasks), config.samples_per_task, g)
            kept = select_episodes(trajs, "accepted", config.threshold)
            row = {"train/round": float(r + 1), **rollout_metrics(trajs),
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
                    q.model.load_state_dict(engine.model.state_dict())
                batch = full.select(batch_indices(full.size, config.batch_size, config.seed * 1_000_003 + r, s))
                q_logp = torch.zeros_like(ref_logp)  # [full rows, T-1]; filled on this step's rows
                q_logp[batch.index] = q.forward(batch).logprobs
                m = engine.forward_backward(batch, _loss_fn(config, q_logp, ref_logp))
                o = engine.optim_step()
                if s + 1 < config.steps_per_round:
                    save_point(checkpointer, engine, engine.step, history, (s + 1) % config.q_update_every == 0,
                               tensors=lambda: {"ref_logp": ref_logp}, round=r, inner=s + 1, row=row,
                               kept=lambda: trajectories_to_json(kept))
            row.update(train_row(m, o))
        # 4. log, checkpoint
        if evaluate is not None:
            row.update(evaluate(engine.step))
        if logger is not None:
            logger.log(engine.step, row, stage=stage)
        history.append({"step": engine.step, **row})
        save_point(checkpointer, engine, engine.step, history, round=r + 1)
    return history


def _loss_fn(config: IWSFTConfig, q_logp: torch.Tensor, ref_logp: torch.Tensor):
    """loss_fn over rows of the round's batch; q_logp, ref_logp [full rows, T-1] indexed by `batch.index`."""
    def loss_fn(out: ForwardOutput, batch: Batch):
        rows = batch.index
        return iw_sft_loss(out.logprobs, q_logp[rows], ref_logp[rows], batch.action_mask, variant=config.variant,
                           step_clip=(config.step_clip_low, config.step_clip_high), traj_clip=config.traj_clip,
                           alpha=config.alpha, aggregation=config.aggregation)
    loss_fn.aggregation = config.aggregation  # the normaliser, for engines that split the batch (trajtune.distributed)
    return loss_fn
