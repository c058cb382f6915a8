"""`trajtune rm` / experiment "hf_rm": a Bradley-Terry reward model (a value head on the model).

    trajtune rm --model ./my-model --data pairs.jsonl --out runs/rm

Data: 'prompt'/'chosen'/'rejected' rows or implicit-prompt 'chosen'/'rejected' (trajtune.data).
One stage, "rm": `train_reward_model`; model/ holds the body and value_head.safetensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ...algorithms.reward_model import RewardModelConfig, train_reward_model
from ...engine import OptimConfig
from .common import announce, check_run, finish, hf_optim, OutputConfig, run_method, stage_run
from .model import ModelConfig, load_engine
from .prepare import Prepared, check_same_run, pair_data


@dataclass
class RewardModelRun:
    METHOD: ClassVar[str] = "rm"
    RESUMABLE: ClassVar[tuple[str, ...]] = ("rm.steps", "rm.eval_every", "output.save_every", "model.device",
                                            "model.micro_batch_size")
    """options a resumed run may change (more steps, where it runs); any other change is a different run"""

    model: ModelConfig = field(default_factory=ModelConfig)
    """the model and how it trains (LoRA, precision, lengths)"""
    data: str = ""
    """JSONL file of preference rows (trajtune.data)"""
    rm: RewardModelConfig = field(default_factory=lambda: RewardModelConfig(steps=100, batch_size=8))
    """the reward-model loop (steps, batch_size: pairs per step, margin, seed ...)"""
    optim: OptimConfig = field(default_factory=hf_optim)
    """AdamW (lr 1e-5)"""
    output: OutputConfig = field(default_factory=OutputConfig)
    """what the run writes and when (checkpoints every --save-every steps ...)"""

    def __post_init__(self) -> None:
        check_run(self, "rm")


Config = RewardModelRun


def prepare(config: RewardModelRun, run_dir: Path) -> Prepared:
    check_same_run(config, run_dir, RewardModelRun.METHOD)
    return pair_data(config)


def train(ctx, c: RewardModelRun, data: Prepared, home: str = "") -> dict:
    """The stage: the model with a value head behind ctx.engine, train_reward_model, save model/.
    `home`: where model/ and checkpoints/ go in the run directory ("" here; a pipeline of several
    methods would give each stage its own)."""
    policy, engine = load_engine(ctx, c.model, c.optim, value_head=True, seed=c.rm.seed)
    announce(ctx, c, policy, len(data.items), "pairs")
    run = stage_run(ctx, policy, engine, data.tokenizer, c.output.save_every, home)
    history = train_reward_model(engine, data.items, c.rm, data.pad_id, run)
    return finish(ctx, engine, policy, data.tokenizer, history, home)


def run(config: RewardModelRun, run_dir: Path) -> Path:
    """Check, train, save model/ (with value_head.safetensors); returns the report."""
    return run_method(config, run_dir, train, prepare)
