"""Reward models: a head on the policy network trained as a grader (RLHF book ch.5, "Reward Modeling").

Four objectives, one head (the value head: one output per token, `TinyTransformer(value_head=True)`,
`HFPolicy(value_head=True)`), three loops:

    objective       data                                   score of an episode          loop
    bt              (chosen, rejected) pairs, a per-pair    the head at the last token   train_reward_model
                    margin (Llama 2) optional
    bt, plackett-   ranked lists: K completions of one      the head at the last token   train_ranked_reward_model
      luce          prompt, best first (InstructGPT:
                    all C(K,2) pairs of a prompt in one
                    batch; Starling: Plackett-Luce)
    orm             (episode, 0/1 outcome) labels copied    sigma(head) aggregated over  train_token_reward_model
                    onto every completion token              the completion's tokens
    prm             (episode, one 0/1 label per step) on    sigma(head) aggregated over  train_token_reward_model
                    the last token of each step             the step ends

The token-level models (ORM, PRM) score with `objectives.reward_model.aggregate_scores` (mean, min,
product, last). The trained model scores samples for best-of-N, rejection sampling and RL as a source's
scorer (`trajtune.sources.scoring`). Each loop follows the template:

    1. batch    step s's rows: a function of (seed, s)
    2. loss     forward_backward with the objective's loss on the head's outputs
    3. update   optim_step
    4. log      loss and the objective's accuracy and margin; evaluate; checkpoint

A trained reward model's head also starts PPO's critic (`init_value_head_from_reward_model`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from ..config import check_choices
from ..engine import Engine, ForwardOutput, Loss
from ..objectives.reward_model import (IGNORE_INDEX, all_pairs_loss, bradley_terry_loss, last_token_values, orm_loss,
                                       orm_sequence_loss, plackett_luce_loss, prm_loss, step_ends)
from ..runs.loop import Run, eval_due
from ..trajectory import Batch, Owner, Trajectory, collate, pair_batch
from .common import train_row
from .dpo import Pair, pair_step
from .sft import batch_indices

Objective = Literal["bt", "plackett-luce", "orm", "prm"]
Labelled = tuple[Trajectory, list[int]]
"""an episode and one label per token: 0/1 where supervised, IGNORE_INDEX (-100) elsewhere"""



@dataclass
class RewardModelConfig:
    steps: int = 200
    """optimizer steps"""
    batch_size: int = 32
    """pairs per step (ranked lists: prompts per step; orm / prm: episodes per step)"""
    objective: Objective = "bt"
    """bt: Bradley-Terry on pairs (a ranked list: all C(K,2) pairs of a prompt in one batch, InstructGPT);
    plackett-luce: K-wise on ranked lists (Starling); orm: an outcome reward model (per-token BCE on a 0/1
    label); prm: a process reward model (BCE on the last token of each step) (book ch.5)"""
    orm_form: Literal["token", "sequence"] = "token"
    """orm: token = per-token BCE with the label copied on every completion token (Lightman et al.); sequence =
    BCE of the sigmoid of the mean logit, one term per sequence (Lyu et al.; book ch.5.6)"""
    aggregate: Literal["mean", "min", "product", "last"] = "mean"
    """orm / prm: how the per-token (ORM) or per-step (PRM) probabilities become the reward, saved with the
    model: mean, min, product (as the sum of log p) or last (objectives.reward_model.aggregate_scores)"""
    margin: float = 0.0
    """Bradley-Terry margin m: -log sigma(r_c - r_r - m) (book ch.5 margin loss); a row's own 'margin' column
    replaces it for that pair"""
    length_buckets: int = 1
    """forward each step's pairs in this many groups of similar length (see DPOConfig.length_buckets)"""
    eval_every: int = 0
    """evaluate every this many steps (0: only after the last)"""
    seed: int = 0
    """batch of step s is a function of (seed, s)"""

    def __post_init__(self) -> None:
        check_choices(self)  # objective, orm_form, aggregate
        if self.steps < 0 or self.batch_size < 1 or self.eval_every < 0:
            raise ValueError("RewardModelConfig: steps >= 0, batch_size >= 1 and eval_every >= 0")
        if not self.margin >= 0:
            raise ValueError(f"RewardModelConfig: margin must be >= 0, got {self.margin}")
        if self.length_buckets < 1:
            raise ValueError(f"RewardModelConfig: length_buckets must be >= 1, got {self.length_buckets}")


