"""docs/rlhf_book_checklist.md, the item-by-item audit of the RLHF book checklist, stays true.

Checked without running anything:
- every function a row names (a backticked `trajtune.…` path) imports and resolves;
- every test a row names (`tests/unit/test_x.py::test_name`) is a function in that file, found by parsing it with `ast`;
- a `done` row names at least one of each;
- the counts in the page's first lines are the counts of its rows.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "rlhf_book_checklist.md"
STATUSES = ("done", "partial", "not done", "not implementable here")
FUNCTION = re.compile(r"`(trajtune(?:\.\w+)+)`")
TEST = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def status_of(cell: str) -> str | None:
    """The status word a cell starts with ('not done' before 'done' cannot clash: a cell starts with one)."""
    for status in STATUSES:
        if cell == status or re.match(re.escape(status) + r"\b", cell):
            return status
    return None


def rows() -> list[dict]:
    """Every row of the page's item tables: the tables whose header starts `| item | status |`."""
    out, in_table = [], False
    for number, line in enumerate(PAGE.read_text().splitlines(), 1):
        if line.startswith("| item | status |"):
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        if not in_table or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 5, f"line {number}: {len(cells)} cells, expected 5: {line}"
        out.append({"line": number, "item": cells[0], "status": status_of(cells[1]), "status_cell": cells[1],
                    "functions": FUNCTION.findall(cells[2]), "tests": TEST.findall(cells[3])})
    return out


def resolve(path: str) -> object:
    """Import the longest module prefix of a dotted path, then getattr the rest."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as e:
            if e.name is not None and ".".join(parts[:cut]).startswith(e.name) and e.name.startswith("trajtune"):
                continue  # this prefix is not a module; try a shorter one
            raise
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


@lru_cache(maxsize=None)
def defined_tests(file: str) -> frozenset[str]:
    """The test functions a file defines, at module level or in a class, by parsing it."""
    tree = ast.parse((ROOT / file).read_text(), filename=file)
    return frozenset(node.name for node in ast.walk(tree)
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"))


ROWS = rows()


def test_the_page_has_rows_with_known_statuses_and_unique_items():
    assert len(ROWS) > 100
    bad = [(r["line"], r["status_cell"]) for r in ROWS if r["status"] is None]
    assert not bad, f"rows whose status is not one of {STATUSES}: {bad}"
    ids = Counter(r["item"].split()[0] for r in ROWS)
    assert not [i for i, n in ids.items() if n > 1], f"item numbers used twice: {[i for i, n in ids.items() if n > 1]}"


def test_done_rows_name_a_function_and_a_test():
    bad = [r["item"] for r in ROWS if r["status"] == "done" and not (r["functions"] and r["tests"])]
    assert not bad, f"done rows without a function or a test: {bad}"


def test_every_named_function_resolves():
    failed = []
    for path in sorted({f for r in ROWS for f in r["functions"]}):
        try:
            resolve(path)
        except (ImportError, AttributeError) as e:
            failed.append(f"{path}: {type(e).__name__}: {e}")
    assert not failed, "functions named in docs/rlhf_book_checklist.md that do not resolve:\n" + "\n".join(failed)


def test_every_named_test_exists():
    missing = []
    for r in ROWS:
        for file, name in r["tests"]:
            if not (ROOT / file).is_file():
                missing.append(f"{r['item'].split()[0]}: {file} (no such file)")
            elif name not in defined_tests(file):
                missing.append(f"{r['item'].split()[0]}: {file}::{name}")
    assert not missing, "tests named in docs/rlhf_book_checklist.md that do not exist:\n" + "\n".join(missing)


def test_the_stated_counts_match_the_rows():
    head = "\n".join(PAGE.read_text().splitlines()[:6])
    counts = Counter(r["status"] for r in ROWS)
    stated = re.search(r"Counts: done (\d+), partial (\d+), not done (\d+), not implementable here (\d+); (\d+) rows",
                       head)
    assert stated, "the page's first lines must say 'Counts: done D, partial P, not done X, " \
                   "not implementable here Y; T rows'"
    done, partial, not_done, nir, total = map(int, stated.groups())
    assert (done, partial, not_done, nir, total) == (counts["done"], counts["partial"], counts["not done"],
                                                      counts["not implementable here"], len(ROWS))
    headline = re.search(r"(\d+) of (\d+) items implemented and tested", head)
    assert headline, "the page's first lines must say 'N of M items implemented and tested'"
    assert (int(headline[1]), int(headline[2])) == (done, total - nir)
