"""grpo / rft: how completions are sampled and scored (the sampling section, the rewards), and the source the
loops take (`prompt_source`).

One step's source, top to bottom (`trajtune.sources`):

    EpisodeSource   the step's prompts x group size, one-turn episodes (sharded over ranks under torchrun,
                    all-gathered: every rank holds the whole batch, task-major, group ids kept), sampled with
                    the sampling section
    Scored          every --reward function once on the whole batch, at the same time, in worker processes
                    under --reward-timeout (rank 0 calls them, the rewards are broadcast), and the
                    --reward-model on the rendered prompt + completion (sharded, gathered); several
                    --reward-model directories are one source, `reward_ensemble`, their scores combined by
                    --reward-model-combine (mean, min, mean_minus_std with --reward-model-k;
                    trajtune.sources.ensemble). A reward model scores finished completions only: one cut at
                    --max-new-tokens gets --unfinished-reward instead (the book's convention, ch.6; TRL's
                    missing_eos_penalty). Reward = the --reward-weights sum over the sources that scored the
                    episode (None left out); an episode no source scored, or whose reward call timed out, is
                    left out of the update
    Overlapped      (grpo --max-staleness 1) the next step's episodes sampled and scored while this one trains,
                    in a sampler process one update behind (trajtune.sources.overlap)

A reward function that raises or returns a non-reward stops the run with a message naming it, the
rows and its traceback (trajtune.sources.rewards); the logged rows get reward/<source>/mean and /std.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ...config import check_choices, check_ranges
from ...sources.base import Source
from ...sources.rewards import RewardError, RewardFunction, RewardSet, check_columns
from ...sources.ensemble import RewardEnsemble
from ...sources.build import episode_source
from ...sources.sampling import MOVED, check_sampling as check_section
from ...sources.scoring import RM_NAME, RewardModel, Scored
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
    """weight of each reward source in order (the --reward functions, then --reward-model; empty: 1 each);
    an episode's reward is the weighted sum over the sources that scored it (None left out)"""
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
    overlapped only with an RL loop's tis_cap), a reward source, one weight per source, and room for a prompt within
    the length budget. A single `reward_model` string (a recipe's) becomes a list of one."""
    rl = getattr(config, "rl", None)
    if rl is None and config.sampling.in_process:
        raise ValueError(f"{name}: {flag('sampling.max_staleness')} / {flag('sampling.sampler_process')} are grpo's "
                         f"(an RL loop with --tis-cap); {name} samples on-policy, in the trainer")
    check_section(config.sampling, name, rl=rl, backends=backends, name=lambda n: flag(f"sampling.{n}"))
    if isinstance(config.reward_model, str):
        config.reward_model = [config.reward_model] if config.reward_model else []
    if not (config.reward or config.reward_model or config.reward_judge or config.rubric):
        raise ValueError(f"{name}: needs a reward source: --reward module:function, --reward-model DIR, "
                         "--reward-judge DIR or --rubric FILE (reward / reward_model / reward_judge / rubric in a "
                         "recipe)")
    if len(set(config.reward_model)) != len(config.reward_model):
        raise ValueError(f"{name}: --reward-model names a directory twice ({config.reward_model})")
    if not (config.reward_model_k >= 0 and math.isfinite(config.reward_model_k)):
        raise ValueError(f"{name}: --reward-model-k must be a finite number >= 0, got {config.reward_model_k}")
    if config.unfinished_reward is not None and not math.isfinite(config.unfinished_reward):
        raise ValueError(f"{name}: --unfinished-reward must be a finite number, got {config.unfinished_reward}")
    check_ranges(config, name, label=flag, counts=("judge_max_new_tokens",))
    n = len(config.reward) + bool(config.reward_model) + bool(config.reward_judge) + bool(config.rubric)
    if config.reward_weights and len(config.reward_weights) != n:
        models = " ".join(config.reward_model)
        sources = [f"--reward {r}" for r in config.reward] + ([f"--reward-model {models}"] if models else [])
        sources += ([f"--reward-judge {config.reward_judge}"] if config.reward_judge else [])
        sources += [f"--rubric {config.rubric}"] if config.rubric else []
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
    from ...config import ConfigError
    from .rm_eval import read_kind

    for path in config.reward_model:
        try:
            read_kind(path)  # a value head, and a readable reward_model.json where there is one
        except ConfigError as e:
            raise RewardError(f"--reward-model {e}") from None
    if config.reward_judge:
        from ...models.hf import check_model_dir

        check_model_dir(config.reward_judge)
    if config.rubric:
        from ...sources.rewards.rubric import load_rubric

        rubric = load_rubric(config.rubric)
        unchecked = [i.title for i in rubric.items if i.check is None]
        if unchecked and not config.reward_judge:
            raise RewardError(f"--rubric {config.rubric}: items {unchecked} have no 'check' verifier, so a judge must "
                              "grade them: give --reward-judge MODEL_DIR, or a 'check' (file.py:fn) to each item")


# --- the source ---------------------------------------------------------------------------
def reward_model(ctx, path: str, model: ModelConfig, name: str = RM_NAME) -> RewardModel:
    """A reward model saved by `trajtune rm` as a reward source: its score of the prompt + completion (as its
    `reward_model.json` says: the head at the last token, or an ORM / PRM's aggregate), rendered with the reward
    model's own chat template, on a frozen engine beside the policy's."""
    from ...engine.distributed import launched_distributed
    from ...models import hf
    from ...text.chat import ChatRenderer
    from .rm_eval import read_kind

    kind = read_kind(path)
    renderer = ChatRenderer(hf.load_tokenizer(path))
    policy = hf.load_policy(path, value_head=True)
    device = None if model.device == "cuda" and launched_distributed() else model.device
    engine = ctx.engine(policy, None, frozen=True, device=device,
                        autocast=None if model.precision == "fp32" else model.precision)
    return RewardModel(engine, renderer, name, kind)


def reward_models(ctx, config, columns=frozenset()) -> list:
    """The model-graded reward sources of grpo / rft, in --reward-weights order after the functions: the reward
    models (none, one `RewardModel`, or several as one `RewardEnsemble`: --reward-model-combine, --reward-model-k),
    then --reward-judge (`trajtune.sources.judge.Judge`), then --rubric (`RubricReward`, its unchecked items asked
    of the judge). `columns`: the prompt rows' columns (a pairwise judge compares with `reference` when they have
    it)."""
    from ...sources.judge import load_judge

    paths = config.reward_model
    if len(paths) <= 1:
        out: list = [reward_model(ctx, p, config.model) for p in paths]
    else:
        members = [reward_model(ctx, p, config.model, name=f"{RM_NAME}{i}") for i, p in enumerate(paths)]
        out = [RewardEnsemble(members, config.reward_model_combine, config.reward_model_k)]
    judge = None
    if config.reward_judge:
        from ...engine.distributed import launched_distributed

        device = None if config.model.device == "cuda" and launched_distributed() else config.model.device  # rank's GPU
        judge = load_judge(config.reward_judge, config.judge_template, device=device, precision=config.model.precision,
                           max_new_tokens=config.judge_max_new_tokens,
                           reference="reference" if "reference" in columns else None)
        out.append(judge)
    if config.rubric:
        from ...sources.rewards.rubric import RubricReward

        out.append(RubricReward(config.rubric, judge=judge))
    return out


def prompt_source(ctx, engine, data, config, max_steps: int) -> Source:
    """grpo / rft / dpo's source (module docstring): one-turn episodes of the prompt tasks, sampled as the sampling
    section says (`trajtune.sources.build.episode_source`: with the built-in sampler every episode samples from its
    own seed, so the samples are the same in one process and sharded over N) and scored as a batch. Close it when
    done (`with prompt_source(...) as source:`)."""
    from ...envs.base import SingleTurnEnv

    functions = RewardSet([RewardFunction(spec=spec) for spec in config.reward], timeout=config.reward_timeout)
    try:
        models = reward_models(ctx, config, {k for task in data.items for k in task.columns})

        def score(episodes: Source) -> Source:
            return Scored(episodes, engine, functions, models, config.reward_weights, max_steps,
                          unfinished=None if config.score_unfinished else config.unfinished_reward,
                          score_unfinished=config.score_unfinished)

        rl = getattr(config, "rl", None)
        loop = rl or getattr(config, "rft", None) or config.dpo  # its seed: a colocated vLLM engine's
        return episode_source(config.sampling, engine, SingleTurnEnv, data.renderer, config.METHOD, max_turns=1,
                              max_tokens=data.limit, pad_id=data.pad_id, score=score, rl=rl,
                              model_dir=config.model.path, precision=config.model.precision, seed=loop.seed,
                              name=lambda n: flag(f"sampling.{n}"))
    except BaseException:
        functions.close()
        raise
