"""A prepared check for one CUDA machine (< 4 minutes): sampling tokens/s and `trajtune grpo` on the GPU.

    PYTHONPATH=. python3 benchmarks/gpu_check.py                    # on the CUDA machine, from the repo root
    PYTHONPATH=. python3 benchmarks/gpu_check.py --device cpu --quick   # the same steps, smallest sizes, on a CPU

Needs torch and transformers (peft only if trajtune imports it); trajtune is imported from the repository
(no pip install, no `trajtune` console script: `trajtune.cli.main` in this process). vLLM is optional. Every
line printed also goes to $OUT/gpu_check.txt when OUT is set. Each step is guarded: one that fails prints its
error and the next one runs; the summary table at the end lists every result.

Steps:
  1. versions: torch, transformers, the GPU's name, whether `import vllm` works (if not, the vLLM rows are
     skipped: reason printed);
  2. random Llamas on disk in a temporary directory: small (3.0M), flop (20.5M: benchmarks/vs_trl.py's FLOP row),
     100m (~98M: hidden 768, 12 layers, MLP 2048, vocab 16,384); --quick: tiny (0.10M) only;
  3. tokens/s of trajtune's sampler (`engine.sample(backend="sampler", draw="cdf")`) and HF generate
     (`backend="generate"`) on the device, fp32 and bf16 autocast, 64 prompts x 64 new tokens, no stop token
     (every row writes every token; the count is checked), best of 2 after one warm-up call;
  4. `trajtune grpo --device DEV --precision bf16` on the flop model (--quick: tiny), 8 prompts x 8 completions of
     <= 32 new tokens, 3 steps: step times (the interval between consecutive metrics rows; time/sampling_s); then the same with
     `--max-staleness 1 --tis-cap 2` (the overlapped sampler process, a copy of the weights on the same device,
     synced and checked after every update): its step times and sync/logprob_diff per step. The sampler
     process's check compares the sampler's and the trainer's log-probs of a few rows to --sync-tolerance
     (OverlapConfig.sync_tolerance, 1e-3 by default whatever the precision, unlike --vllm-sync-tolerance, which
     is 5e-2 in bf16); under bf16 the two forwards need not round alike, so this run passes 0.05 and prints the
     measured diffs (under 1e-3: the default would have passed);
  5. if vLLM is importable: the same grpo with `--backend vllm` (colocated, --vllm-gpu-memory-utilization 0.3)
     and its sync/logprob_diff.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402

VOCAB = 16_384
SIZES = {  # name -> (base size of make_random_model, overrides, padded vocab)
    "tiny": ("tiny", None, 0),
    "small": ("small", None, 0),
    "flop": ("tiny", dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=6,
                          num_key_value_heads=6), VOCAB),
    "100m": ("tiny", dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                          num_key_value_heads=12), VOCAB),
}
LOG = None
SUMMARY: list[tuple[str, str, str]] = []  # (what, setting, result)
T0 = time.monotonic()


def say(*parts) -> None:
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    if LOG is not None:
        LOG.write(line + "\n")
        LOG.flush()


def result(what: str, setting: str, value: str) -> None:
    SUMMARY.append((what, setting, value))
    say(f"  -> {what} [{setting}]: {value}")


def guarded(what: str, setting: str = ""):
    """Run the decorated step now; an exception is printed and recorded, and the script goes on."""
    def run(fn):
        t = time.monotonic()
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            say(traceback.format_exc(limit=4).rstrip())
            result(what, setting, f"FAILED: {type(e).__name__}: {' '.join(str(e).split())[:200]}")
        say(f"  ({what}: {time.monotonic() - t:.1f} s; {time.monotonic() - T0:.0f} s since start)")
        return fn
    return run


def make_model(d: Path, size: str) -> Path:
    from trajtune.models.hf_random import make_random_model

    base, over, vocab = SIZES[size]
    return make_random_model(d / size, "llama", base, padded_vocab=vocab, overrides=over)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def tokens_per_s(model_dir: Path, size: str, device: str, batch: int, new: int) -> None:
    from trajtune.engine.torch_engine import make_engine
    from trajtune.models.hf import load_policy

    policy = load_policy(model_dir).eval()
    engine = make_engine(policy, device=device)
    vocab = policy.base_config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, min(vocab, 512), (int(n),), generator=g).tolist()
               for n in torch.randint(8, 25, (batch,), generator=g)]
    dev_type = torch.device(device).type
    for precision in ("fp32", "bf16"):
        for backend in ("sampler", "generate"):
            kw = dict(draw="cdf") if backend == "sampler" else {}

            def call(p=prompts, n=new):
                with torch.autocast(dev_type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                    out = engine.sample(p, n, torch.Generator().manual_seed(1), backend=backend, stop_ids=(), **kw)
                sync(device)
                return out

            setting = f"{size} {precision} {backend} {batch}x{new}"
            try:
                call(prompts[:2], 4)  # warm-up
                best, out = float("inf"), None
                for _ in range(2):
                    t = time.perf_counter()
                    out = call()
                    best = min(best, time.perf_counter() - t)
                toks = sum(len(x) for x in out.tokens)
                check = "" if toks == batch * new else f" (expected {batch * new} tokens!)"
                result("tokens/s", setting, f"{toks / best:,.0f} tok/s ({toks} tokens in {best:.3f} s){check}")
            except Exception as e:  # noqa: BLE001
                say(traceback.format_exc(limit=4).rstrip())
                result("tokens/s", setting, f"FAILED: {type(e).__name__}: {' '.join(str(e).split())[:200]}")
    engine = policy = None  # free them before vLLM starts
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def write_grpo_data(d: Path) -> tuple[Path, Path]:
    data, rewards = d / "prompts.jsonl", d / "rewards.py"
    with open(data, "w") as f:
        for i in range(16):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"what is {i}+5?"}], "answer": str(i + 5)}) + "\n")
    rewards.write_text("def has_digit(prompts, completions, answer, **kw):\n"
                       "    return [float(any(ch.isdigit() for ch in c[-1]['content'])) for c in completions]\n")
    return data, rewards


def grpo(d: Path, model_dir: Path, label: str, device: str, steps: int, shape: tuple[int, int, int],
         extra: list[str]) -> None:
    from trajtune.cli import main
    from trajtune.metrics import read_metrics

    data, rewards = write_grpo_data(d)
    out = d / f"grpo-{label.replace(' ', '-')}"
    P, G, N = shape
    argv = ["grpo", "--model", str(model_dir), "--data", str(data), "--reward", f"{rewards}:has_digit",
            "--steps", str(steps), "--prompts-per-step", str(P), "--group-size", str(G), "--max-new-tokens", str(N),
            "--lr", "1e-5", "--device", device, "--precision", "bf16", "--out", str(out), "--overwrite", *extra]
    say(f"  trajtune {' '.join(argv)}")
    t = time.monotonic()
    code = main(argv)
    wall = time.monotonic() - t
    if code != 0:
        result("grpo", label, f"FAILED: trajtune grpo exited {code} (message above)")
        return
    rows = read_metrics(out)
    for prev, r in zip([None] + rows, rows):
        dt = f"wall_s={r['time'] - prev['time']:.4g} " if prev is not None else "(first step) "
        say("   step", r.get("step"), dt + " ".join(f"{k}={r[k]:.4g}" for k in ( "time/sampling_s", "time/sync_s", "sync/logprob_diff", "sync/logprob_diff_mean",
            "rollout/policy_tokens", "rollout/reward") if isinstance(r.get(k), (int, float))))
    later = rows[1:] or rows
    steps_s = [b["time"] - a["time"] for a, b in zip(rows, rows[1:])]  # consecutive rows' time stamps
    step = statistics.median(steps_s) if steps_s else float("nan")
    samp = [r["time/sampling_s"] for r in later if "time/sampling_s" in r]
    diffs = [r["sync/logprob_diff"] for r in rows if "sync/logprob_diff" in r]
    text = f"{len(rows)} steps in {wall:.1f} s wall (start-up included); median step {step:.3f} s"
    if samp:
        text += f", sampling {statistics.median(samp):.3f} s"
    if diffs:
        text += f"; sync/logprob_diff per sync {', '.join(f'{x:.2g}' for x in diffs)} (max {max(diffs):.2g})"
    result("grpo", label, text)


def main() -> int:
    global LOG
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--quick", action="store_true", help="the smallest sizes and shapes, fewer steps (a CPU test)")
    args = ap.parse_args()
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        LOG = open(Path(os.environ["OUT"]) / "gpu_check.txt", "w")
    device = args.device
    sizes = ["tiny"] if args.quick else ["small", "flop", "100m"]
    grpo_size = "tiny" if args.quick else "flop"
    batch, new = (8, 16) if args.quick else (64, 64)
    steps, shape = (2, (2, 4, 8)) if args.quick else (3, (8, 8, 32))

    import transformers

    say(f"# gpu_check: torch {torch.__version__}, transformers {transformers.__version__}, python "
        f"{sys.version.split()[0]}, device {device}")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            say("CUDA is not available: nothing to check (use --device cpu --quick for the CPU test)")
            return 1
        say(f"GPU: {torch.cuda.get_device_name()} ({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB), "
            f"CUDA {torch.version.cuda}, bf16 supported: {torch.cuda.is_bf16_supported()}")
    else:
        say(f"CPU: {os.cpu_count()} cores, {torch.get_num_threads()} torch threads")
    try:
        import vllm

        has_vllm = True
        say(f"vLLM {vllm.__version__}: present, the vLLM row runs")
    except Exception as e:  # noqa: BLE001
        has_vllm = False
        say(f"vLLM: not importable ({type(e).__name__}: {str(e)[:120]}); the vLLM rows are skipped: "
            "`--backend vllm` needs the vllm package (none installed here, no internet to install it)")
        result("grpo", "vllm colocated", "skipped: vLLM not installed")

    with tempfile.TemporaryDirectory(prefix="trajtune-gpu-check-") as tmp:
        d = Path(tmp)
        dirs: dict[str, Path] = {}

        @guarded("make models")
        def _():
            for size in dict.fromkeys(sizes + [grpo_size]):
                dirs[size] = make_model(d, size)
                cfg = json.loads((dirs[size] / "config.json").read_text())
                say(f"  {size}: hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layers, vocab "
                    f"{cfg['vocab_size']} -> {dirs[size]}")

        for size in sizes:
            if size in dirs:
                say(f"\n## tokens/s: {size}")
                guarded("tokens/s", size)(lambda s=size: tokens_per_s(dirs[s], s, device, batch, new))
        if grpo_size in dirs:
            say(f"\n## trajtune grpo, {grpo_size}, bf16, on-policy")
            guarded("grpo", "bf16 on-policy")(lambda: grpo(d, dirs[grpo_size], f"{grpo_size} bf16 on-policy",
                                                             device, steps, shape, []))
            say(f"\n## trajtune grpo, {grpo_size}, bf16, overlapped sampler process")
            guarded("grpo", "bf16 overlapped")(lambda: grpo(
                d, dirs[grpo_size], f"{grpo_size} bf16 max-staleness 1", device, steps, shape,
                ["--max-staleness", "1", "--tis-cap", "2", "--sync-tolerance", "0.05"]))
            if has_vllm:
                say(f"\n## trajtune grpo, {grpo_size}, bf16, --backend vllm (colocated)")
                guarded("grpo", "vllm")(lambda: grpo(d, dirs[grpo_size], f"{grpo_size} bf16 vllm colocated", device,
                                                     steps, shape, ["--backend", "vllm",
                                                                    "--vllm-gpu-memory-utilization", "0.3"]))

    say(f"\n## summary ({time.monotonic() - T0:.0f} s)\n")
    say("| check | setting | result |")
    say("|---|---|---|")
    for what, setting, value in SUMMARY:
        say(f"| {what} | {setting} | {value} |")
    if LOG is not None:
        LOG.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
