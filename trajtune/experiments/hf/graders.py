"""grpo / rft / dpo: the graders a run's options name, as one weighted list (`trajtune.sources.graders`).

`GRADERS` is the registry: an option of the run config (`PromptRewardRun`'s field, its flag and TOML key) ->
the `GraderKind` that makes graders of it, in the order of --reward-weights:

    reward        --reward a.py:f ...    a `RewardFunction` per spec, under --reward-timeout
    reward_model  --reward-model DIR ... a `RewardModel`, or several as one `RewardEnsemble`
                                         (--reward-model-combine, --reward-model-k)
    reward_judge  --reward-judge DIR     a `Judge` (--judge-template, --judge-max-new-tokens)
    rubric        --rubric FILE          a `RubricReward` (its unchecked items asked of the judge)

`check_graders` (the config alone: a grader at all, one weight each) and `check_grader_inputs` (imports,
columns, model files: before any model loads) run every kind's checks; `build_graders` makes the list,
each grader with its weight (`Weighted`). The messages name the options from the registry. A new kind is its
grader class, one line here and its option field in `PromptRewardRun`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ...config import ConfigError, check_ranges
from ...sources.graders import Grader, Weighted, weighted
from ...sources.rewards import RewardError, RewardFunction, check_columns, unique_names
from ...sources.scoring import RM_NAME, RewardModel
from .model import ModelConfig
from .options import flag

Build = Callable[[Any, Any, frozenset, Mapping[str, list[Grader]]], list[Grader]]
"""(ctx, config, the prompt rows' columns, the graders built so far by kind) -> this kind's graders"""


def _no_check(config, *args) -> None:
    pass


@dataclass(frozen=True)
class GraderKind:
    """How a run's option makes graders of one kind."""

    build: Build
    """its graders (none where its option is unset)"""
    metavar: str = "SPEC"
    """what the option takes, in messages ('--rubric FILE')"""
    each: bool = False
    """one weighted grader per value of the option (--reward a.py:f b.py:g), else one for all of them"""
    check: Callable[[Any, str], None] = _no_check
    """(config, command): the config's own values, before anything loads"""
    check_inputs: Callable[[Any, Sequence], None] = _no_check
    """(config, prompt tasks): imports, columns, files, before any model loads"""


def _values(config, key: str) -> list:
    value = getattr(config, key)
    return list(value) if isinstance(value, (list, tuple)) else [value] if value else []


def sources(config, key: str) -> list[str]:
    """How the command line names each weighted grader of option `key` ('--reward a.py:f')."""
    values = [str(v) for v in _values(config, key)]
    if GRADERS[key].each:
        return [f"{flag(key)} {v}" for v in values]
    return [f"{flag(key)} {' '.join(values)}"] if values else []


# --- reward functions --------------------------------------------------------------------------
def _functions(ctx, config, columns, built) -> list[Grader]:
    return list(unique_names([RewardFunction(spec=spec, timeout=config.reward_timeout) for spec in config.reward]))


def _check_functions(config, name: str) -> None:
    check_ranges(config, name, label=flag, non_negative=("reward_timeout",))


def _functions_in(config, tasks: Sequence) -> None:
    functions = unique_names([RewardFunction(spec=s) for s in config.reward])  # imports, names and duplicates
    check_columns(functions, tasks)


# --- reward models ------------------------------------------------------------------------------
def reward_model(ctx, path: str, model: ModelConfig, name: str = RM_NAME) -> RewardModel:
    """A reward model saved by `trajtune rm` as a grader: its score of the prompt + completion (as its
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


def _models(ctx, config, columns, built) -> list[Grader]:
    from ...sources.ensemble import RewardEnsemble

    paths = config.reward_model
    if len(paths) <= 1:
        return [reward_model(ctx, p, config.model) for p in paths]
    members = [reward_model(ctx, p, config.model, name=f"{RM_NAME}{i}") for i, p in enumerate(paths)]
    return [RewardEnsemble(members, config.reward_model_combine, config.reward_model_k)]


def _check_models(config, name: str) -> None:
    if isinstance(config.reward_model, str):  # a recipe's single directory: a list of one
        config.reward_model = [config.reward_model] if config.reward_model else []
    if len(set(config.reward_model)) != len(config.reward_model):
        raise ValueError(f"{name}: --reward-model names a directory twice ({config.reward_model})")
    if not (config.reward_model_k >= 0 and math.isfinite(config.reward_model_k)):
        raise ValueError(f"{name}: --reward-model-k must be a finite number >= 0, got {config.reward_model_k}")
    if config.unfinished_reward is not None and not math.isfinite(config.unfinished_reward):
        raise ValueError(f"{name}: --unfinished-reward must be a finite number, got {config.unfinished_reward}")


def _model_inputs(config, tasks: Sequence) -> None:
    from .rm_eval import read_kind

    for path in config.reward_model:
        try:
            read_kind(path)  # a value head, and a readable reward_model.json where there is one
        except ConfigError as e:
            raise RewardError(f"--reward-model {e}") from None


# --- a judge ------------------------------------------------------------------------------------
def _judge(ctx, config, columns, built) -> list[Grader]:
    if not config.reward_judge:
        return []
    from ...engine.distributed import launched_distributed
    from ...sources.judge import load_judge

    device = None if config.model.device == "cuda" and launched_distributed() else config.model.device  # rank's GPU
    return [load_judge(config.reward_judge, config.judge_template, device=device, precision=config.model.precision,
                       max_new_tokens=config.judge_max_new_tokens,
                       reference="reference" if "reference" in columns else None)]


def _check_judge(config, name: str) -> None:
    check_ranges(config, name, label=flag, counts=("judge_max_new_tokens",))


def _judge_inputs(config, tasks: Sequence) -> None:
    if config.reward_judge:
        from ...models.hf import check_model_dir

        check_model_dir(config.reward_judge)


# --- a rubric -----------------------------------------------------------------------------------
def _rubric(ctx, config, columns, built) -> list[Grader]:
    if not config.rubric:
        return []
    from ...sources.rewards.rubric import RubricReward

    judges = built.get("reward_judge") or [None]
    return [RubricReward(config.rubric, judge=judges[0])]


def _rubric_inputs(config, tasks: Sequence) -> None:
    if not config.rubric:
        return
    from ...sources.rewards.rubric import load_rubric

    unchecked = [i.title for i in load_rubric(config.rubric).items if i.check is None]
    if unchecked and not config.reward_judge:
        raise RewardError(f"--rubric {config.rubric}: items {unchecked} have no 'check' verifier, so a judge must "
                          "grade them: give --reward-judge MODEL_DIR, or a 'check' (file.py:fn) to each item")


GRADERS: dict[str, GraderKind] = {
    "reward": GraderKind(_functions, "module:function", each=True, check=_check_functions, check_inputs=_functions_in),
    "reward_model": GraderKind(_models, "DIR", check=_check_models, check_inputs=_model_inputs),
    "reward_judge": GraderKind(_judge, "DIR", check=_check_judge, check_inputs=_judge_inputs),
    "rubric": GraderKind(_rubric, "FILE", check_inputs=_rubric_inputs),
}
"""option -> the kind of grader it makes, in --reward-weights order (module docstring)"""


# --- the checks and the list -------------------------------------------------------------------------
def check_graders(config, name: str) -> None:
    """The graders' options alone (`check_sampling`): at least one grader, every kind's checks, one finite
    weight per weighted grader."""
    for kind in GRADERS.values():
        kind.check(config, name)
    named = [s for key in GRADERS for s in sources(config, key)]
    if not named and not getattr(getattr(config, "agent", None), "run", ""):  # (an agent may return the rewards)
        options = ", ".join(f"{flag(key)} {kind.metavar}" for key, kind in GRADERS.items())
        raise ValueError(f"{name}: needs a reward source: {options} ({' / '.join(GRADERS)} in a recipe)")
    if config.reward_weights and len(config.reward_weights) != len(named):
        raise ValueError(f"{name}: --reward-weights has {len(config.reward_weights)} numbers for {len(named)} reward "
                         f"sources ({', '.join(named)}); give one weight per source, in this order")
    if not all(math.isfinite(w) for w in config.reward_weights):
        raise ValueError(f"{name}: --reward-weights must be finite numbers, got {config.reward_weights}")


def check_grader_inputs(config, tasks: list) -> None:
    """Before any model loads: every --reward imports, every column it names is in every row, --reward-model is
    a reward model saved by `trajtune rm`, the judge a model directory, the rubric readable (the stage loads
    them again: its arguments are specs, picklable; a module is imported once per process)."""
    for kind in GRADERS.values():
        kind.check_inputs(config, tasks)


def build_graders(ctx, config, columns: frozenset = frozenset()) -> list[Weighted]:
    """The run's graders in `GRADERS` order, each with its --reward-weights weight (empty: 1 each). `columns`:
    the prompt rows' columns (a pairwise judge compares with `reference` when they have it). Where a kind fails
    to build, the graders built before it are closed."""
    built: dict[str, list[Grader]] = {}
    try:
        for key, kind in GRADERS.items():
            built[key] = kind.build(ctx, config, columns, built)
    except BaseException:
        close_graders([g for gs in built.values() for g in gs])
        raise
    return weighted([g for gs in built.values() for g in gs], config.reward_weights)


def close_graders(graders: Sequence[Grader | Weighted]) -> None:
    """Close each grader (worker processes stopped)."""
    for g in graders:
        (g.grader if isinstance(g, Weighted) else g).close()
