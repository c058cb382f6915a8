"""The RLHF book's 19 Suggested Experiments as one CPU recipe (`trajtune run rlhf_book`), with verdicts.

The book ends chapters 4, 5, 6, 8, 9 and 12 with experiments to run on its companion code, each chapter's
"Suggested Experiments" section (ch.4 §4.4, ch.5 §5.8, ch.6 §6.5, ch.8 §8.6, ch.9 §9.4, ch.12 §12.3.4).
Here each becomes a few stages on the built-in tiny models and gyms, and the report gives, per experiment, the
book's expected observation, ours (a table or plot) and a verdict as strict as the book's sentence, decided
through `runs.verdicts` with its uncertainty (`evidence.py`: which standard error each kind of number has). The upstream
stages are chapter 13's (`trajtune.experiments.shared`: the same functions and settings):

    pretrain -> sft_narrow     the char-level base model (ch.4 starts from it) and instruct policy (ch.6.4, ch.8)
    coldstart                  the calculator (ch.9 starts from it)

and one module per chapter, each with its settings (`Demo`), stages, claims and report section:

    sft   sft.py   S4.1-S4.2  SFT of the base model watched every N steps (stop, format, held-out NLL), 3 LRs
    pg    pg.py    S6.1-S6.4  GRPO with correctness / format / binary and group contrast, RLOO and REINFORCE,
                              group size / temperature / data / format-weight sweeps, GRPO on the instruct gym
    daa   daa.py   S8.1-S8.4  DPO / IPO / dpo_norm / SimPO / ORPO on chapter 13's pairs, two LRs, fewer pairs
    rs    rs.py    S9.1-S9.4  a rollout cache, top vs random selections, N / temperature / top-p, a weaker policy
    distill distill.py S12.1-S12.2 SDPO on string reversal (its own tiny model), rollouts / kl_top_k / prompts

S5.1-S5.3 are the graders recipe's (`trajtune run graders`, part reward_models: claims R1, R3, R5, R6); the
report names them rather than running them twice. An experiment whose chapter is not selected is listed in
the report as not run. `chapters` picks the chapters; `trajtune run rlhf_book --seeds 0,1,2`
reruns everything per seed and writes every verdict on every seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ...algorithms.sft import SFTConfig
from ...engine import OptimConfig

from ...runs.report import Claim, claims_table, claims_verdict, markdown_table, write_claims_over_seeds, write_report
from ...runs.stages import StageOptions
from ..shared.recipe import Parts, adam, check_upstream, derive_seeds, run_and_report, stage_times
from . import daa, distill, pg, rs, sft
from .evidence import SECTIONS
from ..base import over_seeds

CHAPTERS = {"sft": sft, "pg": pg, "daa": daa, "rs": rs, "distill": distill}
"""chapter name -> its module (Demo, stages(config), claims(results, config), section(run_dir, results, config))"""

EXPERIMENTS = [
    ("S4.1", "SFT a base model, fixed-prompt generations every N steps", "sft"),
    ("S4.2", "SFT learning-rate sweep", "sft"),
    ("S5.1", "BT reward model: margin grows", "graders R5 (`trajtune run graders`, rm_bt)"),
    ("S5.2", "ORM separates answers, PRM scores steps", "graders R1, R3 (rm_orm, rm_prm)"),
    ("S5.3", "a 50-200-pair held-out RM eval", "graders R6 (rm_bt's rm-eval)"),
    ("S6.1", "GRPO: correctness, format, binary; group contrast", "pg"),
    ("S6.2", "REINFORCE vs RLOO vs GRPO", "pg"),
    ("S6.3", "GRPO sweeps: rollouts, temperature, data, format weight", "pg"),
    ("S6.4", "the same diagnostics on another task", "pg"),
    ("S8.1", "DPO's loss, accuracy, margins, rewards", "daa"),
    ("S8.2", "DPO vs IPO vs dpo_norm", "daa"),
    ("S8.3", "SimPO and ORPO", "daa"),
    ("S8.4", "data changes vs loss changes", "daa"),
    ("S9.1", "a reusable rollout cache", "rs"),
    ("S9.2", "top vs random matched pairs", "rs"),
    ("S9.3", "N, temperature, top-p", "rs"),
    ("S9.4", "a weaker policy", "rs"),
    ("S12.1", "SDPO on string reversal", "distill"),
    ("S12.2", "SDPO sweeps: rollouts, kl_top_k", "distill"),
]
"""(id, what, where: a chapter of this recipe, another recipe's claims, or None: not built)"""


@dataclass
class Config:
    """The settings of the upstream stages (pretrain, sft_narrow, coldstart: chapter 13's, with its defaults), the
    few more of chapter 13's its parts reuse, and the parts (its config holds only what its stages read)."""

    RENAMED: ClassVar[dict[str, str]] = {"parts": "chapters", "workers": "runner.workers", "threads": "runner.threads"}
    """recipe keys of earlier versions -> where they went (chapter 13's other settings are not this recipe's)"""
    seed: int = 0
    """one seed for every stage (the loops' seeds are derived from it, `shared.recipe.derive_seeds`)"""
    runner: StageOptions = field(default_factory=lambda: StageOptions(workers=2, threads=1))
    """the stage runner: processes running independent stages, torch threads per process"""

    chapters: list[str] = field(default_factory=lambda: list(CHAPTERS))
    """which chapters run: sft (S4), pg (S6), daa (S8), rs (S9), distill (S12)"""
    sft_book: sft.Demo = field(default_factory=sft.Demo)
    """ch.4 instruction tuning (sft.py; `sft` is chapter 13's SFT loop settings, which it reuses)"""
    pg: pg.Demo = field(default_factory=pg.Demo)
    """ch.6 policy gradients (pg.py)"""
    daa: daa.Demo = field(default_factory=daa.Demo)
    """ch.8 direct alignment (daa.py)"""
    rs: rs.Demo = field(default_factory=rs.Demo)
    """ch.9 rejection sampling (rs.py)"""
    distill: distill.Demo = field(default_factory=distill.Demo)
    """ch.12 self-distillation (distill.py)"""

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
    dpo_optim: OptimConfig = field(default_factory=lambda: adam(1e-4))
    """DPO optimizer"""
    rl_optim: OptimConfig = field(default_factory=lambda: adam(3e-4))
    """GRPO optimizer"""

    def __post_init__(self) -> None:
        check_upstream(self, "rlhf_book", counts=("eval_per_word",))
        derive_seeds(self, ("pretrain", "sft", "coldstart"))
        unknown = [c for c in self.chapters if c not in CHAPTERS]
        if unknown or not self.chapters:
            raise ValueError(f"rlhf_book: chapters must be a non-empty list of {list(CHAPTERS)}, got {self.chapters}")


RECIPE = Parts(CHAPTERS, "chapters")
stages = RECIPE.stages
all_claims = RECIPE.claims


def index_table(claims: list[Claim], config: Config) -> str:
    """All 19 experiments: where each is run, and its verdicts (or why none)."""
    rows = []
    for eid, what, where in EXPERIMENTS:
        mine = [c for c in claims if c.id == eid or c.id.startswith(eid) and not c.id[len(eid):].isdigit()]
        if where in CHAPTERS and where in config.chapters:
            status = ", ".join(f"{c.id} {c.verdict}" for c in mine) or "run; not judged (a stage is missing)"
        elif where in CHAPTERS:
            status = f"not run here (chapter `{where}` not selected)"
        elif where:
            status = f"covered by {where}"
        else:
            status = "**not run**: not built yet"
        rows.append([eid, what, status])
    return markdown_table(["#", "experiment", "status / verdict"], rows)


def write_book_report(run_dir: Path, config: Config, results: dict) -> tuple[Path, list[Claim]]:
    """claims.md and report.md (+ .html, plots): N of M claims hold, the 19-experiment index, then each chapter;
    the link to view.html (the recorded episodes, written by the runner before this report). Returns (report path,
    claims): the runner prints `claims_summary(claims)`."""
    claims = all_claims(results, config)
    (run_dir / "claims.md").write_text(claims_table(claims) + "\n")
    intro = (f"Seed {config.seed}. {claims_verdict(claims)}. "
             "Each claim quotes the book's Suggested Experiments (RLHF book, the Suggested Experiments section of "
             "ch.4, 6, 8, 9 and 12: " + ", ".join(f"ch.{c} §{SECTIONS[c]}" for c in (4, 6, 8, 9, 12)) + "); the "
             "models are tiny and every number comes from this run. A comparison holds only when its difference "
             "clears two standard errors (shown beside it, with what they are taken over: held-out problems paired, "
             "sampled replies binomial, training steps Welch); inside them it is *not distinguishable*. A claim "
             "that does not hold is reported with its numbers, not tuned away.")
    return write_report(run_dir, "The RLHF book's Suggested Experiments",  # it links view.html (episodes_note)
                        [intro,
                         "## The 19 experiments\n\n" + index_table(claims, config),
                         "## Claims\n\n" + claims_table(claims), *RECIPE.sections(run_dir, results, config),
                         "## Time per stage (seconds)\n\n" + stage_times(results)]), claims


def run_with_results(config: Config, run_dir: Path) -> tuple[Path, dict[str, dict]]:
    """Run (or resume) every stage, write view.html and the report, print the claims' summary."""
    return run_and_report(f"rlhf_book (seed {config.seed}): {', '.join(config.chapters)}", stages(config), config,
                          run_dir, write_book_report)


def run(config: Config, run_dir: Path) -> Path:
    return run_with_results(config, run_dir)[0]


def seeds_report(config: Config, run_dir: Path, per_seed: dict[int, Path]) -> Path:
    """Every claim's verdict and numbers on every seed (`trajtune run rlhf_book --seeds 0,1,2`)."""
    return write_claims_over_seeds(run_dir, "The RLHF book's Suggested Experiments, over seeds",
                                   RECIPE.claims_over_seeds(config, per_seed))


# the experiment contract (`trajtune.experiments.base.Experiment`): what it offers beyond one run
run_over_seeds = over_seeds(run, seeds_report)  # `trajtune run --seeds`
dry_run = None  # `trajtune run --dry-run`: the run directory's checks alone
parse_options = None  # no options of its own
