"""The Tinker server's cost: per-call overhead against calling the engine directly, and the cookbook-style RL loop's
steps/s (docs/tinker.md).

Table 1, overhead: one training step -- forward_backward(cross_entropy) on a fixed batch, then optim_step -- timed
three ways on the same base model (a fresh model each, built as the server builds it: `TrainedModel`, LoRA rank 32
unless --rank), side by side in one run, in alternating rounds so background load hits all three alike:

    engine      trajtune.tinker.losses.forward_backward(engine, datums, ...) + engine.optim_step(lr): no client
    in-process  the real tinker client -> trajtune.tinker.local.service_client (the service in this process)
    http        the real tinker client -> `trajtune tinker-serve --port 0` (a separate process, loopback TCP)

Each reports the median ms per step over --reps steps after --warmup; overhead = (mode - engine) ms per step
(a step is two client calls, forward_backward and optim_step, each a submit plus its retrieve_future), and the ratio
mode / engine.

Table 2, RL steps/s: examples/tinker_rl_loop.py (rl_loop's call sequence: save weights for a sampler and its sync
check, sample, forward_backward importance_sampling, optim_step) with its defaults -- tiny-llama on task sevens,
30 steps of 8 prompts x 8 samples of 8 tokens -- in-process and over HTTP, and (unless --no-real) the real model
smollm2-135m on task add for --real-steps steps over HTTP. Steps/s counts the loop's steps (not its evaluations).

    python benchmarks/tinker_server.py                     # both tables (~5 min on 2 cores, the real model most of it)
    python benchmarks/tinker_server.py --no-real           # without the real model (~1.5 min)
    python benchmarks/tinker_server.py --rl-steps 0        # table 1 only
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CLOCK = time.perf_counter
MODES = ("engine", "in-process", "http")


def rows(vocab: int, batch: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(5, vocab, size=(batch, length)).tolist()


def engine_step(model, data, lr: float):
    """One step straight on the engine: what the service's forward_backward and optim_step futures run."""
    from trajtune.tinker.losses import forward_backward

    forward_backward(model.engine, data, "cross_entropy", None, False, model.vocab)
    model.engine.optim_step(lr=lr)


def client_step(training_client, data, adam):
    fb = training_client.forward_backward(data, "cross_entropy")
    op = training_client.optim_step(adam)
    fb.result(), op.result()


def serve(home: Path):
    """`trajtune tinker-serve --port 0` in its own process -> (process, url)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "trajtune", "tinker-serve", "--home", str(home), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    line = proc.stdout.readline()
    match = re.search(r"(http://[\d.]+:\d+)", line)
    if not match:
        proc.kill()
        raise SystemExit(f"trajtune tinker-serve did not start: {line}{proc.stdout.read()[-2000:]}")
    return proc, match.group(1)


def stop(proc) -> None:
    proc.terminate()  # SIGTERM: started from a non-interactive shell's background job, SIGINT is ignored
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def worker(args) -> None:
    """One mode's process (table 1): sets its model up, then per line "N" on stdin runs N steps and prints their
    seconds as one line; so only one mode computes at a time and none shares a process (or torch's threads)."""
    import tinker
    from tinker import types

    from trajtune.tinker.local import service_client
    from trajtune.tinker.models import ModelSpec, TrainedModel
    from trajtune.tinker.wire import Datum

    if args.worker == "engine":
        direct = TrainedModel(ModelSpec(model_id="bench:train:0", base_model=args.model, lora_rank=args.rank),
                              Path(args.home))
        vocab = direct.vocab
    else:
        client = (service_client(args.home) if args.worker == "in-process"
                  else tinker.ServiceClient(base_url=args.url, api_key="tml-local"))
        trainer = client.create_lora_training_client(base_model=args.model, rank=args.rank).result()
        vocab = len(trainer.get_tokenizer())
    tokens = rows(vocab, args.batch, args.length)
    ones = np.ones(args.length - 1, np.float32)
    if args.worker == "engine":
        wire = [Datum(tokens=r[:-1], inputs={"target_tokens": np.array(r[1:], np.int64), "weights": ones})
                for r in tokens]

        def step() -> None:
            engine_step(direct, wire, args.lr)
    else:
        data = [types.Datum(model_input=types.ModelInput.from_ints(r[:-1]),
                            loss_fn_inputs={"target_tokens": types.TensorData.from_numpy(np.array(r[1:], np.int64)),
                                            "weights": types.TensorData.from_numpy(ones)}) for r in tokens]
        adam = types.AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.95, eps=1e-8)

        def step() -> None:
            client_step(trainer, data, adam)
    print("ready", flush=True)
    for line in sys.stdin:
        times = []
        for _ in range(int(line)):
            t0 = CLOCK()
            step()
            times.append(CLOCK() - t0)
        print(json.dumps(times), flush=True)


