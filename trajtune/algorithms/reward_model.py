"""Reward models: a scalar head trained on preference pairs (RLHF book ch.5, Bradley-Terry).

The reward of an episode is the value head's output at its last real token
(`objectives.reward_model.last_token_values`). The trained model scores samples for best-of-N,
rejection sampling and RL as a source's scorer (`trajtune.sources.scoring`: `reward_model_scores`,
`pair_accuracy`, `RewardModel`).

    1. step   a batch of pairs: forward chosen and rejected together, Bradley-Terry loss
    2. log    loss, pair accuracy on the batch (and held-out accuracy via `evaluate`)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..engine import Engine, ForwardOutput, Loss
from ..runs.loop import Run, eval_due
from ..objectives.reward_model import bradley_terry_loss, last_token_values
from ..trajectory import Batch, pair_batch
from .common import train_row
from .dpo import Pair, pair_step
from .sft import batch_indices


@dataclass
class RewardModelConfig:
    steps: int = 200
    """optimizer steps"""
    batch_size: int = 32
    """pairs per step"""
    margin: float = 0.0
    """Bradley-Terry margin m: -log sigma(r_c - r_r - m) (book ch.5 margin loss)"""
    length_buckets: int = 1
    """forward each step's pairs in this many groups of similar length (see DPOConfig.length_buckets)"""
    eval_every: int = 0
    """evaluate every this many steps (0: only after the last)"""
    seed: int = 0
    """batch of step s is a function of (seed, s)"""

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or self.eval_every < 0:
            raise ValueError("RewardModelConfig: steps >= 0, batch_size >= 1 and eval_every >= 0")
        if not self.margin >= 0:
            raise ValueError(f"RewardModelConfig: margin must be >= 0, got {self.margin}")
        if self.length_buckets < 1:
            raise ValueError(f"RewardModelConfig: length_buckets must be >= 1, got {self.length_buckets}")


def bradley_terry_loss_fn(config: RewardModelConfig) -> Loss:
    """The Bradley-Terry loss of a `pair_batch` part on the value head's last-token scores."""

    def bt(out: ForwardOutput, batch: Batch):
        r = last_token_values(out.values, batch.attention_mask)  # [2p]
        p = batch.size // 2
        margin = torch.full_like(r[:p], config.margin) if config.margin else None
        return bradley_terry_loss(r[:p], r[p:], margin)

    return Loss(bt, normalizer="sequence", values=True)  # a mean over pairs


def train_reward_model(engine: Engine, pairs: Sequence[Pair], config: RewardModelConfig, pad_id: int,
                       run: Run | None = None) -> list[dict]:
    """Train the value head (and body) of `engine.model` as a Bradley-Terry reward model
    (resumable with a checkpointer on `run`: step s's pairs are a function of (seed, s))."""
    if not pairs:
        raise ValueError("train_reward_model: no pairs")
    run = run or Run("reward_model")
    full, P, loss = pair_batch(pairs, pad_id), len(pairs), bradley_terry_loss_fn(config)
    start, _ = run.start(engine)
    for step in run.steps(start, config.steps):
        # 1. a batch of pairs, 2. Bradley-Terry on their scores, 3. update
        rows = batch_indices(P, config.batch_size, config.seed, step)
        m = pair_step(engine, full, rows, loss, config.length_buckets)
        o = engine.optim_step()
        # 4. log, evaluate, checkpoint
        run.end_step(engine, step + 1, train_row(m, o), eval_now=eval_due(step + 1, config.steps, config.eval_every))
    return run.history
