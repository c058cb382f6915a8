"""`trajtune sft` / experiment "hf_sft": supervised fine-tuning of a local Hugging Face model.

    trajtune sft --model ./my-model --data chats.jsonl --steps 100 --lr 1e-5 --out runs/sft

Data: 'messages' rows (every assistant turn trained) or 'prompt'/'completion' rows (the
completion trained), see trajtune.data. One stage, "sft": `train_sft` on the rows that fit
--max-length; writes model/ and, every --save-every steps, checkpoints/step-N.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ...algorithms.sft import SFTConfig, train_sft
from ...engine import OptimConfig
from .common import announce, check_run, finish, hf_optim, OutputConfig, run_method, stage_run
from .model import ModelConfig, load_engine
from .prepare import Prepared, check_same_run, sft_data


@dataclass
class SFTRun:
    METHOD: ClassVar[str] = "sft"
    RESUMABLE: ClassVar[tuple[str, ...]] = ("sft.steps", "sft.eval_every", "output.save_every", "model.device",
                                            "model.micro_batch_size")
    """options a resumed run may change (more steps, where it runs); any other change is a different run"""

    model: ModelConfig = field(default_factory=ModelConfig)
    """the model and how it trains (LoRA, precision, lengths)"""
    data: str = ""
    """JSONL file of 'messages' or 'prompt'/'completion' rows (trajtune.data)"""
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(steps=100, batch_size=8))
    """the SFT loop (steps, batch_size: conversations per step, seed ...)"""
    optim: OptimConfig = field(default_factory=hf_optim)
    """AdamW (lr 1e-5)"""
    output: OutputConfig = field(default_factory=OutputConfig)
    """what the run writes and when (checkpoints every --save-every steps ...)"""

    def __post_init__(self) -> None:
        check_run(self, "sft")


Config = SFTRun


def prepare(config: SFTRun, run_dir: Path) -> Prepared:
    check_same_run(config, run_dir, SFTRun.METHOD)
    return sft_data(config)


def train(ctx, c: SFTRun, data: Prepared, home: str = "") -> dict:
    """The stage: load the model behind ctx.engine, train_sft, save model/.
    `home`: where model/ and checkpoints/ go in the run directory ("" here; a pipeline of several
    methods would give each stage its own)."""
    policy, engine = load_engine(ctx, c.model, c.optim, seed=c.sft.seed)
    announce(ctx, c, policy, len(data.items), "samples")
    run = stage_run(ctx, policy, engine, data.tokenizer, c.output.save_every, home)
    history = train_sft(engine, data.items, c.sft, data.pad_id, run)
    return finish(ctx, engine, policy, data.tokenizer, history, home)


def run(config: SFTRun, run_dir: Path) -> Path:
    """Check, train, save model/ in the Hugging Face format; returns the report."""
    return run_method(config, run_dir, train, prepare)
