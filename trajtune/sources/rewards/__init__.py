"""Reward functions the TRL way: several of them, weighted, each called once per batch of completions.

A reward function has TRL's signature (`GRPOTrainer(reward_funcs=...)`):

    def exact(prompts, completions, completion_ids, answer, **kwargs) -> list[float | None]:
        return [float(c[-1]["content"].strip() == a) for c, a in zip(completions, answer)]

    prompts         the batch's prompts, as the dataset has them (a string, or a list of messages)
    completions     one per prompt, in the prompt's form: a string for string prompts,
                    [{"role": "assistant", "content": text}] for conversational ones
    completion_ids  the sampled token ids of each completion (the stop token included)
    <column>        every other column of the dataset rows, one list each ("answer" above)
    trainer_state   `RewardState(global_step, max_steps)` (TRL: the Trainer's state)
    log_metric      log_metric(name, value): logged as reward/<function>/<name> (the batch's mean)
    log_extra       log_extra(column, values): one value per completion, kept in info["reward_extra"]

Only the keywords a function names are passed, unless it takes **kwargs (then all of them).
A named parameter that is none of these must be a column of every row: `check_columns`
refuses the data before training otherwise, naming the function, the column and the row.

It returns one reward per completion: a finite number, or None where the function does not
apply to that row (TRL: None is left out of the weighted sum). NaN, Inf, a string, a list of
the wrong length, or no list at all is a `RewardError` naming the function, the row(s) and
the value. `combine` is the weighted sum; a row that every source left None is unscorable
(TRL excludes it from the baseline; the HF commands drop it from the update).

How the calls run (`RewardSet.score`):
  * the functions of one batch are called at the same time, one call each;
  * a function given as a spec ('file.py:fn', 'module:fn') runs in its own worker process
    (started once, reused, the module imported there): a call that runs past `timeout`
    seconds is stopped by killing the process, which nothing in the function can block
    (a hung C call, a GIL-holding regex); a plain callable runs in a thread of this process,
    where the time limit only stops the waiting (a thread cannot be killed);
  * a batch call that raises or overruns is called again row by row (`LOCATE_WORKERS` at a
    time, each under the time limit) to find the rows: an exception stops the run with a
    `RewardError` that shows the function's own traceback once and names the rows
    ('prompts.jsonl:3'); a row that overruns alone fails (its episode gets no reward: `failed`),
    and more failed rows than `max_fault_share` of the batch stop the run.
Nothing here imports torch: a worker starts in ~0.1 s plus the reward module's own imports.
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
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Callable, Sequence

from ...config import ConfigError
from ...processes import exit_with_parent

RESERVED = ("prompts", "completions", "completion_ids", "trainer_state", "log_metric", "log_extra")
"""keywords every reward function may take besides the dataset's columns"""
LOCATE_WORKERS = 4
"""per-row calls running at once while looking for the rows a batch call failed on"""
LOAD_TIMEOUT_S = 300.0
"""how long a new worker may take to import the reward module (not counted in a call's time limit)"""
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
    (for a `SingleTurnEnv`; the HF commands score whole batches with `RewardSet` instead)."""

    def verifier(task, reply: str):
        batch = RewardBatch.of([task], [reply], [[]])
        out = _invoke(fn, batch.kwargs())
        if out.error:
            raise RewardError(f"reward function {callable_name(fn)} raised on {task.where or task.name}:\n{out.error}")
        values, problems = _check(out, 1, callable_name(fn), batch)
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
class Outcome:
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


def _invoke(fn: Callable, kwargs: dict) -> Outcome:
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
        return Outcome(error=user_traceback(e))
    if hasattr(out, "tolist") and not isinstance(out, (list, tuple)):
        out = out.tolist()
    if not isinstance(out, (list, tuple)):
        return Outcome(returned=f"{type(out).__name__} {_short(out)}", metrics=metrics, extras=extras)
    return Outcome(values=[_plain(v) for v in out], metrics=metrics, extras=extras)


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


def _serve(fd: int, parent: int) -> None:
    """A worker process: answer ("call", spec, kwargs) with an Outcome until the parent closes the pipe.
    Ctrl-C and SIGTERM are the parent's to handle (it stops the worker); the worker ends with it."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    exit_with_parent(parent)
    conn = Connection(fd)
    while True:
        try:
            kind, *msg = conn.recv()
        except (EOFError, OSError):
            return
        if kind == "path":
            sys.path[:] = msg[0]
            continue
        if kind == "load":  # import once, before any call is timed
            try:
                load_reward_function(msg[0])
                conn.send(("ready", ""))
            except RewardError as e:
                conn.send(("error", str(e)))
            continue
        spec, kwargs = msg
        try:
            out = _invoke(load_reward_function(spec), kwargs)
        except RewardError as e:
            out = Outcome(error=str(e))
        try:
            conn.send(out)
        except Exception as e:  # noqa: BLE001 - e.g. a log_extra value that cannot be pickled
            conn.send(Outcome(error=f"its results cannot be sent back to the trainer: {type(e).__name__}: {e}"))


