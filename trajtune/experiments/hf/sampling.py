"""grpo / rft: how completions are sampled and scored (the sampling section, the rewards, the collect
the loops take).

One step's collect, top to bottom:

    1. sample   the step's prompts x group size, one-turn episodes (sharded over ranks under torchrun,
                all-gathered: every rank holds the whole batch, task-major, group ids kept)
    2. score    every --reward function once on the whole batch, at the same time, in worker processes
                under --reward-timeout (trajtune.sources.rewards; rank 0 calls them, the rewards are broadcast),
                and the --reward-model on the rendered prompt + completion (sharded, gathered)
    3. combine  reward = the --reward-weights sum over the sources that scored the row (None left out);
                an episode no source scored, or whose reward call timed out, is left out of the update

A reward function that raises or returns a non-reward stops the run with a message naming it, the
rows and its traceback (trajtune.sources.rewards); the logged rows get reward/<source>/mean and /std.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Literal

from ...config import ConfigError, check_choices, check_ranges
from ...metrics import register
from ...sources.rewards import (RewardBatch, RewardError, RewardFunction, RewardSet, RewardState, Scores, check_columns,
                        combine, source_metrics)
from .model import ModelConfig
from .options import flag

log = logging.getLogger("trajtune.sources.rewards")

register("reward/*", "per reward source (a --reward function's name, or reward_model): reward/<name>/mean and "
         "/std over the completions it scored (None left out); reward/<function>/<name>: what the function "
         "logged with log_metric (mean); reward/failed: completions whose reward call ran past --reward-timeout; "
         "reward/unscored: completions no source scored (all None); both are left out of the update")

RM_NAME = "reward_model"
"""the --reward-model's name among the reward sources (its metrics: reward/reward_model/*)"""


@dataclass
class PromptRewardRun:
    """What the runs that sample prompts and score them share (`trajtune grpo`, `trajtune rft`): the model,
    the prompt data and the reward sources. Each run adds its loop, sampling, optimizer and output."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """the model and how it trains (LoRA, precision, lengths)"""
    data: str = ""
    """JSONL file of prompt rows (trajtune.sources.data)"""
    reward: list[str] = field(default_factory=list)
    """reward functions 'file.py:function' or 'module:function', one or more (--reward a.py:f --reward b.py:g);
    TRL's signature fn(prompts, completions, completion_ids, **columns) -> list[float | None], each called
    once per batch of completions (trajtune.sources.rewards)"""
    reward_weights: list[float] = field(default_factory=list)
    """weight of each reward source in order (the --reward functions, then --reward-model; empty: 1 each);
    an episode's reward is the weighted sum over the sources that scored it (None left out)"""
    reward_timeout: float = 60.0
    """seconds one call of a reward function may take (0: no limit); a call past it is stopped (its worker
    process killed) and the completions it hung on get no reward (left out of the update)"""
    reward_model: str = ""
    """a reward model saved by `trajtune rm` (its model/ directory) as one more reward source: its value
    head's score of the prompt + completion"""


@dataclass
class SamplingConfig:
    """How grpo / rft sample completions."""

    max_new_tokens: int = 64
    """generation budget per completion"""
    temperature: float = 1.0
    """sampling temperature"""
    backend: Literal["sampler", "generate"] = "sampler"
    """generation backend: trajtune's KV-cached sampler or HF model.generate"""
    draw: Literal["cdf", "race"] = "cdf"
    """how the sampler draws a token: cdf (inverse CDF, one random number per completion and token) or race
    (torch.multinomial's draw, as HF generate: one per vocabulary entry, ~300 ms per token for 64 completions
    over a 151,936-token vocabulary on one CPU core); the same distribution (trajtune.engine.decoding.pick_next).
    --backend generate always draws as HF generate does"""
    share_prompts: bool = True
    """prefill each prompt once for its whole group of completions (the KV cache rows copied, as vLLM's prefix
    cache shares them), not once per completion; the same samples to float rounding (trajtune.engine.decoding.sample).
    --backend generate prefills every completion"""

    def __post_init__(self) -> None:
        check_choices(self)
        check_ranges(self, "sampling", label=lambda n: flag(f"sampling.{n}"), counts=("max_new_tokens",),
                     positive=("temperature",))


