"""Reward functions the TRL way: what one is, one call of it, and the checks of what it returns.

A reward function has TRL's signature (`GRPOTrainer(reward_funcs=...)`); `trajtune.sources.rewards`
says what it gets and returns. This module loads one ('file.py:fn', 'module:fn'), builds a batch's
keyword arguments (`RewardBatch`), makes one call in this process (`invoke`: hooks filled in, a
coroutine awaited, the result made plain and picklable), checks the values (`check`: a finite
number or None per completion, or a message naming the function, the rows and the values), and
combines the sources (`combine`, `source_metrics`). Where calls run -- worker processes and
threads, time limits, finding the rows a batch call failed on -- is `workers.py`. Nothing here
imports torch.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import statistics
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ...config import ConfigError

if TYPE_CHECKING:
    from .workers import RewardFunction

RESERVED = ("prompts", "completions", "completion_ids", "trainer_state", "log_metric", "log_extra")
"""keywords every reward function may take besides the dataset's columns"""
SHOW = 5
"""rows a message lists before '... and N more'"""


class RewardError(ConfigError):
    """A reward function that cannot be loaded, raised, returned something that is not a reward,
    needs a column the data lacks, or hung on too many rows; the message names it and the rows."""


@dataclass(frozen=True)
class RewardState:
    """What `trainer_state` holds (TRL passes its TrainerState): optimizer steps so far and in all."""

    global_step: int = 0
    max_steps: int = 0


# --- loading ---------------------------------------------------------------------------------
_LOADED: dict[tuple, Callable] = {}


def load_reward_function(spec: str) -> Callable:
    """Import a reward function given as 'file.py:function' or 'module:function' (a file is
    imported once per process and version of the file; its directory joins sys.path so it can
    import the files next to it). Any failure is a `RewardError` naming the spec; an error
    inside the module (a syntax error, a failed import) shows its traceback."""
    if not isinstance(spec, str) or ":" not in spec:
        raise RewardError(f"reward function {spec!r}: expected 'module:function' or 'file.py:function' "
                          "(e.g. 'my_rewards.py:exact_match')")
    mod_name, fn_name = spec.rsplit(":", 1)
    is_file = mod_name.endswith(".py") or os.sep in mod_name
    if is_file and not Path(mod_name).is_file():
        raise RewardError(f"reward function {spec!r}: no such file {mod_name}")
    key = (spec, os.stat(mod_name).st_mtime_ns if is_file else 0)
    if key not in _LOADED:
        try:
            module = _import_file(mod_name) if is_file else importlib.import_module(mod_name)
        except Exception as e:  # noqa: BLE001 - the user's module: show what went wrong in it
            raise RewardError(f"reward function {spec!r}: importing {mod_name} failed:\n{user_traceback(e)}") from None
        fn = getattr(module, fn_name, None)
        if not callable(fn):
            defined = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
            raise RewardError(f"reward function {spec!r}: {mod_name} has no callable {fn_name!r}"
                              f" (its functions: {', '.join(defined) or 'none'})")
        _LOADED[key] = fn
    return _LOADED[key]