class _Worker:
    """One worker process and its pipe; it imports `spec` as it starts (`ready` waits for that)."""

    def __init__(self, spec: str):
        ours, theirs = Pipe()
        root = str(Path(__file__).resolve().parents[3])
        code = (f"import sys; sys.path.insert(0, {root!r}); from trajtune.sources.rewards import _serve; "
                f"_serve({theirs.fileno()}, {os.getpid()})")
        self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),),
                                     stdin=subprocess.DEVNULL)
        theirs.close()
        self.conn = ours
        self.conn.send(("path", list(sys.path)))
        self.conn.send(("load", spec))

    def ready(self, deadline: float) -> str:
        """'' once the worker has imported the function, else what went wrong."""
        if not self.conn.poll(max(0.0, deadline - time.monotonic())):
            return f"a new worker process took more than {LOAD_TIMEOUT_S:g} s to import the function"
        try:
            kind, error = self.conn.recv()
        except (EOFError, OSError):
            return f"a new worker process ended while importing the function (exit code {self.proc.poll()})"
        return error

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.conn.close()


class _Call:
    """A call in flight: `conn` becomes readable when its Outcome is ready."""

    def __init__(self, conn: Connection, worker: _Worker | None, owner: "RewardFunction"):
        self.conn, self.worker, self.owner = conn, worker, owner

    def receive(self) -> Outcome:
        try:
            out = self.conn.recv()
        except (EOFError, OSError):
            code = self.worker.proc.poll() if self.worker else None
            self.owner._retire(self.worker)
            return Outcome(error=f"its worker process ended while scoring (exit code {code}): the function, or "
                                 "something it called, ended the process (os._exit, a crash in native code)")
        self.owner._release(self.worker, self.conn)
        return out

    def cancel(self) -> None:
        """Stop a call that ran out of time: kill its process (a thread cannot be stopped: abandoned)."""
        if self.worker is not None:
            self.owner._retire(self.worker)
        else:
            self.conn.close()