# --- pairs: Bradley-Terry, a margin per pair -----------------------------------------------------
def bradley_terry_loss_fn(config: RewardModelConfig) -> Loss:
    """The Bradley-Terry loss of a `pair_batch` part on the value head's last-token scores; the per-pair
    margins come from `batch.extras['margin']` [2p] where the batch has them, else `config.margin`."""

    def bt(out: ForwardOutput, batch: Batch):
        r = last_token_values(out.values, batch.attention_mask)  # [2p]
        p = batch.size // 2
        if "margin" in batch.extras:
            margin = batch.extras["margin"][:p]
        else:
            margin = torch.full_like(r[:p], config.margin) if config.margin else None
        return bradley_terry_loss(r[:p], r[p:], margin)

    return Loss(bt, normalizer="sequence", values=True)  # a mean over pairs


def pair_margins(pairs: Sequence[Pair], default: float) -> list[float] | None:
    """Each pair's margin: its chosen episode's info['margin'] (a row's 'margin' column), else `default`;
    None when every pair has the default (the loss then reads `config.margin`)."""
    margins = [float(c.info.get("margin", default)) for c, _ in pairs]
    return margins if any(m != default for m in margins) else None


def train_reward_model(engine: Engine, pairs: Sequence[Pair], config: RewardModelConfig, pad_id: int,
                       run: Run | None = None) -> list[dict]:
    """Train the value head (and body) of `engine.model` as a Bradley-Terry reward model
    (resumable with a checkpointer on `run`: step s's pairs are a function of (seed, s))."""
    if not pairs:
        raise ValueError("train_reward_model: no pairs")
    run = run or Run("reward_model")
    full, P, loss = pair_batch(pairs, pad_id), len(pairs), bradley_terry_loss_fn(config)
    margins = pair_margins(pairs, config.margin)
    if margins is not None:
        full.extras["margin"] = torch.tensor(margins).repeat(2)  # [2P]: chosen rows, then rejected
    start, _ = run.start(engine)
    for step in run.steps(start, config.steps):
        # 1. a batch of pairs, 2. Bradley-Terry on their scores, 3. update
        rows = batch_indices(P, config.batch_size, config.seed, step)
        m = pair_step(engine, full, rows, loss, config.length_buckets)
        o = engine.optim_step()
        # 4. log, evaluate, checkpoint
        run.end_step(engine, step + 1, train_row(m, o), eval_now=eval_due(step + 1, config.steps, config.eval_every))
    return run.history


# --- ranked lists: all pairs of a prompt, or Plackett-Luce ------------------------------------------
def ranked_loss_fn(config: RewardModelConfig) -> Loss:
    """The loss of a part of a `ranked_batch`: per prompt (rows sharing extras['group'], ordered by
    extras['rank'], 0 = best) Bradley-Terry over all its C(K,2) pairs, or Plackett-Luce; averaged over the
    prompts whatever their K (extras['weight'], `ranked_step`)."""

    def ranked(out: ForwardOutput, batch: Batch):
        r_B = last_token_values(out.values, batch.attention_mask)  # [b]
        group_B, rank_B, weight_B = batch.extras["group"], batch.extras["rank"], batch.extras["weight"]
        total = r_B.sum() * 0
        stats: dict[str, list[torch.Tensor]] = {"rm/accuracy": [], "rm/margin": [], "rm/top1_accuracy": []}
        for g in group_B.unique():
            rows = (group_B == g).nonzero().squeeze(1)
            r_K = r_B[rows[rank_B[rows].argsort()]]  # best first
            if config.objective == "plackett-luce":
                loss, m = plackett_luce_loss(r_K[None])
                m = {**all_pairs_loss(r_K.detach())[1], **m}
            else:
                loss, m = all_pairs_loss(r_K)
                m["rm/top1_accuracy"] = (r_K.detach().argmax() == 0).float()
            total = total + loss * weight_B[rows].sum()
            for k in stats:
                stats[k].append(m[k])
        return total / batch.size, {k: torch.stack(v).mean() for k, v in stats.items()}

    return Loss(ranked, normalizer="sequence", values=True)


