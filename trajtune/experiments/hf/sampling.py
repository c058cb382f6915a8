"""grpo / rft: how completions are sampled and scored (the sampling section, the rewards), and the source the
loops take (`prompt_source`).

One step's source, top to bottom (`trajtune.sources`):

    EpisodeSource   the step's prompts x group size, one-turn episodes (sharded over ranks under torchrun,
                    all-gathered: every rank holds the whole batch, task-major, group ids kept), sampled with
                    the sampling section
    Scored          the run's graders (trajtune.experiments.hf.graders): every --reward function once on the
                    whole batch, at the same time, in worker processes under --reward-timeout (rank 0 calls
                    them, the rewards are broadcast), and the --reward-model on the rendered prompt +
                    completion (sharded, gathered); several --reward-model directories are one source,
                    `reward_ensemble`, their scores combined by --reward-model-combine (mean, min,
                    mean_minus_std with --reward-model-k; trajtune.sources.ensemble); then --reward-judge and
                    --rubric. A model scores finished completions only: one cut at --max-new-tokens gets
                    --unfinished-reward instead (the book's convention, ch.6; TRL's missing_eos_penalty).
                    Reward = the --reward-weights sum over the graders that scored the episode (None left
                    out); an episode no grader scored, or whose reward call timed out, is left out of the update
    Overlapped      (grpo --max-staleness 1) the next step's episodes sampled and scored while this one trains,
                    in a sampler process one update behind (trajtune.sources.overlap)

A reward function that raises or returns a non-reward stops the run with a message naming it, the
rows and its traceback (trajtune.sources.rewards); the logged rows get reward/<source>/mean and /std.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Literal

from ...config import ConfigError, check_choices, check_ranges
from ...sources.base import Source
from ...sources.episodes import EpisodeSource
from ...sources.overlap import OverlapConfig, overlapped
from ...sources.scoring import Scored
from ...sources.vllm import VLLMConfig
from .graders import build_graders, check_graders, close_graders
from .model import ModelConfig
from .options import flag


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
    """weight of each reward source in order (the --reward functions, then --reward-model, --reward-judge, --rubric:
    trajtune.experiments.hf.graders.GRADERS; empty: 1 each); an episode's reward is the weighted sum over the
    sources that scored it (None left out)"""
    reward_timeout: float = 60.0
    """seconds one call of a reward function may take (0: no limit); a call past it is stopped (its worker
    process killed) and the completions it hung on get no reward (left out of the update)"""
    reward_model: list[str] | str = field(default_factory=list)
    """reward models saved by `trajtune rm` (their model/ directories) as one more reward source: a model's score
    of the prompt + completion as it was trained (Bradley-Terry: its head at the last token; orm / prm: its
    --aggregate over tokens or steps); several are one source, combined by --reward-model-combine"""
    reward_model_combine: Literal["mean", "min", "mean_minus_std"] = "mean"
    """several --reward-model: the reward is their mean, their min (worst case), or mean - k * std over them
    (an uncertainty penalty; RLHF book ch.14.4, trajtune.sources.ensemble)"""
    reward_model_k: float = 1.0
    """--reward-model-combine mean_minus_std: the k of mean - k * std"""
    unfinished_reward: float | None = None
    """the reward-model score of a completion cut at --max-new-tokens (no stop token): a reward model scores
    finished text only (RLHF book ch.6 Implementation). Default: 1 below the lowest score a reward model gave a
    finished completion of the same batch (worse than every finished answer whatever the model's scale; 0
    when none finished); a number: that score"""
    score_unfinished: bool = False
    """let the reward models score unfinished completions as if they had ended (no --unfinished-reward)"""
    reward_judge: str = ""
    """a local Hugging Face model directory as a judge (LLM-as-a-judge, RLHF book ch.5.9): one more reward source,
    asked with --judge-template by greedy decoding, its verdicts cached per (prompt, completion); an unparseable
    verdict is no reward (the completion is left out of the update) and counted (reward/judge/unparseable)"""
    judge_template: Literal["mt_bench_single", "mt_bench_pair"] = "mt_bench_single"
    """mt_bench_single: a 1-10 rating ('Rating: [[5]]'); mt_bench_pair: the book's MT-Bench pairwise prompt, each
    completion against the row's `reference` column when the data has one, else against the other completions of
    its prompt (win 1, tie 0.5, loss 0; every pair judged in both orders, disagreeing verdicts are ties and their
    share is logged: reward/judge/inconsistent)"""
    judge_max_new_tokens: int = 512
    """tokens a judge may write before its verdict (its explanation comes first)"""
    rubric: str = ""
    """a rubric JSON file (RLHF book ch.12.14: weighted items, pitfalls negative) as one more reward source: the sum
    of the met items' weights over the sum of the positive weights; an item with a 'check' (file.py:fn) is graded
    by it, one without by --reward-judge's yes/no; per-item pass rates logged (reward/rubric/...)"""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """where vLLM runs with --backend vllm (colocated, or --vllm-server URLs) and how its syncs are checked"""

    def __post_init__(self) -> None:
        check_choices(self)  # a method's config (GRPORun, RFTRun) checks them again in check_run, with the rest


