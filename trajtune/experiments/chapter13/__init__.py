"""Post-training ch.13 as one recipe (REPRODUCE part B): instruction tuning -> preferences -> RLVR.

The stages (`stages(config)`; `trajtune.runs.stages.run_stages` runs independent ones in parallel
processes, `runner.workers`), what each shows, and the seed's numbers (its seed 0) that the
report puts beside ours (`report.py` holds the claim checks):

    B1 pretrain ─┬─ B2 sft_narrow ─┬─ B3/B4 reward_model (+ best-of-n)
                 │                 └─ B5 dpo_beta1, dpo_beta0.3, dpo_beta0.1
                 └─ B2 sft_broad
    B6 coldstart ─┬─ B6 grpo
                  └─ B7 sft_control

    stage         module         shows                                               seed's numbers
    pretrain     shared/instruct B1 a char LM continues text, ignores the format    val loss 1.77; format 0%
    sft_narrow   shared/instruct B2 SFT on 16 words: a lookup table                  seen 95%; unseen 0%, letter 0%
    sft_broad    shared/instruct B2 SFT on ~400 words: starts to learn the rule     seen 41%; unseen 16%, letter 81%
                                    (both raise the loss on ordinary text)          val loss 1.78 -> 2.06 / 2.04
    reward_model  preference.py  B3 Bradley-Terry on "ends with a period"           100% held-out pair accuracy
                                 B4 best-of-n with it, n = 2/4/8                     27% -> 38/62/88%, format kept
    dpo_beta*     preference.py  B5 DPO beta 1/0.3/0.1: reward @ KL, format          62%@1.35, 80%@5.7, 81%@18.4;
                                    (less reward per nat than best-of-n)            format 92/73/32%
    coldstart    shared/calculator B6 a tiny calculator SFT'd on worked additions      pass@1 25%, pass@16 84%
    grpo          rlvr.py        B6 GRPO from it: pass@1 up, pass@16 flat,          pass@1 47%, pass@16 80%,
                                    fewer distinct answers, ~1/3 groups no signal   distinct 7.3 -> 4.3
    sft_control   rlvr.py        B7 200 more SFT steps instead of RL                 pass@1 75%, pass@16 99%

`run` writes `report.md` / `claims.md` (a claim that does not hold is reported, not tuned
away); `trajtune run chapter13 --seeds 0,1,2` reruns everything per seed into `seed-<s>/`
(`trajtune.runs.rundir.run_seeds`) and `seeds_report` writes the three-seed table (B8, the seed's
mean ± sd beside ours).

How this departs from the seed (seeds/post-training-ch13.md), and why:

1. One renderer for every conversation: a prompt is `<bos><|user|>Q: love\\nA: <|end|><|assistant|>`
   and a reply ends with `<|end|>` (the seed: plain text `Q: love\\nA: `, a reply ends with a
   newline), so demonstrations, pairs and samples share the library's token owners and masks.
2. The model is `TinyTransformer` (~355k parameters at dim 96, 3 layers; the seed's chapter 1
   model has 345k) with a KV cache; the reward model is the same network with a value head read at
   the last token (the seed: a separate `nn.Linear` on the final norm).
3. Batches are pure functions of (seed, step) (`torch.randperm` per step) instead of one
   `random.Random(seed).sample` stream, so a stage cut short resumes exactly; pretraining windows
   are drawn up front from `random.Random(seed)`.
4. Best-of-n draws fresh samples for each n (16 seen words x `bon_repeats` = 64 prompts) instead
   of reusing the first n of the 8 evaluation samples.
5. RLVR uses `envs.arithmetic` (training problems never a held-out pair) and the library's GRPO
   (`advantage="grpo"`: (R - mean) / (std + eps), token aggregation, one update per batch, no KL);
   an answer is up to 4 tokens including `<|end|>` (the seed: 4 characters including a newline).
6. Optimizers are the seed's plain AdamW (betas 0.9/0.999, no warm-up, no clipping); the cold start
   and the control keep the seed's torch-default weight decay 0.01 (`calc_optim`).
7. Every loop setting is a nested loop config (`sft: SFTConfig`, `rl: RLConfig`, ...), so a recipe can
   change e.g. `rl.surrogate`, `rl.kl_coef` or `sft.length_buckets`; the loops' seeds are derived from
   the one `seed` (`derive_seeds`), as the seed shifts every seed by s.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar, Literal

from ...algorithms.dpo import DPOConfig
from ...algorithms.reward_model import RewardModelConfig
from ...algorithms.rl import RLConfig
from ...sources.sampling import MOVED, OVERLAP, SamplingConfig, check_sampling
from ...algorithms.sft import SFTConfig
from ...config import check_choices
from ...engine import OptimConfig
from ...runs.stages import Stage, StageOptions, read_results
from ..shared.instruct import SFT_READS, stage_sft
from ..shared.recipe import UPSTREAM, adam, check_upstream, derive_seeds as shared_derive_seeds, run_and_report
from .preference import DPO_READS, REWARD_MODEL_READS, stage_dpo, stage_reward_model
from .report import write_chapter13_report, write_seed_table
from .rlvr import CONTROL_READS, GRPO_READS, stage_grpo, stage_sft_control
from ..base import over_seeds

Part = Literal["instruct", "preference", "rlvr"]


@dataclass
class Config:
    RENAMED: ClassVar[dict[str, str]] = {
        "overlap": MOVED["overlap"],
        "workers": "runner.workers",
        "threads": "runner.threads",
        "pretrain_steps": "pretrain.steps",
        "pretrain_batch": "pretrain.batch_size",
        "pretrain_lr": "pretrain_optim.lr",
        "sft_steps": "sft.steps",
        "sft_batch": "sft.batch_size",
        "sft_lr": "sft_optim.lr",
        "rm_steps": "reward_model.steps",
        "rm_batch": "reward_model.batch_size",
        "rm_lr": "reward_model_optim.lr",
        "dpo_steps": "dpo.steps",
        "dpo_batch": "dpo.batch_size",
        "dpo_lr": "dpo_optim.lr",
        "calc_steps": "coldstart.steps",
        "calc_batch": "coldstart.batch_size",
        "calc_lr": "calc_optim.lr",
        "grpo_steps": "rl.steps",
        "grpo_prompts": "rl.tasks_per_step",
        "grpo_group": "rl.group_size",
        "grpo_lr": "rl_optim.lr",
        "control_steps": "control.steps",
    }
    """recipe keys of earlier versions -> where they went (a clear error names the new key)"""
    seed: int = 0
    """one seed for model inits, batches, samples and pairs (the seed's 'shift every seed by s');
    every nested loop's `seed` is derived from it (`derive_seeds`)"""
    parts: list[Part] = field(default_factory=lambda: ["instruct", "preference", "rlvr"])
    """which steps to run: instruct (B1-B2), preference (B3-B5, needs instruct), rlvr (B6-B7)"""
    runner: StageOptions = field(default_factory=lambda: StageOptions(workers=2, threads=1))
    """the stage runner: processes running independent stages (1: everything in this process), torch
    threads per process (tiny matmuls: 1 thread per process is fastest on 2 cores)"""
    # --- B1: base model
    dim: int = 96
    """base model width (the seed's chapter 1 model: 96)"""
    n_layers: int = 3
    """base model blocks"""
    n_heads: int = 4
    """attention heads (base and calculator)"""
    block_size: int = 64
    """characters predicted per pretraining window"""
    val_windows: int = 320
    """held-out windows for the Shakespeare val loss (the seed: 10 batches x 32)"""
    pretrain: SFTConfig = field(default_factory=lambda: SFTConfig(steps=600, batch_size=32, eval_every=100))
    """pretraining on raw Shakespeare (every character is POLICY): steps, windows per step, val-loss cadence"""
    pretrain_optim: OptimConfig = field(default_factory=lambda: adam(3e-3))
    """pretraining optimizer"""
    # --- B2: SFT
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(steps=300, batch_size=32))
    """SFT on each demonstration set (narrow and broad). One length bucket: the conversations are 28-74 tokens
    (a padded batch is 1.43x the real tokens), but 4 buckets of 8 rows made the SFT, reward-model and DPO stages
    only 0-9% faster (three alternating pairs of runs), so the recipe keeps its floats"""
    sft_optim: OptimConfig = field(default_factory=lambda: adam(1e-3))
    """SFT optimizer"""
    adherence_samples: int = 8
    """sampled replies per word when measuring adherence"""
    max_reply: int = 64
    """reply budget in characters (tokens)"""
    # --- B3-B5: preferences
    reward_model: RewardModelConfig = field(default_factory=lambda: RewardModelConfig(steps=60, batch_size=32))
    """Bradley-Terry reward model (held-out pair accuracy after the last step, `eval_every` > 0 for more)"""
    reward_model_optim: OptimConfig = field(default_factory=lambda: adam(3e-4))
    """reward-model optimizer"""
    bon_ns: list[int] = field(default_factory=lambda: [2, 4, 8])
    """best-of-n sizes"""
    bon_repeats: int = 4
    """each seen word is asked this many times for best-of-n (16 x 4 = 64 prompts)"""
    eval_per_word: int = 8
    """sampled replies per seen word for the SFT and DPO evaluations (reward, format, KL)"""
    dpo_betas: list[float] = field(default_factory=lambda: [1.0, 0.3, 0.1])
    """DPO beta sweep: one stage per beta (each sets `dpo.beta`)"""
    dpo: DPOConfig = field(default_factory=lambda: DPOConfig(steps=100, batch_size=32))
    """DPO from the narrow SFT model (its `beta` comes from `dpo_betas`)"""
    dpo_optim: OptimConfig = field(default_factory=lambda: adam(1e-4))
    """DPO optimizer"""
    # --- B6-B7: RLVR
    calc_dim: int = 64
    """calculator model width"""
    calc_layers: int = 2
    """calculator blocks"""
    coldstart: SFTConfig = field(default_factory=lambda: SFTConfig(steps=500, batch_size=64))
    """cold-start SFT of the calculator on worked 2-digit additions. It is sensitive to float rounding: the same
    gradients summed in 4 length buckets (equal to 1e-7 per step) end at pass@1 24% instead of 12% after 500
    steps (seed 0), and B6a then fails on pass@16 (92% -> 96%) and B6c on the no-signal share (9%)"""
    calc_optim: OptimConfig = field(default_factory=lambda: adam(3e-3, weight_decay=0.01))
    """the calculator's SFT optimizer (cold start and control; weight decay as the seed's torch default)"""
    rl: RLConfig = field(default_factory=lambda: RLConfig(steps=200, tasks_per_step=32, group_size=8,
                                                          advantage="grpo", aggregation="token"))
    """GRPO from the cold start: steps, problems per step, samples per problem (the group) ..."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """where GRPO samples (max_staleness 1: the next step in a sampler process while this one trains, with
    rl.tis_cap > 0); the built-in sampler, its answers as the arithmetic gym's (shared.calculator.answer_sampling)"""
    rl_optim: OptimConfig = field(default_factory=lambda: adam(3e-4))
    """GRPO optimizer"""
    control: SFTConfig = field(default_factory=lambda: SFTConfig(steps=200, batch_size=64))
    """the control (B7): more SFT steps from the cold start on fresh worked examples"""
    pass_k: int = 16
    """samples per held-out problem for pass@k and distinct answers"""

    def __post_init__(self) -> None:
        check_choices(self)
        check_sampling(self.sampling, "chapter13", rl=self.rl, backends=("sampler",), reads=OVERLAP)
        if "preference" in self.parts and "instruct" not in self.parts:
            raise ValueError("chapter13: part 'preference' starts from the SFT model of part 'instruct'")
        check_upstream(self, "chapter13", counts=("bon_repeats", "eval_per_word"))
        if not self.bon_ns or min(self.bon_ns) < 1:
            raise ValueError(f"chapter13: bon_ns must be a non-empty list of n >= 1, got {self.bon_ns}")
        if not self.dpo_betas or not min(self.dpo_betas) > 0:
            raise ValueError(f"chapter13: dpo_betas must be a non-empty list of betas > 0, got {self.dpo_betas}")
        derive_seeds(self)


