"""Where reward calls run: worker processes for functions given as specs, threads for callables.

`RewardFunction.start(batch, state)` calls the function once on the whole batch under its time limit (the
graders of a batch are started together, so several functions run at the same time); a function given as a
spec ('file.py:fn', 'module:fn') runs in its own worker process (started once, reused, the module imported
there), so a call past the limit is stopped by killing the process, which nothing in the function can block
(a hung C call, a GIL-holding regex); a plain callable runs in a thread of this process, where the limit only
stops the waiting. A batch call that raises or overruns is called again row by row (`LOCATE_WORKERS` at a
time) to find the rows: an exception stops the run with a `RewardError` showing the user's traceback once and
naming the rows; a row that overruns alone fails (its episode gets no reward), and more failed rows than
`max_fault_share` of the batch stop the run (`graders.check_faults`). A worker starts in ~0.1 s plus the
reward module's own imports (nothing here imports torch). `unique_names` names two functions called `reward`
from two files by their files.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Callable, Sequence

from ...processes import exit_with_parent
from ..graders import Grades
from .functions import (CallResult, RewardBatch, RewardError, RewardState, _Bad, _group, _listing, _short,
                        callable_name, check, invoke, load_reward_function, signature_of)

LOCATE_WORKERS = 4
"""per-row calls running at once while looking for the rows a batch call failed on"""
LOAD_TIMEOUT_S = 300.0
"""how long a new worker may take to import the reward module (not counted in a call's time limit)"""


def _serve(fd: int, parent: int) -> None:
    """A worker process: answer ("call", spec, kwargs) with an CallResult until the parent closes the pipe.
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
            out = invoke(load_reward_function(spec), kwargs)
        except RewardError as e:
            out = CallResult(error=str(e))
        try:
            conn.send(out)
        except Exception as e:  # noqa: BLE001 - e.g. a log_extra value that cannot be pickled
            conn.send(CallResult(error=f"its results cannot be sent back to the trainer: {type(e).__name__}: {e}"))


class _Worker:
    """One worker process and its pipe; it imports `spec` as it starts (`ready` waits for that)."""

    def __init__(self, spec: str):
        ours, theirs = Pipe()
        root = str(Path(__file__).resolve().parents[3])
        code = (f"import sys; sys.path.insert(0, {root!r}); from trajtune.sources.rewards.workers import _serve; "
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
    """A call in flight: `conn` becomes readable when its CallResult is ready."""

    def __init__(self, conn: Connection, worker: _Worker | None, owner: "RewardFunction"):
        self.conn, self.worker, self.owner = conn, worker, owner

    def receive(self) -> CallResult:
        try:
            out = self.conn.recv()
        except (EOFError, OSError):
            code = self.worker.proc.poll() if self.worker else None
            self.owner._retire(self.worker)
            return CallResult(error=f"its worker process ended while scoring (exit code {code}): the function, or "
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
    """One reward function as a grader (`trajtune.sources.graders.Grader`), by spec ('file.py:fn': runs in
    worker processes) or as a callable (runs in threads of this process). `label` is how messages name it.

    timeout:         seconds one call may take (0: no limit); a call past it is stopped and its rows fail
    max_fault_share: while looking for the rows a failed batch call hung on, more than this share of the batch
                     stops the search (the batch fails either way: `graders.check_faults`)"""

    finished_only = False
    main_only = True

    def __init__(self, fn: Callable | None = None, *, spec: str = "", name: str = "", timeout: float = 60.0,
                 max_fault_share: float = 0.5):
        if spec:
            fn = load_reward_function(spec)
        if fn is None:
            raise ValueError("RewardFunction: give a callable or a spec")
        self.fn, self.spec, self.name = fn, spec, name or callable_name(fn)
        self.timeout, self.max_fault_share = timeout, max_fault_share
        self.columns, self.accepts = signature_of(fn)
        self._idle: list[_Worker] = []
        self._busy: list[_Worker] = []

    @property
    def label(self) -> str:
        return f"reward function {self.name}" + (f" ({self.spec})" if self.spec else "")

    def start(self, batch: RewardBatch, state: RewardState) -> Callable[[], Grades]:
        """Call the function once on the whole batch (a worker started and the module imported first, outside
        the time limit); the returned wait: where the call raised or overran, call it row by row to find the
        rows, then check every value. Raises RewardError (`trajtune.sources.rewards`)."""
        self.start_workers(1)
        call = self.submit(batch.kwargs(state=state))
        deadline = time.monotonic() + self.timeout if self.timeout else None

        def wait() -> Grades:
            left = None if deadline is None else max(1e-6, deadline - time.monotonic())
            out = wait_all([call], left)[0]
            failed: dict[int, str] = {}
            if out is None or out.error:
                out, hung = self._locate(batch, out, state)
                failed = {i: f"{self.label} ran past its time limit ({self.timeout:g} s) on {batch.where[i]}"
                          for i in hung}
            values, problems = check(out, len(batch), self.label, batch)
            if problems:
                raise RewardError(problems)
            metrics = {f"reward/{self.name}/{k}": statistics.fmean(xs) for k, xs in _group(out.metrics).items()}
            return Grades(values, metrics, failed, out.extras)

        return wait

    def _locate(self, batch: RewardBatch, first: CallResult | None,
                state: RewardState | None) -> tuple[CallResult, set[int]]:
        """Call the function row by row after its batch call raised (`first.error`) or overran (`first` None).
        Returns an CallResult of the per-row values, and the rows that overran alone. Raises RewardError
        for the rows that raised (or, if none did alone, for the batch call's error)."""
        n, cap = len(batch), self.max_fault_share * len(batch)
        values: list = [None] * n
        raised: dict[int, str] = {}
        hung: set[int] = set()
        for start in range(0, n, LOCATE_WORKERS):
            wave = list(range(start, min(n, start + LOCATE_WORKERS)))
            self.start_workers(len(wave))
            for i, out in zip(wave, wait_all([self.submit(batch.kwargs([i], state)) for i in wave], self.timeout)):
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
            error = raised[rows[0]] if rows else first.error if first is not None else ""
            first_row = f"{batch.where[rows[0]]} (completion {_short(batch.text(rows[0]))})" if rows else ""
            head = (f"{self.label} raised on the batch of {n} completions, but on none of them alone:" if not rows else
                    f"{self.label} raised on {first_row}:" if len(rows) == 1 else
                    f"{self.label} raised on {len(rows)} of {n} completions ({_listing(rows, batch)}); on the first, "
                    f"{first_row}:")
            raise RewardError(f"{head}\n{error}")
        return CallResult(values=values), hung

    def submit(self, kwargs: dict) -> _Call:
        """Start one call on `kwargs` (filtered to what the function accepts) and return at once."""
        if self.accepts is not None:
            kwargs = {k: v for k, v in kwargs.items() if k in self.accepts}
        if not self.spec:
            ours, theirs = Pipe(duplex=False)
            threading.Thread(target=_send_outcome, args=(theirs, self.fn, kwargs), daemon=True).start()
            return _Call(ours, None, self)
        self.start_workers(1)
        worker = self._idle.pop()
        self._busy.append(worker)
        worker.conn.send(("call", self.spec, kwargs))
        return _Call(worker.conn, worker, self)

    def start_workers(self, k: int) -> None:
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
    out = invoke(fn, kwargs)
    try:
        conn.send(out)
    except (OSError, ValueError):  # the caller stopped waiting (timeout) and closed the pipe
        pass
    except Exception as e:  # noqa: BLE001 - unpicklable log_extra values
        conn.send(CallResult(error=f"its results cannot be passed back: {type(e).__name__}: {e}"))


def wait_all(calls: Sequence[_Call], timeout: float | None) -> list[CallResult | None]:
    """The CallResult of every call, None for those still running after `timeout` s (0/None: no limit;
    those are cancelled). All the calls were started together, so they share one deadline."""
    deadline = time.monotonic() + timeout if timeout else None
    pending = {c.conn: c for c in calls}
    got: dict[int, CallResult] = {}
    try:
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(list(pending), left)
            if not ready:
                break
            for conn in ready:
                call = pending.pop(conn)  # type: ignore[call-overload]  # wait() gives back the connections
                got[id(call)] = call.receive()
    finally:
        for call in pending.values():
            call.cancel()
    return [got.get(id(c)) for c in calls]


def unique_names(functions: Sequence[RewardFunction]) -> list[RewardFunction]:
    """The functions, two with the same name from two files renamed '<file stem>.<name>'; the same function
    twice is a RewardError."""
    names = [f.name for f in functions]
    out = list(functions)
    for f in out:
        if names.count(f.name) > 1 and f.spec:
            f.name = f"{Path(f.spec.rsplit(':', 1)[0]).stem}.{f.name}"
    if len({f.name for f in out}) < len(out):
        raise RewardError(f"the same reward function is given twice: {names}")
    return out
