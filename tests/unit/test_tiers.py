"""The suite's tiers (pyproject's `testpaths`; tests/conftest.py says what goes where): every test file lives in a
tier folder, none in tests/ itself, so a new test picks its tier; module names are unique across tiers (test modules
import each other's helpers by name); and every marker the default run leaves out (pyproject's addopts) is a tier
`.ci/run` runs."""

import re
import tomllib
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
OPTIONS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
TIERS = [Path(p).name for p in OPTIONS["testpaths"]]


def test_every_test_file_lives_in_a_tier_folder():
    assert OPTIONS["testpaths"] == [f"tests/{tier}" for tier in TIERS] and all((TESTS / t).is_dir() for t in TIERS)
    files = sorted(p.relative_to(TESTS) for p in TESTS.rglob("test_*.py"))
    outside = [str(p) for p in files if len(p.parts) != 2 or p.parts[0] not in TIERS]
    assert files and not outside, (f"test files outside a tier folder (tests/<tier>/test_*.py, tiers "
                                   f"{', '.join(TIERS)}: see tests/conftest.py): {outside}")


def test_module_names_are_unique_across_tiers():
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_ci_runs_every_marker_the_default_run_leaves_out():
    registered = {m.split(":")[0] for m in OPTIONS["markers"]}
    left_out = set(re.findall(r"not (\w+)", OPTIONS["addopts"]))
    assert left_out == registered, (left_out, registered)
    ci = (ROOT / ".ci" / "run").read_text()
    runs = [line.split(" -m pytest", 1)[1] for line in ci.splitlines()
            if " -m pytest" in line and not line.lstrip().startswith("#")]
    assert " -q" in runs, ".ci/run runs the default tiers as the README's command does (`python -m pytest -q`)"
    ran = {m for args in runs for m in re.findall(r"-m '?(\w+)", args)}
    assert left_out <= ran, f".ci/run runs no `pytest -m` for {sorted(left_out - ran)}"