def overhead(args, home: Path, url: str) -> None:
    """Table 1: the three modes' worker processes, driven in alternating rounds of --round steps."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    workers = {}
    for mode in MODES:
        cmd = [sys.executable, __file__, "--worker", mode, "--home", str(home / mode), "--url", url,
               "--model", args.model, "--rank", str(args.rank), "--batch", str(args.batch),
               "--length", str(args.length), "--lr", str(args.lr)]
        workers[mode] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        line = "-"
        while line and line.strip() != "ready":  # whatever a library prints before it
            line = workers[mode].stdout.readline()
        if not line:
            raise SystemExit(f"the {mode} worker did not start (its errors are above)")
    times: dict[str, list[float]] = {m: [] for m in MODES}
    try:
        for r in range(-1, -(-args.reps // args.round)):  # round -1: the warm-up, not counted
            for mode, w in workers.items():
                w.stdin.write(f"{args.warmup if r < 0 else args.round}\n")
                w.stdin.flush()
                line = w.stdout.readline()
                while line and not line.startswith("["):
                    line = w.stdout.readline()
                out = json.loads(line)
                if r >= 0:
                    times[mode] += out
    finally:
        for w in workers.values():
            w.stdin.close()
            w.wait(timeout=60)
    base = statistics.median(times["engine"]) * 1e3
    print(f"\n## Overhead: {args.model}, LoRA rank {args.rank}, batch {args.batch} x {args.length} tokens, "
          f"median of {len(times['engine'])} steps per mode (forward_backward + optim_step)\n")
    print("| mode | ms / step | overhead ms / step | overhead ms / call | ratio to engine |")
    print("|---|---|---|---|---|")
    for name, ts in times.items():
        ms = statistics.median(ts) * 1e3
        print(f"| {name} | {ms:.1f} | {ms - base:+.1f} | {(ms - base) / 2:+.1f} | {ms / base:.2f} |", flush=True)


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def rl_rate(args, home: Path, url: str) -> None:
    import tinker

    from trajtune.tinker.local import service_client

    rl = load_example("tinker_rl_loop")
    runs = [("tiny-llama", "sevens", "in-process", args.rl_steps, 3e-3),
            ("tiny-llama", "sevens", "http", args.rl_steps, 3e-3)]
    if not args.no_real:
        runs.append(("smollm2-135m", "add", "http", args.real_steps, 1e-4))
    print("\n## RL loop (examples/tinker_rl_loop.py: 8 prompts x 8 samples x <= 8 tokens per step)\n")
    print("| model | task | mode | steps | steps/s | s/step | eval reward before -> after |")
    print("|---|---|---|---|---|---|---|")
    for model, task, mode, n, lr in runs:
        client = service_client(home / "rl") if mode == "in-process" else tinker.ServiceClient(
            base_url=url, api_key="tml-local")
        out = rl.main(rl.Settings(model=model, task=task, steps=n, lr=lr), client, verbose=False)
        print(f"| {model} | {task} | {mode} | {n} | {out['steps_per_s']:.3f} | {1 / out['steps_per_s']:.2f} | "
              f"{out['before']:.3f} -> {out['after']:.3f} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-llama", help="table 1's base model (default tiny-llama)")
    p.add_argument("--rank", type=int, default=32, help="table 1's LoRA rank (0: full fine-tune)")
    p.add_argument("--batch", type=int, default=8, help="table 1's datums per forward_backward")
    p.add_argument("--length", type=int, default=64, help="table 1's tokens per datum")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=60, help="table 1's timed steps per mode (0: skip table 1)")
    p.add_argument("--round", type=int, default=10, help="table 1's steps per mode in a turn")
    p.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)  # table 1's worker processes
    p.add_argument("--home", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--rl-steps", type=int, default=30, help="table 2's tiny-model RL steps (0: skip table 2)")
    p.add_argument("--real-steps", type=int, default=6, help="table 2's real-model RL steps")
    p.add_argument("--no-real", action="store_true", help="table 2 without the real model")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    for name in ("batch", "real_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: needs at least 1")
    if args.length < 2:
        p.error(f"--length {args.length}: needs at least 2 tokens")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    print(f"# benchmarks/tinker_server.py on {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        proc, url = serve(home / "server")
        try:
            if args.reps > 0:
                overhead(args, home, url)
            if args.rl_steps > 0:
                rl_rate(args, home, url)
        finally:
            stop(proc)


if __name__ == "__main__":
    main()