def check_sampling(config, name: str) -> None:
    """grpo / rft: a reward source, one weight per source, and room for a prompt within the length budget."""
    if not config.reward and not config.reward_model:
        raise ValueError(f"{name}: needs --reward module:function or --reward-model DIR (reward / reward_model "
                         "in a recipe)")
    n = len(config.reward) + bool(config.reward_model)
    if config.reward_weights and len(config.reward_weights) != n:
        sources = [f"--reward {r}" for r in config.reward] + ([f"--reward-model {config.reward_model}"]
                                                             if config.reward_model else [])
        raise ValueError(f"{name}: --reward-weights has {len(config.reward_weights)} numbers for {n} reward sources "
                         f"({', '.join(sources)}); give one weight per source, in this order")
    check_ranges(config, name, label=flag, non_negative=("reward_timeout",))
    if not all(math.isfinite(w) for w in config.reward_weights):
        raise ValueError(f"{name}: --reward-weights must be finite numbers, got {config.reward_weights}")
    if config.sampling.max_new_tokens >= config.model.max_length:
        raise ValueError(f"{name}: --max-new-tokens {config.sampling.max_new_tokens} leaves no room for a prompt "
                         f"within --max-length {config.model.max_length} (prompt + completion budget)")


def check_rewards(config, tasks: list) -> None:
    """Before any model loads: every --reward imports, every column it names is in every row, and
    --reward-model is a reward model saved by `trajtune rm` (the stage loads them again: its
    arguments are specs, picklable; a module is imported once per process)."""
    functions = [RewardFunction(spec=s) for s in config.reward]
    RewardSet(functions)  # names and duplicates
    check_columns(functions, tasks)
    if config.reward_model:
        from ...models.hf import check_model_dir

        path = check_model_dir(config.reward_model)
        if not (path / "value_head.safetensors").exists():
            raise RewardError(f"--reward-model {path}: not a reward model saved by `trajtune rm` (no "
                              "value_head.safetensors next to its weights); train one with `trajtune rm`")


# --- the stage --------------------------------------------------------------------------
class RewardModel:
    """A reward model saved by `trajtune rm` as a reward source: the value head at the last token of the
    prompt + completion, rendered with the reward model's own chat template as `trajtune rm` trained it
    (the last rendered sample of the conversation), scored in shares over the ranks."""

    def __init__(self, ctx, path: str, model) -> None:
        from ...engine.distributed import launched_distributed
        from ...models import hf
        from ...text.chat import ChatRenderer

        self.renderer = ChatRenderer(hf.load_tokenizer(path))
        policy = hf.load_policy(path, value_head=True)
        device = None if model.device == "cuda" and launched_distributed() else model.device
        self.engine = ctx.engine(policy, None, frozen=True, device=device,
                                 autocast=None if model.precision == "fp32" else model.precision)

    def __call__(self, batch: RewardBatch) -> list[float]:
        from ...algorithms.reward_model import score
        from ...engine.distributed import sharded_map

        trajs = []
        for prompt, i in zip(batch.prompts, range(len(batch)), strict=True):
            opening = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            trajs.append(self.renderer.render_samples(opening + [{"role": "assistant", "content": batch.text(i)}])[-1])
        return sharded_map(self.engine, trajs, lambda part: score(self.engine, part, self.renderer.pad_id))