def derive_seeds(config: Config) -> None:
    """Set every nested loop's `seed` from `config.seed` (`shared.recipe.derive_seeds`); the control's is seed + 1."""
    shared_derive_seeds(config, ("pretrain", "sft", "reward_model", "dpo", "coldstart", "rl"))
    config.control = replace(config.control, seed=config.seed + 1)  # its batches differ from the cold start's


def stages(config: Config) -> list[Stage]:
    """The stage graph, in priority order (longest chain first)."""
    out = []
    if "instruct" in config.parts:
        out.append(UPSTREAM["pretrain"])
    if "rlvr" in config.parts:
        out.append(UPSTREAM["coldstart"])
    if "instruct" in config.parts:
        out.append(UPSTREAM["sft_narrow"])
    if "rlvr" in config.parts:
        out += [Stage("grpo", stage_grpo, after=("coldstart",), reads=GRPO_READS),
                Stage("sft_control", stage_sft_control, after=("coldstart",), reads=CONTROL_READS)]
    if "preference" in config.parts:
        out += [Stage(f"dpo_beta{b:g}", stage_dpo, after=("sft_narrow",), args=(b,), reads=DPO_READS)
                for b in config.dpo_betas]
        out.append(Stage("reward_model", stage_reward_model, after=("sft_narrow",), reads=REWARD_MODEL_READS))
    if "instruct" in config.parts:
        out.append(Stage("sft_broad", stage_sft, after=("pretrain",), args=("broad",), reads=SFT_READS))
    return out


def run_with_results(config: Config, run_dir: Path) -> tuple[Path, dict[str, dict]]:
    """Run (or resume) every stage and write the report: (report path, {stage: results})."""
    return run_and_report(f"chapter13 (seed {config.seed}): parts {', '.join(config.parts)}", stages(config), config,
                          run_dir, write_chapter13_report)


def run(config: Config, run_dir: Path) -> Path:
    return run_with_results(config, run_dir)[0]


def seeds_report(config: Config, run_dir: Path, per_seed: dict[int, Path]) -> Path:
    """B8: the mean ± sd table of the per-seed runs (`trajtune.runs.rundir.run_seeds`: seed -> its run directory)."""
    return write_seed_table(Path(run_dir), {s: read_results(stages(replace(config, seed=s)), d)
                                            for s, d in per_seed.items()}, config.dpo_betas)


# the experiment contract (`trajtune.experiments.base.Experiment`): what it offers beyond one run
run_over_seeds = over_seeds(run, seeds_report)  # `trajtune run --seeds`
dry_run = None  # `trajtune run --dry-run`: the run directory's checks alone
parse_options = None  # no options of its own