def _import_file(path: str):
    p = Path(path).resolve()
    if str(p.parent) not in sys.path:
        sys.path.append(str(p.parent))
    name = f"trajtune_reward_{p.stem}_{abs(hash(str(p))) % 10**8}"  # registered: dataclasses and pickle need it
    s = importlib.util.spec_from_file_location(name, p)
    if s is None or s.loader is None:
        raise ImportError(f"cannot import {p} as a Python module")
    module = importlib.util.module_from_spec(s)
    sys.modules[name] = module
    try:
        s.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def user_traceback(exc: BaseException) -> str:
    """The traceback of `exc` from the user's first frame on (this module's and importlib's frames cut)."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename == __file__
                              or tb.tb_frame.f_code.co_filename.startswith("<frozen")):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb)).rstrip()


def callable_name(fn: Callable) -> str:
    """TRL's display name of a reward function: __name__ (through functools.partial), else the class name."""
    while hasattr(fn, "func") and hasattr(fn, "args"):  # functools.partial
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def signature_of(fn: Callable) -> tuple[list[str], set[str] | None]:
    """(the columns `fn` needs: named parameters without default that are not RESERVED,
    the keywords it accepts or None where it takes **kwargs)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: pass everything, check nothing
        return [], None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = [p for p in params if p.kind in kinds]
    needed = [p.name for p in named if p.default is inspect.Parameter.empty and p.name not in RESERVED]
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    return needed, None if takes_all else {p.name for p in named}


def reward_verifier(fn: Callable):
    """A TRL-style reward function as a per-row trajtune verifier `(task, reply) -> (reward, checks)`
    (for a `SingleTurnEnv`; the HF commands score whole batches with `RewardFunction` graders instead)."""

    def verifier(task, reply: str):
        batch = RewardBatch.of([task], [reply], [[]])
        out = invoke(fn, batch.kwargs())
        if out.error:
            raise RewardError(f"reward function {callable_name(fn)} raised on {task.where or task.name}:\n{out.error}")
        values, problems = check(out, 1, callable_name(fn), batch)
        if problems:
            raise RewardError(problems)
        return (0.0 if values[0] is None else values[0]), {}

    return verifier


# --- one batch in TRL's form -----------------------------------------------------------------
@dataclass
class RewardBatch:
    """N completions of prompt rows, as TRL hands them to a reward function."""

    prompts: list
    completions: list
    completion_ids: list
    columns: dict[str, list]
    """column -> [N] values (None where a row lacks it)"""
    where: list[str]
    """[N] the row each completion answers ('prompts.jsonl:3')"""

    @classmethod
    def of(cls, tasks: Sequence, replies: Sequence[str], ids: Sequence[Sequence[int]]) -> "RewardBatch":
        """From prompt tasks (`trajtune.sources.data.PromptTask`: prompt, columns, where), one per completion."""
        names = list(dict.fromkeys(k for t in tasks for k in t.columns))
        completions = [r if isinstance(t.prompt, str) else [{"role": "assistant", "content": r}]
                       for t, r in zip(tasks, replies, strict=True)]
        return cls([t.prompt for t in tasks], completions, [list(i) for i in ids],
                   {k: [t.columns.get(k) for t in tasks] for k in names},
                   [t.where or t.name for t in tasks])

    def __len__(self) -> int:
        return len(self.prompts)

    def kwargs(self, rows: Sequence[int] | None = None, state: RewardState | None = None) -> dict:
        """The keyword arguments of a call on `rows` (all by default)."""
        rows = range(len(self)) if rows is None else rows
        pick = lambda xs: [xs[i] for i in rows]  # noqa: E731
        return {"prompts": pick(self.prompts), "completions": pick(self.completions),
                "completion_ids": pick(self.completion_ids), **{k: pick(v) for k, v in self.columns.items()},
                "trainer_state": state or RewardState(), "log_metric": _HOOK, "log_extra": _HOOK}

    def text(self, row: int) -> str:
        c = self.completions[row]
        return c if isinstance(c, str) else c[-1]["content"]


_HOOK = "__trajtune_reward_hook__"
"""stands for log_metric / log_extra in a call's arguments; the process that calls replaces it"""


def check_columns(functions: Sequence["RewardFunction"], tasks: Sequence) -> None:
    """Every column a function names must be in every row: else a RewardError naming the function,
    the column and the first row without it (before any model loads)."""
    for f in functions:
        for col in f.columns:
            missing = [t for t in tasks if col not in t.columns]
            if missing:
                more = f" (and {len(missing) - 1} more rows)" if len(missing) > 1 else ""
                have = sorted(missing[0].columns)
                raise RewardError(f"{f.label} needs column {col!r}, but {missing[0].where or missing[0].name} has no "
                                  f"{col!r}{more}; its columns: {have or 'none besides prompt'}. Add the column "
                                  f"to every row, give the parameter a default, or take it from **kwargs")


# --- calling a function: in this process, or in a worker -------------------------------------
@dataclass
class CallResult:
    """What one call gave: values (None, float, or a `_Bad` repr each) or the function's error."""

    values: list | None = None
    returned: str = ""
    """what came back when it was not a list (its type and repr)"""
    error: str = ""
    """the user's traceback"""
    metrics: list = field(default_factory=list)
    extras: dict = field(default_factory=dict)


@dataclass(frozen=True)
class _Bad:
    text: str


