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

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ...config import check_choices
from ...sources.base import Source
from ...sources.build import episode_source
from ...sources.sampling import MOVED, check_sampling as check_section
from ...sources.scoring import Scored
from .graders import build_graders, check_graders, close_graders
from .model import ModelConfig
from .options import flag


@dataclass
class PromptRewardRun:
    """What the runs that sample prompts and score them share (`trajtune grpo`, `trajtune rft`): the model,
    the prompt data and the reward sources. Each run adds its loop, sampling, optimizer and output."""

    RENAMED: ClassVar[dict[str, str]] = MOVED
    """the sections the sampling section replaced (recipes: [config.vllm], [config.overlap])"""

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

    def __post_init__(self) -> None:
        check_choices(self)  # a method's config (GRPORun, RFTRun) checks them again in check_run, with the rest


def check_sampling(config, name: str, backends: tuple[str, ...] = ("sampler", "generate", "vllm")) -> None:
    """grpo / rft / dpo: the sampling section (`sources.sampling.check_sampling`: the backends this run can use,
    overlapped only with an RL loop's tis_cap), the graders' options (`graders.check_graders`: a reward source, one
    weight per source) and room for a prompt within the length budget."""
    rl = getattr(config, "rl", None)
    if rl is None and config.sampling.in_process:
        raise ValueError(f"{name}: {flag('sampling.max_staleness')} / {flag('sampling.sampler_process')} are grpo's "
                         f"(an RL loop with --tis-cap); {name} samples on-policy, in the trainer")
    check_section(config.sampling, name, rl=rl, backends=backends, name=lambda n: flag(f"sampling.{n}"),
                  agent=bool(getattr(getattr(config, "agent", None), "run", "")))
    check_graders(config, name)
    if config.sampling.max_new_tokens >= config.model.max_length:
        raise ValueError(f"{name}: --max-new-tokens {config.sampling.max_new_tokens} leaves no room for a prompt "
                         f"within --max-length {config.model.max_length} (prompt + completion budget)")


# --- the source ---------------------------------------------------------------------------
def prompt_source(ctx, engine, data, config, max_steps: int) -> Source:
    """grpo / rft / dpo's source (module docstring): one-turn episodes of the prompt tasks, sampled as the sampling
    section says (`trajtune.sources.build.episode_source`: with the built-in sampler every episode samples from its
    own seed, so the samples are the same in one process and sharded over N) and scored as a batch by the run's
    graders (`graders.build_graders`). Close it when done (`with prompt_source(...) as source:`)."""
    from ...envs.base import SingleTurnEnv

    graders = build_graders(ctx, config, frozenset(k for task in data.items for k in task.columns))
    try:
        def score(episodes: Source) -> Source:
            return Scored(episodes, engine, graders, max_steps,
                          unfinished=None if config.score_unfinished else config.unfinished_reward,
                          score_unfinished=config.score_unfinished)

        rl = getattr(config, "rl", None)
        loop = rl or getattr(config, "rft", None) or config.dpo  # its seed: a colocated vLLM engine's
        agent = getattr(config, "agent", None)
        return episode_source(config.sampling, engine, SingleTurnEnv, data.renderer, config.METHOD, max_turns=1,
                              max_tokens=data.limit, pad_id=data.pad_id, score=score if graders else None, rl=rl,
                              model_dir=config.model.path, precision=config.model.precision, seed=loop.seed,
                              name=lambda n: flag(f"sampling.{n}"), stage_dir=ctx.dir, agent=agent,
                              tokenizer=data.tokenizer, template_kwargs=data.template_kwargs)
    except BaseException:
        close_graders(graders)
        raise
