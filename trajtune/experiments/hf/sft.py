"""`trajtune sft` / experiment "hf_sft": supervised fine-tuning of a local Hugging Face model.

    trajtune sft --model ./my-model --data chats.jsonl --steps 100 --lr 1e-5 --out runs/sft

Data: 'messages' rows (every assistant turn trained) or 'prompt'/'completion' rows (the
completion trained; assistant turns inside the prompt are context), see trajtune.sources.data. One
stage, "sft": `train_sft` on the rows that fit --max-length; writes model/ and, every
--save-every steps, checkpoints/step-N. With --eval-data, the held-out rows' mean NLL per
trained token is logged as eval/loss every --eval-steps steps (and after the last).
--num-train-epochs, --warmup-ratio and --lr-scheduler-type as in TRL (schedule.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Sequence

from ...algorithms.sft import SFTConfig, train_sft
from ...engine import OptimConfig
from .common import announce, check_run, finish, hf_optim, OutputConfig, stage_run
from .recipe import preflight, run_method
from .model import ModelConfig, load_engine
from .prepare import Prepared, planned, sft_data
from .schedule import ScheduleConfig, check_schedule


@dataclass
class SFTRun:
    METHOD: ClassVar[str] = "sft"
    RESUMABLE: ClassVar[tuple[str, ...]] = ("sft.steps", "sft.eval_every", "schedule.num_train_epochs",
                                            "output.save_every", "model.device", "model.micro_batch_size")
    """options a resumed run may change (more steps, where it runs); any other change is a different run"""

    model: ModelConfig = field(default_factory=ModelConfig)
    """the model and how it trains (LoRA, precision, lengths)"""
    data: str = ""
    """'messages' or 'prompt'/'completion' rows: .jsonl, .json, .parquet or a save_to_disk directory
    (trajtune.sources.data)"""
    eval_data: str = ""
    """held-out rows in the same format: eval/loss (mean NLL per trained token) every --eval-steps steps"""
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(steps=100, batch_size=8))
    """the SFT loop (steps, batch_size: conversations per step, seed ...)"""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """epochs instead of steps, warm-up ratio, learning-rate schedule (TRL's names)"""
    optim: OptimConfig = field(default_factory=hf_optim)
    """AdamW (lr 1e-5)"""
    output: OutputConfig = field(default_factory=OutputConfig)
    """what the run writes and when (checkpoints every --save-every steps ...)"""

    def __post_init__(self) -> None:
        check_run(self, "sft")
        check_schedule(self, "sft")


Config = SFTRun


def prepare(config: SFTRun, run_dir: Path) -> Prepared:
    return planned(config, sft_data(config), "sft", config.sft.batch_size, "samples")


def eval_loss(engine, data: Sequence, pad_id: int, batch_size: int) -> dict:
    """eval/loss: the mean NLL per POLICY token of held-out trajectories (no gradient), as train/loss with
    --aggregation token."""

    from ...trajectory import collate

    nll, tokens = 0.0, 0.0
    for i in range(0, len(data), batch_size):
        batch = collate(list(data[i : i + batch_size]), pad_id)
        logp_B_T = engine.forward(batch).logprobs  # [B, T-1]
        mask = batch.action_mask.to(logp_B_T.device)  # [B, T-1]: the POLICY tokens
        nll -= float((logp_B_T * mask).sum())
        tokens += float(mask.sum())
    return {"eval/loss": nll / max(tokens, 1.0)}


def train(ctx, c: SFTRun, data: Prepared, home: str = "") -> dict:
    """The stage: load the model behind ctx.engine, train_sft, save model/.
    `home`: where model/ and checkpoints/ go in the run directory ("" here; a pipeline of several
    methods would give each stage its own)."""
    c = dataclasses.replace(c, **data.overrides)  # the steps and lr schedule the data resolved (prepare)
    policy, engine = load_engine(ctx, c.model, c.optim, seed=c.sft.seed)
    announce(ctx, c, policy, len(data.items), "samples")
    run = stage_run(ctx, policy, engine, data.tokenizer, c.output.save_every, home, config=c)
    if data.eval_items:
        run.evaluate = lambda step: eval_loss(engine, data.eval_items, data.pad_id, c.sft.batch_size)
    history = train_sft(engine, data.items, c.sft, data.pad_id, run)
    return finish(ctx, engine, policy, data.tokenizer, history, home, start=c.model.path)


def dry_run(config: SFTRun, run_dir: Path) -> str:
    """Every check `run` makes before the model loads, nothing written (`--dry-run`, `trajtune run --dry-run`)."""
    return preflight(config, run_dir, prepare)


def run(config: SFTRun, run_dir: Path) -> Path:
    """Check, train, save model/ in the Hugging Face format; returns the report."""
    return run_method(config, run_dir, train, prepare)


# the experiment contract (`trajtune.experiments.base.Experiment`): what it offers beyond one run
run_over_seeds = None  # no report over seeds: `trajtune run --seeds` is refused
parse_options = None  # no options of its own