def invoke(fn: Callable, kwargs: dict) -> CallResult:
    """Call `fn(**kwargs)` (hooks filled in, a coroutine awaited) -> plain, picklable results."""
    metrics: list = []
    extras: dict = {}
    hooks = {"log_metric": lambda name, value: metrics.append((str(name), float(value))),
             "log_extra": lambda column, values: extras.__setitem__(str(column), list(values))}
    kw = {k: hooks[k] if k in hooks and isinstance(v, str) and v == _HOOK else v for k, v in kwargs.items()}
    try:
        out = fn(**kw)
        if inspect.isawaitable(out):
            out = asyncio.run(_await(out))
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's code: report it, with their traceback
        return CallResult(error=user_traceback(e))
    if hasattr(out, "tolist") and not isinstance(out, (list, tuple)):
        out = out.tolist()
    if not isinstance(out, (list, tuple)):
        return CallResult(returned=f"{type(out).__name__} {_short(out)}", metrics=metrics, extras=extras)
    return CallResult(values=[_plain(v) for v in out], metrics=metrics, extras=extras)


async def _await(awaitable):
    return await awaitable


def _plain(v: Any) -> Any:
    if v is None or (isinstance(v, numbers.Real) and not isinstance(v, str)):
        return None if v is None else float(v)
    if hasattr(v, "item") and getattr(v, "ndim", None) == 0:  # a 0-d numpy array or torch tensor
        return _plain(v.item())
    return _Bad(f"{_short(v)} ({type(v).__name__})")


def _short(v: Any, n: int = 80) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 3] + "..."


def check(out: CallResult, n: int, label: str, batch: RewardBatch) -> tuple[list, str]:
    """(the values as floats / None, '' or the message naming every bad value and its row)."""
    if out.values is None:
        return [], (f"{label} returned {out.returned}; a reward function returns a list with one reward "
                    f"(a number, or None) per completion")
    if len(out.values) != n:
        return [], f"{label} returned {len(out.values)} rewards for {n} completions (one per completion, in order)"
    bad = [i for i, v in enumerate(out.values)
           if isinstance(v, _Bad) or (isinstance(v, float) and not math.isfinite(v))]
    if not bad:
        return list(out.values), ""
    show = lambda i: out.values[i].text if isinstance(out.values[i], _Bad) else repr(out.values[i])  # noqa: E731
    return [], (f"{label} returned {len(bad)} values that are not rewards: "
                + _listing(bad, batch, lambda i: f"{show(i)} (completion {_short(batch.text(i), 40)})")
                + "; a reward is a finite number, or None where the function does not apply to the row")


def _listing(rows: Sequence[int], batch: RewardBatch, say: Callable[[int], str] | None = None) -> str:
    parts = [f"{batch.where[i]}: {say(i)}" if say else batch.where[i] for i in rows[:SHOW]]
    return ", ".join(parts) + (f" ... and {len(rows) - SHOW} more" if len(rows) > SHOW else "")


def _group(pairs: Sequence[tuple[str, float]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for k, v in pairs:
        out.setdefault(k, []).append(v)
    return out


# --- the weighted sum -------------------------------------------------------------------------
def combine(values: Sequence[Sequence[float | None]], weights: Sequence[float]) -> list[float | None]:
    """[K][N] per-source rewards and [K] weights -> [N] weighted sums over the sources that scored
    each row (None is left out, TRL's nansum); None where no source scored the row (unscorable)."""
    if len(values) != len(weights):
        raise ValueError(f"combine: {len(values)} reward sources, {len(weights)} weights")
    n = len(values[0]) if values else 0
    out: list[float | None] = []
    for i in range(n):
        scored = [(w, v[i]) for w, v in zip(weights, values, strict=True) if v[i] is not None]
        out.append(math.fsum(w * x for w, x in scored) if scored else None)
    return out


def source_metrics(names: Sequence[str], values: Sequence[Sequence[float | None]]) -> dict[str, float]:
    """reward/<name>/mean and /std (sample std) of each source over the rows it scored (TRL's rewards/<name>/*)."""
    out = {}
    for name, v in zip(names, values, strict=True):
        xs = [x for x in v if x is not None]
        if xs:
            out[f"reward/{name}/mean"] = statistics.fmean(xs)
            out[f"reward/{name}/std"] = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return out
