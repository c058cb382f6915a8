"""`trajtune rm` / experiment "hf_rm": a reward model (a value head on the model; RLHF book ch.5).

    trajtune rm --model ./my-model --data pairs.jsonl --out runs/rm
    trajtune rm --model ./my-model --data ranked.jsonl --objective plackett-luce
    trajtune rm --model ./my-model --data labelled.jsonl --objective orm --aggregate min
    trajtune rm --model ./my-model --data steps.jsonl --objective prm --step-separator $'\\n'

--objective and its data (trajtune.sources.data, trajtune.algorithms.reward_model):

    bt (default)     'prompt'/'chosen'/'rejected' rows (implicit prompts too; a 'margin' column per pair: Llama 2's
                     margin loss), or ranked rows ('prompt', 'completions' best first or with 'scores'): all
                     C(K,2) pairs of a prompt in one batch, averaged per prompt (InstructGPT)
    plackett-luce    ranked rows (preference rows count as K = 2): the K-wise loss (Starling)
    orm              'prompt'/'completion'/'label' (0/1) rows: an outcome reward model, the label copied onto every
                     completion token; it scores by --aggregate (mean, min, product = sum of log p, last)
    prm              'prompt'/'completions' (steps)/'labels' (one per step) rows: a process reward model, each label
                     on its step's last token (the steps joined by --step-separator); it scores by --aggregate over
                     the steps

One stage, "rm"; model/ holds the body, value_head.safetensors and reward_model.json (the objective,
--aggregate and --step-separator: how `--reward-model`, `rm-eval` and best-of-N score with it). A
Bradley-Terry model is also a sequence classifier: `AutoModelForSequenceClassification.from_pretrained(
"runs/rm/model")` loads it with the trained head (num_labels=1; its logit is the reward at the last non-pad
token). Held-out rows (--eval-data, or --eval-split of --data with --split-seed; --split-swap trains on the
other part: a proxy and a "gold" reward model on disjoint halves) give eval/pair_accuracy, eval/rm_margin and
eval/rm_loss (pairs and ranked lists), or eval/rm_loss and eval/token_accuracy (orm, prm), every --eval-steps
steps. Dropout is off by default (--disable-dropout, TRL's RewardConfig default).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Sequence

from ...algorithms.reward_model import (RewardModelConfig, train_ranked_reward_model, train_reward_model,
                                        train_token_reward_model)
from ...engine import OptimConfig
from ...metrics import register
from .common import announce, check_run, finish, hf_optim, OutputConfig, stage_run
from .recipe import preflight, run_method
from .model import ModelConfig, load_engine
from .prepare import Prepared, planned, reward_model_data
from .rm_eval import KIND_FILE
from .schedule import ScheduleConfig, check_schedule

register("eval/rm_margin", "mean r_chosen - r_rejected of the reward model on held-out pairs (--eval-data)")
register("eval/rm_loss", "the reward model's loss on held-out rows: Bradley-Terry -log sigma(r_chosen - r_rejected - "
         "margin) on pairs, the grouped loss on ranked lists, per-token BCE (orm, prm)")
register("eval/token_accuracy", "an ORM's token-level or a PRM's step-level accuracy on held-out rows")


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
    """held-out rows in --data's format: eval/pair_accuracy, eval/rm_margin, eval/rm_loss (orm / prm:
    eval/rm_loss, eval/token_accuracy) every --eval-steps steps"""
    eval_split: float = 0.0
    """hold out this share of --data's rows as the evaluation rows instead of --eval-data (0: none)"""
    split_seed: int = 0
    """which rows --eval-split holds out: a shuffle seeded with it (the same rows for the same seed)"""
    split_swap: bool = False
    """train on the rows --eval-split holds out and evaluate on the rest (with --eval-split 0.5: a second
    reward model on the half the first never saw, e.g. a "gold" RM beside a proxy)"""
    step_separator: str = "\n"
    """--objective prm: the text that ends each step when the steps of a row are joined into one message"""
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
        if not 0.0 <= self.eval_split < 1.0:
            raise ValueError(f"rm: --eval-split must be in [0, 1), got {self.eval_split}")
        if self.eval_split and self.eval_data:
            raise ValueError("rm: --eval-split holds out part of --data; give it or --eval-data, not both")
        if self.split_swap and not self.eval_split:
            raise ValueError("rm: --split-swap trains on the rows --eval-split holds out; give --eval-split too")
        if not self.step_separator:
            raise ValueError("rm: --step-separator must not be empty")


