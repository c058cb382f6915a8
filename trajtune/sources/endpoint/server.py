"""The OpenAI-compatible endpoint over a run's sampler: `Endpoint`.

    endpoint = Endpoint(sampler, tokenizer, served=["policy"])      # any `trajtune.sources.sampler.Sampler`
    endpoint.start()                                                # 127.0.0.1, a free port (or host=, port=)
    session = endpoint.open("ep-0", seed=1234, version=3, max_turns=6, max_tokens=2048)
    client = openai.OpenAI(base_url=endpoint.base_url("ep-0"), api_key="-")   # .../s/ep-0/v1
    ... the agent talks ...
    traj = endpoint.trajectory(endpoint.finish("ep-0"))             # the episode, tokens exactly as sampled
    endpoint.close()

Routes (HTTP/1.1, JSON): `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, each also under
`/s/<session>/v1/...`: the session is in the base URL the agent is given, so any client works unchanged (the header
`X-Session-Id` works too). A request's wire format -- what is accepted, refused (400 with the field named, 404 for a
model not served) and answered, streaming included -- is `trajtune.sources.endpoint.openai`; how a session's
requests become one episode with the sampled ids kept is `trajtune.sources.endpoint.sessions`.

Batching: requests of all sessions are queued and sampled together, one sampler call per batch (per token budget),
by one thread: a batch goes as soon as every open session has a request waiting (the lockstep of the built-in
episode loop), or `batch_wait_s` after its first request (an agent busy elsewhere does not hold the others up).
Each session samples from its own generator (`Session.seed`), continued across its requests, so its tokens do not
depend on which other requests shared its batch nor on the threads' timing (with the built-in sampler and vLLM;
Hugging Face `generate` draws one stream per call: `row_seeds=False`).

Every answer carries `policy_version` (the version of the weights that sampled it) and, when asked
(`return_token_ids`), the prompt's and the reply's token ids, as vLLM's server does. A sampler that fails (a sync
that did not take, a dead sampler process) fails its requests with status 500 and is kept as `failure`: the run that
owns the endpoint raises it (`trajtune.sources.endpoint.agents`). `close()` stops the server and its thread; both
are daemons, so the endpoint never outlives its process.
"""

from __future__ import annotations

import contextlib
import errno
import json
import socket
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator, Sequence

from ...config import ConfigError
from ...engine.decoding import Samples
from ...text.tool_calls import ToolFormat
from ..sampler import Sampler, SamplerSettings
from .openai import APIError, parse_chat, parse_completion, read_body
from .responses import chat_chunks, chat_response, completion_chunks, completion_response, models_response, sse
from .sessions import Chats, Completions, Session


@dataclass
class _Pending:
    prompt: list[int]
    max_new_tokens: int
    generator: Any
    settings: SamplerSettings
    future: Future


