"""Rejection-sampling fine-tuning / expert iteration (RLHF book ch.9; seed agent-rl ch.15 §15.3).

Source: the policy's own samples, kept if the verifier accepts them (or the best by a
reward model). Weight: 1 on kept episodes -- in policy-gradient terms R_i / p-hat.
One round, top to bottom:

    1. sample   samples_per_task episodes of every task with the current policy (`source.take`;
                those whose environment or reward failed are never kept)
    2. select   accepted / top per prompt / top overall (or a random control of equal size),
                then optional dedup by action sequence and a per-task cap
    3. train    SFT on the kept episodes for steps_per_round steps; `source.after_update`
    4. log      pass rate, kept count, family shares and hack share of the kept set
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence


from ..config import check_choices
from ..engine import Engine
from ..runs.loop import Run
from ..trajectory import Trajectory
from ..sources.base import Draws, Source
from .common import check_selection, dedup_and_cap, rollout_metrics, select_episodes, shares
from .sft import SFTConfig, sft_loss_fn, sft_step
from ..seeding import derive


@dataclass
class RFTConfig:
    rounds: int = 4
    """sample -> select -> train rounds"""
    samples_per_task: int = 16
    """episodes sampled per task and round"""
    steps_per_round: int = 15
    """SFT steps on the kept episodes per round"""
    batch_size: int = 32
    """episodes per SFT step"""
    select: Literal["accepted", "top_per_prompt", "top_overall"] = "accepted"
    """which samples to keep (see algorithms.common.select_episodes)"""
    threshold: float = 1.0
    """reward needed for select='accepted'"""
    top_fraction: float = 0.25
    """share kept by select='top_overall' (when select_k is 0)"""
    select_k: int = 0
    """keep the K best episodes over all tasks with select='top_overall' (the book's top-K overall; 0: top_fraction)"""
    random_control: bool = False
    """keep as many episodes as the selection would, uniformly at random (the control)"""
    dedup: bool = False
    """keep one copy of each (task, action sequence)"""
    per_task_cap: int = 0
    """keep at most this many episodes per task (0: no cap)"""
    accumulate: bool = False
    """train on the kept episodes of all rounds so far (False: this round's only)"""
    share_key: str = "family"
    """info key whose shares in the kept set are logged (e.g. the task family)"""
    aggregation: Literal["token", "sequence", "constant"] = "token"
    """SFT loss aggregation"""
    length_buckets: int = 1
    """SFT batches in this many groups of similar length (SFTConfig.length_buckets)"""
    seed: int = 0
    """round r samples with a generator seeded from (seed, r)"""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.rounds < 0 or self.samples_per_task < 1 or self.steps_per_round < 0 or self.batch_size < 1:
            raise ValueError("RFTConfig: rounds >= 0, samples_per_task >= 1, steps_per_round >= 0, batch_size >= 1")
        check_selection(self, "RFTConfig")
        if not 0 < self.top_fraction <= 1:
            raise ValueError(f"RFTConfig: top_fraction must be in (0, 1], got {self.top_fraction}")
        if self.select_k < 0:
            raise ValueError(f"RFTConfig: select_k must be >= 0 (0: use top_fraction), got {self.select_k}")
        if self.per_task_cap < 0:
            raise ValueError(f"RFTConfig: per_task_cap must be >= 0 (0: no cap), got {self.per_task_cap}")


@dataclass
class RFTState:
    """Where expert iteration stands between steps (saved with the engine)."""

    round: int = 0
    """rounds finished"""
    inner: int = 0
    """SFT steps done in the current round"""
    row: dict | None = None
    """the current round's row so far (None: it has not sampled yet)"""
    pool: list[Trajectory] = field(default_factory=list)
    """the kept episodes SFT trains on (this round's, or all rounds' with accumulate)"""


def train_rft(engine: Engine, tasks: Sequence, source: Source, config: RFTConfig, pad_id: int,
              run: Run | None = None, score: Callable[[list[Trajectory]], list[float]] | None = None) -> list[dict]:
    """Expert iteration. `score`, if given, replaces each sample's reward (a reward model) before
    selection. Returns one row per round, logged (and evaluated) at the cumulative SFT step.

    Resumes exactly with a checkpointer on `run`, mid-round included: a checkpoint holds the
    round, its SFT step, the kept episodes and the round's row so far (`RFTState`)."""
    run = run or Run("rft")
    _, state = run.start(engine, RFTState(), source)
    pool, loss = state.pool, sft_loss_fn(config.aggregation)
    draws = Draws(tasks, config.samples_per_task, config.seed, config.rounds)
    for r in range(state.round, config.rounds):
        if r == state.round and state.row is not None:  # resumed inside round r: its samples are already selected
            row, done = state.row, state.inner
        else:
            # 1. sample
            episodes = source.take(draws(r))
            trajs = episodes.trainable
            row = {"train/round": float(r + 1), **rollout_metrics(episodes.trajs), **episodes.metrics}
            if score is not None:
                for t, s in zip(trajs, score(trajs), strict=True):
                    t.info["verifier_reward"], t.reward = t.reward, float(s)
            # 2. select: weight 1 on the kept episodes
            kept = select_episodes(trajs, config.select, config.threshold, config.top_fraction,
                                   config.random_control, seed=derive(config.seed, r), top_k=config.select_k)
            raw = len(kept)
            kept = dedup_and_cap(kept, config.dedup, config.per_task_cap)
            run.record_episodes(engine, r + 1, trajs, kept=kept, every=1)  # a few episodes for `trajtune view`
            pool = pool + kept if config.accumulate else kept
            row.update(kept_metrics(trajs, raw, kept, config.share_key))
            done = 0
        # 3. train: SFT on the pool (step k's batch is a function of (seed, r, k))
        if pool and config.steps_per_round:
            sft = SFTConfig(steps=config.steps_per_round, batch_size=config.batch_size, aggregation=config.aggregation,
                            length_buckets=config.length_buckets, seed=derive(config.seed, r))
            for k in range(done, config.steps_per_round):
                last = sft_step(engine, pool, sft, pad_id, k, loss)
                row["train/skipped"] = row.get("train/skipped", 0.0) + last["train/skipped"]  # steps of the round
                if k + 1 < config.steps_per_round:
                    run.checkpoint(engine, engine.step, RFTState(r, k + 1, row, pool))
            row.update({k: last[k] for k in ("train/loss", "train/grad_norm", "train/lr")})
            row.update(source.after_update(engine))
        # 4. log, evaluate, checkpoint
        run.end_step(engine, engine.step, row, eval_now=True,
                     state=RFTState(r + 1, pool=pool if config.accumulate else []))
    return run.history


def kept_metrics(sampled: list[Trajectory], raw_kept: int, kept: list[Trajectory], share_key: str) -> dict:
    """Kept counts, the share of reward hacks among kept episodes, and per-`share_key` shares."""
    out = {"rft/sampled": float(len(sampled)), "rft/kept_raw": float(raw_kept), "rft/kept": float(len(kept))}
    if kept and all("public_pass" in t.info and "hidden_pass" in t.info for t in kept):
        out["rft/kept_hack_share"] = sum(t.info["public_pass"] and not t.info["hidden_pass"] for t in kept) / len(kept)
    for k, v in shares(kept, share_key).items() if kept and share_key else ():
        out[f"rft/share_{k}"] = v
    return out
