"""`trajtune endpoint --model DIR`: a model behind an OpenAI-compatible endpoint, every session recorded exactly.

    trajtune endpoint --model runs/grpo/model                        # http://127.0.0.1:8000/v1, until Ctrl-C
    trajtune endpoint --model smollm2-135m --host 0.0.0.0 --port 9000 --record sessions.jsonl

The same endpoint an RL run serves its agents (`trajtune grpo --agent FILE.py:FUNCTION`, `trajtune.sources.endpoint`),
standing alone: for agents on another machine, for trying an agent against a model before training it, or to collect
episodes. Any OpenAI client works with base URL `http://HOST:PORT/v1` (model name: --served-name, default "policy", the
name an RL run's endpoint serves, so an agent written for `trajtune grpo --agent` runs against it unchanged). A
request's temperature, top-p and max_tokens are its own (an RL run's endpoint fixes them to the run's). Requests are
grouped into sessions by the base URL `http://HOST:PORT/s/<session>/v1` (or the header X-Session-Id); with --record each
session's episode -- prompt and sampled token ids exactly as sampled, their log-probs and owners -- is one JSON line of
FILE when the endpoint stops (the trajectory fields of `trajtune.trajectory.Trajectory`). A port in use is one line;
Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from ..config import ConfigError


def add_endpoint_parser(subparsers) -> None:
    """Add `endpoint` to the `trajtune` subcommands."""
    p = subparsers.add_parser("endpoint", help="HF model: an OpenAI-compatible endpoint (/v1/chat/completions ...) "
                              "recording each session's tokens", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, metavar="MODEL", help="a local Hugging Face model folder, a .gguf file "
                   "or a catalog name (smollm2-135m)")
    p.add_argument("--host", default="127.0.0.1", help="where to listen (default 127.0.0.1; 0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free one, printed)")
    p.add_argument("--served-name", default="policy", help="the model name clients ask for (default policy: the name "
                   "an RL run's endpoint serves its agents)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="the most tokens one reply may take (default 256)")
    p.add_argument("--backend", choices=("sampler", "generate", "vllm"), default="sampler",
                   help="trajtune's KV-cached sampler, HF generate or vLLM (default sampler)")
    p.add_argument("--tool-syntax", choices=("json", "python"), default=None,
                   help="how a model whose template has no tool calls writes them (default json)")
    p.add_argument("--record", metavar="FILE.jsonl", default="", help="write each session's episode here at exit")
    p.add_argument("--device", default="cpu", help='torch device (default cpu)')
    p.set_defaults(func=cmd_endpoint)


def cmd_endpoint(args, ready: threading.Event | None = None, stop: threading.Event | None = None) -> int:
    """Serve until Ctrl-C (or `stop`, for tests); `ready` is set once it listens."""
    from ..sources.endpoint.server import Endpoint
    from ..sources.sampler import SamplerSettings
    from .chat import Settings, load_chat

    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    record = Path(args.record) if args.record else None
    if record is not None and record.exists():
        raise ConfigError(f"--record {record}: the file exists (a run never overwrites another's output)")
    chat = load_chat(args.model, Settings(args.max_new_tokens, backend=args.backend, device=args.device))
    name = args.served_name
    settings = SamplerSettings(args.max_new_tokens)
    endpoint = Endpoint(chat.make_sampler(settings), chat.renderer.tokenizer, served=[name], host=args.host,
                        port=args.port, flexible=chat.make_sampler, open_sessions=True, tool_syntax=args.tool_syntax)
    endpoint.start()
    print(f"trajtune endpoint: {args.model} as {name!r} at {endpoint.base_url()} (sessions: "
          f"{endpoint.url}/s/<session>/v1); Ctrl-C stops it", flush=True)
    try:
        wait_for_stop(ready, stop)
    finally:
        sessions = [s for s in map(endpoint.finish, list(endpoint.sessions)) if s is not None]
        endpoint.close()
        if record is not None:
            from ..runs.resume import trajectories_to_json

            rows = trajectories_to_json([endpoint.trajectory(s) for s in sessions])
            record.write_text("".join(json.dumps({"session": s.id, **row}) + "\n"
                                      for s, row in zip(sessions, rows, strict=True)))
            print(f"trajtune endpoint: {len(rows)} session(s) written to {record}", flush=True)
    return 0


def wait_for_stop(ready: threading.Event | None, stop: threading.Event | None) -> None:
    """A server command's foreground: set `ready` (tests wait on it), then block until `stop` is set, Ctrl-C or
    SIGTERM (a server started in the background of a script, which ignores SIGINT, stops cleanly with `kill`)."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if ready is not None:
        ready.set()
    try:
        stop.wait()
    except KeyboardInterrupt:
        print(file=sys.stderr)