class Batcher:
    """One thread sampling the queued requests in batches (module docstring). `live()`: how many sessions may still
    send a request (a batch goes at once when that many are waiting)."""

    def __init__(self, sampler: Sampler, stop_ids: Sequence[int], live: Callable[[], int],
                 flexible: Callable[[SamplerSettings], Sampler] | None = None, batch_wait_s: float = 0.05,
                 row_seeds: bool = True):
        self.sampler, self.stop_ids, self.live, self.flexible = sampler, list(stop_ids), live, flexible
        self.row_seeds = row_seeds  # the sampler draws each row from its own generator (else one per call)
        self.batch_wait_s = batch_wait_s
        self._queue: list[_Pending] = []
        self._cv = threading.Condition()
        self._closed = False
        self.failure: BaseException | None = None
        self.batches = 0
        self._thread = threading.Thread(target=self._run, name="trajtune-endpoint-batcher", daemon=True)
        self._thread.start()

    def submit(self, prompt: list[int], max_new_tokens: int, generator: Any, settings: SamplerSettings) -> Future:
        future: Future = Future()
        with self._cv:
            if self.failure is not None:
                future.set_exception(self.failure)
                return future
            self._queue.append(_Pending(prompt, max_new_tokens, generator, settings, future))
            self._cv.notify_all()
        return future

    def wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._closed)
                if self._closed:
                    return
                deadline = time.monotonic() + self.batch_wait_s
                while not self._closed and len(self._queue) < max(1, self.live()):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cv.wait(left)
                batch, self._queue = self._queue, []
            self._sample(batch)

    def _sample(self, batch: list[_Pending]) -> None:
        groups: dict[tuple, list[_Pending]] = {}
        for p in batch:  # one sampler call per (settings, token budget)
            groups.setdefault((p.settings, p.max_new_tokens), []).append(p)
        for (settings, budget), rows in groups.items():
            try:
                sampler = self.sampler if self.flexible is None else self.flexible(settings)
                gens = [p.generator for p in rows]
                seeds = (gens if self.row_seeds else gens[0]) if all(g is not None for g in gens) else None
                out: Samples = sampler.sample([p.prompt for p in rows], self.stop_ids, seeds,  # type: ignore[call-arg]
                                              max_new_tokens=budget)
                self.batches += 1
            except BaseException as e:  # noqa: BLE001 - the sampler's failure is every waiting request's (and the run's)
                with self._cv:
                    self.failure = self.failure or e
                for p in rows:
                    p.future.set_exception(e)
                continue
            for p, tokens, logprobs, stopped in zip(rows, out.tokens, out.logprobs, out.stopped, strict=True):
                p.future.set_result((list(tokens), list(logprobs), bool(stopped)))

    def close(self) -> None:
        with self._cv:
            self._closed = True
            for p in self._queue:
                p.future.set_exception(RuntimeError("the endpoint closed"))
            self._queue = []
            self._cv.notify_all()
        self._thread.join(timeout=5)


