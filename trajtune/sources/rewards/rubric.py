"""Rubrics as rewards (RLHF book ch.12.14 "Rubrics: Prompt-Specific AI Feedback for Training"; checklist 12.14).

A rubric is a list of weighted criteria. Each item is graded met / not met -- by a verifier function (a
'file.py:fn' or 'module:fn' spec, or a Python callable, with the TRL reward-function signature of
`trajtune.sources.rewards`: a value > 0 means met, None means the item does not apply to that row) or, when it
names none, by a judge asked a yes/no question with the item's criterion (`trajtune.sources.judge.Judge.ask`).

The score of a completion (`rubric_score`; the book leaves the aggregation open, the checklist's [NOTE] fixes
the default):

    positive  sum of the weights of the met items / sum of the positive weights   (the default)
              -- a pitfall item (negative weight) is "met" when the response makes that mistake, so it
              subtracts; the score lies in [-(sum of pitfall weights) / positive, 1]
    clipped   the same, clipped below at 0
    sum       the raw sum of the met weights
    hard_rules=True: a response that misses an item tagged "[Hard Rule]" scores 0 (the book's tags mark priority)

An item a verifier left None is out of both sums for that row; an item the judge could not grade
(unparseable) leaves the whole completion unscored (None, counted in reward/<name>/ungraded), never 0.

JSON formats (`load_rubric`), the two the book prints:

    Format A (science, Gunjal et al.): a list of {"title", "description", "weight"}; the description begins with
        its category, "Essential Criteria: ...", "Important Criteria:", "Optional Criteria:" (weight 1-5) or
        "Pitfall Criteria:" (weight -1 or -2)
    Format B (Rezaei et al.): {"initial_reasoning": ..., "rubrics": [{"reasoning", "criterion", "weight" 1-10}]}

Either may add "check": "file.py:fn" to an item (trajtune's extension: a verifier grades it). Anything else is a
`RubricError` naming the file, the item and the field. Nothing here imports torch.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

from ...config import ConfigError
from ...metrics import register
from ..graders import Grades
from ..judge import question_text
from .functions import RewardBatch, RewardState, callable_name, invoke, load_reward_function

How = Literal["positive", "clipped", "sum"]
HOWS: tuple[str, ...] = ("positive", "clipped", "sum")
CATEGORIES: dict[str, tuple[int, int]] = {"Essential": (1, 5), "Important": (1, 5), "Optional": (1, 5),
                                          "Pitfall": (-2, -1)}
"""Format A's categories and their allowed weights (inclusive)"""
HARD_RULE = "[Hard Rule]"

register("reward/rubric/pass/*", "rubric items (sources.rewards.rubric): share of the last call's completions that "
                                 "met the item (a pitfall item: that made the mistake), by item title")
register("reward/rubric/ungraded", "rubric: share of the last call's completions left unscored because the judge's "
                                   "verdict on one of their items was unparseable")


class RubricError(ConfigError):
    """A rubric file or item that is not one of the book's formats; the message names the file, item and field."""


@dataclass(frozen=True)
class RubricItem:
    title: str
    """a short name (Format A's title; Format B: the criterion's first words)"""
    criterion: str
    """what is checked: the question a judge is asked"""
    weight: float
    """> 0 rewards meeting it; < 0 is a pitfall, charged when the response makes that mistake"""
    category: str = ""
    """Format A's Essential / Important / Optional / Pitfall ('' for Format B)"""
    check: str | Callable | None = None
    """a verifier (spec or callable) that grades the item; None: the judge grades it"""
    hard: bool = False
    """the criterion is tagged [Hard Rule]"""


@dataclass
class Rubric:
    items: list[RubricItem]
    source: str = "rubric"
    """where it came from, for messages"""
    reasoning: str = ""
    """Format B's initial_reasoning"""

    @property
    def titles(self) -> list[str]:
        return [i.title for i in self.items]


def rubric_score(met: Sequence[bool | None], weights: Sequence[float], how: str = "positive",
                 hard: Sequence[bool] = (), hard_rules: bool = False) -> float:
    """One completion's score from its items (module docstring). met[k]: item k met (a pitfall: the mistake
    made), None: does not apply. Worked: weights [5, 3, -2], met [True, False, True] -> (5 - 2) / (5 + 3) =
    0.375 ("positive"), 3.0 ("sum")."""
    if len(met) != len(weights):
        raise ValueError(f"rubric_score: {len(met)} grades for {len(weights)} items")
    if how not in HOWS:
        raise ValueError(f"rubric_score: how must be one of {HOWS}, got {how!r}")
    if hard_rules and any(h and m is False for h, m in zip(hard, met, strict=False)):
        return 0.0
    applies = [(m, w) for m, w in zip(met, weights, strict=True) if m is not None]
    total = math.fsum(w for m, w in applies if m)
    if how == "sum":
        return total
    positive = math.fsum(w for _, w in applies if w > 0)
    if positive <= 0:
        raise ValueError("rubric_score: no positive item applies to this completion (nothing to normalize by)")
    return max(0.0, total / positive) if how == "clipped" else total / positive


