"""The code passes ruff's pyflakes and syntax checks (pyproject [tool.ruff]): unused imports and
variables, undefined names -- the kind of slip that let a test assertion vanish into a comment."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    if ruff is None:
        pytest.skip("ruff is not installed (it comes with the [test] extra)")
    out = subprocess.run([ruff, "check", "trajtune", "tests", "benchmarks", "examples"], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr
