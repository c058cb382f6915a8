"""The servers' per-request latency on one keep-alive connection, with Nagle's algorithm on against off, side by side.

    .venv/bin/python benchmarks/server_latency.py          # ~20 s; --requests N (default 100), --rounds R (default 2)

trajtune's two HTTP servers -- the OpenAI-compatible endpoint (`trajtune.sources.endpoint`) and the Tinker server
(`trajtune.tinker.server`) -- answer with a headers write and a body write. With Nagle on, the body waits for the
client's ACK of the headers, and a client on a keep-alive connection (the `openai` and `tinker` clients both keep
theirs) delays that ACK: each request then costs the delayed-ACK timer. Both servers set `disable_nagle_algorithm`.
This script times the same requests with the attribute forced on and off, alternating, on 127.0.0.1:

  * endpoint: chat completions of a scripted sampler (two fixed tokens: no model time), one session;
  * tinker:   `POST /api/v1/get_server_capabilities` and `create_session` (no model time).

It prints the median milliseconds per request of each, and their ratio.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import time
from pathlib import Path

from trajtune.engine.decoding import Samples
from trajtune.models.hf import load_tokenizer
from trajtune.models.hf_random import make_random_model
from trajtune.sources.endpoint import server as endpoint_server
from trajtune.sources.sampler import SamplerSettings
from trajtune.tinker import server as tinker_server
from trajtune.tinker.service import TinkerService


class TwoTokens:
    """A sampler that answers every prompt with the same two tokens and a stop token: the endpoint's own cost only."""

    settings = SamplerSettings(8)

    def __init__(self, stop_id: int) -> None:
        self.stop_id = stop_id

    def sample(self, prompts, stop_ids, seeds, max_new_tokens=None):
        out = [[5, 6, self.stop_id] for _ in prompts]
        return Samples(out, [[-0.5] * 3 for _ in out], [True] * len(out))


def timed(port: int, requests: list[tuple[str, str, bytes]]) -> float:
    """Median ms of `requests` (method, path, body) sent one after another on one keep-alive connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    times = []
    for method, path, body in requests:
        t = time.perf_counter()
        conn.request(method, path, body, {"Content-Type": "application/json"})
        conn.getresponse().read()
        times.append(time.perf_counter() - t)
    conn.close()
    return statistics.median(times) * 1e3


def with_nagle(module, nagle: bool):
    """`module._handler` patched so its handler class has Nagle on (`nagle`) or off; returns the original."""
    original = module._handler

    def handler(owner):
        cls = original(owner)
        cls.disable_nagle_algorithm = not nagle
        return cls

    module._handler = handler
    return original


def endpoint_ms(tokenizer, stop_id: int, n: int, nagle: bool) -> float:
    original = with_nagle(endpoint_server, nagle)
    try:
        with endpoint_server.Endpoint(TwoTokens(stop_id), tokenizer, served=["policy"], open_sessions=True) as ep:
            body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}]}).encode()
            return timed(ep.port, [("POST", "/s/bench/v1/chat/completions", body)] * n)
    finally:
        endpoint_server._handler = original


def tinker_ms(home: Path, n: int, nagle: bool) -> float:
    original = with_nagle(tinker_server, nagle)
    try:
        with tinker_server.TinkerServer(TinkerService(home), port=0) as server:
            session = json.dumps({"tags": [], "sdk_version": "bench"}).encode()
            reqs = [("GET", "/api/v1/get_server_capabilities", b""), ("POST", "/api/v1/create_session", session)]
            return timed(server.port, reqs * (n // 2))
    finally:
        tinker_server._handler = original


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if args.requests < 2 or args.rounds < 1:
        ap.error("--requests must be >= 2 and --rounds >= 1")
    work = Path(tempfile.mkdtemp(prefix="trajtune-latency-"))
    tokenizer = load_tokenizer(make_random_model(work / "model", "qwen2", "tiny"))
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    print("median ms per request on one keep-alive connection (127.0.0.1)")
    for r in range(args.rounds):
        for name, run in (("endpoint", lambda nagle: endpoint_ms(tokenizer, stop, args.requests, nagle)),
                          ("tinker", lambda nagle: tinker_ms(work / f"home-{r}-{nagle}", args.requests, nagle))):
            on, off = run(True), run(False)
            print(f"round {r}  {name:8s}  Nagle on {on:7.2f} ms   off (trajtune's) {off:6.2f} ms   x{on / off:.0f}")


if __name__ == "__main__":
    main()