class EpisodeRewards:
    """Steps 2 and 3 of the collect (module docstring) for one stage; `metrics` are the last batch's."""

    def __init__(self, ctx, config, max_steps: int):
        functions = [RewardFunction(spec=spec) for spec in config.reward]
        self.functions = RewardSet(functions, timeout=config.reward_timeout)
        self.model = RewardModel(ctx, config.reward_model, config.model) if config.reward_model else None
        self.names = [f.name for f in functions] + ([RM_NAME] if self.model else [])
        self.weights = list(config.reward_weights) or [1.0] * len(self.names)
        self.max_steps, self.counters, self.metrics = max_steps, ctx.counters, {}
        self.counters.setdefault("reward_s", 0.0)

    def apply(self, trajs: list, tasks: list, engine) -> list:
        """Score `trajs` (episode i answers tasks[i]) and return those that got a reward, in order."""
        from ...trajectory import Owner

        t0 = time.perf_counter()
        batch = RewardBatch.of(tasks, [(t.info.get("actions") or [""])[-1] for t in trajs],
                               [t.tokens_of(Owner.POLICY) for t in trajs])
        scores = self._call_functions(batch, RewardState(engine.step, self.max_steps), engine)
        values = scores.values + ([self.model(batch)] if self.model else [])
        totals = combine(values, self.weights)
        kept, unscored = [], []
        for i, (t, total) in enumerate(zip(trajs, totals, strict=True)):
            t.info["rewards"] = {name: v[i] for name, v in zip(self.names, values, strict=True)}
            if scores.extras[i]:
                t.info["reward_extra"] = scores.extras[i]
            if i in scores.failed:
                t.info["env_error"] = scores.failed[i]
            elif total is None:
                unscored.append(i)
            else:
                t.reward = total
                kept.append(t)
        self._report(batch, scores, unscored, engine)
        self.metrics = {**source_metrics(self.names, values), **scores.metrics,
                        "reward/failed": float(len(scores.failed)), "reward/unscored": float(len(unscored))}
        self.counters["reward_s"] += time.perf_counter() - t0
        return kept

    def _call_functions(self, batch: RewardBatch, state: RewardState, engine) -> Scores:
        """The functions' Scores: called on rank 0 only, broadcast (every rank gets the same rewards)."""
        from ...engine.distributed import broadcast_object

        if not self.functions.functions:
            return Scores([], {}, {}, [{} for _ in range(len(batch))])
        out = None
        if engine.is_main:
            try:
                out = self.functions.score(batch, state)
            except RewardError as e:
                out = e
        out = broadcast_object(out)
        if isinstance(out, RewardError):
            raise out
        return out

    def _report(self, batch: RewardBatch, scores: Scores, unscored: list[int], engine) -> None:
        n = len(batch)
        if len(unscored) == n:
            raise RewardError(f"no reward source scored any of the batch's {n} completions (every one returned "
                              f"None, e.g. for {batch.where[0]}); None means 'does not apply to this row', and "
                              f"every row needs at least one source that applies")
        if not engine.is_main:
            return
        for i in sorted(scores.failed)[:3]:
            log.warning("%s: the episode gets no reward and is left out of this update", scores.failed[i])
        if unscored:
            log.warning("every reward source returned None for %d of %d completions (%s ...): left out of this "
                        "update (TRL: unscorable)", len(unscored), n, batch.where[unscored[0]])

    def close(self) -> None:
        self.functions.close()


def prompt_collect(ctx, engine, data, config, rewards: EpisodeRewards):
    """`collect(tasks, n, generator)` for grpo / rft: one-turn episodes of the prompt tasks, sampled
    with the sampling section and scored as a batch by `rewards`. With the built-in sampler every
    episode samples from its own seed (`episode_seeds`), so the samples are the same in one process
    and sharded over N (`shard=engine.shard`). Sampling and reward times are counters."""
    from ...sources.episodes import make_collect, timed
    from ...envs.base import SingleTurnEnv
    from ...engine.generate import make_backend

    sampling = config.sampling
    own_seeds = sampling.backend == "sampler"  # HF generate draws one seed per call, not one per episode
    if engine.shard is not None and not own_seeds:
        raise ConfigError(f"--backend {sampling.backend} cannot sample sharded under torchrun (it has no "
                          "per-episode seeds); use --backend sampler")
    sample = timed(make_collect(make_backend(sampling.backend, engine, data.pad_id), SingleTurnEnv, data.renderer,
                                shard=engine.shard, episode_seeds=own_seeds, max_turns=1, max_tokens=data.limit,
                                max_action_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                                draw=sampling.draw if own_seeds else "race",
                                share_prompts=sampling.share_prompts and own_seeds),
                   ctx.counters)

    def collect(tasks, n_per_task, generator):
        trajs = sample(tasks, n_per_task, generator)  # task-major: episode i answers tasks[i // n_per_task]
        return rewards.apply(trajs, [task for task in tasks for _ in range(n_per_task)], engine)

    return collect


class RewardMetricsRun:
    """The stage's `Run`, with the reward metrics of the step's (or round's) batch added to its row."""

    def __init__(self, run, rewards: EpisodeRewards):
        self._run, self._rewards = run, rewards

    def end_step(self, engine, step: int, row: dict, **kw) -> None:
        row.update(self._rewards.metrics)
        self._rewards.metrics = {}
        self._run.end_step(engine, step, row, **kw)

    def __getattr__(self, name: str):
        return getattr(self._run, name)


def train_scored(ctx, c, data, engine, max_steps: int, loop):
    """Build the rewards and the collect, run `loop(collect, wrap)` (wrap: Run -> RewardMetricsRun),
    and stop the reward workers however it ends."""
    rewards = EpisodeRewards(ctx, c, max_steps)
    try:
        return loop(prompt_collect(ctx, engine, data, c, rewards), lambda run: RewardMetricsRun(run, rewards))
    finally:
        rewards.close()

