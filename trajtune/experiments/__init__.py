"""Experiments: runnable compositions of sources, weightings and evaluations.

Each experiment module defines a config dataclass `Config` and
`run(config, run_dir) -> Path` (the path of its report). Recipes (TOML files in
`trajtune/recipes/`) name an experiment and set fields of its `Config`. The
library (everything outside `experiments/` and `cli.py`) never imports them.
"""

from __future__ import annotations

import importlib

EXPERIMENTS: dict[str, str] = {
    "addition_sft": "trajtune.experiments.addition",
    "agent": "trajtune.experiments.agent",
    "hf": "trajtune.experiments.hf",
    "chapter13": "trajtune.experiments.chapter13",
    "iw_sft_bandit": "trajtune.experiments.iw_sft_bandit",
    "iw_sft_bugfix": "trajtune.experiments.iw_sft_bugfix",
}


def get_experiment(name: str):
    """The experiment module registered under `name` (with `Config` and `run`)."""
    if name not in EXPERIMENTS:
        import difflib

        close = difflib.get_close_matches(name, list(EXPERIMENTS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise KeyError(f"unknown experiment {name!r}{hint} (known: {', '.join(EXPERIMENTS)})")
    return importlib.import_module(EXPERIMENTS[name])