class RewardFunction:
    """One reward function, by spec ('file.py:fn': runs in worker processes) or as a callable
    (runs in threads of this process). `label` is how messages name it."""

    def __init__(self, fn: Callable | None = None, *, spec: str = "", name: str = ""):
        if spec:
            fn = load_reward_function(spec)
        if fn is None:
            raise ValueError("RewardFunction: give a callable or a spec")
        self.fn, self.spec, self.name = fn, spec, name or callable_name(fn)
        self.columns, self.accepts = signature_of(fn)
        self.label = f"reward function {self.name}" + (f" ({spec})" if spec else "")
        self._idle: list[_Worker] = []
        self._busy: list[_Worker] = []

    def submit(self, kwargs: dict) -> _Call:
        """Start one call on `kwargs` (filtered to what the function accepts) and return at once."""
        if self.accepts is not None:
            kwargs = {k: v for k, v in kwargs.items() if k in self.accepts}
        if not self.spec:
            ours, theirs = Pipe(duplex=False)
            threading.Thread(target=_send_outcome, args=(theirs, self.fn, kwargs), daemon=True).start()
            return _Call(ours, None, self)
        self.start(1)
        worker = self._idle.pop()
        self._busy.append(worker)
        worker.conn.send(("call", self.spec, kwargs))
        return _Call(worker.conn, worker, self)

    def start(self, k: int) -> None:
        """Have `k` idle workers (specs only), the function imported in each: started together, and
        before any call's time limit runs (a module that imports torch takes seconds)."""
        if not self.spec or len(self._idle) >= k:
            return
        new = [_Worker(self.spec) for _ in range(k - len(self._idle))]
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        errors = [e for e in (w.ready(deadline) for w in new) if e]
        if errors:
            for w in new:
                w.kill()
            raise RewardError(f"{self.label}: {errors[0]}")
        self._idle += new

    def _release(self, worker: _Worker | None, conn: Connection) -> None:
        if worker is None:
            conn.close()
        else:
            self._busy.remove(worker)
            self._idle.append(worker)

    def _retire(self, worker: _Worker | None) -> None:
        if worker is None:
            return
        if worker in self._busy:
            self._busy.remove(worker)
        worker.kill()

    def close(self) -> None:
        for w in self._idle + self._busy:
            w.kill()
        self._idle, self._busy = [], []


def _send_outcome(conn: Connection, fn: Callable, kwargs: dict) -> None:
    out = _invoke(fn, kwargs)
    try:
        conn.send(out)
    except (OSError, ValueError):  # the caller stopped waiting (timeout) and closed the pipe
        pass
    except Exception as e:  # noqa: BLE001 - unpicklable log_extra values
        conn.send(Outcome(error=f"its results cannot be passed back: {type(e).__name__}: {e}"))


def wait_all(calls: Sequence[_Call], timeout: float | None) -> list[Outcome | None]:
    """The Outcome of every call, None for those still running after `timeout` s (0/None: no limit;
    those are cancelled). All the calls were started together, so they share one deadline."""
    deadline = time.monotonic() + timeout if timeout else None
    pending = {c.conn: c for c in calls}
    got: dict[int, Outcome] = {}
    try:
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(list(pending), left)
            if not ready:
                break
            for conn in ready:
                call = pending.pop(conn)
                got[id(call)] = call.receive()
    finally:
        for call in pending.values():
            call.cancel()
    return [got.get(id(c)) for c in calls]


# --- scoring a batch ---------------------------------------------------------------------------
@dataclass
class Scores:
    """What `RewardSet.score` found for a batch of N completions and K functions."""

    values: list[list[float | None]]
    """[K][N] each function's reward per completion (None: does not apply, or the row failed)"""
    failed: dict[int, str]
    """row -> why it got no reward (a call that ran past the time limit)"""
    metrics: dict[str, float]
    """what the functions logged with log_metric, as reward/<function>/<name> (mean)"""
    extras: list[dict]
    """[N] what they logged with log_extra"""


