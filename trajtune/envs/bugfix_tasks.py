"""The BugFix gym's tasks: 40 small Python functions, each with one bug (seed ch.15, ch.4 gym).

Five families, one repair op each (bugfix.py applies them to the source text):

| family  | the bug                                    | op              | visible marker in `read` |
|---------|--------------------------------------------|-----------------|--------------------------|
| minmax  | `min` and `max` swapped                    | swap_minmax     | min( / max(              |
| range   | `range(...)` stops one too early           | fix_range_end   | range(                   |
| compare | strict vs non-strict comparison            | fix_compare     | < > <= >=                |
| zero    | division without a zero-divisor guard      | guard_zero      | // %                     |
| init    | accumulator starts at the wrong value      | fix_init        | acc = 0 / acc = 1        |

Each marker appears in its own family only, so applying another family's op
leaves the source unchanged (tests/unit/test_envs_bugfix.py checks this), and the
family can always be read off the code — never off the function name.

Splits, per family (`make_tasks`):

    train     4 tasks: the SFT demonstrations, the RL and RFT tasks
    heldout   2 variants under function names that never occur in training, over the same
              repair cues as training (the seed's "10 held-out variants (unseen function
              names)"): every other symbol of a held-out listing occurs in training listings,
              none twice as common in another family's as in its own (unless three or more
              families share it), no parameter name that another family's training functions
              take, and no listing equals a training one. (Parameter names were the cue a
              student took besides the marker: with `fits(size, capacity)` in training,
              `per_person(part, size)` and `modulo(a, size)` got compare's edit 0.75-1.00 of
              the time after oracle SFT, so every training parameter name now belongs to
              one family: `cap(value, upper)`, `fits(x, capacity)`, `chunk_count(items, size)`,
              and the init family's `nums`.)
              With a word-level tokenizer a name is one opaque token, so a policy that
              picks the edit from the listing's marker transfers and one that keys on
              the name does not.
    novel     2 variants of unseen *code* as well (a probe beyond the seed): an operator no
              training listing shows (`<=` in `before`), a new keyword (`and`), a loop-shaped
              `minmax` task (`peak`, whose `best = ...` line looks like the init family's
              accumulator), new variable names
    renamed   the 20 training tasks, code and tests unchanged, each under one of its family's
              held-out names: what unseen names alone cost

Tests: `public` cases are what `submit` reports to the policy; `hidden` cases
decide the default reward. Inputs are disjoint and both sets contain at least
one input that exposes the bug, so special-casing the public inputs (the
`hardcode_tests` exploit) passes public tests and fails hidden ones. Expected
values come from running the hand-written `fixed` source (trusted code).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

FAMILIES: tuple[str, ...] = ("minmax", "range", "compare", "zero", "init")
FAMILY_OP: dict[str, str] = {
    "minmax": "swap_minmax",
    "range": "fix_range_end",
    "compare": "fix_compare",
    "zero": "guard_zero",
    "init": "fix_init",
}
SPLITS = ("train", "heldout", "novel", "all", "renamed")


@dataclass(frozen=True)
class BugFixTask:
    """One buggy function.

    name:    "family/function", e.g. "minmax/clamp" (what info["task"] reports)
    family:  one of FAMILIES
    entry:   the function's name
    split:   "train", "heldout", "novel" or "renamed"
    source:  the buggy source (what `read` shows before any edit)
    fixed:   the correct source (what the family's op must produce)
    public:  ((args, expected), ...) shown by `submit`
    hidden:  ((args, expected), ...) never shown; the default reward
    """

    name: str
    family: str
    entry: str
    split: str
    source: str
    fixed: str
    public: tuple[tuple[tuple[Any, ...], Any], ...]
    hidden: tuple[tuple[tuple[Any, ...], Any], ...]

    @property
    def issue(self) -> str:
        """The first observation: names the function, not the bug."""
        return f"fix the bug in {self.entry}"

    @property
    def op(self) -> str:
        """The repair op of this task's family."""
        return FAMILY_OP[self.family]


# (family, split, buggy source, fixed source, public inputs, hidden inputs); each input is an args tuple.
_TABLE: tuple[tuple[str, str, str, str, tuple, tuple], ...] = (
    # --- minmax: min and max swapped ------------------------------------------------
    ("minmax", "train",
     "def clamp(value, lower, upper):\n    return min(lower, max(value, upper))",
     "def clamp(value, lower, upper):\n    return max(lower, min(value, upper))",
     ((5, 0, 3), (2, 0, 3)), ((-1, 0, 10), (7, 0, 10), (12, 0, 10))),
    ("minmax", "train",
     "def largest(xs):\n    return min(xs)",
     "def largest(xs):\n    return max(xs)",
     (([3, 1, 2],), ([5],)), (([1, 9, 4],), ([2, 2],), ([-3, -8],))),
    ("minmax", "train",
     "def spread(xs):\n    return min(xs) - max(xs)",
     "def spread(xs):\n    return max(xs) - min(xs)",
     (([1, 4],), ([7, 7],)), (([2, 9, 5],), ([0, 10],), ([3],))),
    ("minmax", "train",
     "def cap(value, upper):\n    return max(value, upper)",
     "def cap(value, upper):\n    return min(value, upper)",
     ((5, 3), (1, 3)), ((10, 4), (2, 8), (6, 6))),
    ("minmax", "novel",
     "def floor_at(x, low):\n    return min(x, low)",
     "def floor_at(x, low):\n    return max(x, low)",
     ((-2, 0), (5, 0)), ((3, 4), (9, 1), (0, 0))),
    ("minmax", "novel",
     "def peak(xs):\n    best = xs[0]\n    for x in xs:\n        best = min(best, x)\n    return best",
     "def peak(xs):\n    best = xs[0]\n    for x in xs:\n        best = max(best, x)\n    return best",
     (([2, 7, 3],), ([4],)), (([1, 5, 9],), ([8, 6],), ([-1, -4],))),
    # --- range: the range stops one too early ---------------------------------------
    ("range", "train",
     "def sum_to(n):\n    return sum(range(1, n))",
     "def sum_to(n):\n    return sum(range(1, n + 1))",
     ((3,), (1,)), ((4,), (10,), (0,))),
    ("range", "train",
     "def evens_upto(n):\n    return list(range(0, n, 2))",
     "def evens_upto(n):\n    return list(range(0, n + 1, 2))",
     ((4,), (3,)), ((6,), (5,), (2,))),
    ("range", "train",
     "def squares_upto(n):\n    return [i * i for i in range(n)]",
     "def squares_upto(n):\n    return [i * i for i in range(n + 1)]",
     ((2,), (0,)), ((3,), (1,), (4,))),
    ("range", "train",
     "def numbers(n):\n    return list(range(1, n))",
     "def numbers(n):\n    return list(range(1, n + 1))",
     ((3,), (1,)), ((5,), (2,), (0,))),
    ("range", "novel",
     "def triangle(n):\n    return sum(range(n))",
     "def triangle(n):\n    return sum(range(n + 1))",
     ((3,), (0,)), ((4,), (5,), (1,))),
    ("range", "novel",
     "def odd_list(n):\n    return list(range(1, n, 2))",
     "def odd_list(n):\n    return list(range(1, n + 1, 2))",
     ((5,), (4,)), ((7,), (1,), (6,))),
    # --- compare: strict where it should be non-strict, or the reverse ---------------
    ("compare", "train",
     "def at_least(x, limit):\n    return x > limit",
     "def at_least(x, limit):\n    return x >= limit",
     ((5, 5), (2, 5)), ((7, 7), (9, 3), (1, 4))),
    ("compare", "train",
     "def in_range(x, lo, hi):\n    return lo < x < hi",
     "def in_range(x, lo, hi):\n    return lo <= x <= hi",
     ((0, 0, 5), (3, 0, 5)), ((5, 0, 5), (2, 2, 9), (10, 0, 5))),
    ("compare", "train",
     "def above(x, limit):\n    return x >= limit",
     "def above(x, limit):\n    return x > limit",
     ((3, 3), (4, 3)), ((8, 8), (1, 6), (9, 2))),
    ("compare", "train",
     "def fits(x, capacity):\n    return x < capacity",
     "def fits(x, capacity):\n    return x <= capacity",
     ((10, 10), (3, 10)), ((4, 4), (12, 5), (0, 1))),
    ("compare", "novel",
     "def before(a, b):\n    return a <= b",
     "def before(a, b):\n    return a < b",
     ((2, 2), (1, 3)), ((6, 6), (4, 9), (8, 5))),
    ("compare", "novel",
     "def between(x, lo, hi):\n    return lo < x and x < hi",
     "def between(x, lo, hi):\n    return lo <= x and x <= hi",
     ((1, 1, 4), (2, 1, 4)), ((4, 1, 4), (0, 1, 4), (3, 3, 3))),
    # --- zero: division without a guard for a zero divisor (spec: return 0) ----------
    ("zero", "train",
     "def safe_div(a, b):\n    return a // b",
     "def safe_div(a, b):\n    if b == 0:\n        return 0\n    return a // b",
     ((7, 0), (9, 3)), ((5, 0), (8, 2), (0, 0))),
    ("zero", "train",
     "def percent(part, total):\n    return 100 * part // total",
     "def percent(part, total):\n    if total == 0:\n        return 0\n    return 100 * part // total",
     ((1, 0), (1, 4)), ((3, 0), (2, 8), (5, 5))),
    ("zero", "train",
     "def remainder(a, b):\n    return a % b",
     "def remainder(a, b):\n    if b == 0:\n        return 0\n    return a % b",
     ((5, 0), (7, 3)), ((2, 0), (9, 4), (6, 6))),
    ("zero", "train",
     "def chunk_count(items, size):\n    return (items + size - 1) // size",
     "def chunk_count(items, size):\n    if size == 0:\n        return 0\n    return (items + size - 1) // size",
     ((10, 0), (10, 3)), ((7, 0), (9, 3), (1, 5))),
    ("zero", "novel",
     "def share(amount, people):\n    return amount // people",
     "def share(amount, people):\n    if people == 0:\n        return 0\n    return amount // people",
     ((10, 0), (10, 5)), ((4, 0), (9, 2), (0, 3))),
    ("zero", "novel",
     "def leftover(items, boxes):\n    return items % boxes",
     "def leftover(items, boxes):\n    if boxes == 0:\n        return 0\n    return items % boxes",
     ((5, 0), (5, 2)), ((8, 0), (9, 4), (3, 7))),
    # --- init: the accumulator starts at the wrong value -----------------------------
    ("init", "train",
     "def product(nums):\n    acc = 0\n    for x in nums:\n        acc *= x\n    return acc",
     "def product(nums):\n    acc = 1\n    for x in nums:\n        acc *= x\n    return acc",
     (([2, 3],), ([],)), (([4, 5],), ([1, 7, 2],), ([3],))),
    ("init", "train",
     "def total(nums):\n    acc = 1\n    for x in nums:\n        acc += x\n    return acc",
     "def total(nums):\n    acc = 0\n    for x in nums:\n        acc += x\n    return acc",
     (([1, 2],), ([],)), (([5],), ([2, 2, 2],), ([0, 4],))),
    ("init", "train",
     "def count_items(nums):\n    count = 1\n    for x in nums:\n        count += 1\n    return count",
     "def count_items(nums):\n    count = 0\n    for x in nums:\n        count += 1\n    return count",
     (([7, 8],), ([],)), (([1],), ([3, 3, 3],), ([0, 0],))),
    ("init", "train",
     "def sum_squares(nums):\n    acc = 1\n    for x in nums:\n        acc += x * x\n    return acc",
     "def sum_squares(nums):\n    acc = 0\n    for x in nums:\n        acc += x * x\n    return acc",
     (([1, 2],), ([3],)), (([2, 2],), ([],), ([1, 1, 1],))),
    ("init", "novel",
     "def multiply_all(xs):\n    result = 0\n    for v in xs:\n        result *= v\n    return result",
     "def multiply_all(xs):\n    result = 1\n    for v in xs:\n        result *= v\n    return result",
     (([3, 3],), ([2],)), (([5, 2],), ([1, 1],), ([4, 1, 2],))),
    ("init", "novel",
     "def tally(items):\n    n = 1\n    for item in items:\n        n += 1\n    return n",
     "def tally(items):\n    n = 0\n    for item in items:\n        n += 1\n    return n",
     (([4, 4],), ([9],)), (([],), ([1, 2, 3],), ([5, 6],))),
    # --- heldout: unseen function names over the training tasks' repair cues ----------
    # every other symbol of these listings occurs in training listings, and none is twice as
    # common in another family's as in its own (unless three or more families share it); every
    # parameter name is one only its own family's training functions take: new compositions of
    # seen code, not new code, and no word that points at another family's edit
    ("minmax", "heldout",
     "def smallest(xs):\n    return max(xs)",
     "def smallest(xs):\n    return min(xs)",
     (([3, 1, 2],), ([5],)), (([4, 9, 2],), ([7, 7],), ([-1, -6],))),
    ("minmax", "heldout",
     "def bounded(value, lower):\n    return min(value, lower)",
     "def bounded(value, lower):\n    return max(value, lower)",
     ((2, 4), (9, 4)), ((1, 6), (10, 3), (5, 5))),
    ("range", "heldout",
     "def count_up(n):\n    return list(range(n))",
     "def count_up(n):\n    return list(range(n + 1))",
     ((2,), (0,)), ((3,), (1,), (5,))),
    ("range", "heldout",
     "def total_to(n):\n    return sum(range(0, n))",
     "def total_to(n):\n    return sum(range(0, n + 1))",
     ((4,), (1,)), ((5,), (2,), (0,))),
    ("compare", "heldout",
     "def exceeds(x, capacity):\n    return x >= capacity",
     "def exceeds(x, capacity):\n    return x > capacity",
     ((4, 4), (6, 2)), ((7, 7), (1, 5), (9, 3))),
    ("compare", "heldout",
     "def within_limit(x, hi):\n    return x < hi",
     "def within_limit(x, hi):\n    return x <= hi",
     ((5, 5), (3, 5)), ((8, 8), (9, 2), (0, 1))),
    ("zero", "heldout",
     "def per_person(part, size):\n    return part // size",
     "def per_person(part, size):\n    if size == 0:\n        return 0\n    return part // size",
     ((9, 0), (9, 3)), ((4, 0), (8, 2), (0, 5))),
    ("zero", "heldout",
     "def modulo(a, size):\n    return a % size",
     "def modulo(a, size):\n    if size == 0:\n        return 0\n    return a % size",
     ((5, 0), (7, 2)), ((3, 0), (9, 4), (6, 3))),
    ("init", "heldout",
     "def add_up(nums):\n    count = 1\n    for x in nums:\n        count += x\n    return count",
     "def add_up(nums):\n    count = 0\n    for x in nums:\n        count += x\n    return count",
     (([1, 2],), ([],)), (([5],), ([2, 3, 4],), ([0, 1],))),
    ("init", "heldout",
     "def product_of(nums):\n    count = 0\n    for x in nums:\n        count *= x\n    return count",
     "def product_of(nums):\n    count = 1\n    for x in nums:\n        count *= x\n    return count",
     (([2, 3],), ([],)), (([4, 5],), ([1, 3],), ([7],))),
)


def _entry_name(source: str) -> str:
    return source.split("def ", 1)[1].split("(", 1)[0]


def _expected(fixed: str, entry: str, inputs: tuple) -> tuple:
    """Run the trusted reference source in-process: ((args, expected), ...)."""
    namespace: dict[str, Any] = {}
    exec(compile(fixed, f"<fixed {entry}>", "exec"), namespace)  # our own reference code, not a submission
    fn = namespace[entry]
    return tuple((tuple(args), fn(*args)) for args in inputs)


@lru_cache(maxsize=1)
def _all_tasks() -> tuple[BugFixTask, ...]:
    tasks = []
    for family, split, source, fixed, public, hidden in _TABLE:
        entry = _entry_name(source)
        source, fixed = textwrap.dedent(source).strip() + "\n", textwrap.dedent(fixed).strip() + "\n"
        tasks.append(BugFixTask(
            name=f"{family}/{entry}", family=family, entry=entry, split=split, source=source, fixed=fixed,
            public=_expected(fixed, entry, public), hidden=_expected(fixed, entry, hidden),
        ))
    return tuple(tasks)


def make_tasks(split: str = "train") -> list[BugFixTask]:
    """The tasks of one split: "train" (20), "heldout" (10), "novel" (10), "all" (40) or "renamed" (20),
    in table order (each split in family order).

    "renamed" is a probe of generalisation: the training tasks, code and tests unchanged, each
    with its function renamed to one of its family's held-out names (alternating). A policy
    that does worse on them than on "train" keys on the name; the rest of its held-out gap
    comes from code it has not seen.
    """
    if split not in SPLITS:
        raise ValueError(f"make_tasks: split must be one of {SPLITS}, got {split!r}")
    if split == "renamed":
        held: dict[str, list[str]] = {}
        for t in _all_tasks():
            if t.split == "heldout":
                held.setdefault(t.family, []).append(t.entry)
        train = make_tasks("train")
        return [rename(t, held[t.family][i % len(held[t.family])]) for i, t in enumerate(train)]
    return [t for t in _all_tasks() if split == "all" or t.split == split]


def rename(task: BugFixTask, entry: str) -> BugFixTask:
    """The same task with its function called `entry` (name "family/entry~old"; split "renamed")."""
    old = f"def {task.entry}("
    if old not in task.source or old not in task.fixed:
        raise ValueError(f"rename: {task.name} does not define {task.entry}()")
    return BugFixTask(name=f"{task.family}/{entry}~{task.entry}", family=task.family, entry=entry, split="renamed",
                      source=task.source.replace(old, f"def {entry}("), fixed=task.fixed.replace(old, f"def {entry}("),
                      public=task.public, hidden=task.hidden)
