"""Reinforcement learning with the policy-gradient family: REINFORCE, RLOO, GRPO, Dr. GRPO,
PPO (with a value head and GAE), GSPO, CISPO.

Source: the policy's own samples, `group_size` per task. Weight: an advantage
(DESIGN.md table). One step, top to bottom:

    1. sample   tasks_per_step tasks x group_size episodes with the current policy
    2. score    rewards -> advantages (group baseline, or GAE with the value head)
    3. update   epochs x minibatches of policy_gradient_loss (+ value loss)
    4. log, evaluate every `eval_every` steps, checkpoint

Overlapped (`max_staleness = 1`, one-step off-policy as in PipelineRL, prime-rl and verl's
async trainers): steps 2-3 of step s run in a thread while the main thread collects step
s+1, whose episodes (rendering, sampling, the environments) run in a sampler process
holding its own copy of the weights, one update behind (trajtune.sources.process); the
weights are synced and checked after every update, and the truncated importance weight
against the sampler's log-probs (`tis_cap`) corrects the lag:

    main thread:   collect s+1 (sampler: theta_s)   sync theta_s+1   collect s+2 (theta_s+1) ...
    train thread:  score + update s (-> theta_s+1)                   score + update s+1 ...

Everything the loss needs lives in `trajtune.objectives`; this file only wires it. The
step's advantages, returns and old / reference log-probs travel on the batch
(`Batch.extras`), so the loss is a pure function of (forward output, batch).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import torch

from ..sources.process import SamplerProcess
from ..config import check_choices, check_ranges
from ..engine import Engine, ForwardOutput, Loss
from ..runs.loop import Run, eval_due
from ..objectives.advantages import gae, group_advantages, group_reward_range, place_at_last_action, whiten
from ..objectives.kl import kl_penalized_rewards
from ..objectives.policy_gradient import policy_gradient_loss, value_loss
from ..trajectory import Batch, Owner, Trajectory, collate
from .common import Collect, pick_tasks, rollout_metrics, train_row
from ..seeding import generator


@dataclass
class RLConfig:
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
    kl_in_reward: bool = False
    """put the KL penalty into per-token rewards (PPO/GAE style) instead of the loss"""
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
    """truncated importance sampling cap against the sampler's log-probs (0 disables)"""
    length_buckets: int = 1
    """forward each minibatch in this many groups of similar length, each without the padding it does not
    need (the same gradient up to float rounding; faster when episode lengths vary)"""
    max_staleness: int = 0
    """how many updates the sampling policy may lag: 0 samples step s with the policy step s updates
    (on-policy); 1 samples step s+1 while step s trains, in a sampler process holding its own copy of
    the weights, one update behind (needs tis_cap > 0: the truncated importance weight against the
    sampler's log-probs corrects the lag)"""
    sampler_process: bool = False
    """run the episodes in a separate process with its own copy of the weights, synced and checked after
    every update (implied by max_staleness 1; with 0 a run equals the one-process run: bit for bit when
    sampler_threads is the trainer's torch thread count, else up to float rounding)"""
    sampler_threads: int = 1
    """torch threads of the sampler process (1: the sampler on one core, the trainer on the others)"""
    sampler_timeout: float = 600.0
    """longest wait for the sampler process to answer (one step's episodes, a weight sync) before the run
    stops with an error (0: no limit); a sampler process that dies stops the run at once, naming the cause"""
    sync_tolerance: float = 1e-3
    """after every weight sync the sampler's and the trainer's log-probs of the same tokens (the first rows
    of the step's batch) must agree to this (max abs difference, nats; logged as sync/logprob_diff), and
    the sampler's weights must equal the trainer's, or the run stops"""
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
        if self.max_staleness not in (0, 1):
            raise ValueError(f"RLConfig: max_staleness must be 0 (on-policy) or 1 (sample the next step while this "
                             f"one trains), got {self.max_staleness}")
        if self.max_staleness and not self.tis_cap:
            raise ValueError("RLConfig: max_staleness 1 samples with the policy one update behind; set tis_cap "
                             "(e.g. 2.0) so the truncated importance weight against the sampler's log-probs "
                             "corrects the lag")
        check_ranges(self, "RLConfig", counts=("length_buckets", "sampler_threads"),
                     non_negative=("eps_low", "eps_high", "kl_coef", "vf_coef", "value_clip", "tis_cap", "eval_every",
                                   "sampler_timeout"),
                     positive=("sync_tolerance",))
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
            raise ValueError(f"RLConfig: gamma and lam must be in [0, 1], got {self.gamma}, {self.lam}")


BASELINES = {"reinforce": ("mean", False), "rloo": ("leave_one_out", False), "grpo": ("mean", True),
             "dr_grpo": ("mean", False), "none": ("none", False)}


