"""Tokens/s of the KV-cached sampler vs recomputing the whole sequence every step.

The recompute baseline is what a minimal sampler does (seed post-training ch.13,
`sample`): run the model on prompt + everything generated so far, take the last
logits, repeat. Both samplers run side by side in one process on the same model,
prompts and seed, and must produce identical tokens.

    python benchmarks/sampling.py                 # batch 64, 16/64/256 new tokens
    python benchmarks/sampling.py --lengths 16 64 --repeats 1
"""

from __future__ import annotations

import argparse
import time

import torch

from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.sampling import sample


def timed(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2, help="runs per cell; the fastest counts")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = TinyTransformer(TinyConfig(vocab_size=300, dim=args.dim, n_layers=args.layers, n_heads=4, max_len=512)).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 300, (int(n),), generator=g).tolist() for n in torch.randint(8, 25, (args.batch,), generator=g)]
    print(f"TinyTransformer dim={args.dim} layers={args.layers} ({model.num_parameters():,} params), "
          f"batch {args.batch}, prompts 8-24 tokens, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'new tokens':>10} | {'KV cache tok/s':>14} | {'recompute tok/s':>15} | {'speed-up':>8}")
    print(f"{'-' * 10}-+-{'-' * 14}-+-{'-' * 15}-+-{'-' * 8}")
    for n in args.lengths:
        kw = dict(max_new_tokens=n, temperature=1.0)
        t_cache, a = timed(lambda: sample(model, prompts, generator=torch.Generator().manual_seed(1), **kw), args.repeats)
        t_full, b = timed(lambda: sample(model, prompts, generator=torch.Generator().manual_seed(1), use_cache=False, **kw), args.repeats)
        assert a.tokens == b.tokens, "cached and recomputed sampling disagree"
        toks = sum(len(t) for t in a.tokens)
        print(f"{n:>10} | {toks / t_cache:>14,.0f} | {toks / t_full:>15,.0f} | {t_full / t_cache:>7.1f}x", flush=True)


if __name__ == "__main__":
    main()
