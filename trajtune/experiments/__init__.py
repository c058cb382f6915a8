"""Experiments: runnable compositions of sources, weightings and evaluations, as stages.

One package (or module) per experiment; each registered module is an `Experiment` (`base.py`, checked by mypy
in tests/unit/test_protocols.py): a config dataclass `Config` (nesting the loop dataclasses it uses and
`runner: StageOptions`), `run(config, run_dir) -> Path` (the path of its report), which runs its stages through
`trajtune.runs.stages.run_stages` (each declaring the config fields it reads), and what it offers beyond one run,
each None where it offers nothing:

    run_over_seeds(config, run_dir, seeds, call)   `trajtune run --seeds 0,1,2`: every seed (run_dir/seed-<s>), then
                                                   the report over them (`base.over_seeds(run, seeds_report)`)
    dry_run(config, run_dir) -> str                `trajtune run --dry-run`: the checks a run makes before its first
                                                   step (the files it names exist and parse)
    parse_options(argv, seeds) -> Namespace        its own `trajtune run` options (the agent's --kernels)

An experiment imports no other experiment's internals: what several share is a declared shared module (`shared/`
for chapter13, graders and rlhf_book; `hf/`; `bugfix.py`; `task_rl.py`) or the library (tests/unit/test_layout.py).
The modules here that are not experiments: `base.py` (the contract), `shared/`, `bugfix.py`, `task_rl.py`.

Recipes (TOML files in `trajtune/recipes/`) name an experiment and set fields of its
`Config`. The library (everything outside `experiments/` and the command line) never
imports them.

    agent           seed agent-rl ch.15 on the BugFix gym (the main job)          agent/
    chapter13       seed post-training ch.13: instruction tuning -> preferences -> RLVR  chapter13/
    iw_sft_bandit   iw-SFT paper, the two-arm bandit                                iw_sft/bandit.py
    iw_sft_bugfix   iw-SFT vs plain expert iteration on the BugFix gym              iw_sft/bugfix.py
    addition_sft    the smallest end-to-end run: SFT on 2-digit addition           addition.py
    hf_sft, hf_rm, hf_dpo, hf_grpo, hf_rft   Hugging Face models (`trajtune sft|rm|dpo|grpo|rft`)  hf/
    hf_pipeline     a small HF Llama learns addition: pretrain -> SFT -> DPO -> GRPO        hf_pipeline/
    hf_gym          RL of an HF model in a multi-turn gym (BugFix, TextArena); sampler, generate or vLLM  hf_gym.py
    graders         the RLHF book, part 1: judges, rubrics, AI feedback, ORM/PRM, over-optimization, evals  graders/
    rlhf_book       the RLHF book's Suggested Experiments (S4, S6, S8, S9, S12) with verdicts      rlhf_book/
    smollm2         SmolLM2-135M-Instruct (real, pretrained) learns arithmetic: warm start -> GRPO, over seeds  smollm2/
    reasoning_gym   GRPO on a reasoning-gym dataset with the tiny model                       reasoning_gym.py
    textarena       GRPO on a TextArena game with the tiny model                              textarena.py
                    (both through task_rl.py: RL on a task library's tasks)
    mismatch_lab    injected train-inference mismatch x the corrections, on replayed batches, 3 seeds  mismatch_lab/
    (shared)        the BugFix gym as both BugFix experiments use it                           bugfix.py
"""

from __future__ import annotations

import importlib
from typing import cast

from .base import Experiment

EXPERIMENTS: dict[str, str] = {
    "addition_sft": "trajtune.experiments.addition",
    "agent": "trajtune.experiments.agent",
    "chapter13": "trajtune.experiments.chapter13",
    "iw_sft_bandit": "trajtune.experiments.iw_sft.bandit",
    "iw_sft_bugfix": "trajtune.experiments.iw_sft.bugfix",
    "hf_sft": "trajtune.experiments.hf.sft",
    "hf_rm": "trajtune.experiments.hf.rm",
    "hf_dpo": "trajtune.experiments.hf.dpo",
    "hf_grpo": "trajtune.experiments.hf.grpo",
    "hf_rft": "trajtune.experiments.hf.rft",
    "hf_pipeline": "trajtune.experiments.hf_pipeline",
    "reasoning_gym": "trajtune.experiments.reasoning_gym", "textarena": "trajtune.experiments.textarena",
    "hf_gym": "trajtune.experiments.hf_gym",
    "graders": "trajtune.experiments.graders",
    "rlhf_book": "trajtune.experiments.rlhf_book",
    "smollm2": "trajtune.experiments.smollm2",
    "mismatch_lab": "trajtune.experiments.mismatch_lab",
}


def get_experiment(name: str) -> Experiment:
    """The experiment registered under `name` (a module; tests/unit/test_protocols.py checks each is an
    `Experiment`)."""
    if name not in EXPERIMENTS:
        import difflib

        close = difflib.get_close_matches(name, list(EXPERIMENTS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise KeyError(f"unknown experiment {name!r}{hint} (known: {', '.join(EXPERIMENTS)})")
    return cast("Experiment", importlib.import_module(EXPERIMENTS[name]))
