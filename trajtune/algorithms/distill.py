"""On-policy distillation (RLHF book ch.12): the student samples, a teacher grades every token.

Source: the student's own samples. Weight: per token, the teacher's log-ratio
log pi_T(a_t) - log pi_theta(a_t) (a per-token reverse-KL reward, "sampled"),
the exact reverse KL over the vocabulary at every visited state ("full"), or the reverse KL over
the student's top-K tokens and a tail bucket ("top_k", SDPO's `kl_top_k`).

    1. sample   the student's episodes (`source.take`)
    2. grade    teacher log-probs (or logits) on exactly those tokens
    3. update   policy-gradient step with per-token advantages / reverse-KL loss
    4. log

On-policy self-distillation (`train_self_distill`: SDPO / OPSD, checklist 12.9) has no second model: the
teacher is the policy itself, forwarded on the same sampled completion but conditioned on privileged
information -- a correct sibling's completion from the same group -- with a stop-gradient. Groups with no
correct rollout have no demonstration and are skipped (`distill/skipped`, counted per step).

Sequence-level KD (`train_seq_kd`: SEQ-KD, checklist 12.3, the offline distillation of 12.1) is SFT on the
teacher's own sequences, L = -log p(u_hat | s) with u_hat the teacher's decoding of s:

    1. sample   the teacher's completions of every prompt (`teacher_completions`: greedy -- beam search of width
                1 -- or sampled, as the teacher's source decodes; seeded), optionally kept by reward
    2. train    `trajtune.algorithms.sft.train_sft` on them (the one SFT loop)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Literal, NamedTuple, Sequence

import torch


from ..config import check_choices
from ..engine import Engine, ForwardOutput, Loss
from ..metrics import register
from ..runs.loop import Run, eval_due
from ..objectives.distill import distill_advantages, reverse_kl_loss, top_k_reverse_kl_loss, top_k_with_tail
from ..objectives.inputs import PGInputs, PGOptions
from ..objectives.policy_gradient import policy_gradient_loss
from ..trajectory import Batch, Owner, Trajectory, collate
from ..seeding import generator
from ..sources.base import Draw, Draws, Source
from .common import rollout_metrics, train_row
from .sft import SFTConfig, train_sft


register("distill/skipped", "SDPO: prompts of the step whose group had no correct rollout (no demonstration: skipped)")
register("distill/skipped_share", "SDPO: distill/skipped / the step's prompts")
register("distill/top_k_kl", "top-K reverse KL(student || teacher) with a tail bucket, per POLICY token (nats)")
register("distill/top_k_mass", "the student's probability on its own top-K tokens, per POLICY token")
register("distill/forward_kl", "forward KL(teacher || student) per POLICY token (GKD / WORD-KD, nats)")


@dataclass
class DistillConfig:
    steps: int = 40
    """student updates"""
    tasks_per_step: int = 8
    """tasks per step"""
    samples_per_task: int = 4
    """student episodes per task"""
    mode: Literal["sampled", "full", "top_k"] = "sampled"
    """sampled: teacher log-ratio of the sampled token as advantage; full: exact reverse KL; top_k: reverse KL over
    the student's kl_top_k most likely tokens and a tail bucket"""
    kl_top_k: int = 20
    """mode top_k: tokens per position (SDPO's default 20)"""
    aggregation: Literal["token", "sequence", "constant"] = "token"
    """loss aggregation"""
    eval_every: int = 0
    """evaluate every this many steps (0: only after the last)"""
    seed: int = 0
    """step s samples with a generator seeded from (seed, s)"""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.steps < 0 or self.tasks_per_step < 1 or self.samples_per_task < 1 or self.eval_every < 0:
            raise ValueError("DistillConfig: steps >= 0, tasks_per_step >= 1, samples_per_task >= 1 and "
                             f"eval_every >= 0 (got {self.steps}, {self.tasks_per_step}, {self.samples_per_task}, "
                             f"{self.eval_every})")
        if self.aggregation == "constant":
            raise ValueError("DistillConfig: aggregation='constant' needs a constant, which DistillConfig has not")
        if self.kl_top_k < 1:
            raise ValueError(f"DistillConfig: kl_top_k must be >= 1, got {self.kl_top_k}")


