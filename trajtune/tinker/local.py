"""The in-process mode: the real `tinker` client's objects backed by a `TinkerService` in this process, no socket.

    from trajtune.tinker.local import service_client
    client = service_client("runs/tinker")                  # a tinker.ServiceClient; a home folder or a TinkerService
    training = client.create_lora_training_client(base_model="tiny-llama", rank=8)

For tests and notebooks: the same client code as against `trajtune tinker-serve`, the same `TinkerService.handle`
behind it, without a port. It works by giving the client's httpx connection (`tinker._base_client.
AsyncHttpxClientWrapper`, the one class through which the client makes every request when the server's client/config
turns its other transport off, as trajtune's does) a transport that calls the service: only for base URLs of the form
`http://<name>.trajtune.local`, which this module hands out; every other client in the process is untouched. That class
is private to the client, so the `tinker` version is pinned (the `tinker` extra) and
tests/unit/test_tinker_client.py fails loudly if it moves.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from pathlib import Path
from typing import Any

from .service import TinkerService

DOMAIN = ".trajtune.local"

_services: dict[str, TinkerService] = {}
_names = itertools.count(1)
_lock = threading.Lock()
_installed = False


def service_client(service: TinkerService | str | Path, **kw: Any):
    """A `tinker.ServiceClient` whose requests `service` (or a new `TinkerService(home)`) answers in this process.
    `kw` go to the ServiceClient (user_metadata ...); the API key is a local placeholder."""
    import tinker

    if not isinstance(service, TinkerService):
        service = TinkerService(service)
    with _lock:
        _install()
        host = f"svc{next(_names)}{DOMAIN}"
        _services[host] = service
    return tinker.ServiceClient(base_url=f"http://{host}", api_key=kw.pop("api_key", "tml-local"), **kw)


def _install() -> None:
    """Patch the client's httpx wrapper once: base URLs on `DOMAIN` get the in-process transport."""
    global _installed
    if _installed:
        return
    import httpx
    from tinker import _base_client

    class InProcess(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            service = _services.get(request.url.host)
            if service is None:
                return httpx.Response(503, json={"detail": f"no in-process Tinker service at {request.url.host}"})
            body = await request.aread()
            headers = dict(request.headers.items())
            path = request.url.raw_path.decode()
            # the service may block (a long poll, a model loading): off the client's event loop
            reply = await asyncio.to_thread(service.handle, request.method, path, headers, body)
            return httpx.Response(reply.status, headers={"content-type": reply.content_type}, content=reply.body)

    wrapper = _base_client.AsyncHttpxClientWrapper
    original = wrapper.__init__

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        base = str(kwargs.get("base_url") or "")
        if httpx.URL(base).host.endswith(DOMAIN) if base else False:
            kwargs["transport"] = InProcess()
            kwargs.pop("http2", None)
        original(self, *args, **kwargs)

    wrapper.__init__ = __init__  # type: ignore[method-assign]
    _installed = True
