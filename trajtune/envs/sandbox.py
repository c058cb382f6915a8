"""Run test cases against function source in a persistent, restricted worker process.

Starting a Python process per test run would cost ~30 ms, a thousand episodes
half a minute. Instead one worker (`_sandbox_worker.py`, standard library only)
is started lazily and fed jobs as JSON lines over a pipe; results are memoized
by the exact (source, entry point, cases), and the set of distinct edited
sources in a gym is small, so after warm-up most submits cost a dict lookup.

Time limits: the worker interrupts each case after `case_timeout` seconds; if a
job still overruns (code that blocks the alarm), this side kills the worker and
restarts it on the next job, and every case of that job is a "timeout". A
crashed worker is restarted the same way. Neither ever raises into the
environment: the outcome is a failed test with a reason.

Outcomes: "pass", "fail", "timeout", "error: <ExceptionType>", "forbidden: <what>".
See `_sandbox_worker.py` for what is forbidden and why this is a guard rail, not
a security boundary.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

WORKER = Path(__file__).with_name("_sandbox_worker.py")
Case = tuple[Sequence[Any], Any]  # (positional args, expected return value); JSON-serialisable


class Sandbox:
    """A persistent sandbox worker with memoized results.

    case_timeout: seconds one test case may run (wall clock, enforced in the worker)
    memory_mb:    address-space limit of the worker (RLIMIT_AS)
    slack:        extra seconds per job before this side kills the worker
    """

    def __init__(self, case_timeout: float = 0.5, memory_mb: int = 512, slack: float = 2.0):
        self.case_timeout = case_timeout
        self.memory_mb = memory_mb
        self.slack = slack
        self.cache: dict[tuple, tuple[str, ...]] = {}
        self.n_jobs = 0  # jobs actually sent to the worker (cache misses)
        self.n_restarts = 0
        self._proc: subprocess.Popen | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def run(self, source: str, entry: str, cases: Sequence[Case]) -> tuple[str, ...]:
        """Define `entry` by executing `source`, call it on each case -> one outcome per case."""
        cases_json = json.dumps([[list(args), expected] for args, expected in cases])
        key = (source, entry, cases_json)
        with self._lock:
            if key not in self.cache:
                self.cache[key] = self._execute(source, entry, cases_json, len(cases))
            return self.cache[key]

    def close(self) -> None:
        """Stop the worker (a later `run` starts a new one)."""
        proc, self._proc = self._proc, None
        if proc is not None and self._pid == os.getpid():
            try:
                proc.stdin.close()
                proc.wait(timeout=1.0)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()

    # --- internals ----------------------------------------------------------------
    def _execute(self, source: str, entry: str, cases_json: str, n: int) -> tuple[str, ...]:
        proc = self._worker()
        self.n_jobs += 1
        request = '{"source": %s, "entry": %s, "cases": %s}\n' % (json.dumps(source), json.dumps(entry), cases_json)
        try:
            proc.stdin.write(request)
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], self.case_timeout * (n + 1) + self.slack)
            line = proc.stdout.readline() if ready else ""
        except (OSError, ValueError):
            line = ""
        except BaseException:  # interrupted mid-exchange (a caller's time limit, Ctrl-C): the pipe may hold
            self._kill()      # a stale reply, so this worker must not serve the next job
            raise
        if not line:  # overran its time, or died: kill it, restart on the next job
            timed_out = proc.poll() is None
            self._kill()
            return ("timeout" if timed_out else "error: sandbox worker died",) * n
        results = tuple(json.loads(line)["results"])
        if len(results) != n:
            return ("error: sandbox",) * n
        return results

    def _worker(self) -> subprocess.Popen:
        if self._pid != os.getpid():  # we are a forked child: never share the parent's pipe
            self._proc, self._pid = None, os.getpid()
        if self._proc is None or self._proc.poll() is not None:
            config = json.dumps({"case_timeout": self.case_timeout, "memory_mb": self.memory_mb})
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(WORKER), config],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                bufsize=1,
                cwd="/" if os.name == "posix" else None,
            )
        return self._proc

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            self.n_restarts += 1
            proc.kill()
            proc.wait()


_DEFAULT: Sandbox | None = None


def default_sandbox() -> Sandbox:
    """The process-wide shared sandbox (one worker, one cache), started on first use."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Sandbox()
        atexit.register(_DEFAULT.close)
    return _DEFAULT
