"""`trajtune rft` / experiment "hf_rft": rejection-sampling fine-tuning (expert iteration).

    trajtune rft --model ./my-model --data prompts.jsonl --reward my_rewards:exact --rounds 4

Data and rewards as for grpo (several --reward functions and a --reward-model, weighted:
trajtune.experiments.hf.sampling). One stage, "rft": `train_rft` -- each round samples
--samples-per-task completions of every prompt, keeps those the reward accepts (--threshold)
and fine-tunes on them for --steps-per-round steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ...algorithms.rft import RFTConfig, train_rft
from ...engine import OptimConfig
from .common import announce, check_run, finish, hf_optim, OutputConfig, stage_run
from .recipe import preflight, run_method
from .model import load_engine
from ...sources.sampling import SamplingConfig
from .graders import check_grader_inputs
from .sampling import PromptRewardRun, check_sampling, prompt_source
from .prepare import Prepared, prompt_data


@dataclass
class RFTRun(PromptRewardRun):
    METHOD: ClassVar[str] = "rft"
    RESUMABLE: ClassVar[tuple[str, ...]] = ("rft.rounds", "output.save_every", "model.device", "model.micro_batch_size",
                                            "reward_timeout")
    """options a resumed run may change (more rounds, where it runs); any other change is a different run"""

    rft: RFTConfig = field(default_factory=lambda: RFTConfig(samples_per_task=8, steps_per_round=100, batch_size=8))
    """the expert-iteration loop (rounds, samples_per_task, steps_per_round, batch_size, threshold, seed ...)"""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """how completions are sampled"""
    optim: OptimConfig = field(default_factory=hf_optim)
    """AdamW (lr 1e-5)"""
    output: OutputConfig = field(default_factory=OutputConfig)
    """what the run writes and when (checkpoints every --save-every optimizer steps ...)"""

    def __post_init__(self) -> None:
        check_run(self, "rft")
        check_sampling(self, "rft")


Config = RFTRun


def prepare(config: RFTRun, run_dir: Path) -> Prepared:
    prepared = prompt_data(config)
    check_grader_inputs(config, prepared.items)  # imports, columns, the reward model's files: before the model loads
    return prepared


def train(ctx, c: RFTRun, data: Prepared, home: str = "") -> dict:
    """The stage: load the model behind ctx.engine, train_rft, save model/.
    `home`: where model/ and checkpoints/ go in the run directory ("" here; a pipeline of several
    methods would give each stage its own)."""
    policy, engine = load_engine(ctx, c.model, c.optim, seed=c.rft.seed)
    announce(ctx, c, policy, len(data.items), "prompts")
    run = stage_run(ctx, policy, engine, data.tokenizer, c.output.save_every, home, config=c)
    with prompt_source(ctx, engine, data, c, c.rft.rounds * c.rft.steps_per_round) as source:
        history = train_rft(engine, data.items, source, c.rft, data.pad_id, run)
    return finish(ctx, engine, policy, data.tokenizer, history, home, start=c.model.path)


def dry_run(config: RFTRun, run_dir: Path) -> str:
    """Every check `run` makes before the model loads, nothing written (`--dry-run`, `trajtune run --dry-run`)."""
    return preflight(config, run_dir, prepare)


def run(config: RFTRun, run_dir: Path) -> Path:
    """Check, train, save model/ in the Hugging Face format; returns the report."""
    return run_method(config, run_dir, train, prepare)


# the experiment contract (`trajtune.experiments.base.Experiment`): what it offers beyond one run
run_over_seeds = None  # no report over seeds: `trajtune run --seeds` is refused
parse_options = None  # no options of its own