@dataclass
class SamplingConfig:
    """How grpo / rft sample completions."""

    max_new_tokens: int = 64
    """generation budget per completion"""
    temperature: float = 1.0
    """sampling temperature"""
    top_k: int = 0
    """sample from the k most likely tokens only (0: off). A sampling-only choice: the trainer's policy stays
    softmax(logits / temperature); the sampler records the log-probs of the truncated distribution it drew from,
    and grpo's --tis-cap importance weight (policy / sampler) corrects for the cut (trajtune.engine.decoding.Samples)"""
    top_p: float = 1.0
    """sample from the smallest set of most likely tokens whose probability reaches top_p (nucleus; 1.0: off);
    after --top-k, sampling-only as it"""
    backend: Literal["sampler", "generate", "vllm"] = "sampler"
    """generation backend: trajtune's KV-cached sampler, HF model.generate, or vLLM (colocated, or the
    --vllm-server servers; its weights synced and checked after every update: trajtune.sources.vllm)"""
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
                     non_negative=("top_k",), positive=("temperature", "top_p"))
        if not self.top_p <= 1.0:
            raise ValueError(f"sampling: {flag('sampling.top_p')} must be in (0, 1], got {self.top_p!r}")


def check_sampling(config, name: str) -> None:
    """grpo / rft: the graders' options (`graders.check_graders`: a reward source, one weight per source) and
    room for a prompt within the length budget. A single `reward_model` string (a recipe's) becomes a list of
    one."""
    check_graders(config, name)
    if config.sampling.max_new_tokens >= config.model.max_length:
        raise ValueError(f"{name}: --max-new-tokens {config.sampling.max_new_tokens} leaves no room for a prompt "
                         f"within --max-length {config.model.max_length} (prompt + completion budget)")


# --- the source ---------------------------------------------------------------------------
def prompt_source(ctx, engine, data, config, max_steps: int, overlap: OverlapConfig | None = None) -> Source:
    """grpo / rft's source (module docstring): one-turn episodes of the prompt tasks, sampled with the sampling
    section and scored as a batch. With the built-in sampler every episode samples from its own seed
    (`episode_seeds`), so the samples are the same in one process and sharded over N (`shard=engine.shard`).
    `overlap`: where they are sampled (grpo). Close it when done (`with prompt_source(...) as source:`)."""
    from ...envs.base import SingleTurnEnv

    sampling = config.sampling
    own_seeds = sampling.backend in ("sampler", "vllm")  # HF generate draws one seed per call, not one per episode
    if engine.shard is not None and not own_seeds:
        raise ConfigError(f"--backend {sampling.backend} cannot sample sharded under torchrun (it has no "
                          "per-episode seeds); use --backend sampler")
    graders = build_graders(ctx, config, frozenset(k for task in data.items for k in task.columns))

    def build(policy) -> Source:
        episodes = EpisodeSource(policy, SingleTurnEnv, data.renderer, shard=engine.shard, episode_seeds=own_seeds,
                                 max_turns=1, max_tokens=data.limit, max_action_tokens=sampling.max_new_tokens,
                                 temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                                 draw=sampling.draw if sampling.backend == "sampler" else "race",
                                 share_prompts=sampling.share_prompts and sampling.backend == "sampler")
        return Scored(episodes, engine, graders, max_steps,
                      unfinished=None if config.score_unfinished else config.unfinished_reward,
                      score_unfinished=config.score_unfinished)

    if sampling.backend == "vllm":  # vLLM holds its own weights: synced after every update, overlapped or not
        from ...sources.vllm import vllm_runner

        try:
            loop = getattr(config, "rl", None) or config.rft  # grpo's loop or rft's: its seed
            runner = vllm_runner(engine, config.model.path, config.vllm, precision=config.model.precision,
                                 max_model_len=data.limit, seed=loop.seed)
        except BaseException:
            close_graders(graders)
            raise
        return overlapped(engine, overlap or OverlapConfig(), build, runner=runner)
    here = functools.partial(engine.sample, backend=sampling.backend, pad_id=data.pad_id)
    return overlapped(engine, overlap or OverlapConfig(), build, here)