def distill_loss(config: DistillConfig) -> Loss:
    """sampled: policy gradient with the per-token advantages in `batch.pg.advantages` [B, T-1];
    full: reverse KL to the teacher's logits in `batch.extras["teacher_logits"]` [B, T-1, V] (a
    full-vocabulary loss: the one loss that asks the engine for the whole logits, `Loss(logits=True)`)."""

    options = PGOptions(aggregation=config.aggregation)

    def sampled(out: ForwardOutput, batch: Batch):
        assert batch.pg is not None, "distill_loss (sampled) reads batch.pg"
        return policy_gradient_loss(out.logprobs, batch.action_mask, batch.pg, options)

    def full(out: ForwardOutput, batch: Batch):
        return reverse_kl_loss(out.logits[:, :-1], batch.extras["teacher_logits"], batch.action_mask,
                               config.aggregation)

    def top_k(out: ForwardOutput, batch: Batch):
        return top_k_reverse_kl_loss(out.logits[:, :-1], batch.extras["top_ids"], batch.extras["teacher_top"],
                                     batch.action_mask, config.aggregation)

    if config.mode == "sampled":
        return Loss(sampled, normalizer=config.aggregation)
    return Loss(full if config.mode == "full" else top_k, normalizer=config.aggregation, logits=True)


@torch.no_grad()
def teacher_top(engine: Engine, teacher: Engine, batch: Batch, teacher_batch: Batch, k: int) -> Batch:
    """`batch` with the student's top-k ids [B, T-1, k] and the teacher's top-k-plus-tail log-probs at them
    [B, T-1, k+1] in `extras` (top_ids, teacher_top). Row b of `teacher_batch` holds the same POLICY tokens as
    row b of `batch` in another context (the teacher's); the two are matched action token by action token."""
    s_logits = engine.forward(batch, logits=True).logits[:, :-1]  # [B, T-1, V]
    ids = s_logits.topk(min(k, s_logits.shape[-1]), dim=-1).indices  # [B, T-1, k]
    t_logits = teacher.forward(teacher_batch, logits=True).logits[:, :-1]  # [B', T'-1, V]
    s_mask, t_mask = batch.action_mask.bool(), teacher_batch.action_mask.bool()  # [B, T-1], [B, T'-1]
    bad = (s_mask.sum(-1) != t_mask.sum(-1)).nonzero()
    if len(bad):
        b = int(bad[0])
        raise ValueError(f"teacher_top: row {b} has {int(s_mask[b].sum())} action tokens for the student and "
                         f"{int(t_mask[b].sum())} for the teacher")
    out = torch.zeros(*ids.shape[:2], ids.shape[-1] + 1)
    out[s_mask] = top_k_with_tail(t_logits[t_mask], ids[s_mask])  # row-major order matches token by token
    return batch.with_extras(top_ids=ids, teacher_top=out)


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
        episodes = source.take(draws(step), ahead=draws)
        trajs = episodes.trainable
        batch = collate(trajs, pad_id)
        # 2. grade: the teacher on exactly those tokens
        if config.mode == "top_k":
            batch = teacher_top(engine, teacher, batch, batch, config.kl_top_k)
        elif config.mode == "sampled":
            t_logp = teacher.forward(batch).logprobs
            batch = replace(batch, pg=PGInputs(distill_advantages(engine.forward(batch).logprobs, t_logp,
                                                                  batch.action_mask)))  # [B, T-1]
        else:
            batch = batch.with_extras(teacher_logits=teacher.forward(batch, logits=True).logits[:, :-1])  # [B, T-1, V]
        # 3. update
        m = engine.forward_backward(batch, loss)
        o = engine.optim_step()
        # 4. log, evaluate, checkpoint
        row = {**rollout_metrics(episodes.trajs), **episodes.metrics, **train_row(m, o), **source.after_update(engine)}
        run.end_step(engine, step + 1, row,
                     eval_now=eval_due(step + 1, config.steps, config.eval_every))
    return run.history


