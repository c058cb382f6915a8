"""grpo / rft: how completions are sampled and scored (the sampling section, the collect the loops take)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...config import ConfigError, check_ranges
from .options import flag


@dataclass
class SamplingConfig:
    """How grpo / rft sample completions."""

    max_new_tokens: int = 64
    """generation budget per completion"""
    temperature: float = 1.0
    """sampling temperature"""
    backend: Literal["sampler", "generate"] = "sampler"
    """generation backend: trajtune's KV-cached sampler or HF model.generate"""

    def __post_init__(self) -> None:
        check_ranges(self, "sampling", label=lambda n: flag(f"sampling.{n}"), counts=("max_new_tokens",),
                     positive=("temperature",))


def check_sampling(config, name: str) -> None:
    """grpo / rft: a reward function, and room for a prompt within the length budget."""
    if not config.reward:
        raise ValueError(f"{name}: needs --reward module:function (reward in a recipe)")
    if config.sampling.max_new_tokens >= config.model.max_length:
        raise ValueError(f"{name}: --max-new-tokens {config.sampling.max_new_tokens} leaves no room for a prompt "
                         f"within --max-length {config.model.max_length} (prompt + completion budget)")


# --- the stage --------------------------------------------------------------------------


def prompt_collect(ctx, engine, data, reward: str, sampling: SamplingConfig):
    """`collect(tasks, n, generator)` for grpo / rft: one-turn episodes of the prompt tasks, scored by the
    reward function (imported again here: the stage takes only picklable arguments), sampled with the
    sampling section. With the built-in sampler every episode samples from its own seed
    (`episode_seeds`), so the samples are the same in one process and sharded over N
    (`shard=engine.shard`). Sampling time is a counter."""
    from ... import data as D
    from ...collect import make_collect, timed
    from ...envs.base import SingleTurnEnv
    from ...generation import make_backend

    own_seeds = sampling.backend == "sampler"  # HF generate draws one seed per call, not one per episode
    if engine.shard is not None and not own_seeds:
        raise ConfigError(f"--backend {sampling.backend} cannot sample sharded under torchrun (it has no "
                          "per-episode seeds); use --backend sampler")
    verifier = D.reward_verifier(D.load_reward_function(reward))
    collect = make_collect(make_backend(sampling.backend, engine, data.pad_id), lambda: SingleTurnEnv(verifier),
                           data.renderer, shard=engine.shard, episode_seeds=own_seeds, max_turns=1,
                           max_tokens=data.limit, max_action_tokens=sampling.max_new_tokens,
                           temperature=sampling.temperature)
    return timed(collect, ctx.counters)
