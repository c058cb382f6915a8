"""Supervised fine-tuning: trajectories from demonstrations, weight 1 on every POLICY token.

    loss = - sum_i log pi_theta(tau_i)   over POLICY tokens, aggregated (token / sequence / constant)

The loop, top to bottom: 1. pick the step's batch, 2. forward/backward the NLL,
3. optimizer step, 4. log and (every `eval_every` steps) evaluate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import torch

from ..engine import ForwardOutput, LocalEngine
from ..objectives.sft import sft_loss
from ..metrics import MetricsLogger, progress
from ..resume import Checkpointer
from ..trajectory import Batch, Trajectory, collate
from .common import bucketed_forward_backward, finish_step, save_point, start_from


@dataclass
class SFTConfig:
    steps: int = 200
    """optimizer steps"""
    batch_size: int = 32
    """trajectories per step (sampled without replacement within a step)"""
    aggregation: Literal["token", "sequence", "constant"] = "token"
    """how per-token NLL becomes one number (RLHF book, Loss Aggregation)"""
    aggregation_constant: float = 0.0
    """the constant C for aggregation='constant' (e.g. the longest completion)"""
    eval_every: int = 0
    """evaluate every this many steps (0: only at the end)"""
    length_buckets: int = 1
    """forward each batch in this many groups of similar length, each without the padding it does not need
    (the same gradient up to float rounding; faster when lengths vary)"""
    seed: int = 0
    """the batch of step s is a function of (seed, s): resumes are exact"""

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1:
            raise ValueError(f"SFTConfig: steps must be >= 0 and batch_size >= 1 (got {self.steps}, {self.batch_size})")
        if self.aggregation == "constant" and self.aggregation_constant <= 0:
            raise ValueError("SFTConfig: aggregation='constant' needs aggregation_constant > 0")
        if self.eval_every < 0:
            raise ValueError(f"SFTConfig: eval_every must be >= 0, got {self.eval_every}")
        if self.length_buckets < 1:
            raise ValueError(f"SFTConfig: length_buckets must be >= 1, got {self.length_buckets}")


def sft_loss_fn(aggregation: str = "token", constant: float = 0.0):
    """loss_fn for `engine.forward_backward`: masked NLL on POLICY tokens."""

    def loss_fn(out: ForwardOutput, batch: Batch):
        return sft_loss(out.logprobs, batch.action_mask, aggregation, constant or None)

    loss_fn.aggregation = aggregation  # the normaliser, for engines that split the batch (trajtune.distributed)
    return loss_fn


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> torch.Tensor:
    """Indices of step `step`'s batch: a pure function of (seed, step). -> [min(batch_size, n)]"""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randperm(n, generator=g)[: min(batch_size, n)]


def sft_step(engine: LocalEngine, data: Sequence[Trajectory], config: SFTConfig, pad_id: int, step: int,
             loss_fn) -> dict:
    """One optimizer step on step `step`'s batch (a function of (config.seed, step)); returns its train row."""
    batch = collate([data[i] for i in batch_indices(len(data), config.batch_size, config.seed, step)], pad_id)
    m = bucketed_forward_backward(engine, batch, loss_fn, config.length_buckets)
    o = engine.optim_step()
    return {"train/loss": m["loss"], "train/tokens": float(batch.action_mask.sum()), "train/grad_norm": o["grad_norm"],
            "train/lr": o["lr"], "train/skipped": o["skipped"]}


def train_sft(
    engine: LocalEngine,
    data: Sequence[Trajectory],
    config: SFTConfig,
    pad_id: int,
    logger: MetricsLogger | None = None,
    evaluate: Callable[[int], dict] | None = None,
    stage: str = "sft",
    checkpointer: Checkpointer | None = None,
) -> list[dict]:
    """Train on demonstrations; returns the logged rows (train and eval metrics per step).

    With a `checkpointer` the loop resumes from its last checkpoint (step s's batch is a
    function of (seed, s), so the resumed run equals an uninterrupted one) and saves
    periodically and on Ctrl-C / SIGTERM (see trajtune.resume)."""
    if not data:
        raise ValueError("train_sft: no demonstrations")
    loss_fn = sft_loss_fn(config.aggregation, config.aggregation_constant)
    start, history, _ = start_from(checkpointer, engine, logger, stage)
    for step in progress(range(start, config.steps), desc=stage):
        # 1-3. this step's batch, forward / backward, update
        row = sft_step(engine, data, config, pad_id, step, loss_fn)
        # 4. log / evaluate, checkpoint
        finish_step(step, config.steps, row, history, logger, evaluate, config.eval_every, stage)
        save_point(checkpointer, engine, step + 1, history)
    return history