# --- loading ------------------------------------------------------------------------------
def load_rubric(path: str | Path) -> Rubric:
    """A rubric JSON file in Format A or B (module docstring); errors name the file, the item and the field."""
    p = Path(path)
    if not p.is_file():
        raise RubricError(f"rubric {p}: no such file")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RubricError(f"rubric {p}: not JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    return parse_rubric(data, str(p))


def parse_rubric(data: Any, source: str = "rubric") -> Rubric:
    """A rubric from parsed JSON (Format A: a list; Format B: an object with "rubrics")."""
    if isinstance(data, list):
        items, reasoning = [_format_a(x, k, source) for k, x in enumerate(data, 1)], ""
    elif isinstance(data, dict) and "rubrics" in data:
        if not isinstance(data["rubrics"], list):
            raise RubricError(f"rubric {source}: \"rubrics\" must be a list of items")
        items = [_format_b(x, k, source) for k, x in enumerate(data["rubrics"], 1)]
        reasoning = str(data.get("initial_reasoning", ""))
    else:
        raise RubricError(f"rubric {source}: expected Format A (a list of {{title, description, weight}}) or Format B "
                          f"({{initial_reasoning, rubrics: [{{reasoning, criterion, weight}}]}}), got "
                          f"{type(data).__name__}{' with keys ' + str(sorted(data)) if isinstance(data, dict) else ''}")
    if not items:
        raise RubricError(f"rubric {source}: no items")
    if not any(i.weight > 0 for i in items):
        raise RubricError(f"rubric {source}: no item has a positive weight (the score is normalized by their sum)")
    titles = [i.title for i in items]
    dup = sorted({t for t in titles if titles.count(t) > 1})
    if dup:
        raise RubricError(f"rubric {source}: item titles must differ (their pass rates are logged by title): {dup}")
    return Rubric(items, source, reasoning)


def _fields(x: Any, k: int, source: str, required: Sequence[str], allowed: Sequence[str]) -> dict:
    where = f"rubric {source} item {k}"
    if not isinstance(x, dict):
        raise RubricError(f"{where}: expected an object, got {type(x).__name__} {x!r:.60}")
    missing = [f for f in required if f not in x]
    extra = sorted(set(x) - set(required) - set(allowed))
    if missing or extra:
        raise RubricError(f"{where}: " + "; ".join(
            ([f"missing {missing}"] if missing else []) + ([f"unknown keys {extra}"] if extra else []))
            + f" (its keys: {sorted(x)}; an item has {list(required)}, optionally {list(allowed)})")
    for f in required:
        if f != "weight" and not (isinstance(x[f], str) and x[f].strip()):
            raise RubricError(f"{where}: {f!r} must be non-empty text, got {x[f]!r:.60}")
    w = x["weight"]
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w != int(w):
        raise RubricError(f"{where} ({x.get('title') or x.get('criterion')!r:.40}): 'weight' must be an integer, "
                          f"got {w!r}")
    if "check" in x and not (isinstance(x["check"], str) and ":" in x["check"]):
        raise RubricError(f"{where}: 'check' must be a verifier spec 'file.py:fn' or 'module:fn', got {x['check']!r}")
    return x


def _format_a(x: Any, k: int, source: str) -> RubricItem:
    x = _fields(x, k, source, ("title", "description", "weight"), ("check",))
    found = re.match(r"\s*(\w+) Criteria:\s*", x["description"])
    if not found or found.group(1) not in CATEGORIES:
        raise RubricError(f"rubric {source} item {k} ({x['title']!r}): 'description' must begin with its category, "
                          f"one of {[c + ' Criteria:' for c in CATEGORIES]}; got {x['description']!r:.60}")
    category = found.group(1)
    lo, hi = CATEGORIES[category]
    if not lo <= x["weight"] <= hi:
        raise RubricError(f"rubric {source} item {k} ({x['title']!r}): a {category} item's 'weight' must be "
                          f"{lo} to {hi}, got {x['weight']}")
    criterion = x["description"][found.end():]
    return RubricItem(x["title"].strip(), criterion, float(x["weight"]), category, x.get("check"),
                      HARD_RULE in criterion)


def _format_b(x: Any, k: int, source: str) -> RubricItem:
    x = _fields(x, k, source, ("criterion", "weight"), ("reasoning", "check", "title"))
    if not 1 <= x["weight"] <= 10:
        raise RubricError(f"rubric {source} item {k} ({x['criterion']!r:.40}): 'weight' must be 1 to 10 (Format B), "
                          f"got {x['weight']}")
    title = x.get("title") or " ".join(re.sub(r"\[[^\]]*\]", "", x["criterion"]).split()[:6])
    return RubricItem(title, x["criterion"], float(x["weight"]), "", x.get("check"), HARD_RULE in x["criterion"])


# --- the scorer ---------------------------------------------------------------------------
class RubricReward:
    """A rubric as a grader (`trajtune.sources.graders.Grader`; called: `RewardBatch` -> list[float | None], its
    `.metrics` those of the last call): `Scored(..., [Weighted(rubric)])`.

    rubric:      a `Rubric` (or a path: `load_rubric`)
    judge:       grades the items without a `check` (`Judge.ask`); needed only when there are such items
    how:         "positive" (default), "clipped" or "sum" (`rubric_score`)
    hard_rules:  a response that misses a [Hard Rule] item scores 0
    """

    finished_only = True
    main_only = False

    def __init__(self, rubric: Rubric | str | Path, judge=None, how: str = "positive", hard_rules: bool = False,
                 name: str = "rubric"):
        self.rubric = rubric if isinstance(rubric, Rubric) else load_rubric(rubric)
        if how not in HOWS:
            raise ValueError(f"RubricReward: how must be one of {HOWS}, got {how!r}")
        needs_judge = [i.title for i in self.rubric.items if i.check is None]
        if needs_judge and judge is None:
            raise RubricError(f"rubric {self.rubric.source}: items {needs_judge} have no 'check' verifier, so a judge "
                              "must grade them; give one (--reward-judge), or a 'check' to each item")
        self.checks = {i.title: load_reward_function(i.check) if isinstance(i.check, str) else i.check
                       for i in self.rubric.items if i.check is not None}
        self.judge, self.how, self.hard_rules, self.name = judge, how, hard_rules, name
        self.metrics: dict[str, float] = {}

    def grade(self, batch: RewardBatch) -> list[list[bool | None]]:
        """[N][K] grades of N completions on the K items: True met, False not, None does not apply (a verifier's
        None) or unparseable (the judge's: see `__call__`)."""
        n = len(batch)
        columns: list[list[bool | None]] = []
        for item in self.rubric.items:
            if item.check is None:
                columns.append(list(self.judge.ask([question_text(p) for p in batch.prompts],
                                                   [batch.text(i) for i in range(n)], [item.criterion] * n)))
            else:
                columns.append(self._verify(item, batch))
        return [[col[i] for col in columns] for i in range(n)]

    def _verify(self, item: RubricItem, batch: RewardBatch) -> list[bool | None]:
        fn = self.checks[item.title]
        out = invoke(fn, batch.kwargs())
        label = f"rubric {self.rubric.source} item {item.title!r} (check {callable_name(fn)})"
        if out.error:
            raise RubricError(f"{label} raised:\n{out.error}")
        if out.values is None or len(out.values) != len(batch):
            got = out.returned or f"{len(out.values or [])} values"
            raise RubricError(f"{label} returned {got} for {len(batch)} completions; it returns one value per "
                              "completion (> 0: met, None: does not apply)")
        bad = [i for i, v in enumerate(out.values) if v is not None and not isinstance(v, float)]
        if bad:
            shown = getattr(out.values[bad[0]], "text", out.values[bad[0]])
            raise RubricError(f"{label} returned {shown} for {batch.where[bad[0]]}: not a number or None")
        return [None if v is None else v > 0 for v in out.values]

    def __call__(self, batch: RewardBatch) -> list[float | None]:
        items = self.rubric.items
        weights, hard = [i.weight for i in items], [i.hard for i in items]
        grades = self.grade(batch)
        judged = [k for k, i in enumerate(items) if i.check is None]
        out: list[float | None] = []
        for row in grades:
            if any(row[k] is None for k in judged):  # the judge could not grade an item: unscored, not 0
                out.append(None)
            elif not any(g is not None and w > 0 for g, w in zip(row, weights, strict=True)):
                out.append(None)  # no positive item applies: nothing to normalize by
            else:
                out.append(rubric_score(row, weights, self.how, hard, self.hard_rules))
        self.metrics = {f"reward/{self.name}/ungraded": sum(v is None for v in out) / max(1, len(out))}
        for k, item in enumerate(items):
            graded = [bool(row[k]) for row in grades if row[k] is not None]
            if graded:
                self.metrics[f"reward/{self.name}/pass/{slug(item.title)}"] = sum(graded) / len(graded)
        return out

    def start(self, batch: RewardBatch, state: RewardState) -> Callable[[], Grades]:
        """As a grader (`trajtune.sources.graders.Grader`): its scores and `metrics`, computed in the wait."""
        return lambda: Grades(self(batch), self.metrics)

    def close(self) -> None:
        pass


def slug(title: str) -> str:
    """A title as a metric-key part: lower case, runs of other characters as one '_'."""
    return re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_") or "item"

