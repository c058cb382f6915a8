"""`trajtune rm` / experiment "hf_rm": a Bradley-Terry reward model (a value head on the model).

    trajtune rm --model ./my-model --data pairs.jsonl --out runs/rm

Data: 'prompt'/'chosen'/'rejected' rows or implicit-prompt 'chosen'/'rejected' (trajtune.sources.data).
One stage, "rm": `train_reward_model`; model/ holds the body and value_head.safetensors, and is
also a sequence classifier: `AutoModelForSequenceClassification.from_pretrained("runs/rm/model")`
loads it with the trained head (num_labels=1; its logit is the reward at the last non-pad token).
With --eval-data, held-out pairs give eval/pair_accuracy, eval/rm_margin and eval/rm_loss every
--eval-steps steps. Dropout is off by default (--disable-dropout, TRL's RewardConfig default).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Sequence

from ...algorithms.reward_model import RewardModelConfig, train_reward_model
from ...engine import OptimConfig
from ...metrics import register
from .common import announce, check_run, finish, hf_optim, OutputConfig, preflight, run_method, stage_run
from .model import ModelConfig, load_engine
from .prepare import Prepared, pair_data, planned
from .schedule import ScheduleConfig, check_schedule

register("eval/rm_margin", "mean r_chosen - r_rejected of the reward model on held-out pairs (--eval-data)")
register("eval/rm_loss", "Bradley-Terry loss -log sigma(r_chosen - r_rejected - margin) on held-out pairs")


@dataclass
class RewardModelRun:
    METHOD: ClassVar[str] = "rm"
    RESUMABLE: ClassVar[tuple[str, ...]] = ("rm.steps", "rm.eval_every", "schedule.num_train_epochs",
                                            "output.save_every", "model.device", "model.micro_batch_size")
    """options a resumed run may change (more steps, where it runs); any other change is a different run"""

    model: ModelConfig = field(default_factory=lambda: ModelConfig(disable_dropout=True))
    """the model and how it trains (LoRA, precision, lengths; dropout off as in TRL's RewardConfig)"""
    data: str = ""
    """preference rows: .jsonl, .json, .parquet or a save_to_disk directory (trajtune.sources.data)"""
    eval_data: str = ""
    """held-out preference rows: eval/pair_accuracy, eval/rm_margin, eval/rm_loss every --eval-steps steps"""
    rm: RewardModelConfig = field(default_factory=lambda: RewardModelConfig(steps=100, batch_size=8))
    """the reward-model loop (steps, batch_size: pairs per step, margin, seed ...)"""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """epochs instead of steps, warm-up ratio, learning-rate schedule (TRL's names)"""
    optim: OptimConfig = field(default_factory=hf_optim)
    """AdamW (lr 1e-5)"""
    output: OutputConfig = field(default_factory=OutputConfig)
    """what the run writes and when (checkpoints every --save-every steps ...)"""

    def __post_init__(self) -> None:
        check_run(self, "rm")
        check_schedule(self, "rm")


Config = RewardModelRun


def prepare(config: RewardModelRun, run_dir: Path) -> Prepared:
    return planned(config, pair_data(config), "rm", config.rm.batch_size, "pairs")


def eval_pairs(engine, pairs: Sequence, pad_id: int, margin: float, batch_size: int) -> dict:
    """The reward model on held-out pairs (no gradient): eval/pair_accuracy, eval/rm_margin, eval/rm_loss."""
    import torch

    from ...objectives.reward_model import last_token_values
    from ...objectives.reward_model import bradley_terry_loss
    from ...trajectory import collate

    episodes, scores = [c for c, _ in pairs] + [r for _, r in pairs], []
    for i in range(0, len(episodes), batch_size):
        batch = collate(episodes[i : i + batch_size], pad_id).to(engine.device)
        scores.append(last_token_values(engine.forward(batch, values=True).values, batch.attention_mask).cpu())
    r_2P = torch.cat(scores)  # [2P]: chosen, then rejected
    chosen_P, rejected_P = r_2P.chunk(2)
    loss, m = bradley_terry_loss(chosen_P, rejected_P, torch.full_like(chosen_P, margin) if margin else None)
    return {"eval/pair_accuracy": float(m["rm/accuracy"]), "eval/rm_margin": float(m["rm/margin"]),
            "eval/rm_loss": float(loss)}


def train(ctx, c: RewardModelRun, data: Prepared, home: str = "") -> dict:
    """The stage: the model with a value head behind ctx.engine, train_reward_model, save model/.
    `home`: where model/ and checkpoints/ go in the run directory ("" here; a pipeline of several
    methods would give each stage its own)."""
    c = dataclasses.replace(c, **data.overrides)  # the steps and lr schedule the data resolved (prepare)
    policy, engine = load_engine(ctx, c.model, c.optim, value_head=True, seed=c.rm.seed)
    announce(ctx, c, policy, len(data.items), "pairs")
    run = stage_run(ctx, policy, engine, data.tokenizer, c.output.save_every, home, config=c)
    if data.eval_items:
        run.evaluate = lambda step: eval_pairs(engine, data.eval_items, data.pad_id, c.rm.margin, c.rm.batch_size)
    history = train_reward_model(engine, data.items, c.rm, data.pad_id, run)
    return finish(ctx, engine, policy, data.tokenizer, history, home)


def dry_run(config: RewardModelRun, run_dir: Path) -> str:
    """Every check `run` makes before the model loads, nothing written (`--dry-run`, `trajtune run --dry-run`)."""
    return preflight(config, run_dir, prepare)


def run(config: RewardModelRun, run_dir: Path) -> Path:
    """Check, train, save model/ (with value_head.safetensors); returns the report."""
    return run_method(config, run_dir, train, prepare)
