"""Post-training ch.13 as one recipe (REPRODUCE part B): instruction tuning -> preferences -> RLVR.

    B1 pretrain ─┬─ B2 sft_narrow ─┬─ B3/B4 reward_model + best-of-n
                 │                 └─ B5 dpo_beta1, dpo_beta0.3, dpo_beta0.1
                 └─ B2 sft_broad
    B6 coldstart ─┬─ B6 grpo
                  └─ B7 sft_control

Stages live in `chapter13_instruct`, `chapter13_preference` and `chapter13_rlvr`; this
module wires them (`chapter13_stages.run_stages`, parallel processes when `workers > 1`) and
writes the report (`chapter13_report`). `run_seeds` reruns everything per seed and
writes the three-seed table (B8).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from ..config import check_ranges, to_dict
from .chapter13_instruct import stage_pretrain, stage_sft
from .chapter13_preference import stage_dpo, stage_reward_model
from .chapter13_report import write_chapter13_report, write_seed_table
from .chapter13_rlvr import stage_coldstart, stage_grpo, stage_sft_control
from .chapter13_stages import Stage, run_stages

Part = Literal["instruct", "preference", "rlvr"]


@dataclass
class Config:
    seed: int = 0
    """one seed for model inits, batches, samples and pairs (the seed's 'shift every seed by s')"""
    parts: list[Part] = field(default_factory=lambda: ["instruct", "preference", "rlvr"])
    """which steps to run: instruct (B1-B2), preference (B3-B5, needs instruct), rlvr (B6-B7)"""
    workers: int = 2
    """processes running independent stages in parallel (1: everything in this process)"""
    threads: int = 1
    """torch threads per process (tiny matmuls: 1 thread per process is fastest on 2 cores)"""
    # --- B1: base model
    dim: int = 96
    """base model width (the seed's chapter 1 model: 96)"""
    n_layers: int = 3
    """base model blocks"""
    n_heads: int = 4
    """attention heads (base and calculator)"""
    pretrain_steps: int = 600
    """pretraining steps on raw Shakespeare"""
    pretrain_batch: int = 32
    """windows per pretraining step"""
    block_size: int = 64
    """characters predicted per pretraining window"""
    pretrain_lr: float = 3e-3
    """pretraining AdamW learning rate"""
    val_windows: int = 320
    """held-out windows for the Shakespeare val loss (the seed: 10 batches x 32)"""
    # --- B2: SFT
    sft_steps: int = 300
    """SFT steps on each demonstration set"""
    sft_batch: int = 32
    """demonstrations per SFT step"""
    sft_lr: float = 1e-3
    """SFT learning rate"""
    adherence_samples: int = 8
    """sampled replies per word when measuring adherence"""
    max_reply: int = 64
    """reply budget in characters (tokens)"""
    # --- B3-B5: preferences
    rm_steps: int = 60
    """Bradley-Terry steps"""
    rm_batch: int = 32
    """pairs per reward-model step"""
    rm_lr: float = 3e-4
    """reward-model learning rate"""
    bon_ns: list[int] = field(default_factory=lambda: [2, 4, 8])
    """best-of-n sizes"""
    bon_repeats: int = 4
    """each seen word is asked this many times for best-of-n (16 x 4 = 64 prompts)"""
    eval_per_word: int = 8
    """sampled replies per seen word for the SFT and DPO evaluations (reward, format, KL)"""
    dpo_betas: list[float] = field(default_factory=lambda: [1.0, 0.3, 0.1])
    """DPO beta sweep"""
    dpo_steps: int = 100
    """DPO steps per beta"""
    dpo_batch: int = 32
    """pairs per DPO step"""
    dpo_lr: float = 1e-4
    """DPO learning rate"""
    # --- B6-B7: RLVR
    calc_dim: int = 64
    """calculator model width"""
    calc_layers: int = 2
    """calculator blocks"""
    calc_steps: int = 500
    """cold-start SFT steps"""
    calc_batch: int = 64
    """worked examples per SFT step (cold start and control)"""
    calc_lr: float = 3e-3
    """calculator SFT learning rate"""
    grpo_steps: int = 200
    """GRPO steps"""
    grpo_prompts: int = 32
    """problems per GRPO step"""
    grpo_group: int = 8
    """samples per problem (the group)"""
    grpo_lr: float = 3e-4
    """GRPO learning rate"""
    control_steps: int = 200
    """extra SFT steps of the control (B7)"""
    pass_k: int = 16
    """samples per held-out problem for pass@k and distinct answers"""

    def __post_init__(self) -> None:
        if "preference" in self.parts and "instruct" not in self.parts:
            raise ValueError("chapter13: part 'preference' starts from the SFT model of part 'instruct'")
        check_ranges(self, "chapter13",
                     counts=("workers", "threads", "dim", "n_layers", "n_heads", "pretrain_batch", "block_size",
                             "val_windows", "sft_batch", "adherence_samples", "max_reply", "rm_batch", "bon_repeats",
                             "eval_per_word", "dpo_batch", "calc_dim", "calc_layers", "calc_batch", "grpo_prompts",
                             "pass_k"),
                     non_negative=("pretrain_steps", "sft_steps", "rm_steps", "dpo_steps", "calc_steps", "grpo_steps",
                                   "control_steps"),
                     positive=("pretrain_lr", "sft_lr", "rm_lr", "dpo_lr", "calc_lr", "grpo_lr"))
        if self.dim % self.n_heads or self.calc_dim % self.n_heads:
            raise ValueError(f"chapter13: dim ({self.dim}) and calc_dim ({self.calc_dim}) must be divisible by n_heads ({self.n_heads})")
        if self.grpo_group < 2:
            raise ValueError(f"chapter13: grpo_group must be >= 2 (GRPO's baseline is the group), got {self.grpo_group}")
        if not self.bon_ns or min(self.bon_ns) < 1:
            raise ValueError(f"chapter13: bon_ns must be a non-empty list of n >= 1, got {self.bon_ns}")
        if not self.dpo_betas or not min(self.dpo_betas) > 0:
            raise ValueError(f"chapter13: dpo_betas must be a non-empty list of betas > 0, got {self.dpo_betas}")


def stages(config: Config) -> list[Stage]:
    """The stage graph, in priority order (longest chain first)."""
    out = []
    if "instruct" in config.parts:
        out.append(Stage("pretrain", stage_pretrain))
    if "rlvr" in config.parts:
        out.append(Stage("coldstart", stage_coldstart))
    if "instruct" in config.parts:
        out.append(Stage("sft_narrow", stage_sft, ("narrow",), after=("pretrain",)))
    if "rlvr" in config.parts:
        out += [Stage("grpo", stage_grpo, after=("coldstart",)), Stage("sft_control", stage_sft_control, after=("coldstart",))]
    if "preference" in config.parts:
        out += [Stage(f"dpo_beta{b:g}", stage_dpo, (b,), after=("sft_narrow",)) for b in config.dpo_betas]
        out.append(Stage("reward_model", stage_reward_model, after=("sft_narrow",)))
    if "instruct" in config.parts:
        out.append(Stage("sft_broad", stage_sft, ("broad",), after=("pretrain",)))
    return out


def run(config: Config, run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(to_dict(config), indent=1))
    print(f"chapter13 (seed {config.seed}): parts {', '.join(config.parts)}, {config.workers} worker(s)", flush=True)
    results = run_stages(stages(config), config, run_dir, config.workers, config.threads)
    report = write_chapter13_report(run_dir, config, results)
    print((run_dir / "claims.md").read_text())
    return report


def run_seeds(config: Config, run_dir: Path, seeds: list[int]) -> Path:
    """B8: the whole recipe once per seed (into seed-<s>/), then the mean ± sd table."""
    run_dir = Path(run_dir)
    per_seed = {}
    for s in seeds:
        run(replace(config, seed=s), run_dir / f"seed-{s}")
        per_seed[s] = {p.parent.name: json.loads(p.read_text()) for p in (run_dir / f"seed-{s}").glob("*/result.json")}
    return write_seed_table(run_dir, per_seed)
