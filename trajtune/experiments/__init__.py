"""Experiments: runnable compositions of sources, weightings and evaluations, as stages.

One package (or module) per experiment; each registered module defines a config
dataclass `Config` (nesting the loop dataclasses it uses and `runner: StageOptions`)
and `run(config, run_dir) -> Path` (the path of its report), and runs its stages
through `trajtune.runs.stages.run_stages`; it builds the sources its loops take
(`trajtune.sources`). Two hooks are optional:

    seeds_report(config, run_dir, per_seed) -> Path   `trajtune run --seeds 0,1,2`: the mean +- sd report
                                                      over the per-seed runs (run_dir/seed-<s>)
    dry_run(config, run_dir) -> str                   `trajtune run --dry-run`: the checks a run makes before
                                                      its first step (the files it names exist and parse)

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
    (shared)        the BugFix gym as both BugFix experiments use it                           bugfix.py
"""

from __future__ import annotations

import importlib

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
}


def get_experiment(name: str):
    """The experiment module registered under `name` (with `Config` and `run`)."""
    if name not in EXPERIMENTS:
        import difflib

        close = difflib.get_close_matches(name, list(EXPERIMENTS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise KeyError(f"unknown experiment {name!r}{hint} (known: {', '.join(EXPERIMENTS)})")
    return importlib.import_module(EXPERIMENTS[name])
