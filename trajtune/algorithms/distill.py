"""On-policy distillation (RLHF book ch.12): the student samples, a teacher grades every token.

Source: the student's own samples. Weight: per token, the teacher's log-ratio
log pi_T(a_t) - log pi_theta(a_t) (a per-token reverse-KL reward, "sampled"),
or the exact reverse KL over the vocabulary at every visited state ("full").

    1. sample   the student's episodes
    2. grade    teacher log-probs (or logits) on exactly those tokens
    3. update   policy-gradient step with per-token advantages / reverse-KL loss
    4. log
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import torch

from ..distributed import make_engine
from ..engine import ForwardOutput, LocalEngine
from ..metrics import MetricsLogger, progress
from ..objectives.distill import distill_advantages, reverse_kl_loss
from ..objectives.policy_gradient import policy_gradient_loss
from ..trajectory import Batch, collate
from ..resume import Checkpointer
from .common import Collect, finish_step, pick_tasks, rollout_metrics, save_point, start_from, train_row


@dataclass
class DistillConfig:
    steps: int = 40
    """student updates"""
    tasks_per_step: int = 8
    """tasks per step"""
    samples_per_task: int = 4
    """student episodes per task"""
    mode: Literal["sampled", "full"] = "sampled"
    """sampled: teacher log-ratio of the sampled token as advantage; full: exact reverse KL"""
    aggregation: Literal["token", "sequence", "constant"] = "token"
    """loss aggregation"""
    seed: int = 0
    """step s samples with a generator seeded from (seed, s)"""

    def __post_init__(self) -> None:
        if self.steps < 0 or self.tasks_per_step < 1 or self.samples_per_task < 1:
            raise ValueError(f"DistillConfig: steps >= 0, tasks_per_step >= 1 and samples_per_task >= 1 "
                             f"(got {self.steps}, {self.tasks_per_step}, {self.samples_per_task})")
        if self.aggregation == "constant":
            raise ValueError("DistillConfig: aggregation='constant' needs a constant, which DistillConfig has not")


def train_distill(
    engine: LocalEngine,
    teacher: torch.nn.Module,
    tasks: Sequence,
    collect: Collect,
    config: DistillConfig,
    pad_id: int,
    logger: MetricsLogger | None = None,
    evaluate: Callable[[int], dict] | None = None,
    eval_every: int = 0,
    stage: str = "distill",
    checkpointer: Checkpointer | None = None,
) -> list[dict]:
    """Distil `teacher` into the policy on its own samples; resumable with a `checkpointer`."""
    teacher_engine = make_engine(teacher, device=engine.device, frozen=True)  # sharded like the policy under torchrun
    start, history, _ = start_from(checkpointer, engine, logger, stage)
    for step in progress(range(start, config.steps), desc=stage):
        g = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
        # 1. sample
        trajs = collect(pick_tasks(tasks, config.tasks_per_step, g), config.samples_per_task, g)
        batch = collate(trajs, pad_id)
        # 2. grade
        t_out = teacher_engine.forward(batch)
        if config.mode == "sampled":
            adv = distill_advantages(engine.forward(batch).logprobs, t_out.logprobs, batch.action_mask)  # [B, T-1]

            def loss_fn(out: ForwardOutput, b: Batch):
                return policy_gradient_loss(out.logprobs, adv[b.index], b.action_mask, aggregation=config.aggregation)
        else:
            def loss_fn(out: ForwardOutput, b: Batch):
                return reverse_kl_loss(out.logits[:, :-1], t_out.logits[b.index, :-1], b.action_mask, config.aggregation)
        loss_fn.aggregation = config.aggregation  # the normaliser, for engines that split the batch (trajtune.distributed)
        # 3. update
        m = engine.forward_backward(batch, loss_fn)
        o = engine.optim_step()
        # 4. log
        row = {**rollout_metrics(trajs), **train_row(m, o)}
        finish_step(step, config.steps, row, history, logger, evaluate, eval_every, stage)
        save_point(checkpointer, engine, step + 1, history)
    return history