def advantages_for(batch: Batch, config: RLConfig, values: torch.Tensor | None, ref_logp: torch.Tensor | None,
                   old_logp: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Advantages [B] (group baselines) or [B, T-1] (GAE), and GAE returns [B, T-1] or None."""
    if config.advantage != "gae":
        baseline, std = BASELINES[config.advantage]
        return group_advantages(batch.rewards, batch.groups, baseline=baseline, std_normalize=std), None
    mask = batch.action_mask
    if config.kl_coef and config.kl_in_reward:
        token_rewards = kl_penalized_rewards(batch.rewards, old_logp, ref_logp, mask, config.kl_coef)
    else:
        token_rewards = place_at_last_action(batch.rewards, mask)
    return gae(token_rewards, values, mask, config.gamma, config.lam)


def rl_loss(config: RLConfig, use_old: bool) -> Loss:
    """The policy-gradient loss (+ value loss) of a minibatch; reads the step's tensors from `batch.extras`:
    advantages [B] or [B, T-1], old_logp / ref_logp [B, T-1], and for GAE returns, old_values [B, T-1]."""
    kl_loss_coef = config.kl_coef if not config.kl_in_reward else 0.0
    constant = config.aggregation_constant or None

    def pg(out: ForwardOutput, batch: Batch):
        x, mask = batch.extras, batch.action_mask
        entropy = out.entropy if config.entropy_coef else None
        loss, metrics = policy_gradient_loss(
            out.logprobs, x["advantages"], mask, x["old_logp"] if use_old else None,
            surrogate=config.surrogate, ratio_level=config.ratio_level, eps_low=config.eps_low, eps_high=config.eps_high,
            sampler_logp=batch.old_logprobs if config.tis_cap else None, tis_cap=config.tis_cap or None,
            ref_logp=x["ref_logp"] if kl_loss_coef else None, kl_coef=kl_loss_coef,
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


@dataclass
class RLState:
    """What an overlapped run (max_staleness 1) carries over a checkpoint: the next step's rollouts, sampled
    while the last step trained, and the state of that step's generator (it still shuffles its minibatches)."""

    pending: list[Trajectory] = field(default_factory=list)
    pending_step: int = -1
    pending_rng: torch.Tensor | None = None


def train_rl(engine: Engine, tasks: Sequence, collect: Collect, config: RLConfig, pad_id: int,
             run: Run | None = None) -> list[dict]:
    """Run `config.steps` policy-gradient updates; returns the logged rows.

    Resumes exactly with a checkpointer on `run` (step s samples with a generator seeded from
    (seed, s); the KL reference is the stage's starting policy, saved once; an overlapped run saves
    the rollouts of the step after the checkpoint, sampled one update behind, in `RLState`)."""
    run = run or Run("rl")
    start, state = run.start(engine, RLState())
    ref = run.reference(engine, start) if config.kl_coef else None  # the frozen starting policy
    use_old = config.epochs > 1 or config.minibatches > 1 or config.surrogate != "reinforce"
    loss = rl_loss(config, use_old)
    with Rollouts(engine, tasks, collect, config, state) as rollouts:
        for step in run.steps(start, config.steps):
            eval_now = eval_due(step + 1, config.steps, config.eval_every)
            # 1. sample (max_staleness 1: drawn by the sampler process while the last step trained)
            trajs, g = rollouts.take(step)
            row = rollout_metrics(trajs)
            if config.skip_zero_variance:
                trajs = drop_zero_variance_groups(trajs)

            def update(trajs: list[Trajectory] = trajs, g: torch.Generator = g) -> tuple[Batch, dict]:
                # 2. score: rewards -> advantages, on the batch
                batch = score(engine, ref, collate(trajs, pad_id), config, use_old)
                run.record_episodes(engine, step + 1, trajs, batch)  # a few episodes for `trajtune view`
                # 3. update
                for epoch in range(config.epochs):
                    order = torch.randperm(batch.size, generator=g)
                    for chunk in order.chunk(config.minibatches):
                        m = engine.forward_backward(batch.select(chunk), loss, buckets=config.length_buckets)
                        o = engine.optim_step()
                return batch, {**train_row(m, o), "train/kept_episodes": float(batch.size),
                               "train/tokens": float(batch.action_mask.sum())}

            # 2-3 (max_staleness 1: in a thread, while step + 1 is sampled); no trajectories: every group had
            # equal rewards, nothing to learn from this step
            row.update(rollouts.overlap(step, update if trajs else None))
            # 4. log (the last minibatch's loss statistics), evaluate, checkpoint
            run.end_step(engine, step + 1, row, eval_now=eval_now, state=state)
    return run.history


class Rollouts:
    """Where each step's trajectories come from: `collect` in this process (the default), or `collect` with its
    episodes run in a `SamplerProcess` (`sampler_process`; the first step's here, while it starts), sampled one
    step ahead while the last step trains (`max_staleness` 1).

    take(step)            -> (the step's trajectories, its generator after sampling them)
    overlap(step, update) -> update()'s row, plus sync/logprob_diff of the weight sync the sampler loaded in the step;
                             with max_staleness 1, step + 1 is sampled while `update` runs in a thread
    """

    PROBE_ROWS = 2
    """rows of the step's batch on which the sampler's and the trainer's log-probs are compared after a sync"""

    def __init__(self, engine: Engine, tasks: Sequence, collect: Collect, config: RLConfig, state: RLState):
        self.engine, self.tasks, self.collect, self.config, self.state = engine, tasks, collect, config, state
        self.sampler: SamplerProcess | None = None
        if config.sampler_process or config.max_staleness:
            if engine.shard is not None:
                raise ValueError("RLConfig: max_staleness 1 / sampler_process need a one-process engine "
                                 "(not torchrun: every rank would need its own sampler process)")
            self.sampler = SamplerProcess(engine, config.sampler_threads, config.sync_tolerance,
                                          config.sampler_timeout)
        self.first = True
        self._pool: ThreadPoolExecutor | None = None  # the update thread (max_staleness 1), one for the whole loop

    def take(self, step: int) -> tuple[list[Trajectory], torch.Generator]:
        s, first, self.first = self.state, self.first, False
        if s.pending_step == step:  # sampled while the last step trained (or saved with the checkpoint)
            g = torch.Generator()
            g.set_state(s.pending_rng)
            trajs, s.pending, s.pending_step, s.pending_rng = s.pending, [], -1, None
            return trajs, g
        return self._sample(step, local=first)  # the first: here, while the sampler process boots (same weights)

    def overlap(self, step: int, update: Callable[[], tuple[Batch, dict]] | None) -> dict:
        ahead = self.config.max_staleness > 0 and step + 1 < self.config.steps
        if update is None:
            if ahead:
                self._prefetch(step + 1)
            return {"train/kept_episodes": 0.0}
        sampler = self.sampler

        def update_and_probe() -> tuple[dict, Any]:  # the trainer's side of the sync check, in the same thread
            batch, row = update()
            return row, None if sampler is None else sampler.probe(
                batch.select(torch.arange(min(self.PROBE_ROWS, batch.size))))

        needed = sampler is not None and step + 1 + self.config.max_staleness < self.config.steps  # sampled with
        if ahead:
            if self._pool is None:  # started once: a thread per step cost ~1 ms of the trainer's GIL a step
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="trajtune-update")
            job = self._pool.submit(update_and_probe)
            try:
                if needed:  # sent as soon as the update ends, even while step + 1's episodes are still sampled
                    sampler.sync_when_done(job, lambda: sampler.sync(job.result()[1]))
                self._prefetch(step + 1)  # the sampler holds the weights before `update`: one behind
            except BaseException:
                futures_wait([job])  # the update never outlives its step; the sampling error is the one raised
                raise
            row, probe = job.result()
            if needed:
                sampler.sync_if_not_done()
        else:
            row, probe = update_and_probe()
            if needed:
                sampler.sync(probe)  # checked when the episodes sampled with these weights arrive
        if sampler is not None:
            row.update(sampler.checked())  # the sync the sampler loaded this step (checked before its episodes)
        return row

    def _prefetch(self, step: int) -> None:
        trajs, g = self._sample(step, local=False)
        self.state.pending, self.state.pending_step, self.state.pending_rng = trajs, step, g.get_state()

    def _sample(self, step: int, local: bool) -> tuple[list[Trajectory], torch.Generator]:
        c = self.config
        g = generator(c.seed, step)
        picked = pick_tasks(self.tasks, c.tasks_per_step, g)
        if self.sampler is None or local:
            return self.collect(picked, c.group_size, g), g
        calls = self.sampler.calls
        with self.sampler.routing():  # make_collect runs engine.sample's episodes in the sampler process
            trajs = self.collect(picked, c.group_size, g)
        if self.sampler.calls == calls and any(t.count(Owner.POLICY) for t in trajs):
            raise ValueError("RLConfig: max_staleness 1 / sampler_process: the collect sampled its episodes without "
                             "the sampler process (a sampler other than engine.sample, e.g. Hugging Face generate, "
                             "or a collect not built by trajtune.sources.episodes.make_collect); use "
                             "make_collect(engine.sample, ...)")
        return trajs, g

    def __enter__(self) -> "Rollouts":
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        if self.sampler is not None:
            self.sampler.close()


def drop_zero_variance_groups(trajs: list[Trajectory]) -> list[Trajectory]:
    """Keep the episodes of groups whose rewards differ (the 'informative' groups)."""
    rewards = torch.tensor([t.reward for t in trajs])
    groups = torch.tensor([t.group for t in trajs])
    spread, index = group_reward_range(rewards, groups)
    return [t for t, s in zip(trajs, spread[index].tolist(), strict=True) if s > 0]

