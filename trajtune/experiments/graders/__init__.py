"""The RLHF book, part 1, as one recipe: models as graders on the built-in gyms (`trajtune run graders`).

The book's chapters 5 (reward models: Bradley-Terry, margins, K-wise, ORM, PRM, evaluation), 11-12 (preference
data from ratings, AI feedback, Constitutional AI, rubrics), 14 (over-optimization) and 16 (evaluation) use a
model to grade another. Tiny models cannot judge like GPT-4, so every grader here is trained on a property the
gyms can verify (the chapter-13 instruct gym's `format_ok`, `first_letter_ok`, `ends_with_period`; the
calculator's exact answers; BugFix's tests) and reported beside that verifier: the mechanics are the point,
and the same code runs with a real judge or reward model (the HF commands' `--reward-judge`, `--reward-model`).

The upstream stages are chapter 13's (`trajtune.experiments.shared`: the same functions and settings):

    pretrain -> sft_narrow     the char-level instruct policy every instruct demo starts from
    coldstart                  the calculator every arithmetic demo starts from

and four parts, each a module with its settings (`Demo`), its stages, its claims and its report section:

    judges         judges.py         LLM-as-a-judge (pairwise MT-Bench form, pointwise 1-10), position-swap
                                     consistency, rubrics as rewards, RLAIF and Constitutional-AI labels,
                                     DPO on AI labels vs on verifier labels (ch.5.9, 12.11-12.14, 16.3)
    reward_models  reward_models.py  ORM on the calculator's samples reranking best-of-N, PRM on BugFix
                                     actions, margins, K-wise Plackett-Luce, held-out RM eval (ch.5, S5.1-S5.3)
    overopt        overopt.py        RL against a proxy RM with the verifier as gold; an ensemble (min)
                                     (ch.14.1-14.4)
    evals          evals.py          maj@k beside pass@k, conditional log-likelihood scoring, decontamination,
                                     the random-reward control, Elo / Bradley-Terry ratings (ch.16)

`demos` picks the parts. A claim is as strict as the book's sentence; one that does not hold is reported with
its numbers, not tuned away. `trajtune run graders --seeds 0,1,2` reruns everything per seed and writes the
verdict of every claim on every seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ...algorithms.sft import SFTConfig
from ...algorithms.dpo import DPOConfig
from ...algorithms.reward_model import RewardModelConfig
from ...engine import OptimConfig

from ...runs.report import claims_table, claims_verdict, write_claims_over_seeds, write_report
from ...runs.stages import StageOptions
from ..shared.recipe import Parts, adam, check_upstream, derive_seeds, run_and_report, stage_times
from . import evals, judges, overopt, reward_models
from ..base import over_seeds

PARTS = {"judges": judges, "reward_models": reward_models, "overopt": overopt, "evals": evals}
"""part name -> its module (Demo, stages(config), claims(results, config), section(run_dir, results, config))"""


@dataclass
class Config:
    """The settings of the upstream stages (pretrain, sft_narrow, coldstart: chapter 13's, with its defaults), the
    few more of chapter 13's its parts reuse, and the parts (its config holds only what its stages read)."""

    RENAMED: ClassVar[dict[str, str]] = {"parts": "demos", "workers": "runner.workers", "threads": "runner.threads"}
    """recipe keys of earlier versions -> where they went (chapter 13's other settings are not this recipe's)"""
    seed: int = 0
    """one seed for every stage (the loops' seeds are derived from it, `shared.recipe.derive_seeds`)"""
    runner: StageOptions = field(default_factory=lambda: StageOptions(workers=2, threads=1))
    """the stage runner: processes running independent stages, torch threads per process"""

    demos: list[str] = field(default_factory=lambda: list(PARTS))
    """which parts run: judges, reward_models, overopt, evals"""
    judges: judges.Demo = field(default_factory=judges.Demo)
    """LLM-as-a-judge, rubrics, AI feedback (judges.py)"""
    reward_models: reward_models.Demo = field(default_factory=reward_models.Demo)
    """ORM, PRM, reward-model tooling (reward_models.py)"""
    overopt: overopt.Demo = field(default_factory=overopt.Demo)
    """over-optimization (overopt.py)"""
    evals: evals.Demo = field(default_factory=evals.Demo)
    """evaluation tools (evals.py)"""

    # --- chapter 13's settings for the upstream stages (shared.recipe.UPSTREAM_FIELDS), with its defaults
    dim: int = 96
    """the instruct policy's base model width (`trajtune run chapter13`: B1)"""
    n_layers: int = 3
    """base model blocks"""
    n_heads: int = 4
    """attention heads (base model and calculator)"""
    block_size: int = 64
    """characters predicted per pretraining window"""
    val_windows: int = 320
    """held-out windows for the Shakespeare val loss"""
    pretrain: SFTConfig = field(default_factory=lambda: SFTConfig(steps=600, batch_size=32, eval_every=100))
    """pretraining on raw Shakespeare (`pretrain`)"""
    pretrain_optim: OptimConfig = field(default_factory=lambda: adam(3e-3))
    """pretraining optimizer"""
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(steps=300, batch_size=32))
    """SFT on the narrow demonstrations (`sft_narrow`)"""
    sft_optim: OptimConfig = field(default_factory=lambda: adam(1e-3))
    """SFT optimizer"""
    adherence_samples: int = 8
    """sampled replies per word when measuring adherence"""
    max_reply: int = 64
    """reply budget in characters (tokens)"""
    calc_dim: int = 64
    """calculator model width"""
    calc_layers: int = 2
    """calculator blocks"""
    coldstart: SFTConfig = field(default_factory=lambda: SFTConfig(steps=500, batch_size=64))
    """the calculator's cold-start SFT on worked 2-digit additions (`coldstart`)"""
    calc_optim: OptimConfig = field(default_factory=lambda: adam(3e-3, weight_decay=0.01))
    """the calculator's SFT optimizer"""
    pass_k: int = 16
    """samples per held-out problem for pass@k and distinct answers"""
    # --- chapter 13's settings its parts reuse
    eval_per_word: int = 8
    """sampled replies per seen word in the reward-at-KL evaluation (`shared.preference.evaluate_policy`)"""
    reward_model: RewardModelConfig = field(default_factory=lambda: RewardModelConfig(steps=60, batch_size=32))
    """the Bradley-Terry reward model's loop (reward_models: each demo sets its steps)"""
    reward_model_optim: OptimConfig = field(default_factory=lambda: adam(3e-4))
    """reward-model optimizer"""
    dpo: DPOConfig = field(default_factory=lambda: DPOConfig(steps=100, batch_size=32))
    """DPO from the narrow SFT model (judges: its `beta` comes from `judges.dpo_beta`)"""
    dpo_optim: OptimConfig = field(default_factory=lambda: adam(1e-4))
    """DPO optimizer"""
    rl_optim: OptimConfig = field(default_factory=lambda: adam(3e-4))
    """GRPO optimizer"""

    def __post_init__(self) -> None:
        check_upstream(self, "graders", counts=("eval_per_word",))
        derive_seeds(self, ("pretrain", "sft", "reward_model", "dpo", "coldstart"))
        unknown = [d for d in self.demos if d not in PARTS]
        if unknown or not self.demos:
            raise ValueError(f"graders: demos must be a non-empty list of {list(PARTS)}, got {self.demos}")


