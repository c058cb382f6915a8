"""Faults in user code fail one episode, not the run: the time limit and the run-level fault limit.

An `env.reset` or `env.step` (or the reward function inside it) that raises, or
runs past its time limit (`step_timeout_s`, default `STEP_TIMEOUT_S` = 60 s;
`StepTimeout`), gives that episode reward 0 and info["env_error"], logged with
its task (the rollout records it: `trajtune.rollout`); the other episodes of
the batch go on. `check_faults` is the run-level limit: `collect`
(`trajtune.collect.make_collect`) stops the run with `TooManyFaults` when more
than `max_fault_share` of a call's episodes fail.

The time limit is a SIGALRM timer (`time_limit`; see its docstring for what it
can and cannot interrupt); it only works in the main thread.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from .trajectory import Trajectory

log = logging.getLogger("trajtune.faults")

STEP_TIMEOUT_S = 60.0
"""Default time limit of one `env.reset` / `env.step` call, in seconds (0 or None: none)."""


class TooManyFaults(RuntimeError):
    """More episodes of a batch failed in user code than the run allows."""


def check_faults(trajectories: Sequence[Trajectory], max_share: float = 0.5) -> int:
    """Count episodes that ended with `env_error`; raise `TooManyFaults` if their share exceeds `max_share`.

    Returns the count. The message names the first failing tasks and their exceptions.
    """
    failed = [t for t in trajectories if "env_error" in t.info]
    if trajectories and len(failed) / len(trajectories) > max_share:
        examples = "; ".join(f"{t.info.get('task')}: {t.info['env_error']}" for t in failed[:3])
        raise TooManyFaults(f"{len(failed)} of {len(trajectories)} episodes failed in the environment "
                            f"(limit {max_share:.0%}): {examples}")
    return len(failed)


class StepTimeout(Exception):
    """An environment call ran past the rollout's time limit (`step_timeout_s`)."""


_warned_no_limit = False


@contextmanager
def time_limit(seconds: float | None, what: str = "env.step") -> Iterator[None]:
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
    """
    if not seconds or seconds <= 0:
        yield
        return
    can_alarm = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGALRM) if can_alarm else None
    if previous is None:  # no SIGALRM, not the main thread, or a handler not installed from Python
        global _warned_no_limit
        if not _warned_no_limit:
            _warned_no_limit = True
            log.warning("%s runs without its %g s time limit: not the main thread, no SIGALRM on this "
                        "platform, or an alarm handler set outside Python (this warning is shown once)", what, seconds)
        yield
        return
    alarm = _Alarm(seconds, what, previous)
    try:
        signal.signal(signal.SIGALRM, alarm)
        alarm.arm()
        yield
    finally:
        alarm.close()


class _Alarm:
    """The SIGALRM handler of one `time_limit` body, sharing the one real timer with an outer alarm.

    On entry the outer timer (if any) is paused and read; the timer is then armed for
    whichever comes first, this limit's deadline or the outer alarm. All times are in
    `time.monotonic()` seconds.
    """

    def __init__(self, seconds: float, what: str, previous: Any):
        self.seconds, self.what, self.previous = seconds, what, previous
        delay, interval = signal.setitimer(signal.ITIMER_REAL, 0)  # pause the outer timer (if any), read it
        now = time.monotonic()
        self.deadline = now + seconds
        self.outer_at = now + delay if delay > 0 else math.inf
        self.outer_interval = interval
        self.closing = False

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
        self.closing = True
        signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            signal.signal(signal.SIGALRM, self.previous)  # runs pending signals' handlers first (our alarm: ignored)
        finally:  # ... and one of them (Ctrl-C) may raise before the handler is swapped
            if signal.getsignal(signal.SIGALRM) is self:
                signal.signal(signal.SIGALRM, self.previous)
            if self.outer_at < math.inf:  # the outer timer goes on with its remaining time (at once if overdue)
                signal.setitimer(signal.ITIMER_REAL, max(self.outer_at - time.monotonic(), 1e-6), self.outer_interval)
