"""`trajtune dpo` / experiment "hf_dpo": direct preference optimisation (and ipo / simpo / orpo).

    trajtune dpo --model runs/sft/model --data pairs.jsonl --beta 0.1 --lora-r 16 --out runs/dpo

Data: 'prompt'/'chosen'/'rejected' rows or implicit-prompt 'chosen'/'rejected' (trajtune.data).
One stage, "dpo": `train_dpo` against the starting policy (with LoRA: the base model, adapters off).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ...algorithms.dpo import DPOConfig, train_dpo
from ...engine import OptimConfig
from .common import announce, check_run, finish, hf_optim, OutputConfig, run_method, stage_run
from .model import ModelConfig, load_engine
from .prepare import Prepared, check_same_run, pair_data


@dataclass
class DPORun:
    METHOD: ClassVar[str] = "dpo"
    RESUMABLE: ClassVar[tuple[str, ...]] = ("dpo.steps", "dpo.eval_every", "output.save_every", "model.device",
                                            "model.micro_batch_size")
    """options a resumed run may change (more steps, where it runs); any other change is a different run"""

    model: ModelConfig = field(default_factory=ModelConfig)
    """the model and how it trains (LoRA, precision, lengths)"""
    data: str = ""
    """JSONL file of preference rows (trajtune.data)"""
    dpo: DPOConfig = field(default_factory=lambda: DPOConfig(steps=100, batch_size=8))
    """the preference loop (steps, batch_size: pairs per step, loss, beta, seed ...)"""
    optim: OptimConfig = field(default_factory=hf_optim)
    """AdamW (lr 1e-5)"""
    output: OutputConfig = field(default_factory=OutputConfig)
    """what the run writes and when (checkpoints every --save-every steps ...)"""

    def __post_init__(self) -> None:
        check_run(self, "dpo")
        if self.dpo.regenerate_every:
            raise ValueError("dpo: --regenerate-every needs a pair generator; the dpo command trains on the "
                             "pairs of --data (set it to 0)")


Config = DPORun


def prepare(config: DPORun, run_dir: Path) -> Prepared:
    check_same_run(config, run_dir, DPORun.METHOD)
    return pair_data(config)


def train(ctx, c: DPORun, data: Prepared, home: str = "") -> dict:
    """The stage: load the model behind ctx.engine, train_dpo, save model/.
    `home`: where model/ and checkpoints/ go in the run directory ("" here; a pipeline of several
    methods would give each stage its own)."""
    policy, engine = load_engine(ctx, c.model, c.optim, seed=c.dpo.seed)
    announce(ctx, c, policy, len(data.items), "pairs")
    run = stage_run(ctx, policy, engine, data.tokenizer, c.output.save_every, home)
    history = train_dpo(engine, data.items, c.dpo, data.pad_id, run)
    return finish(ctx, engine, policy, data.tokenizer, history, home)


def run(config: DPORun, run_dir: Path) -> Path:
    """Check, train, save model/ in the Hugging Face format; returns the report."""
    return run_method(config, run_dir, train, prepare)