RECIPE = Parts(PARTS, "demos")
stages = RECIPE.stages
all_claims = RECIPE.claims


def write_graders_report(run_dir: Path, config: Config, results: dict) -> tuple[Path, list]:
    """claims.md and report.md (+ .html, plots; view.html, which the runner writes first, linked by `write_report`):
    N of M claims hold on the first screen, then the claims with the difference that decided each and its noise,
    then each part -> (report path, claims): the runner prints `claims_summary(claims)`."""
    claims = all_claims(results, config)
    table = claims_table(claims)
    (run_dir / "claims.md").write_text(table + "\n")
    intro = (f"Seed {config.seed}. {claims_verdict(claims)}. Each claim is the book's sentence, cited by chapter and "
             "section (N. Lambert, *Reinforcement Learning from Human Feedback*, <https://rlhfbook.com>: \"RLHF book "
             "ch.14 §14.1\"; §N.M numbers the book's checklist items, docs/rlhf_book_checklist.md). A comparison "
             "holds only when its difference clears 2 standard errors (binomial over replies or problems, paired "
             "where the same items are measured twice), does not hold when it clears them the other way, and is "
             "*not distinguishable* in between; the difference and its noise stand beside each verdict. The graders "
             "are tiny models trained on what the gyms verify, and every number comes from this run. A claim that "
             "does not hold is reported with its numbers, not tuned away.")
    return write_report(run_dir, "The RLHF book, part 1: models as graders",
                        [intro, "## Claims\n\n" + table,
                         *RECIPE.sections(run_dir, results, config),
                         "## Time per stage (seconds)\n\n" + stage_times(results)]), claims


def run_with_results(config: Config, run_dir: Path) -> tuple[Path, dict[str, dict]]:
    return run_and_report(f"graders (seed {config.seed}): {', '.join(config.demos)}", stages(config), config, run_dir,
                          write_graders_report)


def run(config: Config, run_dir: Path) -> Path:
    return run_with_results(config, run_dir)[0]


def seeds_report(config: Config, run_dir: Path, per_seed: dict[int, Path]) -> Path:
    """Every claim's verdict and numbers on every seed (`trajtune run graders --seeds 0,1,2`)."""
    return write_claims_over_seeds(run_dir, "The RLHF book, part 1: models as graders, over seeds",
                                   RECIPE.claims_over_seeds(config, per_seed))


# the experiment contract (`trajtune.experiments.base.Experiment`): what it offers beyond one run
run_over_seeds = over_seeds(run, seeds_report)  # `trajtune run --seeds`
dry_run = None  # `trajtune run --dry-run`: the run directory's checks alone
parse_options = None  # no options of its own
