"""On-policy distillation (RLHF book ch.12): the student samples, a teacher grades every token.

Source: the student's own samples. Weight: per token, the teacher's log-ratio
log pi_T(a_t) - log pi_theta(a_t) (a per-token reverse-KL reward, "sampled"),
or the exact reverse KL over the vocabulary at every visited state ("full").

    1. sample   the student's episodes (`source.take`)
    2. grade    teacher log-probs (or logits) on exactly those tokens
    3. update   policy-gradient step with per-token advantages / reverse-KL loss
    4. log
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence


from ..config import check_choices
from ..engine import Engine, ForwardOutput, Loss
from ..runs.loop import Run, eval_due
from ..objectives.distill import distill_advantages, reverse_kl_loss
from ..objectives.policy_gradient import policy_gradient_loss
from ..trajectory import Batch, collate
from ..sources.base import Draws, Source
from .common import rollout_metrics, train_row


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
    eval_every: int = 0
    """evaluate every this many steps (0: only after the last)"""
    seed: int = 0
    """step s samples with a generator seeded from (seed, s)"""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.steps < 0 or self.tasks_per_step < 1 or self.samples_per_task < 1 or self.eval_every < 0:
            raise ValueError(f"DistillConfig: steps >= 0, tasks_per_step >= 1, samples_per_task >= 1 and eval_every >= 0 "
                             f"(got {self.steps}, {self.tasks_per_step}, {self.samples_per_task}, {self.eval_every})")
        if self.aggregation == "constant":
            raise ValueError("DistillConfig: aggregation='constant' needs a constant, which DistillConfig has not")


def distill_loss(config: DistillConfig) -> Loss:
    """sampled: policy gradient with the per-token advantages in `batch.extras["advantages"]` [B, T-1];
    full: reverse KL to the teacher's logits in `batch.extras["teacher_logits"]` [B, T-1, V] (a
    full-vocabulary loss: the one loss that asks the engine for the whole logits, `Loss(logits=True)`)."""

    def sampled(out: ForwardOutput, batch: Batch):
        return policy_gradient_loss(out.logprobs, batch.extras["advantages"], batch.action_mask,
                                    aggregation=config.aggregation)

    def full(out: ForwardOutput, batch: Batch):
        return reverse_kl_loss(out.logits[:, :-1], batch.extras["teacher_logits"], batch.action_mask, config.aggregation)

    if config.mode == "sampled":
        return Loss(sampled, normalizer=config.aggregation)
    return Loss(full, normalizer=config.aggregation, logits=True)


def train_distill(engine: Engine, teacher: Engine, tasks: Sequence, source: Source, config: DistillConfig,
                  pad_id: int, run: Run | None = None) -> list[dict]:
    """Distil the frozen `teacher` engine (built like the policy's, e.g. make_engine(model, frozen=True))
    into the policy on its own samples; resumable with a checkpointer on `run`."""
    run = run or Run("distill")
    loss = distill_loss(config)
    start, _ = run.start(engine, source=source)
    draws = Draws(tasks, config.samples_per_task, config.seed, config.steps, per_step=config.tasks_per_step)
    for step in run.steps(start, config.steps):
        # 1. sample
        episodes = source.take(draws(step), ahead=draws(step + 1))
        trajs = episodes.trainable
        batch = collate(trajs, pad_id)
        # 2. grade: the teacher on exactly those tokens
        t_out = teacher.forward(batch, logits=config.mode != "sampled")
        if config.mode == "sampled":
            batch = batch.with_extras(advantages=distill_advantages(engine.forward(batch).logprobs, t_out.logprobs,
                                                                    batch.action_mask))  # [B, T-1]
        else:
            batch = batch.with_extras(teacher_logits=t_out.logits[:, :-1])  # [B, T-1, V]
        # 3. update
        m = engine.forward_backward(batch, loss)
        o = engine.optim_step()
        # 4. log, evaluate, checkpoint
        row = {**rollout_metrics(episodes.trajs), **episodes.metrics, **train_row(m, o), **source.after_update(engine)}
        run.end_step(engine, step + 1, row,
                     eval_now=eval_due(step + 1, config.steps, config.eval_every))
    return run.history
