"""The Tinker protocol's replies and futures: `Reply` (what a route answers), `HTTPError` (a refusal with its status),
and the futures: every call but a few returns `{"request_id": ...}` at once, and the client fetches the
result with `POST /api/v1/retrieve_future`, which this module answers by long-polling.

    futures = Futures(boot="b1f3")
    rid = futures.submit(work)                 # work() -> Result, run by whoever executes the request
    futures.wait(rid, timeout=20.0)            # the Result, or None when still running (the client asks again)

A request id names the server's boot (`{boot}-{n}`), so a retrieve after a restart is told that the server restarted
and lost the request, rather than that it never existed. Finished results are kept until fetched, then for
`keep_s` more seconds (a client may fetch twice after a dropped connection), and dropped after that.
"""

from __future__ import annotations

import itertools
import logging
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..checkpoint import CheckpointError
from ..sources.sync import SyncError
from .models import ModelError
from .wire import WireError

log = logging.getLogger("trajtune.tinker")


@dataclass
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json"

    @staticmethod
    def json(data: Any, status: int = 200) -> "Reply":
        return Reply(status, json.dumps(data).encode())


class HTTPError(Exception):
    """A request answered with `status` and {"detail": message}."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def json_body(body: bytes) -> Any:
    """A JSON request body (empty: {}); HTTPError 400 when it does not parse."""
    if not body:
        return {}
    try:
        return json.loads(body)
    except ValueError as e:
        raise HTTPError(400, f"the request body is not JSON ({e})") from None


def field_of(body: Any, name: str, kind: type) -> Any:
    """body[name], of type `kind`; HTTPError 400 naming it otherwise (the few routes with no dataclass)."""
    if not isinstance(body, dict) or not isinstance(body.get(name), kind):
        raise HTTPError(400, f"the request needs {name!r} ({kind.__name__})")
    return body[name]


class Restored(Exception):
    """A model restored after a restart lost steps: its next training request fails once with this message."""


@dataclass
class Result:
    """A finished request: a JSON body (`json`), a protobuf body (`proto`, sent when the client accepts it), or a
    failure (`error`, with the client's category: "user" for a refused or bad request, "server" for our bug)."""

    json: dict | None = None
    proto: bytes | None = None
    error: str | None = None
    category: str = "user"


@dataclass
class _Entry:
    result: Result | None = None
    done_at: float = 0.0
    fetched: bool = False
    event: threading.Event = field(default_factory=threading.Event)


class Futures:
    """The futures of one server boot (thread-safe)."""

    def __init__(self, boot: str, keep_s: float = 300.0) -> None:
        self.boot, self.keep_s = boot, keep_s
        self._entries: dict[str, _Entry] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def new(self) -> str:
        """A fresh request id, its result pending."""
        with self._lock:
            rid = f"{self.boot}-{next(self._ids)}"
            self._entries[rid] = _Entry()
            self._sweep()
        return rid

    def finish(self, rid: str, result: Result) -> None:
        with self._lock:
            entry = self._entries.get(rid)
            if entry is None:
                return
            entry.result, entry.done_at = result, time.monotonic()
        entry.event.set()

    def wait(self, rid: str, timeout: float) -> Result | None:
        """The result of `rid` once it is done, waiting up to `timeout` seconds; None if it is still running.
        Raises KeyError with the reason when the id is unknown (another boot's, or long gone)."""
        with self._lock:
            entry = self._entries.get(rid)
        if entry is None:
            boot = rid.rsplit("-", 1)[0]
            if boot != self.boot:
                raise KeyError(f"request {rid} was made before the server restarted and is lost (the server keeps "
                               "sessions, models and checkpoints across restarts, not requests in flight); submit "
                               "it again")
            raise KeyError(f"no request {rid} (unknown, or its result was fetched more than {self.keep_s:g} s ago)")
        if not entry.event.wait(timeout):
            return None
        with self._lock:
            entry.fetched = True
        return entry.result

    def pending(self) -> int:
        with self._lock:
            return sum(e.result is None for e in self._entries.values())

    def _sweep(self) -> None:
        """Drop results fetched more than keep_s ago, and unfetched ones after 10 x keep_s (under the lock)."""
        now = time.monotonic()
        old = [rid for rid, e in self._entries.items() if e.result is not None
               and now - e.done_at > (self.keep_s if e.fetched else 10 * self.keep_s)]
        for rid in old:
            del self._entries[rid]


def attempt(work: Callable[[], Result | None]) -> Result:
    """work() as a future's result (None: a plain success, `Result()`), or its exception's (`failure`)."""
    try:
        return work() or Result()
    except Exception as e:  # noqa: BLE001 - sorted by `failure`; the server stays up
        return failure(e)


def failure(e: Exception) -> Result:
    """An exception as a failed future: a refused or bad request (a missing checkpoint or snapshot, a value the engine
    refuses) is the user's error; a sync check that failed, or anything else (our bug, logged with its traceback),
    the server's."""
    if isinstance(e, (WireError, ModelError, Restored, ValueError, LookupError, CheckpointError)):
        return Result(error=str(e.args[0]) if isinstance(e, KeyError) else str(e), category="user")
    if isinstance(e, SyncError):
        return Result(error=f"sampler weights: {e}", category="server")
    log.error("tinker: a request failed", exc_info=e)
    return Result(error=f"internal error: {type(e).__name__}: {e} (the server's log has the traceback)",
                  category="server")