@dataclass
class SelfDistillConfig:
    """On-policy self-distillation (SDPO / OPSD; the book's companion settings in brackets)."""

    steps: int = 200
    """student updates [200]"""
    tasks_per_step: int = 16
    """prompts per step [prompts_per_step 16]"""
    samples_per_task: int = 8
    """rollouts per prompt, the group a correct sibling comes from [num_rollouts 8]"""
    kl_top_k: int = 20
    """tokens per position in the top-K reverse KL, plus a tail bucket [kl_top_k 20]"""
    success_threshold: float = 1.0
    """reward of a correct rollout (a demonstration for its siblings) [1.0]"""
    aggregation: Literal["token", "sequence"] = "token"
    """loss aggregation (token: normalised by the action tokens, as the companion code)"""
    eval_every: int = 0
    """evaluate every this many steps (0: only after the last)"""
    seed: int = 0
    """step s samples with a generator seeded from (seed, s)"""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.steps < 0 or self.tasks_per_step < 1 or self.samples_per_task < 1 or self.kl_top_k < 1:
            raise ValueError(f"SelfDistillConfig: steps >= 0, tasks_per_step, samples_per_task and kl_top_k >= 1 (got "
                             f"{self.steps}, {self.tasks_per_step}, {self.samples_per_task}, {self.kl_top_k})")


def with_context(prompt_ids: Sequence[int], episode: Trajectory) -> Trajectory:
    """The teacher's row: `prompt_ids` (PROMPT) followed by `episode`'s tokens from its first POLICY token on, with
    their owners and turns (so the action tokens are the same, in the same order)."""
    first = next((i for i, o in enumerate(episode.owners) if o == Owner.POLICY), None)
    if first is None:
        raise ValueError("with_context: the episode has no POLICY token")
    t = Trajectory(reward=episode.reward, group=episode.group)
    t.append(list(prompt_ids), Owner.PROMPT, 0)
    t.ids += episode.ids[first:]
    t.owners += episode.owners[first:]
    t.turns += episode.turns[first:]
    if t.logprobs is not None:
        t.logprobs += [0.0] * (len(t.ids) - len(t.logprobs))
    return t