class Endpoint:
    """An OpenAI-compatible endpoint over `sampler` (module docstring).

    sampler:    the run's sampler; its settings are the run's (a request asking for another temperature, top-k or
                top-p is refused: the trainer's log-probs belong to that policy) unless `flexible` makes a sampler for
                a request's own settings (a standalone server, `trajtune endpoint`)
    tokenizer:  the policy's Hugging Face tokenizer, with its chat template
    served:     the model names it answers to (`/v1/models`; another is refused with 404)
    fmt:        how the model writes tool calls (`trajtune.text.tool_calls.ToolFormat`; default: from its template)
    host, port: where it listens (port 0: a free one); `public_url`: the URL agents are given, when they reach it
                by another name (another machine: host "0.0.0.0")
    open_sessions: a request naming an unknown session opens it (a standalone server); else it is refused
    row_seeds:  the sampler takes one generator per row (the built-in sampler, vLLM); False (Hugging Face generate):
                one per call, the first row's session's, so the samples depend on the batch
    """

    def __init__(self, sampler: Sampler, tokenizer: Any, *, served: Sequence[str] = ("policy",),
                 fmt: ToolFormat | None = None, host: str = "127.0.0.1", port: int = 0, public_url: str = "",
                 flexible: Callable[[SamplerSettings], Sampler] | None = None, batch_wait_s: float = 0.05,
                 open_sessions: bool = False, template_kwargs: dict | None = None, tool_syntax: str | None = None,
                 row_seeds: bool = True):
        self.sampler, self.served, self.flexible = sampler, list(served), flexible
        self.host, self.port, self.public_url, self.open_sessions = host, port, public_url, open_sessions
        self.fmt = fmt or ToolFormat(tokenizer, tool_syntax)
        self.chats = Chats(tokenizer, self.fmt, template_kwargs)
        self.completions = Completions(tokenizer, self.chats.stop_ids)
        self.batch_wait_s, self.row_seeds = batch_wait_s, row_seeds
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.batcher: Batcher | None = None
        self.version = 0
        """the version a session opened by a request is served with (a standalone server's)"""

    # --- lifetime -------------------------------------------------------------------------------------------
    def start(self) -> "Endpoint":
        if self._server is not None:
            return self
        server = listen(self.host, self.port, _handler(self), "endpoint")
        self._server, self.port = server, server.server_address[1]
        self.batcher = Batcher(self.sampler, self.chats.stop_ids, self._live, self.flexible, self.batch_wait_s,
                               self.row_seeds)
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="trajtune-endpoint", daemon=True)
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        return self.public_url.rstrip("/") or f"http://{self.host}:{self.port}"

    def base_url(self, session: str | None = None) -> str:
        """The OpenAI base URL an agent is given (with the session in it)."""
        return f"{self.url}/s/{session}/v1" if session else f"{self.url}/v1"

    @property
    def failure(self) -> BaseException | None:
        return None if self.batcher is None else self.batcher.failure

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self.batcher is not None:
            self.batcher.close()
            self.batcher = None

    def __enter__(self) -> "Endpoint":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # --- sessions -------------------------------------------------------------------------------------------
    def open(self, session: str, *, seed: int | None = None, version: int = 0, max_turns: int = 0,
             max_tokens: int = 0, task: Any = None) -> Session:
        """Open an episode's session (its id goes into its base URL)."""
        with self._lock:
            if session in self.sessions:
                raise ValueError(f"endpoint: session {session!r} is already open")
            s = self.sessions[session] = Session(session, seed, version, max_turns, max_tokens, task)
        return s

    def finish(self, session: str, stop_reason: str | None = None) -> Session | None:
        """Close a session (later requests are refused) -> it, its episode recorded (`trajectory`); None when it
        was closed already."""
        with self._lock:
            s = self.sessions.pop(session, None)
        if s is None:
            return None
        s.closed = True
        if stop_reason and s.stop_reason is None:
            s.stop_reason = stop_reason
        if self.batcher is not None:
            self.batcher.wake()  # one fewer session to wait for
        return s

    def trajectory(self, session: Session):
        """The session's recorded episode (`sessions.Chats.trajectory`, or its completions' record)."""
        if session.completion is not None and session.transcript is None:
            from .sessions import versioned

            return versioned(session.completion.traj, session.turn_versions)
        return self.chats.trajectory(session)

    def _live(self) -> int:
        with self._lock:
            return len(self.sessions)  # (`finish` removes a session as it closes it)

    def _session(self, sid: str | None) -> Session:
        with self._lock:
            s = self.sessions.get(sid) if sid else None
            if s is None and self.open_sessions:
                sid = sid or uuid.uuid4().hex[:12]
                s = self.sessions[sid] = Session(sid, None, self.version)
        if s is None:
            raise APIError(400 if not sid else 404, "no session: use the base URL the run gave the agent "
                           "(.../s/<session>/v1) or send the header X-Session-Id" if not sid else
                           f"no open session {sid!r} (its episode ended, or it never started)",
                           code="session_not_found")
        return s

    # --- requests -------------------------------------------------------------------------------------------
    def _sample(self, session: Session, prompt: list[int], settings: SamplerSettings) -> tuple[list[int], list[float],
                                                                                                bool]:
        """One reply to `prompt` within the request's budget (`settings.max_new_tokens`), from the session's stream."""
        session.check_budget(prompt, settings.max_new_tokens)
        assert self.batcher is not None
        return self.batcher.submit(prompt, settings.max_new_tokens, session.generator, settings).result()

    @contextlib.contextmanager
    def _held(self, sid: str | None) -> Iterator[Session]:
        """The session of a request, one request at a time (a second one meanwhile: 409), open (else 400)."""
        session = self._session(sid)
        if not session.lock.acquire(blocking=False):
            raise APIError(409, f"session {session.id!r} has a request in progress; send one at a time",
                           code="session_busy")
        try:
            session.check_open()
            yield session
        finally:
            session.requests += 1
            session.lock.release()

    def chat(self, sid: str | None, body: Any) -> dict | list[dict]:
        """A chat completion for session `sid` (its episode recorded: `sessions.Chats`)."""
        req = parse_chat(body, self.served, self.sampler.settings, self.flexible is not None)
        with self._held(sid) as session:
            prompt = self.chats.prompt(session, req.messages, req.tools or None)
            tokens, logprobs, stopped = self._sample(session, prompt, req.settings)
            turn = session.turns
            reply = self.chats.reply(session, tokens, logprobs, stopped, f"call_{session.id}_{turn}")
            out = chat_response(req, message=reply.message, prompt_ids=prompt, token_ids=tokens, logprobs=logprobs,
                                token_texts=self.completions.token_texts(tokens), stopped=stopped,
                                policy_version=session.version, response_id=f"chatcmpl-{session.id}-{turn}")
        return chat_chunks(req, out) if req.stream else out

    def complete(self, sid: str | None, body: Any) -> dict | list[dict]:
        """A text completion for session `sid` (its episode recorded: `sessions.Completions`)."""
        req = parse_completion(body, self.served, self.sampler.settings, self.flexible is not None,
                               vocab_size=self.completions.vocab_size)
        with self._held(sid) as session:
            prompt = self.completions.prompt(session, req.prompt)
            tokens, logprobs, stopped = self._sample(session, prompt, req.settings)
            turn = session.turns
            text = self.completions.reply(session, tokens, logprobs, stopped)
            out = completion_response(req, text=text, prompt_ids=prompt, token_ids=tokens, logprobs=logprobs,
                                      token_texts=self.completions.token_texts(tokens), stopped=stopped,
                                      policy_version=session.version, response_id=f"cmpl-{session.id}-{turn}")
        return completion_chunks(req, out) if req.stream else out


