"""Faults in user code fail one episode, not the run: the time limit and the run-level fault limit.

An `env.reset` or `env.step` (or the reward function inside it) that raises,
runs past its time limit (`step_timeout_s`, default `STEP_TIMEOUT_S` = 60 s;
`StepTimeout`), or returns what the Env contract does not allow (`InvalidStep`:
`check_step` / `check_reset`, e.g. a reward that is None, a string or NaN) gives
that episode the outcome ENV_ERROR (`trajectory.Outcome`: an infrastructure failure, which
no loss and no group baseline sees) and info["env_error"], logged with its task and the
user's traceback (`describe_fault`; the rollout records it: `trajtune.sources.rollout`);
the other episodes of the batch go on. `check_faults` is the run-level limit: an
`EpisodeSource` (`trajtune.sources.episodes`) stops the run with `TooManyFaults` when more
than `max_fault_share` of a draw's episodes fail.

The time limit is a SIGALRM timer (`time_limit`; see its docstring for what it
can and cannot interrupt); it only works in the main thread.
"""

from __future__ import annotations

import _signal
import inspect
import logging
import math
import signal
import threading
import time
import traceback
from contextlib import nullcontext
from functools import lru_cache
from pathlib import Path
from typing import Any, ContextManager, Mapping, Sequence

from ..envs.base import InvalidStep, _short, check_reward, check_verdict  # noqa: F401 (re-exported)
from ..trajectory import Outcome, Trajectory

log = logging.getLogger("trajtune.sources.faults")

STEP_TIMEOUT_S = 60.0
"""Default time limit of one `env.reset` / `env.step` call, in seconds (0 or None: none)."""


class TooManyFaults(RuntimeError):
    """More episodes of a batch failed in user code than the run allows."""


def check_faults(trajectories: Sequence[Trajectory], max_share: float = 0.5) -> int:
    """Count episodes whose environment failed (outcome ENV_ERROR); raise `TooManyFaults` if their share exceeds
    `max_share`. Returns the count. The message names the first failing tasks and their exceptions.
    """
    failed = [t for t in trajectories if t.outcome is Outcome.ENV_ERROR]
    if trajectories and len(failed) / len(trajectories) > max_share:
        examples = "; ".join(f"{t.info.get('task')}: {t.info['env_error']}" for t in failed[:3])
        raise TooManyFaults(f"{len(failed)} of {len(trajectories)} episodes failed in the environment "
                            f"(limit {max_share:.0%}): {examples}")
    return len(failed)


class StepTimeout(Exception):
    """An environment call ran past the rollout's time limit (`step_timeout_s`)."""


def check_step(env: Any, result: Any) -> tuple[str, float, bool, dict]:
    """`env.step`'s result as (observation, reward as a float, done, info), or `InvalidStep` naming the
    environment's `step` (file:line) and what is wrong: not 4 values, an observation that is not a str,
    a reward that is not a finite real number (None, a string, NaN, inf), or an info that is not a dict."""
    if not isinstance(result, tuple) or len(result) != 4:
        raise InvalidStep(f"{_defined_at(env, 'step')} returned {_short(result)}; "
                          "it must return StepResult(observation, reward, done, info)")
    observation, reward, done, info = result
    if type(reward) is float and type(observation) is str and type(info) is dict and math.isfinite(reward):
        return observation, reward, bool(done), info  # the common case, without the ABC checks below
    value = check_reward(reward, lambda: _defined_at(env, "step"))
    if not isinstance(observation, str):
        raise InvalidStep(f"{_defined_at(env, 'step')} returned observation {_short(observation)} "
                          f"({type(observation).__name__}); it must be a str ('' for none)")
    if not isinstance(info, dict):
        raise InvalidStep(f"{_defined_at(env, 'step')} returned info {_short(info)} ({type(info).__name__}); "
                          "it must be a dict")
    return observation, value, bool(done), info


def check_reset(env: Any, first: Any) -> Any:
    """`env.reset`'s result if it is a str or a non-empty list of {"role": str, "content": ...} messages,
    else `InvalidStep` naming the environment's `reset` (file:line)."""
    if isinstance(first, str):
        return first
    if isinstance(first, (list, tuple)) and first and all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and "content" in m for m in first):
        return first
    raise InvalidStep(f"{_defined_at(env, 'reset')} returned {_short(first)} ({type(first).__name__}); it must return "
                      "the first user message (a str) or a list of {'role': ..., 'content': ...} messages")


def describe_fault(exc: BaseException, limit: int = 8) -> str:
    """The traceback of a fault in user code, without the library's own calling frames (the
    rollout's and this module's): the last `limit` frames, as Python prints them."""
    own = {Path(__file__).resolve(), Path(__file__).resolve().with_name("rollout.py")}
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() not in own]
    if not frames:
        return ""
    return "".join(traceback.format_list(frames[-limit:])).rstrip()


def _defined_at(env: Any, method: str) -> str:
    """`ClassName.method (file:line)` of an environment's method, for messages about its results."""
    return _defined_at_class(type(env), method)