def train_self_distill(engine: Engine, tasks: Sequence, source: Source, config: SelfDistillConfig, pad_id: int,
                       teacher_prompt: Callable[[Any, Trajectory], Sequence[int]], run: Run | None = None
                       ) -> list[dict]:
    """SDPO: per step, sample groups; in each group with a correct rollout, every rollout is distilled towards the
    policy's own distribution under `teacher_prompt(task, demo)` -- the token ids the teacher reads before the
    completion (the task's prompt with a correct sibling `demo`'s answer) -- by the top-K reverse KL with a
    stop-gradient on the teacher. Logs distill/skipped (prompts whose group had no correct rollout) and its share."""
    run = run or Run("self_distill")
    loss = distill_loss(DistillConfig(mode="top_k", kl_top_k=config.kl_top_k, aggregation=config.aggregation))
    start, _ = run.start(engine, source=source)
    draws = Draws(tasks, config.samples_per_task, config.seed, config.steps, per_step=config.tasks_per_step)
    for step in run.steps(start, config.steps):
        # 1. sample
        draw = draws(step)
        episodes = source.take(draw, ahead=draws)
        groups: dict[int, tuple[Any, list[Trajectory]]] = {}
        for i, t in enumerate(episodes.trajs):  # episode i answers draw.tasks[i // n]
            groups.setdefault(t.group, (draw.tasks[i // draw.n], []))[1].append(t)
        # 2. grade: each rollout against the policy conditioned on a correct sibling
        kept, teacher_rows, skipped = [], [], 0
        for task, members in groups.values():
            members = [t for t in members if t.trainable]
            correct = [t for t in members if t.reward >= config.success_threshold]
            if not correct:
                skipped += 1
                continue
            for t in members:
                demo = next((c for c in correct if c is not t), correct[0])
                kept.append(t)
                teacher_rows.append(with_context(teacher_prompt(task, demo), t))
        row = {**rollout_metrics(episodes.trajs), **episodes.metrics, "distill/skipped": float(skipped),
               "distill/skipped_share": skipped / max(1, len(groups))}
        # 3. update
        if kept:
            batch = teacher_top(engine, engine, collate(kept, pad_id), collate(teacher_rows, pad_id), config.kl_top_k)
            m = engine.forward_backward(batch, loss)
            o = engine.optim_step()
            row.update(train_row(m, o))
        row.update(source.after_update(engine))
        # 4. log, evaluate, checkpoint
        run.end_step(engine, step + 1, row, eval_now=eval_due(step + 1, config.steps, config.eval_every))
    return run.history


@dataclass
class SeqKDConfig:
    """Sequence-level knowledge distillation (SEQ-KD, checklist 12.3): what is sampled from the teacher. How the
    student trains on it is an `SFTConfig`; how the teacher decodes (greedy or sampled, temperature, length) is
    its source's (e.g. `EpisodeSource(Decoder(teacher.sample, SamplerSettings(greedy=True)), make_env, renderer)`)."""

    samples_per_task: int = 1
    """teacher completions per prompt (greedy decoding gives the same one each time: keep 1)"""
    min_reward: float | None = None
    """keep only completions whose reward is >= this (the teacher's source scores them; None: keep every trainable
    one) -- the "filter teacher responses" of the book's offline distillation (12.1)"""
    chunk: int = 64
    """prompts per draw from the teacher (draw c is seeded with (seed, c))"""
    seed: int = 0
    """the teacher's sampling: a function of (seed, chunk); the student's batches: the SFTConfig's seed"""

    def __post_init__(self) -> None:
        if self.samples_per_task < 1 or self.chunk < 1:
            raise ValueError(f"SeqKDConfig: samples_per_task and chunk must be >= 1 (got {self.samples_per_task}, "
                             f"{self.chunk})")


def teacher_completions(teacher: Source, tasks: Sequence, config: SeqKDConfig) -> tuple[list[Trajectory], dict]:
    """`config.samples_per_task` episodes of every task from the `teacher` source, `config.chunk` tasks per draw
    (draw c seeded with `seeding.generator(config.seed, c)`) -> (the trainable ones with reward >= min_reward,
    metrics seqkd/demos, seqkd/dropped, seqkd/teacher_reward)."""
    kept, dropped, rewards = [], 0, []
    for c, start in enumerate(range(0, len(tasks), config.chunk)):
        part = list(tasks[start : start + config.chunk])
        episodes = teacher.take(Draw(part, config.samples_per_task, generator(config.seed, c), c))
        for t in episodes.trajs:
            ok = t.trainable and (config.min_reward is None or t.reward >= config.min_reward)
            kept += [t] if ok else []
            dropped += not ok
            rewards += [t.reward] if t.trainable else []
    metrics = {"seqkd/demos": float(len(kept)), "seqkd/dropped": float(dropped),
               "seqkd/teacher_reward": sum(rewards) / len(rewards) if rewards else float("nan")}
    return kept, metrics


class SeqKDResult(NamedTuple):
    """What `train_seq_kd` returns."""

    history: list[dict]
    """the SFT loop's rows (train/loss ...)"""
    demos: list[Trajectory]
    """the teacher completions the student was trained on"""
    metrics: dict[str, float]
    """the sampling's seqkd/demos, seqkd/dropped, seqkd/teacher_reward"""


def train_seq_kd(engine: Engine, teacher: Source, tasks: Sequence, config: SeqKDConfig, sft: SFTConfig, pad_id: int,
                 run: Run | None = None) -> SeqKDResult:
    """SEQ-KD: the student `engine` is fine-tuned (`train_sft`, configured by `sft`: steps, batch size, its seed)
    on the completions the `teacher` source gives for `tasks` (`teacher_completions`). Student and teacher share
    the tokenizer and renderer (the student trains on the teacher's tokens). Resumes exactly with a checkpointer on
    `run`: the teacher is frozen and its sampling seeded, so the demonstrations are drawn again the same."""
    # 1. sample the teacher's completions (kept by reward, when min_reward is set)
    demos, metrics = teacher_completions(teacher, tasks, config)
    if not demos:
        raise ValueError(f"train_seq_kd: no teacher completion was kept ({metrics['seqkd/dropped']:.0f} dropped: "
                         f"failed episodes or reward < min_reward={config.min_reward})")
    # 2. SFT on them
    return SeqKDResult(train_sft(engine, demos, sft, pad_id, run), demos, metrics)


# --- WORD-KD / GKD: forward KL to the teacher's full distribution on fixed text (checklist 12.2, 12.5, 12.10) -----


@dataclass
class WordKDConfig:
    """Word-level knowledge distillation on fixed text (Kim & Rush's WORD-KD; the GKD / Gemma form of the book's
    App. A): the student matches the teacher's whole next-token distribution at every POLICY token."""

    steps: int = 100
    """student updates"""
    batch_size: int = 16
    """texts per step (a function of (seed, step), as SFT's batches)"""
    aggregation: Literal["token", "sequence"] = "token"
    """how the per-token KL becomes one number (token: the mean over POLICY tokens)"""
    eval_every: int = 0
    """evaluate every this many steps (0: only after the last)"""
    seed: int = 0
    """step s's batch is a function of (seed, s)"""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.steps < 0 or self.batch_size < 1 or self.eval_every < 0:
            raise ValueError(f"WordKDConfig: steps >= 0, batch_size >= 1 and eval_every >= 0 (got {self.steps}, "
                             f"{self.batch_size}, {self.eval_every})")


def train_word_kd(engine: Engine, teacher: Engine, data: Sequence[Trajectory], config: WordKDConfig, pad_id: int,
                  run: Run | None = None) -> list[dict]:
    """Distil the frozen `teacher` into the policy on fixed text (book ch.12, checklist 12.2 / 12.10):

        L = sum_t KL( pi_T(.|s, u_<t) || pi_theta(.|s, u_<t) )   over each text's POLICY tokens

    (`objectives.distill.forward_kl_loss`: the cross-entropy against the teacher's soft labels minus the teacher's
    entropy). `data` is any text: demonstrations (static text, WORD-KD) or the teacher's own samples drawn once
    (12.5's offline KD on teacher prefixes, u ~ pi_T). Student and teacher share the tokenizer. Resumable with a
    checkpointer on `run`; logs train/* and distill/forward_kl."""
    from ..objectives.distill import forward_kl_loss
    from .sft import batch_indices

    data = [t for t in data if t.trainable]
    if not data:
        raise ValueError("train_word_kd: no text with a POLICY token to distil on")
    run = run or Run("word_kd")

    def kl(out: ForwardOutput, batch: Batch):
        return forward_kl_loss(out.logits[:, :-1], batch.extras["teacher_logits"], batch.action_mask,
                               config.aggregation)

    loss = Loss(kl, normalizer=config.aggregation, logits=True)
    start, _ = run.start(engine)
    for step in run.steps(start, config.steps):
        # 1. this step's texts
        batch = collate([data[i] for i in batch_indices(len(data), config.batch_size, config.seed, step)], pad_id,
                        temperature=1.0)
        # 2. the teacher's full distribution at every position (no gradient)
        batch = batch.with_extras(teacher_logits=teacher.forward(batch, logits=True).logits[:, :-1])  # [B, T-1, V]
        # 3. update
        m = engine.forward_backward(batch, loss)
        o = engine.optim_step()
        # 4. log, evaluate, checkpoint
        row = {**train_row(m, o), "train/tokens": float(batch.action_mask.sum())}
        run.end_step(engine, step + 1, row, eval_now=eval_due(step + 1, config.steps, config.eval_every))
    return run.history
