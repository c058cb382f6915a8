"""Supervised fine-tuning: trajectories from demonstrations, weight 1 on every POLICY token.

    loss = - sum_i log pi_theta(tau_i)   over POLICY tokens, aggregated (token / sequence / constant)

Multi-turn conversations: `train_on` picks which assistant turns are trained (every one, the last, or
one sample per turn: RLHF book ch.4.4).

The loop (the template of `trajtune.runs.loop`), top to bottom: 1. pick the step's batch,
2. weight 1 on every POLICY token, 3. forward/backward the NLL and step, 4. log,
evaluate every `eval_every` steps, checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from ..config import check_choices
from ..engine import Engine, ForwardOutput, Loss
from ..runs.loop import Run, eval_due
from ..objectives.sft import sft_loss
from ..text.render import TrainOn, select_turns
from ..trajectory import Batch, Trajectory, collate
from ..seeding import generator


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
    train_on: TrainOn = "all"
    """multi-turn masking (RLHF book ch.4.4): 'all' trains every assistant turn; 'last' only the final one (earlier
    assistant turns become context, PROMPT-owned); 'unroll' makes one sample per assistant turn, each trained on
    that turn with the earlier ones as context (trajtune.text.render.select_turns)"""
    seed: int = 0
    """the batch of step s is a function of (seed, s): resumes are exact"""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.steps < 0 or self.batch_size < 1:
            raise ValueError(f"SFTConfig: steps must be >= 0 and batch_size >= 1 (got {self.steps}, {self.batch_size})")
        if self.aggregation == "constant" and self.aggregation_constant <= 0:
            raise ValueError("SFTConfig: aggregation='constant' needs aggregation_constant > 0")
        if self.eval_every < 0:
            raise ValueError(f"SFTConfig: eval_every must be >= 0, got {self.eval_every}")
        if self.length_buckets < 1:
            raise ValueError(f"SFTConfig: length_buckets must be >= 1, got {self.length_buckets}")


def sft_loss_fn(aggregation: str = "token", constant: float = 0.0) -> Loss:
    """The `Loss` for `engine.forward_backward`: masked NLL on POLICY tokens."""

    def nll(out: ForwardOutput, batch: Batch):
        return sft_loss(out.logprobs, batch.action_mask, aggregation, constant or None)

    return Loss(nll, normalizer=aggregation)


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> torch.Tensor:
    """Indices of step `step`'s batch: a pure function of (seed, step). -> [min(batch_size, n)]"""
    g = generator(seed, step)
    return torch.randperm(n, generator=g)[: min(batch_size, n)]


def sft_step(engine: Engine, data: Sequence[Trajectory], config: SFTConfig, pad_id: int, step: int,
             loss: Loss) -> dict:
    """One optimizer step on step `step`'s batch (a function of (config.seed, step)); returns its train row."""
    rows = [data[i] for i in batch_indices(len(data), config.batch_size, config.seed, step)]
    batch = collate(rows, pad_id, temperature=1.0)  # imitation fits the model itself, whatever the rows' sampling
    m = engine.forward_backward(batch, loss, buckets=config.length_buckets)
    o = engine.optim_step()
    return {"train/loss": m["loss"], "train/tokens": float(batch.action_mask.sum()), "train/grad_norm": o["grad_norm"],
            "train/lr": o["lr"], "train/skipped": o["skipped"]}


def train_sft(engine: Engine, data: Sequence[Trajectory], config: SFTConfig, pad_id: int,
              run: Run | None = None) -> list[dict]:
    """Train on demonstrations; returns the logged rows (train and eval metrics per step).

    Resumes exactly with a checkpointer on `run` (step s's batch is a function of (seed, s))."""
    if not data:
        raise ValueError("train_sft: no demonstrations")
    if config.train_on != "all":  # each demonstration is one conversation (a no-op on data already selected)
        data = [s for traj in data for s in select_turns([traj], config.train_on)]
    run = run or Run("sft")
    loss = sft_loss_fn(config.aggregation, config.aggregation_constant)
    start, _ = run.start(engine)
    for step in run.steps(start, config.steps):
        # 1-3. this step's batch, weight 1 on every POLICY token, forward / backward, update
        row = sft_step(engine, data, config, pad_id, step, loss)
        # 4. log, evaluate, checkpoint
        run.end_step(engine, step + 1, row, eval_now=eval_due(step + 1, config.steps, config.eval_every))
    return run.history