class RewardSet:
    """Reward functions called once per batch, concurrently, each call under `timeout` seconds
    (0: no limit); `max_fault_share`: the share of a batch that may fail by time-outs."""

    def __init__(self, functions: Sequence[RewardFunction], timeout: float = 60.0, max_fault_share: float = 0.5):
        names = [f.name for f in functions]
        self.functions = list(functions)
        for f in self.functions:  # two functions called `reward` from two files: name them by file too
            if names.count(f.name) > 1 and f.spec:
                f.name = f"{Path(f.spec.rsplit(':', 1)[0]).stem}.{f.name}"
        if len({f.name for f in self.functions}) < len(self.functions):
            raise RewardError(f"the same reward function is given twice: {names}")
        self.timeout, self.max_fault_share = timeout, max_fault_share

    def close(self) -> None:
        """Stop the worker processes (a later `score` starts new ones)."""
        for f in self.functions:
            f.close()

    def __enter__(self) -> "RewardSet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def score(self, batch: RewardBatch, state: RewardState | None = None) -> Scores:
        """1. call every function on the whole batch at once; 2. where a call raised or overran, call
        it row by row to find the rows; 3. check every value. Raises RewardError (module docstring)."""
        n, metrics, extras = len(batch), {}, [dict() for _ in range(len(batch))]
        for f in self.functions:
            f.start(1)
        outcomes = wait_all([f.submit(batch.kwargs(state=state)) for f in self.functions], self.timeout)
        values, failed = [], {}
        for f, out in zip(self.functions, outcomes, strict=True):
            if out is None or out.error:
                out, hung = self._locate(f, batch, out, state)
                failed.update({i: f"{f.label} ran past its time limit ({self.timeout:g} s) on {batch.where[i]}"
                               for i in hung if i not in failed})
            vals, problems = _check(out, n, f.label, batch)
            if problems:
                raise RewardError(problems)
            values.append(vals)
            for name, xs in _group(out.metrics).items():
                metrics[f"reward/{f.name}/{name}"] = statistics.fmean(xs)
            for col, xs in out.extras.items():
                for i, x in zip(range(n), xs):
                    extras[i][col] = x
        if len(failed) > self.max_fault_share * n:
            raise RewardError(f"{len(failed)} of {n} completions got no reward (limit {self.max_fault_share:.0%}): "
                              + _listing(sorted(failed), batch, lambda i: failed[i]))
        return Scores(values, failed, metrics, extras)

    def _locate(self, f: RewardFunction, batch: RewardBatch, first: Outcome | None,
                state: RewardState | None) -> tuple[Outcome, set[int]]:
        """Call `f` row by row after its batch call raised (`first.error`) or overran (`first` None).
        Returns an Outcome of the per-row values, and the rows that overran alone. Raises RewardError
        for the rows that raised (or, if none did alone, for the batch call's error)."""
        n, cap = len(batch), self.max_fault_share * len(batch)
        values: list = [None] * n
        raised: dict[int, str] = {}
        hung: set[int] = set()
        for start in range(0, n, LOCATE_WORKERS):
            wave = list(range(start, min(n, start + LOCATE_WORKERS)))
            f.start(len(wave))
            for i, out in zip(wave, wait_all([f.submit(batch.kwargs([i], state)) for i in wave], self.timeout)):
                if out is None:
                    hung.add(i)
                elif out.error:
                    raised[i] = out.error
                elif out.values is not None and len(out.values) == 1:
                    values[i] = out.values[0]
                else:
                    values[i] = _Bad(f"{out.returned or out.values!r} for one completion")
            hangs_on_all = start == 0 and len(hung) == len(wave)  # the whole first wave overran
            if hangs_on_all or len(hung) > cap:  # the batch fails either way: do not wait for the rest
                hung |= set(range(start + len(wave), n))
                break
        if raised or (first is not None and not hung):
            rows = sorted(raised)
            error = raised[rows[0]] if rows else first.error
            first_row = f"{batch.where[rows[0]]} (completion {_short(batch.text(rows[0]))})" if rows else ""
            head = (f"{f.label} raised on the batch of {n} completions, but on none of them alone:" if not rows else
                    f"{f.label} raised on {first_row}:" if len(rows) == 1 else
                    f"{f.label} raised on {len(rows)} of {n} completions ({_listing(rows, batch)}); on the first, "
                    f"{first_row}:")
            raise RewardError(f"{head}\n{error}")
        return Outcome(values=values), hung


def _check(out: Outcome, n: int, label: str, batch: RewardBatch) -> tuple[list, str]:
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
