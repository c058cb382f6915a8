"""Reinforcement learning with the policy-gradient family: REINFORCE, RLOO, GRPO, Dr. GRPO,
PPO (with a value head and GAE), GSPO, CISPO.

Source: the policy's own samples, `group_size` per task. Weight: an advantage
(DESIGN.md table). One step, top to bottom:

    1. sample   tasks_per_step tasks x group_size episodes (`source.take`), the trainable ones kept
    2. score    rewards -> advantages (group baseline, or GAE with the value head)
    3. update   epochs x minibatches of policy_gradient_loss (+ value loss); `source.after_update`
    4. log, evaluate every `eval_every` steps, checkpoint

The loop is synchronous whatever the source does. An overlapped source
(`trajtune.sources.overlap.Overlapped`: step s+1 sampled in a sampler process one update
behind while step s trains, as PipelineRL, prime-rl and verl's async trainers do) hands back
episodes whose sampling policy lagged by one update (`Episodes.behind`); the truncated
importance weight against the sampler's log-probs (`tis_cap`, required then) corrects the lag.

Episodes whose environment or reward failed (`Trajectory.outcome`) are counted
(rollout/infra_failures) and left out of the update and of their group's baseline: a group
of four with one failure has the advantages of the group of the three others.

The KL to the reference (kl/k3 per token, kl/sequence per episode) is logged whenever a reference
exists -- kl_coef > 0, or kl_coef 0 with a free one (a LoRA base) or `log_kl="copy"` (RLHF
checklist 0.7: always log KL-to-reference); the extra forward draws no random numbers.

Everything the loss needs lives in `trajtune.objectives`; this file only wires it. The
step's advantages, returns and old / reference log-probs travel on the batch
(`Batch.extras`), so the loss is a pure function of (forward output, batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, Sequence

import torch

from ..config import check_choices, check_ranges
from ..engine import Engine, ForwardOutput, Loss
from ..evaluation import informative_group_share
from ..metrics import register
from ..runs.loop import Run, eval_due
from ..objectives.advantages import gae, group_advantages, group_reward_range, place_at_last_action, whiten
from ..objectives.kl import kl_penalized_rewards, sequence_kl
from ..objectives.policy_gradient import policy_gradient_loss, value_loss
from ..sources.base import Draws, Episodes, Source
from ..trajectory import Batch, Trajectory, collate
from .common import rollout_metrics, train_row


@dataclass
class RLConfig:
    RENAMED: ClassVar[dict[str, str]] = {k: f"overlap.{k}" for k in (
        "max_staleness", "sampler_process", "sampler_threads", "sampler_timeout", "sync_tolerance")}
    """where a recipe's old keys went: where episodes are sampled is the source's business (sources.overlap)"""

    steps: int = 40
    """policy updates (one batch of fresh samples each)"""
    tasks_per_step: int = 8
    """tasks sampled per step (with replacement across steps, a function of (seed, step))"""
    group_size: int = 8
    """episodes per task; group baselines compare episodes of the same task"""
    advantage: Literal["reinforce", "rloo", "grpo", "dr_grpo", "gae", "none"] = "reinforce"
    """reinforce: R - group mean; rloo: leave-one-out mean; grpo: (R - mean)/std;
    dr_grpo: R - mean (use with aggregation='constant'); gae: value head + GAE (PPO);
    none: raw reward (the 0/1 policy gradient)"""
    surrogate: Literal["reinforce", "ppo", "cispo"] = "reinforce"
    """per-token objective: plain PG, PPO clipped ratio, or CISPO clipped stop-gradient weight"""
    ratio_level: Literal["token", "sequence"] = "token"
    """'sequence' gives GSPO's length-normalised sequence-level ratio"""
    epochs: int = 1
    """passes over each batch of samples (> 1 makes the ratio leave 1: PPO-style reuse)"""
    minibatches: int = 1
    """optimizer steps per epoch"""
    eps_low: float = 0.2
    """clip range below 1 for PPO/CISPO ratios"""
    eps_high: float = 0.2
    """clip range above 1"""
    kl_coef: float = 0.0
    """weight of KL(pi || ref); > 0 keeps a frozen copy of the starting policy as ref"""
    log_kl: Literal["auto", "copy", "off"] = "auto"
    """the KL to the reference is always logged (kl/k3 per token, kl/sequence per episode; RLHF book checklist 0.7),
    also with kl_coef 0, against -- auto: a LoRA model's base (adapters off: no copy), any other model a frozen copy of
    its starting policy (the weights once more in memory, one forward per step); copy: a frozen copy whatever the
    model; off: nothing when kl_coef is 0 (saves the copy's memory)"""
    kl_in_reward: bool = False
    """put the KL penalty into the rewards instead of the loss: per token for GAE (PPO style), the sequence KL
    subtracted from each episode's reward before the group baseline for the others (the book's RLOO)"""
    entropy_coef: float = 0.0
    """entropy bonus weight"""
    vf_coef: float = 0.5
    """value-loss weight (advantage='gae')"""
    value_clip: float = 0.0
    """value clipping range (0 disables)"""
    gamma: float = 1.0
    """discount for GAE"""
    lam: float = 0.95
    """GAE lambda"""
    whiten_advantages: bool = False
    """normalise advantages over the batch's POLICY tokens"""
    skip_zero_variance: bool = False
    """drop groups whose rewards are all equal (they carry no signal with a group baseline)"""
    aggregation: Literal["token", "sequence", "constant"] = "token"
    """loss aggregation (RLHF book, Loss Aggregation)"""
    aggregation_constant: float = 0.0
    """C for aggregation='constant' (e.g. the longest generation)"""
    tis_cap: float = 0.0
    """truncated importance sampling cap against the sampler's log-probs (0 disables); needed when the source samples
    behind the policy (an overlapped source: trajtune.sources.overlap)"""
    length_buckets: int = 1
    """forward each minibatch in this many groups of similar length, each without the padding it does not
    need (the same gradient up to float rounding; faster when episode lengths vary)"""
    eval_every: int = 0
    """evaluate every this many steps (0: only after the last)"""
    seed: int = 0
    """sampling and task order of step s are functions of (seed, s)"""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.group_size < 2 and self.advantage in ("reinforce", "rloo", "grpo", "dr_grpo"):
            raise ValueError(f"RLConfig: advantage={self.advantage!r} needs group_size >= 2 (got {self.group_size})")
        if self.steps < 0 or self.tasks_per_step < 1 or self.epochs < 1 or self.minibatches < 1:
            raise ValueError("RLConfig: steps >= 0, tasks_per_step, epochs and minibatches >= 1")
        if self.minibatches > self.tasks_per_step * self.group_size:
            raise ValueError(f"RLConfig: minibatches ({self.minibatches}) > episodes per step "
                             f"({self.tasks_per_step} x {self.group_size}): a minibatch would be empty")
        if self.aggregation == "constant" and self.aggregation_constant <= 0:
            raise ValueError("RLConfig: aggregation='constant' needs aggregation_constant > 0")
        reuse = [f"{name} {n}" for name, n in (("epochs", self.epochs), ("minibatches", self.minibatches)) if n > 1]
        if self.surrogate == "reinforce" and reuse:
            raise ValueError(f"RLConfig: {' and '.join(reuse)} updates the policy more than once per batch of samples, "
                             "and surrogate 'reinforce' has no importance ratio to correct for that (nor a trust "
                             "region): use surrogate ppo (or cispo), or one update per batch (epochs 1, minibatches 1)")
        check_ranges(self, "RLConfig", counts=("length_buckets",),
                     non_negative=("eps_low", "eps_high", "kl_coef", "vf_coef", "value_clip", "tis_cap", "eval_every"))
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
            raise ValueError(f"RLConfig: gamma and lam must be in [0, 1], got {self.gamma}, {self.lam}")