class _Server(ThreadingHTTPServer):
    """`ThreadingHTTPServer` with a listen backlog for hundreds of agents connecting at once (socketserver's default,
    5, resets and times out connections when a step's agents start together)."""

    request_queue_size = 1024
    daemon_threads = True


def listen(host: str, port: int, handler: type[BaseHTTPRequestHandler], what: str) -> ThreadingHTTPServer:
    """A threading HTTP server bound to host:port (0: a free port; read it from `server_address`), its handler's
    threads daemons; a port in use, a port out of range or a host that does not resolve is one `ConfigError` line
    starting with `what` (this endpoint's, the Tinker server's: `trajtune.tinker.server`)."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"{what}: port {port} is not a TCP port (0-65535; 0: a free one)")
    try:
        return _Server((host, port), handler)
    except socket.gaierror as e:
        raise ConfigError(f"{what}: cannot listen on host {host!r}: {e.strerror}") from None
    except OSError as e:
        if e.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
            raise ConfigError(f"{what}: cannot listen on {host}:{port}: {e.strerror} (choose another port, or 0 for a "
                              "free one)") from None
        raise


def _route(path: str, headers: Any) -> tuple[str | None, str]:
    """(session id or None, the route under /v1) of a request path."""
    path = path.split("?", 1)[0].rstrip("/")
    sid = None
    if path.startswith("/s/"):
        _, _, rest = path.partition("/s/")
        sid, _, path = rest.partition("/")
        path = "/" + path
    sid = sid or headers.get("X-Session-Id") or None
    return sid, path


def _handler(endpoint: Endpoint) -> type[BaseHTTPRequestHandler]:
    class Requests(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "trajtune-endpoint"
        disable_nagle_algorithm = True  # a reply is one small write: Nagle + delayed ACK would hold it ~40 ms

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: the run logs what matters
            pass

        def _send(self, status: int, payload: dict | list[dict], stream: bool = False) -> None:
            data = sse(payload) if stream else json.dumps(payload).encode()  # type: ignore[arg-type]
            self.send_response(status)
            self.send_header("Content-Type", "text/event-stream" if stream else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, e: APIError) -> None:
            self._send(e.status, e.body())

        def do_GET(self) -> None:
            sid, path = _route(self.path, self.headers)
            if path in ("/v1/models", "/models"):
                self._send(200, models_response(endpoint.served))
            elif path in ("/health", "/v1/health"):
                self._send(200, {"status": "ok"})
            else:
                self._error(APIError(404, f"no route GET {self.path}", code="not_found"))

        def do_POST(self) -> None:
            sid, path = _route(self.path, self.headers)
            try:
                n = int(self.headers.get("Content-Length") or 0)
                body = read_body(self.rfile.read(n) if n else b"")
                if path in ("/v1/chat/completions", "/chat/completions"):
                    out = endpoint.chat(sid, body)
                elif path in ("/v1/completions", "/completions"):
                    out = endpoint.complete(sid, body)
                else:
                    raise APIError(404, f"no route POST {self.path}", code="not_found")
                self._send(200, out, stream=isinstance(out, list))
            except APIError as e:
                self._error(e)
            except Exception as e:  # noqa: BLE001 - the sampler's failure: the agent gets a 500, the run raises it
                self._error(APIError(500, f"the endpoint's sampler failed: {type(e).__name__}: {e}",
                                     type="server_error"))

    return Requests
