"""Sandbox worker: runs test cases against untrusted function source, one JSON job per line.

Started by `trajtune.envs.sandbox.Sandbox` as `python -I -S _sandbox_worker.py CONFIG_JSON`;
it uses the standard library only, so it starts in a few milliseconds and its
memory limit means something. Protocol (one line each way):

    request : {"source": str, "entry": str, "cases": [[args, expected], ...]}
    reply   : {"results": [outcome, ...]}   outcome: "pass" | "fail" | "timeout" |
                                              "error: <ExceptionType>" | "forbidden: <what>"

Layers of protection, outermost first:
  1. the parent kills and restarts this process if a job overruns (sandbox.py);
  2. per-case wall-clock alarm (`signal.setitimer`) -> "timeout";
  3. resource limits: address space (memory bombs -> MemoryError), file size 0
     (no file writes), CPU seconds (a runaway worker dies and is restarted);
  4. restricted builtins (no open/eval/exec/compile/input...) and an import
     allow-list (`import os` -> "forbidden: import os");
  5. an audit hook (PEP 578) that, while submitted code runs, refuses
     write-mode opens, sockets, subprocesses, os.system/exec/spawn/fork and
     file-system changes -> "forbidden: <event>".
This keeps honest mistakes (infinite loops, crashes, stray imports) from
hurting a training run. It is not a security boundary against adversarial
code: run untrusted models' code in a container.
"""

import builtins
import json
import signal
import sys

try:
    import resource
except ImportError:  # not on this platform: rely on the other layers
    resource = None

SAFE_BUILTIN_NAMES = (
    "abs all any bool dict divmod enumerate filter float frozenset int isinstance issubclass iter len list "
    "map max min next pow range repr reversed round set slice sorted str sum tuple zip "
    "ArithmeticError AssertionError Exception IndexError KeyError TypeError ValueError ZeroDivisionError "
    "StopIteration RuntimeError NotImplementedError"
).split()
ALLOWED_MODULES = frozenset({"math", "itertools", "functools", "collections", "operator", "string"})
BLOCKED_EVENT_PREFIXES = (
    "socket.", "subprocess.", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty",
    "os.kill", "os.remove", "os.unlink", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
    "os.truncate", "os.symlink", "os.link", "shutil.", "ctypes.", "urllib.", "http.", "ftplib.", "smtplib.",
    "webbrowser.", "pty.", "sys.addaudithook", "setopencode",
)


class Forbidden(BaseException):
    """Raised when submitted code tries something the sandbox refuses (BaseException: not swallowed by `except
    Exception`)."""


class Timeout(BaseException):
    """Raised by the per-case alarm."""


_armed = False  # the audit hook only polices submitted code, not the worker's own I/O


def _audit(event, args):
    if not _armed:
        return
    if event == "open":
        mode, flags = (args[1], args[2]) if len(args) >= 3 else (args[1] if len(args) > 1 else "r", 0)
        writes = isinstance(mode, str) and any(c in mode for c in "wax+")
        writes = writes or (isinstance(flags, int) and flags & 0o3)  # O_WRONLY | O_RDWR
        if writes:
            raise Forbidden(f"open for writing {args[0]!r}")
    elif event.startswith(BLOCKED_EVENT_PREFIXES):
        raise Forbidden(event)


def _guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level != 0 or name.split(".")[0] not in ALLOWED_MODULES:
        raise Forbidden(f"import {name}")
    return builtins.__import__(name, globals, locals, fromlist, level)


def _on_alarm(signum, frame):
    raise Timeout()


def _outcome(exc):
    if isinstance(exc, Forbidden):
        return f"forbidden: {exc}"
    if isinstance(exc, Timeout):
        return "timeout"
    return f"error: {type(exc).__name__}"


def run_job(job, case_timeout):
    """Define `job["entry"]` from `job["source"]` and call it on every case -> list of outcomes."""
    global _armed
    safe = {name: getattr(builtins, name) for name in SAFE_BUILTIN_NAMES}
    safe["__import__"] = _guarded_import
    safe["__build_class__"] = builtins.__build_class__
    namespace = {"__builtins__": safe, "__name__": "submission"}
    cases = job["cases"]
    try:
        code = compile(job["source"], "<submission>", "exec")
        _armed = True
        signal.setitimer(signal.ITIMER_REAL, case_timeout)
        exec(code, namespace)
        fn = namespace[job["entry"]]
    except BaseException as exc:  # noqa: BLE001 - every failure of submitted code is an outcome
        return [_outcome(exc)] * len(cases)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _armed = False
    results = []
    for args, expected in cases:
        outcome = "timeout"
        try:
            _armed = True
            signal.setitimer(signal.ITIMER_REAL, case_timeout)
            got = fn(*args)
            outcome = "pass" if got == expected else "fail"  # == runs under the alarm too
        except BaseException as exc:  # noqa: BLE001
            outcome = _outcome(exc)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            _armed = False
        results.append(outcome)
    return results


def main():
    config = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    case_timeout = float(config.get("case_timeout", 0.5))
    if resource is not None:
        mem = int(config.get("memory_mb", 512)) * 2**20
        for limit, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_FSIZE, 0),
                             (resource.RLIMIT_CPU, int(config.get("cpu_seconds", 600)))):
            try:
                resource.setrlimit(limit, (value, value))
            except (ValueError, OSError):
                pass
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write raises OSError instead of killing us
    signal.signal(signal.SIGALRM, _on_alarm)
    sys.addaudithook(_audit)
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            results = run_job(json.loads(line), case_timeout)
        except BaseException as exc:  # noqa: BLE001 - a malformed job must not kill the worker
            results = [f"error: {type(exc).__name__}"]
        out.write(json.dumps({"results": results}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
