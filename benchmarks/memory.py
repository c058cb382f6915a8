"""Memory race: peak RSS of one SFT, DPO and GRPO step with a real vocabulary, trajtune vs TRL.

    pip install -e '.[hf,bench]'
    python benchmarks/memory.py                      # SFT, DPO, GRPO; trajtune, trajtune with chunking off, TRL
    python benchmarks/memory.py --kinds SFT
    python benchmarks/memory.py --model smollm2-135m # a real model (or its folder): both checkpointing settings

--model: a real model instead of the random one (a Hugging Face folder, or where `trajtune.models.hub` exists
smollm2-135m, a hub id or a .gguf file). Each library then runs with gradient checkpointing on (TRL's default)
and off (trajtune's), GRPO also with trajtune's old KL log (`log_kl="copy"`: a resident copy of the starting
policy), and the table splits each peak into the fixed part -- weights, gradients and AdamW's two moments, 16
bytes a parameter in fp32 -- and the part above it (activations, logits, the runtime), with the ratio of each.

The model is a random Llama with Qwen2.5's vocabulary size (151,936 rows, tied head) and a small body
(hidden 64, 2 layers) so it runs on a CPU: the logits are what costs memory. trajtune computes the
token log-probs through the output layer in slices of positions (`trajtune.logprobs.TokenHead`; the
backward recomputes each slice), so the [B, T, V] logits never exist whole; `logits_chunk=0` turns
that off (the row "chunking off").

Each measurement runs in its own process (one library, one method): it loads the model and data, resets
the kernel's peak-RSS mark (/proc/self/clear_refs), runs one optimizer step (GRPO: sampling included),
and reports VmHWM, the peak resident memory since the reset, and its rise over the resident memory at the
reset. The ratio is of the peaks.

Workloads (one optimizer step, the same shapes in both libraries):
  SFT   8 conversations of 256 tokens
  DPO   4 preference pairs of ~256 tokens (a chosen and a rejected answer each; the data set is those 4)
  GRPO  4 prompts x 4 completions of 64 new tokens, no KL
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")  # TRL posts usage telemetry from a thread
warnings.filterwarnings("ignore")

sys.path.insert(0, str(Path(__file__).parent))
import vs_trl  # noqa: E402  (the same runners, data and reward as the speed race)

VOCAB = 151_936
BODY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
WORKLOAD = vs_trl.Workload(batch=8, prompts=4, group=4, new_tokens=64, max_length=1024)
SFT_TOKENS = 256
DPO_PAIRS = 4
VARIANTS = {"trajtune": {}, "trajtune, chunking off": {"logits_chunk": 0}, "TRL": None}
"""the random model's rows: variant -> trajtune's engine options (None: TRL with its defaults)"""
REAL = {"trajtune": {}, "trajtune, checkpointing": {"policy_kw": {"gradient_checkpointing": True}},
        "TRL, checkpointing off": {"checkpointing": False}, "TRL": {},
        "trajtune, log_kl copy": {"rl_kw": {"log_kl": "copy"}}}
"""--model's rows: variant -> run_trajtune's / run_trl's options (TRL's default: gradient checkpointing on); the
last for GRPO only (the resident reference copy trajtune's KL log held before issue 38)"""
PAIRS = (("off", "trajtune", "TRL, checkpointing off"), ("on", "trajtune, checkpointing", "TRL"))
"""--model's table: (gradient checkpointing, trajtune's variant, TRL's variant)"""


def _rss(field: str) -> int:
    """`field` (VmRSS, VmHWM) of this process from /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def child(variant: str, kind: str, model_dir: Path, d: Path, real: bool = False) -> dict:
    """One measurement (in its own process): the peak RSS of one optimizer step (real: a --model variant)."""
    import torch

    torch.manual_seed(0)
    w = vs_trl.Workload(**{**WORKLOAD.__dict__, "batch": DPO_PAIRS if kind == "DPO" else WORKLOAD.batch})
    # import and load everything the step needs first, so the peak measured is the step's
    import trajtune.algorithms.rl  # noqa: F401
    import trl  # noqa: F401

    options = (REAL if real else VARIANTS)[variant] or {}
    if variant.startswith("TRL"):
        run = lambda: vs_trl.run_trl(kind, model_dir, d, 0, d / f"trl-{kind}", w, **options)  # noqa: E731
    else:
        run = lambda: vs_trl.run_trajtune(kind, model_dir, d, 0, w, **options)  # noqa: E731
    base = _rss("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    run()
    peak = _rss("VmHWM")
    return {"variant": variant, "kind": kind, "peak": peak, "base": base}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", nargs="+", default=["SFT", "DPO", "GRPO"])
    ap.add_argument("--model", default=None,
                    help="a real model (module docstring): folder, smollm2-135m, hub id, .gguf")
    ap.add_argument("--child", nargs=4, metavar=("VARIANT", "KIND", "MODEL", "DATA"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        variant, kind, model, data = args.child
        print("RESULT " + json.dumps(child(variant, kind, Path(model), Path(data), real=bool(args.model))), flush=True)
        return 0
    from trajtune.models.hf import load_tokenizer
    from trajtune.models.hf_random import make_random_model

    import torch
    import transformers
    import trl

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, CPU fp32; "
          "load average (1, 5, 15 min) " + ", ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    results = {}
    variants = list(REAL) if args.model else list(VARIANTS)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        if args.model:
            model_dir = vs_trl.resolve(args.model)
        else:
            model_dir = make_random_model(d / "model", "llama", "tiny", padded_vocab=VOCAB, overrides=BODY,
                                          max_positions=WORKLOAD.max_length)
        vs_trl.write_data(d, tokenizer=load_tokenizer(model_dir), sft_tokens=SFT_TOKENS)
        # DPO: the data set is the step's 4 pairs, so trajtune's reference pass (over the whole set, once)
        # covers the same rows as TRL's per-step reference forward
        dpo = (d / "dpo.jsonl").read_text().splitlines()[:DPO_PAIRS]
        (d / "dpo.jsonl").write_text("\n".join(dpo) + "\n")
        for kind in args.kinds:
            for variant in variants:
                if variant == "trajtune, log_kl copy" and kind != "GRPO":
                    continue
                cmd = [sys.executable, __file__, "--child", variant, kind, str(model_dir), str(d),
                       *(["--model", args.model] if args.model else [])]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
                if proc.returncode or not line:  # e.g. out of memory: the row says so, the others go on
                    why = proc.stderr.strip().splitlines()[-1:] or [f"killed (exit {proc.returncode}), out of memory?"]
                    print(f"{kind:<5} {variant:<23} failed: {why[0][:200]}", flush=True)
                    results[kind, variant] = None
                    continue
                r = json.loads(line[0][len("RESULT "):])
                results[kind, variant] = r
                print(f"{kind:<5} {variant:<28} peak RSS {r['peak'] / 2**20:7.0f} MiB "
                      f"(+{(r['peak'] - r['base']) / 2**20:.0f} MiB over the {r['base'] / 2**20:.0f} MiB before the "
                      "step)",
                      flush=True)
    print("load average (1, 5, 15 min) " + ", ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    gib = lambda x: f"{x / 2**30:.2f}"  # noqa: E731
    if args.model:
        real_table(results, args.kinds, model_dir, gib)
        return 0
    print("\n| method | trajtune peak RSS (GiB) | trajtune, chunking off | TRL 1.16 | trajtune / TRL |"
          "\n|---|---|---|---|---|")
    for kind in args.kinds:
        a, off, b = (results[kind, v]["peak"] if results[kind, v] else None for v in VARIANTS)
        cells = [gib(x) if x else "failed" for x in (a, off, b)]
        print(f"| {kind} | {' | '.join(cells)} | {f'{a / b:.2f}' if a and b else '-'} |")
    return 0


def real_table(results: dict, kinds: list[str], model_dir: Path, gib) -> None:
    """--model's table: each checkpointing setting's peaks, the fixed part (16 bytes a parameter) and the rest."""
    from trajtune.models.hf import load_policy

    n = load_policy(model_dir).num_parameters()
    fixed = 16 * n
    print(f"\n{n:,} parameters: fixed part (weights, gradients, AdamW's two moments in fp32) {gib(fixed)} GiB\n")
    print("| method | gradient checkpointing | trajtune peak (GiB) | TRL peak (GiB) | trajtune / TRL | trajtune above "
          "the "
          "fixed part | TRL above it | trajtune / TRL above it |\n|---|---|---|---|---|---|---|---|")
    for kind in kinds:
        for setting, ours, theirs in PAIRS:
            a, b = (results.get((kind, v)) for v in (ours, theirs))
            if not a or not b:
                print(f"| {kind} | {setting} | {gib(a['peak']) if a else 'failed'} | "
                      f"{gib(b['peak']) if b else 'failed'} "
                      "| - | - | - | - |")
                continue
            pa, pb = a["peak"], b["peak"]
            print(f"| {kind} | {setting} | {gib(pa)} | {gib(pb)} | {pa / pb:.2f} | {gib(pa - fixed)} | "
                  f"{gib(pb - fixed)} "
                  f"| {(pa - fixed) / (pb - fixed):.2f} |")
    old = results.get(("GRPO", "trajtune, log_kl copy"))
    if old:
        print(f"\nGRPO with the old KL log (log_kl copy, checkpointing off): {gib(old['peak'])} GiB")


if __name__ == "__main__":
    sys.exit(main())