def ranked_batch(groups: Sequence[Sequence[Trajectory]], pad_id: int) -> Batch:
    """Ranked lists (each: one prompt's K >= 2 completions, best first) as one batch: a prompt's rows share a
    `together` key and extras['group'] [B] (its index), extras['rank'] [B] (0 = best)."""
    flat = [t for g in groups for t in g]
    batch = collate(flat, pad_id)
    group = torch.tensor([i for i, g in enumerate(groups) for _ in g])
    rank = torch.tensor([k for g in groups for k in range(len(g))])
    return dataclasses.replace(batch, together=group.clone(), extras={"group": group, "rank": rank})


def ranked_step(engine: Engine, full: Batch, prompts: torch.Tensor, loss: Loss) -> dict:
    """forward_backward on the ranked lists `prompts` [p] of a `ranked_batch`, each row weighted
    b / (p * K_prompt) so that any split of the rows still averages the p prompts' losses equally."""
    rows = torch.cat([(full.extras["group"] == g).nonzero().squeeze(1) for g in prompts.tolist()])
    return engine.forward_backward(with_prompt_weights(full.select(rows)), loss)


def with_prompt_weights(batch: Batch) -> Batch:
    """`batch` (whole ranked lists) with extras['weight'] [b] = b / (p * K_prompt): the weights under which
    `ranked_loss_fn` is the mean of its p prompts' losses, however the engine splits the rows."""
    group_b = batch.extras["group"]
    K_b = (group_b[:, None] == group_b[None, :]).sum(-1).float()  # [b] each row's list length
    batch.extras["weight"] = batch.size / (len(group_b.unique()) * K_b)
    return batch


def train_ranked_reward_model(engine: Engine, groups: Sequence[Sequence[Trajectory]], config: RewardModelConfig,
                              pad_id: int, run: Run | None = None) -> list[dict]:
    """Train the value head on ranked lists (best first): objective bt (all C(K,2) pairs of a prompt in its
    batch, averaged: each prompt one grouped term, InstructGPT) or plackett-luce (K-wise, Starling)."""
    if not groups:
        raise ValueError("train_ranked_reward_model: no ranked lists")
    if any(len(g) < 2 for g in groups):
        raise ValueError("train_ranked_reward_model: every ranked list needs >= 2 completions")
    if config.objective not in ("bt", "plackett-luce"):
        raise ValueError(f"train_ranked_reward_model: objective bt or plackett-luce, got {config.objective!r}")
    run = run or Run("reward_model")
    full, loss = ranked_batch(groups, pad_id), ranked_loss_fn(config)
    start, _ = run.start(engine)
    for step in run.steps(start, config.steps):
        # 1. a batch of prompts (all their completions), 2. the grouped loss, 3. update
        prompts = batch_indices(len(groups), config.batch_size, config.seed, step)
        m = ranked_step(engine, full, prompts, loss)
        o = engine.optim_step()
        # 4. log, evaluate, checkpoint
        run.end_step(engine, step + 1, train_row(m, o), eval_now=eval_due(step + 1, config.steps, config.eval_every))
    return run.history


# --- outcome and process reward models: labels on tokens ---------------------------------------------
def outcome_labels(traj: Trajectory, correct: bool | int) -> list[int]:
    """An ORM's labels (book "Outcome Reward Models"): the episode's outcome (0/1) copied onto every
    completion (POLICY) token, IGNORE_INDEX on the prompt and template."""
    return [int(correct) if o == Owner.POLICY else IGNORE_INDEX for o in traj.owners]


def process_labels(traj: Trajectory, labels: Sequence[bool | int]) -> list[int]:
    """A PRM's labels (book "Process Reward Models"; TRL's packaging): each step's 0/1 label on its last
    token (`objectives.reward_model.step_ends`: info['step_ends'], else each policy turn's last token),
    IGNORE_INDEX elsewhere."""
    ends = step_ends(traj.owners, traj.turns, Owner.POLICY, traj.info.get("step_ends"))
    if len(ends) != len(labels):
        raise ValueError(f"process_labels: {len(labels)} labels for {len(ends)} steps ({traj.info.get('source', '')})")
    out = [IGNORE_INDEX] * len(traj)
    for i, y in zip(ends, labels, strict=True):
        out[i] = int(y)
    return out


