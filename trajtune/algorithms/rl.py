"""Reinforcement learning with the policy-gradient family: REINFORCE (group, batch-mean or moving-average
baseline), RLOO, GRPO, Dr. GRPO, PPO (with a value head and GAE), GSPO, CISPO, TOPR; DAPO's pieces
(clip-higher, dynamic sampling that refills the batch, token-level loss, the overlong penalty and filter);
InstructGPT's adaptive KL controller and PPO-ptx; a teacher's per-token log-ratio added to the advantage (on-policy
distillation, book ch.12) (docs/policy_gradients.md).

Source: the policy's own samples, `group_size` per task. Weight: an advantage
(DESIGN.md table). One step, top to bottom:

    1. sample   tasks_per_step tasks x group_size episodes (`source.take`), the trainable ones kept
                (dynamic sampling: the source wrapped in `sources.refill.Refilling`, more draws until
                tasks_per_step groups carry signal; the first tasks_per_step of those are kept)
    2. score    rewards (+ overlong penalty, scaled) -> advantages (a baseline, or GAE with the value head)
                (+ opd_coef x the teacher's per-token log-ratio: on-policy distillation as reward shaping)
    3. update   epochs x minibatches of policy_gradient_loss (+ value loss, + ptx_coef x pretraining NLL);
                `source.after_update`; the adaptive KL controller's next coefficient
    4. log, evaluate every `eval_every` steps, checkpoint (with the loop's state: `RLState`)

The loop is synchronous whatever the source does. An overlapped source
(`trajtune.sources.overlap.Overlapped`: step s+1 sampled in a sampler process one update
behind while step s trains, as PipelineRL, prime-rl and verl's async trainers do) hands back
episodes whose sampling policy lagged by one update (`Episodes.behind`); the truncated
importance weight against the sampler's log-probs (`tis_cap`, required then) corrects the lag.

Episodes whose environment or reward failed (`Trajectory.outcome`) are counted
(rollout/infra_failures) and left out of the update and of their group's baseline: a group
of four with one failure has the advantages of the group of the three others.

The KL to the reference (kl/k3 per token, kl/sequence per episode) is logged whenever a reference
exists (RLHF checklist 0.7: always log KL-to-reference) -- every step with kl_coef > 0, a free one (a
LoRA base) or `log_kl="copy"`; with kl_coef 0 on any other model at the logging steps against the
starting weights read back from disk (`StartingWeights`: no resident copy); the extra forward draws
no random numbers.

Everything the loss needs lives in `trajtune.objectives`; this file only wires it. The
step's advantages, returns and old / reference log-probs travel on the batch
(`Batch.pg`: `objectives.inputs.PGInputs`), so the loss is a pure function of (forward output, batch).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Literal, Sequence

import torch

from ..config import check_choices, check_ranges
from ..engine import Engine, ForwardOutput, Loss
from ..evaluation import informative_group_share
from ..logprobs import masked_mean
from ..runs.loop import Run, eval_due
from ..objectives.advantages import (gae, minmax_scale, moving_average_baseline, overlong_penalty, place_at_last_action,
                                     sequence_advantages, whiten)
from ..objectives.corrections import Correction, active_correction, band_of, check_correction
from ..objectives.distill import with_distill_advantages
from ..objectives.kl import adaptive_kl_coef, kl_penalized_rewards, sequence_kl
from ..objectives.inputs import PGInputs, PGOptions
from ..objectives.policy_gradient import policy_gradient_loss, value_loss
from ..seeding import derive
from ..sources.base import Draws, Episodes, Source
from ..sources.refill import Refilling, informative_groups
from ..trajectory import Batch, Trajectory, collate, tool_call_mask
from .common import rollout_metrics, train_row
from .reference import StartingWeights, reference_at, reference_for
from .sft import batch_indices, sft_loss_fn


@dataclass
class RLConfig:
    RENAMED: ClassVar[dict[str, str]] = {k: f"sampling.{k}" for k in (
        "max_staleness", "sampler_process", "sampler_threads", "sampler_timeout", "sync_tolerance")}
    """where a recipe's old keys went: where episodes are sampled is the source's business (sources.sampling)"""

    steps: int = 40
    """policy updates (one batch of fresh samples each)"""
    tasks_per_step: int = 8
    """tasks sampled per step (with replacement across steps, a function of (seed, step))"""
    group_size: int = 8
    """episodes per task; group baselines compare episodes of the same task"""
    advantage: Literal["reinforce", "rloo", "grpo", "dr_grpo", "gae", "none", "batch", "moving_average",
                       "maxrl"] = "reinforce"
    """reinforce: R - group mean; rloo: leave-one-out mean; grpo: (R - mean)/std;
    dr_grpo: R - mean (use with aggregation='constant'); gae: value head + GAE (PPO);
    none: raw reward (the 0/1 policy gradient); batch: R - the step's mean reward (REINFORCE's batch-mean
    baseline, checklist 6.2); moving_average: R - b, b a moving average of past steps' mean rewards
    (baseline_decay; saved with the checkpoint); maxrl: (R - mean) / mean within the group, 0 where the mean is 0
    (MaxRL, the book's companion code, for binary rewards)"""
    baseline_decay: float = 0.9
    """advantage='moving_average': b <- decay b + (1 - decay) mean(R) after each step (the first step's b is its own
    mean)"""
    unbiased_std: bool = True
    """advantage='grpo': divide by the group's unbiased std (torch's .std(), the book's code) or, False, the biased
    one (the formula's std; erratum E7)"""
    std_eps: float = 1e-4
    """advantage='grpo': A = (R - mean) / (std + std_eps) (the book's code: 1e-4; erratum E7)"""
    surrogate: Literal["reinforce", "ppo", "cispo", "topr", "sapo"] = "reinforce"
    """per-token objective: plain PG, PPO clipped ratio, CISPO clipped stop-gradient weight, or TOPR (REINFORCE with
    the sequence ratio clipped to [0, 1] on negative-advantage episodes only; checklist 6.11), or SAPO (a smooth gate
    sigmoid(t (rho - 1)) 4 / t in place of PPO's clip: sapo_tau_pos / sapo_tau_neg)"""
    sapo_tau_pos: float = 1.0
    """SAPO: the gate's temperature on tokens of positive advantage (the companion code's 1.0)"""
    sapo_tau_neg: float = 1.05
    """SAPO: the gate's temperature on tokens of zero or negative advantage (the companion code's 1.05)"""
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
    """weight of KL(pi || ref); > 0 keeps a frozen copy of the starting policy as ref (the starting coefficient when
    kl_target is set)"""
    kl_target: float = 0.0
    """adaptive KL controller (Ziegler et al. 2019, InstructGPT): each step moves kl_coef toward the coefficient
    that holds the mean sequence KL (k1 summed over an episode) at this target; 0: a fixed kl_coef"""
    kl_horizon: float = 10000.0
    """the adaptive controller's horizon: kl_coef *= 1 + clip(KL / kl_target - 1, +-0.2) x episodes / kl_horizon"""
    log_kl: Literal["auto", "disk", "copy", "off"] = "auto"
    """the KL to the reference is logged also with kl_coef 0 (kl/k3 per token, kl/sequence per episode; RLHF book
    checklist 0.7), against the stage's starting policy. What each setting costs (kl_coef > 0 runs the reference's
    forward every step whatever this says, the loss needs it: a LoRA model's base, any other model a frozen copy) --
    auto: the cheapest that exists: kl_coef > 0's reference, a LoRA model's base (adapters off: one forward per step,
    no copy), any other model 'disk'; disk: the
    starting weights written to disk once (the stage's resume folder, else a temporary one), read back and swapped
    into the policy for one forward at every log_kl_every-th step and the last (no resident copy; at those steps
    the disk read, the weights once more while no gradients are held, one forward); copy: a frozen copy in memory
    (the weights once more, one forward every step: the KL every step); off: nothing when kl_coef is 0"""
    log_kl_every: int = 10
    """log_kl 'disk' (auto's choice for a full model with kl_coef 0): the KL is logged every this many steps and
    at the last step"""
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
    dynamic_sampling_tries: int = 0
    """DAPO's dynamic sampling: up to this many further draws of tasks_per_step tasks (each a function of
    (seed, step, try)) until the step has tasks_per_step groups whose rewards differ, the others dropped; the
    step trains on what it has when the tries run out (0: off; the source then samples synchronously)"""
    reward_scaling: Literal["none", "minmax", "whiten"] = "none"
    """before the advantage, the step's rewards (after the overlong penalty) scaled to [0, 1] (minmax: over the
    batch) or whitened (mean 0, std 1 over the batch); checklist 6.16"""
    overlong_max: int = 0
    """DAPO's overlong soft penalty: L_max in generated (POLICY) tokens; an episode longer than L_max - overlong_cache
    gets a penalty ramping linearly to -1 at L_max added to its reward (0: off)"""
    overlong_cache: int = 0
    """the penalty's ramp L_cache in tokens (1 <= overlong_cache <= overlong_max)"""
    overlong_filter: bool = False
    """DAPO's overlong filtering: episodes cut off by the token budget (an action without its stop token,
    `Trajectory.truncated`) are left out of the loss (their rewards still count in their group's baseline)"""
    train_tool_calls: bool = True
    """train on the policy's tool calls: the POLICY tokens of a turn the environment answered with a tool result
    (TOOL tokens in the same turn). False leaves them out of the loss, so only answers (turns without a tool result)
    are trained -- the book's figure masks calls and outputs, its text only outputs (erratum E8); tool outputs are
    never trained"""
    ptx_coef: float = 0.0
    """PPO-ptx (InstructGPT; book ch.15): add ptx_coef x the NLL of a batch of pretraining text to every update
    (the pretraining trajectories are given to train_rl; 0: off)"""
    ptx_batch_size: int = 8
    """pretraining sequences per update for ptx_coef > 0 (drawn with a generator seeded by (seed, step))"""
    opd_coef: float = 0.0
    """on-policy distillation added to the advantage (RLHF book ch.12, checklist 12.7): every POLICY token's advantage
    gets opd_coef x (log pi_T(a_t) - log pi(a_t)), the teacher's log-ratio of the sampled token (a per-token
    reverse-KL reward, no gradient through it); the frozen teacher, sharing the policy's tokenizer, is given to
    train_rl (`teacher`); 0: off"""
    aggregation: Literal["token", "sequence", "constant"] = "token"
    """loss aggregation (RLHF book, Loss Aggregation)"""
    aggregation_constant: float = 0.0
    """C for aggregation='constant' (e.g. the longest generation)"""
    tis_cap: float = 0.0
    """C of the truncated IS weight against the sampler's log-probs (0: unset); alone it selects correction tis"""
    correction: Correction = "none"
    """the mismatch correction against the sampler (objectives.corrections; needed when sampling behind): tis, tis_seq,
    decoupled (cap tis_cap), mis_token, mis_seq, mis_geo, mis_veto, icepop (band correction_low..correction_high)"""
    correction_low: float = 0.0
    """lower bound of the mis_* / icepop band (both 0: the correction's default band)"""
    correction_high: float = 0.0
    """upper bound of the mis_* / icepop band"""
    length_buckets: int = 1
    """forward each minibatch in this many groups of similar length, each without the padding it does not
    need (the same gradient up to float rounding; faster when episode lengths vary)"""
    eval_every: int = 0
    """evaluate every this many steps (0: only after the last)"""
    seed: int = 0
    """sampling and task order of step s are functions of (seed, s)"""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.group_size < 2 and self.advantage in ("reinforce", "rloo", "grpo", "dr_grpo", "maxrl"):
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
        check_ranges(self, "RLConfig", counts=("length_buckets", "ptx_batch_size", "log_kl_every"),
                     positive=("kl_horizon", "sapo_tau_pos", "sapo_tau_neg"),
                     non_negative=("eps_low", "eps_high", "kl_coef", "vf_coef", "value_clip", "tis_cap", "eval_every",
                                   "correction_low", "correction_high",
                                   "std_eps", "kl_target", "dynamic_sampling_tries", "overlong_max", "overlong_cache",
                                   "ptx_coef", "opd_coef"))
        self._check_new_options()
        check_correction(active_correction(self.correction, self.tis_cap), self.tis_cap or None, band_of(
            self.correction_low, self.correction_high), "RLConfig", surrogate=self.surrogate)
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
            raise ValueError(f"RLConfig: gamma and lam must be in [0, 1], got {self.gamma}, {self.lam}")

    def _check_new_options(self) -> None:
        """Issue 31's options: baselines, the adaptive KL controller, DAPO's overlong pieces, TOPR."""
        if not 0 <= self.baseline_decay < 1:
            raise ValueError(f"RLConfig: baseline_decay must be in [0, 1), got {self.baseline_decay}")
        if self.kl_target and not self.kl_coef:
            raise ValueError("RLConfig: kl_target (the adaptive KL controller) needs kl_coef > 0 to start from")
        if self.overlong_max and not 1 <= self.overlong_cache <= self.overlong_max:
            raise ValueError(f"RLConfig: overlong_max {self.overlong_max} needs 1 <= overlong_cache <= overlong_max, "
                             f"got overlong_cache {self.overlong_cache}")
        if self.overlong_cache and not self.overlong_max:
            raise ValueError("RLConfig: overlong_cache is the ramp of the overlong penalty; set overlong_max too")
        if self.surrogate == "topr" and self.ratio_level != "token":
            raise ValueError("RLConfig: surrogate 'topr' builds its own sequence ratio; use ratio_level 'token'")
        if self.dynamic_sampling_tries and self.advantage in ("gae", "none", "batch", "moving_average"):
            raise ValueError("RLConfig: dynamic_sampling_tries refills groups whose rewards differ, which only a "
                             f"group baseline needs; advantage {self.advantage!r} has none")


PTX_STREAM = 999_999
"""seeding.derive(seed, PTX_STREAM): the seed of the pretraining batches (PPO-ptx), apart from the sampling's"""


@dataclass
class RLState:
    """What the loop carries from step to step besides the weights (saved with every checkpoint: exact resume)."""

    kl_coef: float | None = None
    """the adaptive KL controller's coefficient for the next step (None: RLConfig.kl_coef)"""
    baseline: float | None = None
    """the moving-average baseline for the next step (None: no step yet)"""


def shaped_rewards(batch: Batch, config: RLConfig) -> torch.Tensor:
    """The step's rewards [B] as the advantage sees them: + DAPO's overlong penalty on the episode's POLICY tokens
    (overlong_max), then scaled to [0, 1] or whitened over the batch (reward_scaling)."""
    rewards = batch.rewards.float()  # [B]
    if config.overlong_max:
        lengths = batch.action_mask.sum(-1)  # [B] generated tokens
        rewards = rewards + overlong_penalty(lengths, config.overlong_max, config.overlong_cache)
    if config.reward_scaling == "minmax":
        rewards = minmax_scale(rewards)
    elif config.reward_scaling == "whiten":
        rewards = whiten(rewards)
    return rewards


def step_rewards(batch: Batch, config: RLConfig, ref_logp: torch.Tensor | None, old_logp: torch.Tensor | None,
                 kl_coef: float) -> torch.Tensor:
    """The rewards [B] a sequence-level baseline compares: `shaped_rewards`, minus kl_coef x the sequence KL with
    kl_in_reward (k1 summed over the completion's POLICY tokens, pi_old against the reference: the book's RLOO,
    ch.6.3 and 6.15 "aggregates" the per-token KL -- a sum, erratum E12)."""
    rewards = shaped_rewards(batch, config)
    if kl_coef and config.kl_in_reward:
        assert old_logp is not None and ref_logp is not None
        rewards = rewards - kl_coef * sequence_kl(old_logp, ref_logp, batch.action_mask, "k1", "sum")
    return rewards


def advantages_for(batch: Batch, config: RLConfig, values: torch.Tensor | None, ref_logp: torch.Tensor | None,
                   old_logp: torch.Tensor | None, *, kl_coef: float | None = None,
                   baseline: float | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Advantages [B] (sequence-level baselines) or [B, T-1] (GAE), and GAE returns [B, T-1] or None.

    kl_coef: the step's coefficient (None: config.kl_coef). baseline: advantage='moving_average''s b (None: the
    batch mean). With kl_in_reward a sequence-level advantage's rewards are `step_rewards` (the KL folded in
    *before* the baseline); GAE gets it per token."""
    kl_coef = config.kl_coef if kl_coef is None else kl_coef
    if config.advantage != "gae":
        rewards = step_rewards(batch, config, ref_logp, old_logp, kl_coef)  # [B]
        return sequence_advantages(rewards, batch.groups, config.advantage, config.std_eps, config.unbiased_std,
                                   baseline), None
    mask = batch.action_mask
    rewards = shaped_rewards(batch, config)
    if kl_coef and config.kl_in_reward:
        token_rewards = kl_penalized_rewards(rewards, old_logp, ref_logp, mask, kl_coef)
    else:
        token_rewards = place_at_last_action(rewards, mask)
    return gae(token_rewards, values, mask, config.gamma, config.lam)


def rl_loss(config: RLConfig, use_old: bool, kl_coef: float | None = None) -> Loss:
    """The policy-gradient loss (+ value loss) of a minibatch; reads the step's tensors from `batch.pg`
    (`PGInputs`: advantages [B] or [B, T-1], old_logp / ref_logp [B, T-1], and for GAE returns, old_values [B, T-1])
    and the sampler's log-probs (the mismatch correction) from `batch.old_logprobs`. kl_coef: the step's coefficient
    (None: config.kl_coef; the adaptive controller passes its own)."""
    options = pg_options(config, config.kl_coef if kl_coef is None else kl_coef)

    def pg(out: ForwardOutput, batch: Batch):
        x, mask = batch.pg, batch.action_mask
        assert x is not None, "rl_loss reads batch.pg (`score`)"
        entropy = out.entropy if config.entropy_coef else None
        inputs = replace(x, old_logp=x.old_logp if use_old else None,  # the sampler's: the batch's own
                         sampler_logp=batch.old_logprobs if options.active_correction != "none" else None)
        loss, metrics = policy_gradient_loss(out.logprobs, mask, inputs, options, entropy)
        if x.returns is not None:
            vloss, vm = value_loss(out.values[:, :-1], x.returns, mask, x.old_values,
                                   config.value_clip or None, config.aggregation, options.constant)
            loss = loss + config.vf_coef * vloss
            metrics.update(vm)
        return loss, metrics

    return Loss(pg, normalizer=config.aggregation, values=config.advantage == "gae", entropy=bool(config.entropy_coef))


def pg_options(config: RLConfig, kl_coef: float) -> PGOptions:
    """The loss's settings for a step with KL coefficient `kl_coef` (the KL enters the loss unless kl_in_reward;
    it is logged whenever ref_logp is there)."""
    return PGOptions(surrogate=config.surrogate, ratio_level=config.ratio_level, eps_low=config.eps_low,
                     eps_high=config.eps_high, correction=config.correction, tis_cap=config.tis_cap or None,
                     correction_band=band_of(config.correction_low, config.correction_high),
                     kl_coef=kl_coef if not config.kl_in_reward else 0.0, entropy_coef=config.entropy_coef,
                     aggregation=config.aggregation, constant=config.aggregation_constant or None,
                     sapo_tau=(config.sapo_tau_pos, config.sapo_tau_neg))


def score(engine: Engine, ref: Engine | StartingWeights | None, batch: Batch, config: RLConfig, use_old: bool,
          state: RLState | None = None, teacher: Engine | None = None) -> tuple[Batch, dict]:
    """Step 2: the batch with its advantages (and the old / reference log-probs and GAE returns the
    loss reads) in `pg` (`PGInputs`), and the step's scoring metrics (the moving baseline, the measured KL the
    adaptive controller reads, the overlong counts, kl/teacher). pi_old's forward runs only when something reads
    it: one on-policy REINFORCE step never does, and skipping it saves a quarter of the step. With opd_coef the
    teacher's log-ratio against pi_old is added to every POLICY token's advantage (`with_distill_advantages`)."""
    state = state or RLState()
    kl_coef = config.kl_coef if state.kl_coef is None else state.kl_coef
    use_values = config.advantage == "gae"
    # both read only at the POLICY tokens (the loss, the KL reward): the output layer runs only there
    reads_old = use_old or use_values or config.kl_in_reward or bool(config.kl_target) or bool(config.opd_coef)
    old = engine.forward(batch, values=use_values, positions="actions") if reads_old else None
    old_logp = old.logprobs if old is not None else None
    ref_logp = ref.forward(batch, positions="actions").logprobs if ref is not None else None
    old_values = old.values[:, :-1] if use_values else None
    metrics: dict[str, float] = {}
    baseline = None
    if config.advantage == "moving_average":
        baseline, metrics["next_baseline"] = moving_average_baseline(
            state.baseline, step_rewards(batch, config, ref_logp, old_logp, kl_coef), config.baseline_decay)
        metrics["rollout/baseline"] = baseline
    if config.overlong_max:
        lengths = batch.action_mask.sum(-1)
        metrics["rollout/overlong_penalty"] = float(
            overlong_penalty(lengths, config.overlong_max, config.overlong_cache).mean())
    if config.kl_target:  # the KL the controller reads: k1 summed over each episode, pi_old against the reference
        assert ref_logp is not None and old_logp is not None
        metrics["measured_kl"] = float(sequence_kl(old_logp, ref_logp, batch.action_mask, "k1", "sum").mean())
    advantages, returns = advantages_for(batch, config, old_values, ref_logp, old_logp, kl_coef=kl_coef,
                                         baseline=baseline)
    if config.opd_coef:  # on-policy distillation: + opd_coef x (log pi_T - log pi_old) on every POLICY token
        assert teacher is not None and old_logp is not None
        teacher_logp = teacher.forward(batch, positions="actions").logprobs  # [B, T-1]
        advantages = with_distill_advantages(advantages, old_logp, teacher_logp, batch.action_mask, config.opd_coef)
        metrics["kl/teacher"] = float(masked_mean(old_logp - teacher_logp, batch.action_mask))
    # what leaves the loss (after the rewards, lengths and advantages saw every POLICY token)
    if config.overlong_filter:  # DAPO: truncated episodes, whose rewards still entered their group's baseline
        cut = batch.truncated  # [B]
        metrics["rollout/overlong_filtered"] = float(cut.sum())
        batch = replace(batch, action_mask=batch.action_mask * (~cut)[:, None].to(batch.action_mask.dtype))
    if not config.train_tool_calls:  # erratum E8: the policy's tool calls too, not only the tool outputs
        batch = replace(batch, action_mask=batch.action_mask * (1 - tool_call_mask(batch)))
    if config.whiten_advantages:
        advantages = whiten(advantages if advantages.dim() == 2 else
                            advantages[:, None].expand_as(batch.action_mask).contiguous(), batch.action_mask)
    inputs = PGInputs(advantages, old_logp=old_logp, ref_logp=ref_logp, returns=returns, old_values=old_values)
    return replace(batch, pg=inputs), metrics


def train_rl(engine: Engine, tasks: Sequence, source: Source, config: RLConfig, pad_id: int,
             run: Run | None = None, ptx: Sequence[Trajectory] | None = None,
             teacher: Engine | None = None) -> list[dict]:
    """Run `config.steps` policy-gradient updates on `source`'s episodes; returns the logged rows.

    ptx: the pretraining text of PPO-ptx (config.ptx_coef > 0), as trajectories whose tokens to fit are POLICY.
    teacher: the frozen teacher of on-policy distillation (config.opd_coef > 0; e.g. make_engine(model,
    frozen=True)), with the policy's tokenizer.

    Resumes exactly with a checkpointer on `run` (step s draws with a generator seeded from (seed, s), its
    refills from (seed, s, try); the KL reference is the stage's starting policy, saved once; the adaptive KL
    coefficient and the moving baseline are saved with each checkpoint (`RLState`); episodes an overlapped
    source drew ahead are saved with the checkpoint and trained on after the resume)."""
    if config.ptx_coef and not ptx:
        raise ValueError("RLConfig: ptx_coef > 0 needs pretraining trajectories (train_rl's `ptx`)")
    if bool(config.opd_coef) != (teacher is not None):
        raise ValueError(f"RLConfig: opd_coef and a teacher (train_rl's `teacher`) go together; got opd_coef "
                         f"{config.opd_coef} and {'a' if teacher is not None else 'no'} teacher")
    run = run or Run("rl")
    if config.dynamic_sampling_tries:  # DAPO: more draws until tasks_per_step groups carry signal
        source = Refilling(source, tasks, config.dynamic_sampling_tries, config.seed)
    start, state = run.start(engine, RLState(), source)
    ref = reference_for(engine, run, start, config)  # the frozen starting policy, or None
    use_old = config.epochs > 1 or config.minibatches > 1 or config.surrogate != "reinforce"
    draws = Draws(tasks, config.group_size, config.seed, config.steps, per_step=config.tasks_per_step)
    for step in run.steps(start, config.steps):
        kl_coef = config.kl_coef if state.kl_coef is None else state.kl_coef
        loss = rl_loss(config, use_old, kl_coef)
        # 1. sample: the step's episodes (a source that samples ahead starts the next step's now)
        episodes = source.take(draws(step), ahead=draws)
        check_lag(episodes, config)
        row = {**rollout_metrics(episodes.trajs), **episodes.metrics}
        trajs = episodes.trainable
        row["rollout/no_signal_share"] = no_signal_share(trajs)
        if config.dynamic_sampling_tries or config.skip_zero_variance:  # the groups a baseline gets a signal from
            trajs = informative_groups(trajs, config.tasks_per_step if config.dynamic_sampling_tries else None)
        row["train/kept_episodes"] = float(len(trajs))
        if config.kl_target:
            row["kl/coef"] = kl_coef
        if trajs:  # none: every group had equal rewards (or failed), nothing to learn from this step
            # 2. score: rewards -> advantages, on the batch
            batch, scored = score(engine, reference_at(ref, step + 1), collate(trajs, pad_id), config, use_old, state,
                                  teacher)
            if bool((batch.versions >= 0).any()):  # sampled behind (an overlapped source): cut shares by lag
                batch = replace(batch, pg=replace(batch.pg, staleness=batch.staleness(step)))
            run.record_episodes(engine, step + 1, trajs, batch)  # a few episodes for `trajtune view`
            # 3. update (PPO-ptx: + ptx_coef x the NLL of a pretraining batch, before each optimizer step)
            for epoch in range(config.epochs):
                order = torch.randperm(batch.size, generator=episodes.generator)
                for k, chunk in enumerate(order.chunk(config.minibatches)):
                    part = batch.select(chunk)
                    m = engine.forward_backward(part, loss, buckets=config.length_buckets)
                    if config.ptx_coef:
                        update = (step * config.epochs + epoch) * config.minibatches + k
                        row["train/ptx_loss"] = ptx_update(engine, ptx, config, pad_id, update)
                    o = engine.optim_step()
            row.update({**train_row(m, o), "train/tokens": float(batch.action_mask.sum())})
            if "kl/k3" in m:  # per episode: the token mean (exact however the engine split the rows) x tokens/episode
                row["kl/sequence"] = m["kl/k3"] * float(part.action_mask.sum()) / part.size
            state = next_state(state, scored, config, kl_coef, len(trajs), row)
        row.update(source.after_update(engine))
        # 4. log (the last minibatch's loss statistics), evaluate, checkpoint
        run.end_step(engine, step + 1, row, eval_now=eval_due(step + 1, config.steps, config.eval_every), state=state)
    return run.history


def next_state(state: RLState, scored: dict, config: RLConfig, kl_coef: float, n: int, row: dict) -> RLState:
    """The loop state for the next step: the adaptive KL coefficient moved by the step's measured KL over its `n`
    episodes (`objectives.kl.adaptive_kl_coef`), the moving baseline updated with the step's rewards; the step's
    row gets the measured KL the controller read (kl/controller_kl)."""
    if config.kl_target:
        row["kl/controller_kl"] = scored["measured_kl"]
        kl_coef = adaptive_kl_coef(kl_coef, scored["measured_kl"], config.kl_target, config.kl_horizon, n)
    baseline = scored.get("next_baseline", state.baseline)
    row.update({k: v for k, v in scored.items() if "/" in k})  # the metrics (not next_baseline, measured_kl)
    return RLState(kl_coef=kl_coef if config.kl_target else None, baseline=baseline)



def ptx_update(engine: Engine, ptx: Sequence[Trajectory], config: RLConfig, pad_id: int, update: int) -> float:
    """PPO-ptx (InstructGPT, RLHF book ch.15 "pretraining gradients"; checklist 15.3): accumulate ptx_coef x the
    token-mean NLL of `ptx_batch_size` pretraining trajectories (POLICY tokens are fitted), the batch a pure function
    of (seed, update); the caller's optimizer step then takes the RL and pretraining gradients together.
    -> the batch's NLL."""
    rows = [ptx[i] for i in batch_indices(len(ptx), config.ptx_batch_size, derive(config.seed, PTX_STREAM), update)]
    m = engine.forward_backward(collate(rows, pad_id, temperature=1.0), sft_loss_fn("token"), scale=config.ptx_coef)
    return m["loss"]


def check_lag(episodes: Episodes, config: RLConfig) -> None:
    """Episodes sampled behind the policy need an importance correction against the sampler's log-probs."""
    if episodes.behind and active_correction(config.correction, config.tis_cap) == "none":
        raise ValueError(f"RLConfig: step {episodes.step}'s episodes were sampled {episodes.behind} update(s) behind "
                         "the policy (an overlapped source, max_staleness >= 1); set tis_cap (e.g. 2.0) or another "
                         "correction (objectives.corrections) against the sampler's log-probs to correct the lag")


def no_signal_share(trajs: list[Trajectory]) -> float:
    """Share of the step's groups whose rewards are all equal: a group baseline gets no signal from them (the
    share DAPO's dynamic sampling refills; REPRODUCE B6)."""
    if not trajs:
        return 0.0
    rewards, groups = torch.tensor([t.reward for t in trajs]), torch.tensor([t.group for t in trajs])
    return 1.0 - informative_group_share(rewards, groups)
