"""A prepared check for one CUDA machine (a few minutes): the real model's tokens/s and `trajtune grpo` on the GPU.

    PYTHONPATH=. python3 benchmarks/gpu_check.py                          # on the CUDA machine, from the repo root
    PYTHONPATH=. python3 benchmarks/gpu_check.py --model DIR              # the model's folder, where no name resolves
    PYTHONPATH=. python3 benchmarks/gpu_check.py --device cpu --quick     # the same steps, small shapes, on a CPU

The model: SmolLM2-135M-Instruct (Apache-2.0; a dequantized Q4_1 GGUF, not the bf16 original), found through
`trajtune.models.hub.resolve_model(--model)` (default `smollm2-135m`: the folder `trajtune models fetch
smollm2-135m` converted; a .gguf file is converted on first use) where this trajtune has it, else --model must
be the converted folder. A device machine that reaches no registry needs the model brought along: the
converted folder (538 MB) or the GGUF (98 MB; `--model FILE.gguf`, converted there in ~30 s).

Needs torch and transformers (peft only if trajtune imports it); trajtune is imported from the repository
(no pip install, no `trajtune` console script: `trajtune.cli.main` in this process). vLLM is optional. Every
line printed also goes to $OUT/gpu_check.txt when OUT is set. Each step is guarded: one that fails prints its
error and the next one runs; the summary table at the end lists every result.

Steps:
  1. versions: torch, transformers, the GPU's name, whether `import vllm` works (if not, the vLLM rows are
     skipped: reason printed);
  2. the model: its folder, layers, head size, where it came from (`trajtune.models.cache.provenance`);
  3. tokens/s of trajtune's sampler (`engine.sample(backend="sampler", draw="cdf")`) and HF generate
     (`backend="generate"`) on the device, fp32 weights and bf16 autocast, 64 prompts x 64 new tokens (--quick:
     8 x 16), random prompts of 8-24 ids, no stop token (every row writes every token; the count is checked),
     best of 2 after one warm-up call;
  4. `trajtune grpo --device DEV --precision bf16` on the model, 8 prompts x 8 completions of <= 32 new tokens,
     3 steps (--quick: 2 x 4 x 8, 2 steps): step times (the interval between consecutive metrics rows;
     time/sampling_s); then the same with `--max-staleness 1 --tis-cap 2` (the overlapped sampler process, a
     copy of the weights on the same device, synced and checked after every update): its step times and
     sync/logprob_diff per step. The sampler process's check compares the sampler's and the trainer's log-probs
     of a few rows to --sync-tolerance (SamplingConfig.sync_tolerance: 1e-3 by default in fp32, 5e-2 in bf16);
     under bf16 the two forwards need not round alike, so this run passes 0.05 and prints the measured diffs;
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

MODEL = "smollm2-135m"
"""the real model's catalog name (`trajtune models fetch smollm2-135m`)"""
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


def resolve(spec: str) -> Path:
    """The model's local folder: `trajtune.models.hub.resolve_model(spec)` where trajtune has it (a catalog name, a
    hub id, a .gguf file, a folder), else `spec` as a folder."""
    try:
        from trajtune.models.hub import resolve_model
    except ImportError:
        path = Path(spec).expanduser()
        if not (path / "config.json").is_file():
            raise RuntimeError(f"--model {spec}: no Hugging Face folder there (config.json), and this "
                             "trajtune resolves no names (trajtune.models.hub): pass --model DIR, the converted "
                             "folder") from None
        return path
    return Path(resolve_model(spec))


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def tokens_per_s(model_dir: Path, name: str, device: str, batch: int, new: int) -> None:
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

            setting = f"{name} {precision} {backend} {batch}x{new}"
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
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"what is {i}+5?"}],
                                "answer": str(i + 5)}) + "\n")
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
        say("   step", r.get("step"), dt + " ".join(f"{k}={r[k]:.4g}" for k in ( "time/sampling_s", "time/sync_s",
                                                                                "sync/logprob_diff",
                                                                                "sync/logprob_diff_mean",
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
    ap.add_argument("--quick", action="store_true", help="small shapes, fewer steps (a CPU test)")
    ap.add_argument("--model", default=MODEL, help=f"the model (default {MODEL}): a catalog name, hub id or .gguf "
                    "file trajtune.models.hub resolves, or a converted Hugging Face folder")
    args = ap.parse_args()
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        LOG = open(Path(os.environ["OUT"]) / "gpu_check.txt", "w")
    device = args.device
    batch, new = (8, 16) if args.quick else (64, 64)
    steps, shape = (2, (2, 4, 8)) if args.quick else (3, (8, 8, 32))

    import transformers

    say(f"# gpu_check: torch {torch.__version__}, transformers {transformers.__version__}, python "
        f"{sys.version.split()[0]}, device {device}")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            say("CUDA is not available: nothing to check (use --device cpu --quick for the CPU test)")
            return 1
        say(f"GPU: {torch.cuda.get_device_name()} ({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} "
            "GiB), "
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
        found: list[Path] = []

        @guarded("model", args.model)
        def _():
            model_dir = resolve(args.model)
            cfg = json.loads((model_dir / "config.json").read_text())
            cfg = cfg.get("text_config", cfg)
            head = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
            try:
                from trajtune.models.cache import provenance

                source = provenance(model_dir) or {}
            except ImportError:
                source = {}
            say(f"  {model_dir}: {cfg.get('model_type')}, hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} "
                f"layers, head size {head}, vocab {cfg['vocab_size']}, dtype {cfg.get('torch_dtype', '?')}"
                + (f"; from {json.dumps(source)[:300]}" if source else ""))
            found.append(model_dir)
            result("model", args.model, str(model_dir))

        if found:
            model_dir, name = found[0], Path(args.model).name
            say(f"\n## tokens/s: {name}")
            guarded("tokens/s", name)(lambda: tokens_per_s(model_dir, name, device, batch, new))
            say(f"\n## trajtune grpo, {name}, bf16, on-policy")
            guarded("grpo", "bf16 on-policy")(lambda: grpo(d, model_dir, f"{name} bf16 on-policy", device, steps,
                                                             shape, []))
            say(f"\n## trajtune grpo, {name}, bf16, overlapped sampler process")
            guarded("grpo", "bf16 overlapped")(lambda: grpo(
                d, model_dir, f"{name} bf16 max-staleness 1", device, steps, shape,
                ["--max-staleness", "1", "--tis-cap", "2", "--sync-tolerance", "0.05"]))
            if has_vllm:
                say(f"\n## trajtune grpo, {name}, bf16, --backend vllm (colocated)")
                guarded("grpo", "vllm")(lambda: grpo(d, model_dir, f"{name} bf16 vllm colocated", device, steps,
                                                     shape, ["--backend", "vllm", "--vllm-gpu-memory-utilization",
                                                             "0.3"]))

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