@lru_cache(maxsize=256)
def _defined_at_class(cls: type, method: str) -> str:
    """`_defined_at` per class, cached: `check_step` runs on every env.step (inspect reads the source file)."""
    fn = getattr(cls, method, None)
    label = f"{cls.__name__}.{method}"
    try:
        return f"{label} ({inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]})"
    except (TypeError, OSError):
        return label


_warned_no_limit = False
_NO_LIMIT = nullcontext()


def time_limit(seconds: float | None, what: str = "env.step") -> ContextManager[None]:
    """Raise `StepTimeout("<what> exceeded <seconds> s")` in the body if it runs longer than `seconds`.

    0 or None: no limit. The limit is a SIGALRM timer (`signal.setitimer(ITIMER_REAL)`),
    so it needs the main thread of a platform with SIGALRM; anywhere else the body runs
    without a limit and a warning is logged once.

    What it can interrupt: Python code (the alarm is handled between bytecodes: a busy
    `while True: pass`, a deep recursion) and blocking calls that return on a signal
    (`time.sleep`, `select`, socket reads). What it cannot: a C call that never returns
    to the interpreter (a regex with catastrophic backtracking, a C extension's endless
    loop) — for untrusted code use a separate process, like the BugFix sandbox
    (envs/sandbox.py). An interrupted environment is left in whatever state it was in;
    the rollout never calls it again.

    Nesting-safe: an outer alarm (another `time_limit`, a test timeout) keeps its handler
    and its deadline. If it falls due inside the body, its handler is called then, as if
    this limit were not there; afterwards the handler and the remaining time of the outer
    timer (and its interval) are restored (`_Alarm`).

    Cost: a few microseconds per call (every `env.reset` / `env.step` of a rollout goes through
    it): `_Alarm` is a plain context manager on the `_signal` primitives (no enum wrapping).
    """
    if not seconds or seconds <= 0:
        return _NO_LIMIT
    return _Alarm(seconds, what)


class _Alarm:
    """The SIGALRM handler of one `time_limit` body, sharing the one real timer with an outer alarm.

    On entry the outer timer (if any) is paused and read; the timer is then armed for
    whichever comes first, this limit's deadline or the outer alarm. All times are in
    `time.monotonic()` seconds. Handlers are read and set with `_signal` (what `signal.signal`
    wraps): the same handlers, without converting them to and from `signal.Handlers`.
    """

    def __init__(self, seconds: float, what: str):
        self.seconds, self.what = seconds, what
        self.previous: Any = None
        self.active = False
        self.closing = False

    def __enter__(self) -> None:
        main = threading.current_thread() is threading.main_thread()
        self.previous = _signal.getsignal(signal.SIGALRM) if main and hasattr(signal, "SIGALRM") else None
        if self.previous is None:  # no SIGALRM, not the main thread, or a handler not installed from Python
            global _warned_no_limit
            if not _warned_no_limit:
                _warned_no_limit = True
                log.warning("%s runs without its %g s time limit: not the main thread, no SIGALRM on this "
                            "platform, or an alarm handler set outside Python (this warning is shown once)",
                            self.what, self.seconds)
            return
        delay, interval = signal.setitimer(signal.ITIMER_REAL, 0)  # pause the outer timer (if any), read it
        now = time.monotonic()
        self.deadline = now + self.seconds
        self.outer_at = now + delay if delay > 0 else math.inf
        self.outer_interval = interval
        self.active = True
        try:
            _signal.signal(signal.SIGALRM, self)
            self.arm()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: Any) -> None:
        if self.active:
            self.close()

    def arm(self) -> None:
        """Fire at whichever comes first: our deadline or the outer alarm."""
        signal.setitimer(signal.ITIMER_REAL, max(min(self.deadline, self.outer_at) - time.monotonic(), 1e-4))

    def __call__(self, signum: int, frame: Any) -> None:
        if self.closing:  # an outer alarm that is due is delivered again by the restored timer (close)
            return
        now = time.monotonic()
        if now >= self.outer_at:  # the outer alarm is due: hand it over, then keep our own limit
            self.outer_at = now + self.outer_interval if self.outer_interval > 0 else math.inf
            self.arm()
            if callable(self.previous):
                self.previous(signum, frame)
            elif self.previous == signal.SIG_DFL:  # what the outer alarm would have done: end the process
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
                signal.raise_signal(signal.SIGALRM)
            return
        if now < self.deadline:  # early (timer rounding): wait for the rest
            self.arm()
            return
        raise StepTimeout(f"{self.what} exceeded {self.seconds:g} s")

    def close(self) -> None:
        """Stop the timer, put the outer handler back, and let the outer timer go on with its remaining time."""
        self.closing, self.active = True, False
        signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            _signal.signal(signal.SIGALRM, self.previous)  # runs pending signals' handlers first (our alarm: ignored)
        finally:  # ... and one of them (Ctrl-C) may raise before the handler is swapped
            if _signal.getsignal(signal.SIGALRM) is self:
                _signal.signal(signal.SIGALRM, self.previous)
            if self.outer_at < math.inf:  # the outer timer goes on with its remaining time (at once if overdue)
                signal.setitimer(signal.ITIMER_REAL, max(self.outer_at - time.monotonic(), 1e-6), self.outer_interval)