def token_batch(examples: Sequence[Labelled], pad_id: int) -> Batch:
    """Labelled episodes as one batch; extras['token_labels'] [B, T-1] are the labels of positions 1..T-1
    (position 0 is never labelled), aligned with `values[:, 1:]`."""
    batch = collate([t for t, _ in examples], pad_id)
    T = batch.ids.shape[1]
    labels = torch.full((batch.size, T), IGNORE_INDEX, dtype=torch.long)
    for i, (t, y) in enumerate(examples):
        if len(y) != len(t):
            raise ValueError(f"token_batch: row {i} has {len(y)} labels for {len(t)} tokens")
        labels[i, : len(y)] = torch.tensor(y, dtype=torch.long)
    if (labels[:, 0] != IGNORE_INDEX).any():
        raise ValueError("token_batch: position 0 cannot carry a label (nothing has been read yet)")
    batch.extras["token_labels"] = labels[:, 1:]
    return batch


def token_loss_fn(config: RewardModelConfig) -> Loss:
    """ORM or PRM loss of a `token_batch` part: the head's per-position logits values[:, 1:] [b, T-1] against
    extras['token_labels'] (per-token BCE over the supervised positions)."""
    if config.objective not in ("orm", "prm"):
        raise ValueError(f"token_loss_fn: objective orm or prm, got {config.objective!r}")

    def token(out: ForwardOutput, batch: Batch):
        logits_BT = out.values[:, 1:]  # [b, T-1]
        labels_BT = batch.extras["token_labels"]
        if config.objective == "prm":
            return prm_loss(logits_BT, labels_BT)
        return (orm_loss if config.orm_form == "token" else orm_sequence_loss)(logits_BT, labels_BT)

    # ORM: a mean over the completion's tokens (= POLICY tokens, what "token" weighs parts by), or over sequences
    # (orm_form sequence); PRM: over steps, parts weighed by their rows (exact without micro-batches)
    token_level = config.objective == "orm" and config.orm_form == "token"
    return Loss(token, normalizer="token" if token_level else "sequence", values=True)


def train_token_reward_model(engine: Engine, examples: Sequence[Labelled], config: RewardModelConfig, pad_id: int,
                             run: Run | None = None) -> list[dict]:
    """Train the value head as an outcome (objective orm) or process (prm) reward model on labelled episodes
    (`outcome_labels`, `process_labels`); step s's episodes are a function of (seed, s)."""
    if not examples:
        raise ValueError("train_token_reward_model: no labelled episodes")
    run = run or Run("reward_model")
    full, loss = token_batch(examples, pad_id), token_loss_fn(config)
    start, _ = run.start(engine)
    for step in run.steps(start, config.steps):
        # 1. a batch of episodes, 2. BCE on their labelled positions, 3. update
        rows = batch_indices(len(examples), config.batch_size, config.seed, step)
        m = engine.forward_backward(full.select(rows), loss, buckets=config.length_buckets)
        o = engine.optim_step()
        # 4. log, evaluate, checkpoint
        run.end_step(engine, step + 1, train_row(m, o), eval_now=eval_due(step + 1, config.steps, config.eval_every))
    return run.history


def init_value_head_from_reward_model(policy: torch.nn.Module, reward_model: torch.nn.Module) -> None:
    """PPO's critic starts as the reward model (InstructGPT; Tulu 3; checklist 6.5 "initialization: from the reward
    model"): copy the reward model's scalar head (`.value`, a Linear: a `TinyTransformer(value_head=True)` or an
    `HFPolicy(value_head=True)`, trained by algorithms.reward_model) into the policy's, in place.

    The head reads the policy's own hidden states, so the policy's values equal the reward model's scores exactly
    where the two bodies agree (a reward model trained on top of this policy with its body frozen, or a policy that
    starts from the reward model's body); otherwise the copy is a warm start, as the SFT-body-plus-RM-head variant."""
    head, rm_head = getattr(policy, "value", None), getattr(reward_model, "value", None)
    if head is None or rm_head is None:
        raise ValueError("init_value_head_from_reward_model: both models need a value head (value_head=True)")
    if head.weight.shape != rm_head.weight.shape:
        raise ValueError(f"init_value_head_from_reward_model: the heads differ in shape ({tuple(head.weight.shape)} vs "
                         f"{tuple(rm_head.weight.shape)}): the reward model must share the policy's hidden size")
    with torch.no_grad():
        head.load_state_dict({k: v.to(head.weight.device, head.weight.dtype) for k, v in rm_head.state_dict().items()})