Config = RewardModelRun


NOUNS = {"bt": "pairs", "plackett-luce": "ranked lists", "orm": "labelled completions", "prm": "stepwise completions"}


def prepare(config: RewardModelRun, run_dir: Path) -> Prepared:
    data = reward_model_data(config)
    noun = "ranked lists" if data.items and isinstance(data.items[0], list) else NOUNS[config.rm.objective]
    return planned(config, data, "rm", config.rm.batch_size, noun)


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


def eval_items(engine, items: list, c: RewardModelRun, pad_id: int) -> dict:
    """Held-out ranked lists (eval/pair_accuracy, eval/rm_margin, eval/rm_loss) or labelled episodes (eval/rm_loss,
    eval/token_accuracy), no gradient."""
    import torch

    from ...algorithms.reward_model import (ranked_batch, ranked_loss_fn, token_batch, token_loss_fn,
                                            with_prompt_weights)

    with torch.no_grad():
        if isinstance(items[0], list):  # ranked lists
            batch, loss_fn = with_prompt_weights(ranked_batch(items, pad_id)), ranked_loss_fn(c.rm)
        else:
            batch, loss_fn = token_batch(items, pad_id), token_loss_fn(c.rm)
        out = engine.forward(batch, values=True)
        loss, m = loss_fn(out, batch.to(out.values.device))
    if isinstance(items[0], list):
        return {"eval/pair_accuracy": float(m["rm/accuracy"]), "eval/rm_margin": float(m["rm/margin"]),
                "eval/rm_loss": float(loss)}
    key = "orm/accuracy" if c.rm.objective == "orm" else "prm/accuracy"
    return {"eval/rm_loss": float(loss), "eval/token_accuracy": float(m[key])}


def train(ctx, c: RewardModelRun, data: Prepared, home: str = "") -> dict:
    """The stage: the model with a value head behind ctx.engine, train_reward_model, save model/.
    `home`: where model/ and checkpoints/ go in the run directory ("" here; a pipeline of several
    methods would give each stage its own)."""
    c = dataclasses.replace(c, **data.overrides)  # the steps and lr schedule the data resolved (prepare)
    policy, engine = load_engine(ctx, c.model, c.optim, value_head=True, seed=c.rm.seed)
    announce(ctx, c, policy, len(data.items), "pairs")
    run = stage_run(ctx, policy, engine, data.tokenizer, c.output.save_every, home, config=c)
    ranked = isinstance(data.items[0], list)
    pairs = c.rm.objective == "bt" and not ranked
    if data.eval_items:
        run.evaluate = ((lambda step: eval_pairs(engine, data.eval_items, data.pad_id, c.rm.margin, c.rm.batch_size))
                        if pairs else (lambda step: eval_items(engine, data.eval_items, c, data.pad_id)))
    if c.rm.objective in ("orm", "prm"):
        history = train_token_reward_model(engine, data.items, c.rm, data.pad_id, run)
    elif ranked:
        history = train_ranked_reward_model(engine, data.items, c.rm, data.pad_id, run)
    else:
        history = train_reward_model(engine, data.items, c.rm, data.pad_id, run)
    results = finish(ctx, engine, policy, data.tokenizer, history, home, start=c.model.path)
    if engine.is_main:  # how the saved model scores (read by --reward-model, rm-eval)
        kind = {"objective": c.rm.objective, "aggregate": c.rm.aggregate, "step_separator": c.step_separator}
        (Path(results["model"]) / KIND_FILE).write_text(json.dumps(kind, indent=1) + "\n")
    return results


def dry_run(config: RewardModelRun, run_dir: Path) -> str:
    """Every check `run` makes before the model loads, nothing written (`--dry-run`, `trajtune run --dry-run`)."""
    return preflight(config, run_dir, prepare)


def run(config: RewardModelRun, run_dir: Path) -> Path:
    """Check, train, save model/ (with value_head.safetensors); returns the report."""
    return run_method(config, run_dir, train, prepare)


# the experiment contract (`trajtune.experiments.base.Experiment`): what it offers beyond one run
run_over_seeds = None  # no report over seeds: `trajtune run --seeds` is refused
parse_options = None  # no options of its own
