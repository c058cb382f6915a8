"""Graders recipe, part 'reward_models' (see the package docstring). Being written."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...runs.report import Claim
from ...runs.stages import Stage


@dataclass
class Demo:
    """this part's settings"""


def stages(config) -> list[Stage]:
    return []


def claims(results: dict, config) -> list[Claim]:
    return []


def section(run_dir: Path, results: dict, config) -> str:
    return ""
