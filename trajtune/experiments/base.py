"""The experiment contract: what `trajtune run` needs of a registered experiment (`Experiment`), and how the
command was called (`Call`), for an experiment that runs itself again (the agent's `--kernels`).

An experiment is a module; mypy checks each registered one against `Experiment` (tests/unit/test_protocols.py assigns
each to it). The command line calls these members and nothing else: no member is probed for.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol


@dataclass(frozen=True)
class Call:
    """How `trajtune run` was called: what a run of the same recipe in a child process repeats."""

    recipe: Path
    """the recipe file"""
    overrides: list[str] = field(default_factory=list)
    """its `--set KEY=VALUE` overrides, in order"""
    options: argparse.Namespace = field(default_factory=argparse.Namespace)
    """the experiment's own options (`Experiment.parse_options`), parsed and checked; empty for one without"""


class Experiment(Protocol):
    """A registered experiment (`trajtune.experiments.EXPERIMENTS`): its config type, its run, and what it offers
    beyond one run (None where it offers nothing: `trajtune run` then refuses the option in one line)."""

    @property
    def Config(self) -> type:  # noqa: N802 (the module's class)
        """the dataclass a recipe's [config] table builds (`trajtune.config.from_dict`)"""
        ...

    def run(self, config: Any, run_dir: Path) -> Path:
        """Run (or resume) the stages in run_dir and write the report -> the report's path."""
        ...

    @property
    def run_over_seeds(self) -> Callable[[Any, Path, list[int], Call], Path | None] | None:
        """`trajtune run --seeds`: (config, run_dir, seeds, call) -> the report over the seeds (each seed's run in
        run_dir/seed-<s>; None on a rank that writes nothing); None: --seeds is refused"""
        ...

    @property
    def dry_run(self) -> Callable[[Any, Path], str] | None:
        """`trajtune run --dry-run`: (config, run_dir) -> the checks a run makes before its first step beyond the run
        directory's (the files the recipe names exist and parse); None: only the run directory's checks"""
        ...

    @property
    def parse_options(self) -> Callable[[list[str], list[int] | None], argparse.Namespace] | None:
        """the experiment's own `trajtune run` options (the agent's --kernels): (the arguments `trajtune run` does not
        know, the --seeds or None) -> them parsed and checked (a ConfigError naming the option: one line), before the
        run directory exists; None: it has none, and such an argument is refused naming the experiment"""
        ...


def over_seeds(run: Callable[[Any, Path], Path], report: Callable[[Any, Path, dict[int, Path]], Path]
               ) -> Callable[[Any, Path, list[int], Call], Path | None]:
    """The usual `Experiment.run_over_seeds`: `run` once per seed into run_dir/seed-<s> (`runs.rundir.run_seeds`),
    then `report(config, run_dir, {seed: its run directory})` on the main rank."""
    from ..engine.distributed import is_main
    from ..runs.rundir import run_seeds

    def run_over_seeds(config: Any, run_dir: Path, seeds: list[int], call: Call) -> Path | None:
        per_seed = run_seeds(run, config, run_dir, seeds)
        return report(config, run_dir, per_seed) if is_main() else None

    return run_over_seeds
