"""Tokens/s of trajtune's KV-cached sampler: vs recomputing the whole sequence, and vs HF `generate`.

Table 1 (TinyTransformer): the recompute baseline is what a minimal sampler does (seed
post-training ch.13, `sample`): run the model on prompt + everything generated so far, take
the last logits, repeat. Both run side by side in one process on the same model, prompts and
seed, and must produce identical tokens.

Table 2 (random Llama, the sizes of benchmarks/vs_trl.py, nothing downloaded):
`trajtune.engine.decoding.sample` through the `HFPolicy` adapter (what `trajtune grpo` runs) vs the
model's own `generate(do_sample=True)` (what TRL's GRPOTrainer runs without vLLM), same prompts,
same number of new tokens (no stop token, so both write every token), plus the `generate`
backend of trajtune.engine.generate (generate + the behaviour log-probs RL needs). Ratios > 1: trajtune faster.

    python benchmarks/sampling.py                 # table 1: batch 64, 16/64/256 new tokens; table 2
    python benchmarks/sampling.py --lengths 16 64 --repeats 1 --hf-sizes tiny
    python benchmarks/sampling.py --hf-sizes       # table 1 only
    python benchmarks/sampling.py --threads 1 --clock cpu   # on a busy machine: CPU seconds, one thread
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time

import torch

from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.engine.decoding import sample


CLOCK = time.perf_counter


def timed(fn, repeats: int):
    """(fastest seconds of `repeats` calls on CLOCK, the last result)."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = CLOCK()
        out = fn()
        best = min(best, CLOCK() - t0)
    return best, out


def tiny_table(args) -> None:
    torch.manual_seed(0)
    model = TinyTransformer(TinyConfig(vocab_size=300, dim=args.dim, n_layers=args.layers, n_heads=4,
                                       max_len=512)).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 300, (int(n),), generator=g).tolist() for n in torch.randint(8, 25, (args.batch,),
                                                                                             generator=g)]
    print(f"TinyTransformer dim={args.dim} layers={args.layers} ({model.num_parameters():,} params), "
          f"batch {args.batch}, prompts 8-24 tokens")
    print(f"{'new tokens':>10} | {'KV cache tok/s':>14} | {'recompute tok/s':>15} | {'speed-up':>8}")
    print(f"{'-' * 10}-+-{'-' * 14}-+-{'-' * 15}-+-{'-' * 8}")
    for n in args.lengths:
        kw = dict(max_new_tokens=n, temperature=1.0)
        t_cache, a = timed(lambda: sample(model, prompts, generator=torch.Generator().manual_seed(1), **kw),
                           args.repeats)
        t_full, b = timed(lambda: sample(model, prompts, generator=torch.Generator().manual_seed(1), use_cache=False,
                                         **kw), args.repeats)
        assert a.tokens == b.tokens, "cached and recomputed sampling disagree"
        toks = sum(len(t) for t in a.tokens)
        print(f"{n:>10} | {toks / t_cache:>14,.0f} | {toks / t_full:>15,.0f} | {t_full / t_cache:>7.1f}x", flush=True)


def hf_table(args) -> None:
    from trajtune.engine.generate import generate as hf_generate
    from trajtune.models.hf import load_policy
    from trajtune.models.hf_random import make_random_model

    print(f"\nrandom Llama (benchmarks/vs_trl.py sizes), batch {args.hf_batch}, prompts 8-24 tokens, "
          "sampling at temperature 1, no stop token")
    print(f"{'size':>5} | {'new':>4} | {'trajtune tok/s':>14} | {'HF generate tok/s':>17} | {'ratio':>6} | "
          f"{'backend generate tok/s':>22} | {'ratio':>6}")
    print(f"{'-' * 5}-+-{'-' * 4}-+-{'-' * 14}-+-{'-' * 17}-+-{'-' * 6}-+-{'-' * 22}-+-{'-' * 6}")
    with tempfile.TemporaryDirectory(prefix="bench-sampling-") as d:
        for size in args.hf_sizes:
            policy = load_policy(make_random_model(f"{d}/{size}", "llama", size)).eval()
            model, V = policy.model, policy.base_config.vocab_size
            g = torch.Generator().manual_seed(0)
            prompts = [torch.randint(3, V, (int(n),), generator=g).tolist()
                       for n in torch.randint(8, 25, (args.hf_batch,), generator=g)]
            P = max(len(p) for p in prompts)
            ids = torch.tensor([[0] * (P - len(p)) + p for p in prompts])
            mask = (torch.arange(P)[None] >= torch.tensor([P - len(p) for p in prompts])[:, None]).long()
            backend = functools.partial(hf_generate, policy, pad_id=0)

            def generate(n):
                torch.manual_seed(1)
                with torch.inference_mode():
                    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                          do_sample=True, temperature=1.0, top_k=None, top_p=None, pad_token_id=0)

            for n in args.hf_lengths:
                t_ours, ours = timed(lambda: sample(policy, prompts, n, torch.Generator().manual_seed(1)), args.repeats)
                t_hf, out = timed(lambda: generate(n), args.repeats)
                t_be, be = timed(lambda: backend(prompts, n, torch.Generator().manual_seed(1)), args.repeats)
                toks = sum(len(t) for t in ours.tokens)
                assert toks == args.hf_batch * n and out.shape[1] - P == n and sum(len(t) for t in be.tokens) == toks
                print(f"{size:>5} | {n:>4} | {toks / t_ours:>14,.0f} | {toks / t_hf:>17,.0f} | {t_hf / t_ours:>5.2f}x "
                      "| "
                      f"{toks / t_be:>22,.0f} | {t_be / t_ours:>5.2f}x", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lengths", type=int, nargs="*", default=[16, 64, 256], help="table 1 (none: skip it)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hf-sizes", nargs="*", default=["tiny", "small"], help="table 2's Llama sizes (none: skip it)")
    ap.add_argument("--hf-batch", type=int, default=64, help="table 2: 8 prompts x 8 completions, as vs_trl's GRPO")
    ap.add_argument("--hf-lengths", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--repeats", type=int, default=2, help="runs per cell; the fastest counts")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: CPU seconds of this process (with --threads 1, robust to other jobs on the machine)")
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.clock} clock")
    if args.lengths:
        tiny_table(args)
    if args.hf_sizes:
        hf_table(args)


if __name__ == "__main__":
    main()
