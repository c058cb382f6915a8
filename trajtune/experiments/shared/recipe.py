"""What the recipes on chapter 13's models share: the seed's optimizer, the upstream stages, the runner.

chapter13, graders and rlhf_book are each their own recipe; the stages the latter two start from (the instruct
policy `pretrain -> sft_narrow` and the calculator `coldstart`) are chapter 13's, with chapter 13's settings, so
their functions, their settings and the one runner of these recipes live here, not in chapter13:

    adam(lr, weight_decay)       the seed's optimizer
    UPSTREAM_FIELDS, check_upstream, derive_seeds   the settings the upstream stages read, checked and seeded
    UPSTREAM, with_upstream      the upstream stages and the ones a list of stages needs
    run_and_report               run the stages, write view.html and the report, print the claims' summary
    Parts                        a recipe made of parts (modules with stages, claims and a report section)
    stage_times                  a markdown table of every stage's wall and CPU seconds
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ...config import check_ranges
from ...engine import OptimConfig
from ...engine.distributed import init_distributed, is_main
from ...runs.report import claims_summary
from ...runs.stages import Stage, read_results, run_stages
from .calculator import COLDSTART_READS, stage_coldstart
from .instruct import PRETRAIN_READS, SFT_READS, stage_pretrain, stage_sft


def adam(lr: float, weight_decay: float = 0.0) -> OptimConfig:
    """The seed's optimizer: plain AdamW (betas 0.9/0.999), no warm-up, no clipping."""
    return OptimConfig(lr=lr, weight_decay=weight_decay, beta2=0.999, grad_clip=0.0)


UPSTREAM_FIELDS = tuple(dict.fromkeys(PRETRAIN_READS + SFT_READS + COLDSTART_READS))
"""the config fields the upstream stages read (`pretrain`, `sft_narrow`, `coldstart`): a recipe built on them holds
these fields, with chapter 13's defaults, beside its own"""


def check_upstream(config, where: str, counts: tuple[str, ...] = ()) -> None:
    """The checks of the upstream settings (and of `counts`, more fields that must be >= 1)."""
    check_ranges(config, where, counts=("dim", "n_layers", "n_heads", "block_size", "val_windows",
                                        "adherence_samples", "max_reply", "calc_dim", "calc_layers", "pass_k", *counts))
    if config.dim % config.n_heads or config.calc_dim % config.n_heads:
        raise ValueError(f"{where}: dim ({config.dim}) and calc_dim ({config.calc_dim}) must be divisible by n_heads "
                         f"({config.n_heads})")


def derive_seeds(config, loops: tuple[str, ...]) -> None:
    """Set the `seed` of each nested loop config named in `loops` from `config.seed` (replacing the nested configs,
    never mutating shared ones): the seeds the recipes always used, so their numbers do not move."""
    for name in loops:
        setattr(config, name, replace(getattr(config, name), seed=config.seed))


UPSTREAM = {"pretrain": Stage("pretrain", stage_pretrain, reads=PRETRAIN_READS),
            "sft_narrow": Stage("sft_narrow", stage_sft, after=("pretrain",), args=("narrow",), reads=SFT_READS),
            "coldstart": Stage("coldstart", stage_coldstart, reads=COLDSTART_READS)}
"""chapter 13's stages the recipes built on it start from (graders, rlhf_book): the instruct policy and the
calculator"""


def with_upstream(own: list[Stage]) -> list[Stage]:
    """`own` stages after the chapter-13 `UPSTREAM` stages they need (directly or through one another), longest
    chain first."""
    needed: set[str] = set()
    todo = [a for s in own for a in s.after]
    while todo:
        name = todo.pop()
        if name in UPSTREAM and name not in needed:
            needed.add(name)
            todo += list(UPSTREAM[name].after)
    return [UPSTREAM[n] for n in ("pretrain", "coldstart", "sft_narrow") if n in needed] + own


def run_and_report(label: str, stage_list: list[Stage], config, run_dir: Path, write) -> tuple[Path, dict[str, dict]]:
    """Run (or resume) `stage_list` in run_dir, then `write(run_dir, config, results)` the report -> (report path,
    claims); it leaves claims.md beside it and writes view.html first when a stage recorded episodes
    (`runs.view.write_view_if_recorded`). Prints `runs.report.claims_summary` ("N of M claims hold" and one short
    line per claim; the table stays in the report): (report path, {stage: results}). Under torchrun every rank
    runs, rank 0 alone talks and writes. `label`: the first line printed. The one runner of chapter 13 and the
    recipes built on it (graders, rlhf_book): every `write` returns (report path, claims)."""
    from ...runs.view import write_view_if_recorded

    run_dir = Path(run_dir)
    init_distributed()  # under torchrun: join the process group (a no-op in one process, or if joined)
    main = is_main()
    if main:
        print(f"{label}, {config.runner.workers} worker(s)", flush=True)
    results = run_stages(stage_list, config, run_dir, config.runner)
    report = run_dir / "report.md"
    if main:
        write_view_if_recorded(run_dir)  # before the report, which links it (`runs.report.episodes_note`)
        report, claims = write(run_dir, config, results)
        print(claims_summary(claims))
    return report, results


@dataclass(frozen=True)
class Parts:
    """A recipe made of parts on chapter 13's upstream stages (graders, rlhf_book). `modules`: part name -> its
    module (stages(config), claims(results, config), section(run_dir, results, config)); `chosen`: the config field
    that lists the parts to run."""

    modules: dict
    chosen: str

    def names(self, config) -> list[str]:
        return list(getattr(config, self.chosen))

    def stages(self, config) -> list[Stage]:
        """The upstream stages the chosen parts need, then the parts' stages."""
        return with_upstream([s for name in self.names(config) for s in self.modules[name].stages(config)])

    def claims(self, results: dict, config) -> list:
        return [c for name in self.names(config) for c in self.modules[name].claims(results, config)]

    def sections(self, run_dir: Path, results: dict, config) -> list[str]:
        return [self.modules[name].section(run_dir, results, config) for name in self.names(config)]

    def claims_over_seeds(self, config, per_seed: dict[int, Path]) -> dict[int, list]:
        """seed -> its claims, read back from each seed's run directory (`trajtune run --seeds`)."""
        out = {}
        for s, d in per_seed.items():
            c = replace(config, seed=s)
            out[s] = self.claims(read_results(self.stages(c), d), c)
        return out


def stage_times(results: dict[str, dict]) -> str:
    """A markdown table of every stage's wall and CPU seconds."""
    from ...runs.report import markdown_table

    rows = [(name, f"{r['time']['wall_s']:.0f}", f"{r['time']['cpu_s']:.0f}") for name, r in results.items()]
    return markdown_table(["stage", "wall", "CPU"], rows)