register("kl/sequence", "KL(pi || ref) per episode: the per-token estimate (kl/<estimator>) summed over the episode's "
         "POLICY tokens, mean over episodes (logged whenever a reference exists, kl_coef 0 included)")

BASELINES = {"reinforce": ("mean", False), "rloo": ("leave_one_out", False), "grpo": ("mean", True),
             "dr_grpo": ("mean", False), "none": ("none", False)}


def advantages_for(batch: Batch, config: RLConfig, values: torch.Tensor | None, ref_logp: torch.Tensor | None,
                   old_logp: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Advantages [B] (group baselines) or [B, T-1] (GAE), and GAE returns [B, T-1] or None.

    With kl_in_reward, a group advantage's rewards are R_i - kl_coef * KL_i, KL_i the sequence KL (k1 summed over
    the completion's POLICY tokens, pi_old against the reference) folded in *before* the baseline, as the book's
    RLOO (ch.6.3, 6.15: "aggregates" the per-token KL; a sum, erratum E12); GAE gets it per token."""
    if config.advantage != "gae":
        baseline, std = BASELINES[config.advantage]
        rewards = batch.rewards  # [B]
        if config.kl_coef and config.kl_in_reward:
            assert old_logp is not None and ref_logp is not None
            rewards = rewards - config.kl_coef * sequence_kl(old_logp, ref_logp, batch.action_mask, "k1", "sum")
        return group_advantages(rewards, batch.groups, baseline=baseline, std_normalize=std), None
    mask = batch.action_mask
    if config.kl_coef and config.kl_in_reward:
        token_rewards = kl_penalized_rewards(batch.rewards, old_logp, ref_logp, mask, config.kl_coef)
    else:
        token_rewards = place_at_last_action(batch.rewards, mask)
    return gae(token_rewards, values, mask, config.gamma, config.lam)


def rl_loss(config: RLConfig, use_old: bool) -> Loss:
    """The policy-gradient loss (+ value loss) of a minibatch; reads the step's tensors from `batch.extras`:
    advantages [B] or [B, T-1], old_logp / ref_logp [B, T-1], and for GAE returns, old_values [B, T-1]."""
    kl_loss_coef = config.kl_coef if not config.kl_in_reward else 0.0  # the KL is logged whenever ref_logp is there
    constant = config.aggregation_constant or None

    def pg(out: ForwardOutput, batch: Batch):
        x, mask = batch.extras, batch.action_mask
        entropy = out.entropy if config.entropy_coef else None
        loss, metrics = policy_gradient_loss(
            out.logprobs, x["advantages"], mask, x["old_logp"] if use_old else None,
            surrogate=config.surrogate, ratio_level=config.ratio_level, eps_low=config.eps_low, eps_high=config.eps_high,
            sampler_logp=batch.old_logprobs if config.tis_cap else None, tis_cap=config.tis_cap or None,
            ref_logp=x.get("ref_logp"), kl_coef=kl_loss_coef,
            entropy=entropy, entropy_coef=config.entropy_coef,
            aggregation=config.aggregation, constant=constant,
        )
        if "returns" in x:
            vloss, vm = value_loss(out.values[:, :-1], x["returns"], mask, x["old_values"],
                                   config.value_clip or None, config.aggregation, constant)
            loss = loss + config.vf_coef * vloss
            metrics.update(vm)
        return loss, metrics

    return Loss(pg, normalizer=config.aggregation, values=config.advantage == "gae", entropy=bool(config.entropy_coef))


def score(engine: Engine, ref: Engine | None, batch: Batch, config: RLConfig, use_old: bool) -> Batch:
    """Step 2: the batch with its advantages (and the old / reference log-probs and GAE returns the
    loss reads) in `extras`. pi_old's forward runs only when something reads it: one on-policy
    REINFORCE step never does, and skipping it saves a quarter of the step."""
    use_values = config.advantage == "gae"
    # both read only at the POLICY tokens (the loss, the KL reward): the output layer runs only there
    reads_old = use_old or use_values or config.kl_in_reward
    old = engine.forward(batch, values=use_values, positions="actions") if reads_old else None
    old_logp = old.logprobs if old is not None else None
    ref_logp = ref.forward(batch, positions="actions").logprobs if ref is not None else None
    old_values = old.values[:, :-1] if use_values else None
    advantages, returns = advantages_for(batch, config, old_values, ref_logp, old_logp)
    if config.whiten_advantages:
        advantages = whiten(advantages if advantages.dim() == 2 else
                            advantages[:, None].expand_as(batch.action_mask).contiguous(), batch.action_mask)
    extras = {"advantages": advantages, "old_logp": old_logp, "ref_logp": ref_logp, "returns": returns,
              "old_values": old_values}
    return batch.with_extras(**{k: v for k, v in extras.items() if v is not None})


def train_rl(engine: Engine, tasks: Sequence, source: Source, config: RLConfig, pad_id: int,
             run: Run | None = None) -> list[dict]:
    """Run `config.steps` policy-gradient updates on `source`'s episodes; returns the logged rows.

    Resumes exactly with a checkpointer on `run` (step s draws with a generator seeded from (seed, s);
    the KL reference is the stage's starting policy, saved once; episodes an overlapped source drew
    ahead are saved with the checkpoint and trained on after the resume)."""
    run = run or Run("rl")
    start, _ = run.start(engine, source=source)
    ref = reference_for(engine, run, start, config)  # the frozen starting policy, or None
    use_old = config.epochs > 1 or config.minibatches > 1 or config.surrogate != "reinforce"
    loss = rl_loss(config, use_old)
    draws = Draws(tasks, config.group_size, config.seed, config.steps, per_step=config.tasks_per_step)
    for step in run.steps(start, config.steps):
        # 1. sample: the step's episodes (a source that samples ahead starts the next step's now)
        episodes = source.take(draws(step), ahead=draws(step + 1))
        check_lag(episodes, config)
        row = {**rollout_metrics(episodes.trajs), **episodes.metrics}
        trajs = episodes.trainable
        row["rollout/no_signal_share"] = no_signal_share(trajs)
        if config.skip_zero_variance:
            trajs = drop_zero_variance_groups(trajs)
        row["train/kept_episodes"] = float(len(trajs))
        if trajs:  # none: every group had equal rewards (or failed), nothing to learn from this step
            # 2. score: rewards -> advantages, on the batch
            batch = score(engine, ref, collate(trajs, pad_id), config, use_old)
            run.record_episodes(engine, step + 1, trajs, batch)  # a few episodes for `trajtune view`
            # 3. update
            for epoch in range(config.epochs):
                order = torch.randperm(batch.size, generator=episodes.generator)
                for chunk in order.chunk(config.minibatches):
                    m = engine.forward_backward(batch.select(chunk), loss, buckets=config.length_buckets)
                    o = engine.optim_step()
            row.update({**train_row(m, o), "train/tokens": float(batch.action_mask.sum())})
        row.update(source.after_update(engine))
        # 4. log (the last minibatch's loss statistics), evaluate, checkpoint
        run.end_step(engine, step + 1, row, eval_now=eval_due(step + 1, config.steps, config.eval_every))
    return run.history


def reference_for(engine: Engine, run: Run, start: int, config: RLConfig) -> Engine | None:
    """The KL reference: the stage's starting policy, frozen (`run.reference`: saved with the stage's checkpoint) --
    for the loss (kl_coef > 0), or only for the log (`log_kl`: auto / copy); with log_kl "auto" a LoRA model's
    base with its adapters off instead (no copy of the weights); None with kl_coef 0 and log_kl "off"."""
    if config.kl_coef or config.log_kl == "copy":
        return run.reference(engine, start)
    if config.log_kl == "off":
        return None
    if getattr(getattr(engine, "model", None), "is_lora", False):
        return engine.reference_engine(adapters_off=True)
    return run.reference(engine, start)


def check_lag(episodes: Episodes, config: RLConfig) -> None:
    """Episodes sampled behind the policy need the truncated importance weight against the sampler's log-probs."""
    if episodes.behind and not config.tis_cap:
        raise ValueError(f"RLConfig: step {episodes.step}'s episodes were sampled {episodes.behind} update(s) behind the "
                         "policy (an overlapped source, max_staleness 1); set tis_cap (e.g. 2.0) so the truncated "
                         "importance weight against the sampler's log-probs corrects the lag")


def no_signal_share(trajs: list[Trajectory]) -> float:
    """Share of the step's groups whose rewards are all equal: a group baseline gets no signal from them (the
    share DAPO's dynamic sampling refills; REPRODUCE B6)."""
    if not trajs:
        return 0.0
    return 1.0 - informative_group_share(torch.tensor([t.reward for t in trajs]), torch.tensor([t.group for t in trajs]))


def drop_zero_variance_groups(trajs: list[Trajectory]) -> list[Trajectory]:
    """Keep the episodes of groups whose rewards differ (the 'informative' groups)."""
    rewards = torch.tensor([t.reward for t in trajs])
    groups = torch.tensor([t.group for t in trajs])
    spread, index = group_reward_range(rewards, groups)
    return [t for t, s in zip(trajs, spread[index].tolist(), strict=True) if s > 0]

