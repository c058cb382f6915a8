"""mypy over the Protocols (the seams) and the modules that implement them: a Protocol is a contract only where
something checks it. The files are `[tool.mypy] files` in pyproject.toml, the one list (add a module there);
`python -m mypy` in the repository root runs the same check. tests/unit/test_protocols.py, in that list, assigns each
implementation to its Protocol: that is where mypy compares them.

The same run also checks a planted file whose layout lacks a parameter of `Layout.copy_weights`, and
expects mypy to reject it there (a check that cannot fail is no check)."""

import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]

PLANTED = '''
import torch

from trajtune.engine import Layout
from trajtune.engine.collectives import Whole


class OneArgument(Whole):
    def copy_weights(self, dst: torch.nn.Module) -> None:  # the Protocol's takes (dst, src)
        pass


layout: Layout = OneArgument()
'''


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory) -> tuple[list[str], Path]:
    pytest.importorskip("mypy", reason="mypy comes with the [test] extra")
    tmp = tmp_path_factory.mktemp("mypy")
    planted = tmp / "planted_layout.py"
    planted.write_text(PLANTED)
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp / "cache"), "--no-error-summary",
                          *FILES, str(planted)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    print(f"mypy over {len(FILES)} entries of [tool.mypy] files: {time.perf_counter() - start:.1f}s")
    assert out.returncode in (0, 1), out.stdout + out.stderr  # 2: mypy itself failed (a bad config, a crash)
    return [line for line in out.stdout.splitlines() if ": error:" in line], planted


@pytest.mark.slow  # mypy from a fresh cache: the slow tier
def test_mypy_finds_no_error_in_the_protocols_and_their_implementations(mypy_errors):
    errors, planted = mypy_errors
    ours = [e for e in errors if not e.startswith(str(planted))]
    assert not ours, "mypy:\n" + "\n".join(ours)


@pytest.mark.slow  # mypy from a fresh cache: the slow tier
def test_mypy_rejects_a_layout_that_does_not_match_its_protocol(mypy_errors):
    errors, planted = mypy_errors
    mine = [e for e in errors if e.startswith(str(planted))]
    assert any('type "OneArgument", variable has type "Layout"' in e for e in mine), errors


def test_the_listed_files_exist():
    assert FILES and all((ROOT / f).exists() for f in FILES), [f for f in FILES if not (ROOT / f).exists()]
