"""`trajtune tinker-serve`: the Tinker training API on this machine, for the `tinker` client and tinker-cookbook.

    trajtune tinker-serve                                   # http://127.0.0.1:8000, state in runs/tinker
    trajtune tinker-serve --home runs/tinker --port 9000 --device cuda
    TINKER_BASE_URL=http://127.0.0.1:8000 TINKER_API_KEY=tml-local HF_HUB_OFFLINE=1 python my_tinker_script.py

A Tinker script runs unchanged against it: `create_lora_training_client(base_model=...)` with a built-in tiny model
(tiny-llama, tiny-qwen2), a local Hugging Face folder, a .gguf file or a catalog name (smollm2-135m), rank 0 for a full
fine-tune; forward_backward with the client's losses, optim_step, sampling, save_state / load, sampler weights. Each
sampler weight save is checked against the trainer (its weights and its log-probs, --sync-tolerance). The home keeps
sessions, models and checkpoints: a restarted server with the same --home goes on from each model's last saved state.
What is refused, and why: docs/tinker.md. Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import sys
import threading

from ..config import ConfigError


def add_tinker_parser(subparsers) -> None:
    """Add `tinker-serve` to the `trajtune` subcommands."""
    p = subparsers.add_parser("tinker-serve", help="the Tinker training API (the tinker client, tinker-cookbook) "
                              "over trajtune's engine", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--home", default="runs/tinker", help="sessions, models and checkpoints (default runs/tinker; a "
                   "restart with the same home goes on from there)")
    p.add_argument("--host", default="127.0.0.1", help="where to listen (default 127.0.0.1; 0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free one, printed)")
    p.add_argument("--device", default="cpu", help="where models train and sample (default cpu)")
    p.add_argument("--sampler", choices=("own", "vllm"), default="own", help="trajtune's sampler on a copy of the "
                   "weights, or vLLM (installed: README) (default own)")
    p.add_argument("--sync-tolerance", type=float, default=1e-3, help="the largest sampler-trainer log-prob "
                   "difference (nats) a sampler weight save may show (default 1e-3)")
    p.add_argument("--api-key", default=None, help="answer only clients that send this X-API-Key (default: any)")
    p.set_defaults(func=cmd_tinker_serve)


def cmd_tinker_serve(args, ready: threading.Event | None = None, stop: threading.Event | None = None) -> int:
    """Serve until Ctrl-C (or `stop`, for tests); `ready` is set once it listens."""
    from ..engine.torch_engine import AUTOCAST_DTYPES  # noqa: F401 - torch before the server starts
    from ..tinker.server import TinkerServer
    from ..tinker.service import TinkerService
    from .chat import check_device

    if not args.sync_tolerance > 0:
        raise ConfigError(f"--sync-tolerance must be > 0, got {args.sync_tolerance}")
    check_device(args.device)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no "Loading weights" bars in the server's log at every new model
    except ImportError:  # pragma: no cover
        pass
    try:
        service = TinkerService(args.home, device=args.device, sampler=args.sampler, tolerance=args.sync_tolerance)
    except ValueError as e:  # a registry that does not read
        raise ConfigError(str(e)) from None
    except OSError as e:  # a home that cannot be made or written
        raise ConfigError(f"--home {args.home}: cannot write the server's registry there ({e.strerror or e})") from None
    server = TinkerServer(service, args.host, args.port, api_key=args.api_key)
    print(f"trajtune tinker-serve: {server.url} (home {args.home}); clients: TINKER_BASE_URL={server.url} "
          "TINKER_API_KEY=tml-local; Ctrl-C stops it", flush=True)
    if ready is not None:
        ready.set()
    try:
        (stop or threading.Event()).wait()
    except KeyboardInterrupt:
        print(file=sys.stderr)
    finally:
        server.close()
    return 0
