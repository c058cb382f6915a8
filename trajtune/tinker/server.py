"""`TinkerServer`: `TinkerService` over HTTP (what `trajtune tinker-serve` runs).

    with TinkerServer(TinkerService("runs/tinker"), port=0) as server:   # 0: a free port
        client = tinker.ServiceClient(base_url=server.url)              # TINKER_API_KEY=tml-<anything>

Plain HTTP/1.1 on the standard library's threading server (`trajtune.sources.endpoint.server.listen`: the endpoint's
backlog and one-line bind errors), keep-alive, Nagle off (a reply is one small write: with Nagle and delayed ACKs a
call took ~50 ms on loopback, without ~8 ms). Every request goes to `TinkerService.handle`, which never raises.
The API key the client sends (`X-API-Key`) is not checked unless `api_key` is given.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from ..sources.endpoint.server import listen
from .service import Reply, TinkerService


class TinkerServer:
    """The service on host:port, served from a daemon thread until `close()`."""

    def __init__(self, service: TinkerService, host: str = "127.0.0.1", port: int = 8000,
                 api_key: str | None = None) -> None:
        self.service, self.host, self.api_key = service, host, api_key
        self.connections: set[socket.socket] = set()  # open keep-alive connections: closed with the server
        self._lock = threading.Lock()
        self._server = listen(host, port, _handler(self), "tinker-serve")
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="tinker-serve", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        """Stop listening, cut the open connections (a client's next request reconnects: to a restarted server, if
        one listens), then close the service."""
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            for conn in list(self.connections):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        self.service.close()

    def __enter__(self) -> "TinkerServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _handler(server: TinkerServer) -> type[BaseHTTPRequestHandler]:
    class Requests(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "trajtune-tinker"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet; failures are logged
            pass

        def setup(self) -> None:
            super().setup()
            with server._lock:
                server.connections.add(self.connection)

        def finish(self) -> None:
            with server._lock:
                server.connections.discard(self.connection)
            super().finish()

        def _send(self, reply: Reply) -> None:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)

        def _answer(self, method: str) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            if server.api_key is not None and self.headers.get("X-API-Key") != server.api_key:
                self._send(Reply.json({"detail": "wrong or missing X-API-Key (this server was started with "
                                                 "--api-key)"}, 401))
                return
            self._send(server.service.handle(method, self.path, dict(self.headers.items()), body))

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

        def do_DELETE(self) -> None:
            self._answer("DELETE")

        def do_PUT(self) -> None:
            self._answer("PUT")

    return Requests
