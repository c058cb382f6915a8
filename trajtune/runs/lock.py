"""One run per directory: an exclusive lock on run_dir/.lock, named by who holds it.

`run_lock(run_dir)` holds the lock for its body (rank 0; every rank hears a refusal): a POSIX flock, released
with its process however that ends (kill -9 included), holding {pid, host, command, since}. A second run on
the same directory is refused at once (`RunDirBusy`, naming the holder); the lock is reentrant within a
process (the command line holds it around a whole run, `run_stages` inside). `holder(run_dir)` says who holds
it now without taking it (a dry run). `trajtune.runs.rundir.RunDir` is its one user.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no run lock
    fcntl = None  # type: ignore[assignment]

from ..config import ConfigError
from ..engine import distributed

LOCK = ".lock"


class RunDirBusy(ConfigError):
    """Another live process runs in this run directory (the message names it)."""


_held: dict[Path, list] = {}
"""run directory (resolved) -> [its open lock file, depth]: the locks this process holds"""


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike) -> Iterator[None]:
    """Hold `run_dir/.lock` for the body (rank 0; every rank hears a refusal): an exclusive POSIX
    flock, released with the process however it ends, holding {pid, host, command, since}.

    Another process holding it: `RunDirBusy` at once, naming it. Reentrant within a process (the
    command line holds it around a whole run, `run_stages` inside). A directory that cannot be
    created or written is a `ConfigError` naming it and the OS reason."""
    message, key = None, None
    if distributed.is_main() and fcntl is not None:
        try:
            key = _acquire(Path(run_dir))
        except ConfigError as e:
            message = (isinstance(e, RunDirBusy), str(e))
    message = distributed.broadcast_object(message)
    if message is not None:
        raise (RunDirBusy if message[0] else ConfigError)(message[1])
    try:
        yield
    finally:
        if key is not None:
            _release(key)


def _acquire(run_dir: Path) -> Path:
    key = run_dir.resolve()
    if key in _held:
        _held[key][1] += 1
        return key
    if key.exists() and not key.is_dir():
        raise ConfigError(f"the run directory {run_dir} is a file, not a directory; choose another one")
    try:
        key.mkdir(parents=True, exist_ok=True)
        fh = open(key / LOCK, "a+", encoding="utf-8")
    except OSError as e:
        where = f" ({e.filename})" if e.filename and Path(e.filename) != run_dir else ""
        raise ConfigError(f"cannot write to the run directory {run_dir}: {e.strerror or e}{where}; "
                          "choose a writable directory") from None
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        holder = fh.read()
        fh.close()
        raise RunDirBusy(_busy(run_dir, holder)) from None
    fh.seek(0)
    fh.truncate()
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                         "since": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
    fh.flush()
    _held[key] = [fh, 1]
    return key


def _release(key: Path) -> None:
    held = _held[key]
    held[1] -= 1
    if held[1] == 0:
        del _held[key]
        fh = held[0]
        with contextlib.suppress(OSError):
            fh.truncate(0)  # no holder any more
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        fh.close()


def _busy(run_dir: Path, holder: str) -> str:
    """The refusal of a second run: who holds the directory, and what to do."""
    try:
        h = json.loads(holder)
        who = f"pid {h['pid']} on {h['host']} (`{h['command']}`, since {h['since']})"
    except (ValueError, KeyError, TypeError):
        who = "another process (it has not written its details yet)"
    return (f"{run_dir} is in use by another run: {who}. Two runs in one directory would mix their metrics "
            f"and checkpoints; wait for it to finish, stop it, or choose another run directory")


def holder(run_dir: Path) -> str | None:
    """Who holds `run_dir`'s lock now (the refusal a run would meet), or None; takes nothing, writes nothing."""
    lock = Path(run_dir) / LOCK
    if fcntl is None or not lock.is_file() or lock.parent.resolve() in _held:
        return None
    with contextlib.suppress(OSError), open(lock, encoding="utf-8") as fh:  # unreadable: the run's lock will say
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _busy(Path(run_dir), fh.read())
    return None
