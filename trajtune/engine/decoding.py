"""Batched autoregressive sampling with a KV cache.

Prompts of different lengths are left-padded into one batch, prefilled once,
then every step feeds one new token per row through the cache. Finished rows
(stop token or budget) keep riding along as padding that nobody attends to, so
there is no per-row Python loop in the hot path.

Model contract: `model(ids [B,t], attention_mask=[B,t], cache=cache) -> logits [B,t,V]`
and `model.new_cache(batch_size, max_len)`, a cache with `select_rows(index [B'])` for
`share_prompts`; `TinyTransformer` and the Hugging Face adapter both provide them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

DRAWS = ("race", "cdf")
"""`pick_next(draw=)`: how a token is drawn from a row's distribution"""
LOGPROBS = ("processed", "raw")
"""`pick_next(logprobs=)`: which distribution a drawn token's log-prob is of (`Samples`)"""


@dataclass
class Samples:
    """What the sampler returns, one entry per prompt.

    tokens:   the new token ids (a stop token, if one was produced, is included last)
    logprobs: log-prob of each new token under the distribution it was drawn from: the model's
              logits / temperature, truncated by top-k / top-p and renormalised (without a filter,
              log softmax(logits / T); greedy: log softmax(logits), at temperature 1). The trainer's
              policy is softmax(logits / T) at the batch's temperature (`Trajectory.temperature`), so
              the importance weight pi_T / mu corrects for the truncation, a sampling-only choice.
              `logprobs="raw"` records instead the full softmax's log-prob of the drawn token, log softmax(logits
              / T), before top-k / top-p (vLLM's raw_logprobs): what the trainer computes, so the cut is hidden
              from a correction; the tokens drawn are the same
    stopped:  True if the row ended with a stop token, False if it ran out of budget
    """

    tokens: list[list[int]]
    logprobs: list[list[float]]
    stopped: list[bool]


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Mask logits outside the top-k and the top-p nucleus with -inf.

    logits [B, V] -> [B, V]. top_k=0 and top_p=1.0 disable each filter. The most
    likely token always survives.
    """
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass strictly before it already reaches top_p
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def pick_next(
    logits: torch.Tensor,
    generator: torch.Generator | None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool = False,
    generators: Sequence[torch.Generator] | None = None,
    draw: str = "race",
    logprobs: str = "processed",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose one token per row. logits [B, V] -> (tokens [B] long, logprobs [B] float).

    logprobs: "processed" -- of the distribution drawn from (truncated by top-k / top-p, renormalised); "raw" --
    of the full log softmax(logits / temperature) (`Samples`; the same tokens, the same random numbers used).

    draw: how a token is drawn from the row's distribution (both exact in distribution; `DRAWS`):
      "race"  the token `torch.multinomial(probs, 1)` draws (and so HF `generate`): an exponential race,
              argmax(probs / q) with q ~ Exp(1), V random numbers per row. Their generation is serial on a
              CPU: 30-45 ms per [64, 16384] pick on one core, 420-440 ms at Qwen's 151,936 tokens, more than
              a small model's decode step (benchmarks/vs_trl.py --draw).
      "cdf"   inverse CDF: one uniform per row, searched for in blocks of the row's cumulative
              probabilities (`_pick_cdf`): ~3 ms per [64, 16384], ~90 ms at 151,936. From the same seed it
              draws other tokens than "race".
    `generators` (one per row, replaces `generator`): row b draws from `generators[b]` alone, the
    token `pick_next(logits[b:b+1], generators[b], draw=draw)` draws (tests/loops/test_sampling.py); for "race"
    that is `torch.multinomial(probs[b:b+1], 1, generator=generators[b])`. Drawing q (or u) row by row and
    the race batched keeps each row's stream its own without B separate softmaxes.
    """
    if draw not in DRAWS:
        raise ValueError(f"pick_next: draw must be one of {DRAWS}, got {draw!r}")
    if logprobs not in LOGPROBS:
        raise ValueError(f"pick_next: logprobs must be one of {LOGPROBS}, got {logprobs!r}")
    logits = logits.float()
    scaled = logits if greedy or temperature == 1.0 else logits / temperature
    if generators is not None and not greedy and len(generators) != logits.shape[0]:
        raise ValueError(f"pick_next: {len(generators)} generators for {logits.shape[0]} rows")
    if logprobs == "raw" and not greedy and (top_k or top_p < 1.0):  # the draw as processed, the full log-prob
        tok, _ = pick_next(logits, generator, temperature, top_k, top_p, False, generators, draw)
        return tok, torch.log_softmax(scaled, dim=-1).gather(-1, tok[:, None]).squeeze(-1)
    if draw == "cdf" and not greedy:
        return _pick_cdf(scaled, top_k, top_p, generator, generators)
    if greedy:
        logp = torch.log_softmax(scaled, dim=-1)  # [B, V]
        tok = logits.argmax(-1)
    else:
        filtered = filter_logits(scaled, top_k, top_p) if top_k or top_p < 1.0 else scaled  # [B, V]
        logp = torch.log_softmax(filtered, dim=-1)  # [B, V] the distribution drawn from (-inf where cut)
        probs = torch.softmax(filtered, dim=-1)  # [B, V]
        if generators is None:
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        else:
            q = torch.empty_like(probs)  # [B, V] Exp(1) noise, row b from generators[b]
            for row, g in zip(q, generators, strict=True):
                row.exponential_(generator=g)
            tok = (probs / q).argmax(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


CDF_BLOCK = 1024
"""`draw="cdf"`: vocabulary entries per block of the two-level search"""


def _pick_cdf(scaled: torch.Tensor, top_k: int, top_p: float, generator: torch.Generator | None,
              generators: Sequence[torch.Generator] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`pick_next(draw="cdf")`: scaled logits [B, V] -> (tokens [B] long, logprobs [B] float).

    One pass of exp over the row (no softmax and log_softmax, no [B, V] float64 tensor):
    w = exp(scaled - max) are the unnormalised probabilities; top-k / top-p zero the cut entries of w before
    the draw, and the log-prob is scaled[token] - max - log(sum w), the sum after the cut (the truncated,
    renormalised distribution drawn from, as "race" reports it). The draw is two-level: u ~ U[0, 1)
    (float64, one per row, from `generators[b]` for row b when given), a block of `CDF_BLOCK` entries
    by the blocks' masses (float32 sums, accumulated in
    float64), then the entry within the block by its float64 cumulative sum: the first entry whose
    cumulative mass exceeds u x total, so an entry of mass 0 (cut by top-k / top-p) is never drawn.
    Block masses are as exact as the float32 probabilities they sum. A vocabulary of at most one block
    is searched in one level (its float64 cumulative sum)."""
    B, V = scaled.shape
    top = scaled.amax(-1, keepdim=True)  # [B, 1]
    w = torch.exp(scaled - top)  # [B, V] unnormalised probabilities
    if generators is None:
        u = torch.rand(B, 1, dtype=torch.float64, generator=generator,
                       device=torch.device("cpu") if generator is None else generator.device)
    else:
        u = torch.cat([torch.rand(1, dtype=torch.float64, generator=g) for g in generators])[:, None]
    below = lambda x: torch.nextafter(x, torch.zeros_like(x))  # noqa: E731  the largest float64 under x
    if V <= CDF_BLOCK:
        if top_k or top_p < 1.0:
            w = w.masked_fill(filter_logits(scaled, top_k, top_p) == float("-inf"), 0.0)
        cum = w.double().cumsum(-1)  # [B, V]
        log_z = top.squeeze(-1).double() + cum[:, -1].log()  # [B] log of the (truncated) normaliser
        total = cum[:, -1:]  # [B, 1]
        tok = torch.searchsorted(cum, torch.minimum(u.to(cum.device) * total, below(total)), right=True).squeeze(-1)
        return tok, (scaled.gather(-1, tok[:, None]).squeeze(-1).double() - log_z).float()
    n_full, K = V // CDF_BLOCK, CDF_BLOCK
    masses = torch.empty(B, n_full + (V % K > 0), dtype=torch.float64, device=w.device)  # [B, NB]

    def fill_masses(x: torch.Tensor) -> None:  # x [B, V] >= 0 -> masses of its blocks
        if n_full:
            masses[:, :n_full] = x.unfold(-1, K, K).sum(-1)
        if V % K:
            masses[:, n_full] = x[:, n_full * K:].sum(-1)

    if top_k or top_p < 1.0:
        w = w.masked_fill(filter_logits(scaled, top_k, top_p) == float("-inf"), 0.0)
    fill_masses(w)
    log_z = top.squeeze(-1).double() + masses.sum(-1).log()  # [B] log of the (truncated) normaliser
    cum = masses.cumsum(-1)  # [B, NB]
    total = cum[:, -1:]  # [B, 1]
    target = torch.minimum(u.to(cum.device) * total, below(total))  # [B, 1], < total
    block = torch.searchsorted(cum, target, right=True)  # [B, 1] the first block whose cumulative mass exceeds it
    rest = target - torch.where(block > 0, cum.gather(-1, (block - 1).clamp(min=0)), 0.0)  # [B, 1] mass left
    idx = block * K + torch.arange(K, device=w.device)  # [B, K] the block's entries
    inside = w.gather(-1, idx.clamp(max=V - 1)).double().masked_fill(idx >= V, 0.0).cumsum(-1)  # [B, K]
    rest = torch.minimum(rest, below(inside[:, -1:]))  # the two sums of the block round differently
    tok = (block * K + torch.searchsorted(inside, rest, right=True)).squeeze(-1)  # [B]
    logp = (scaled.gather(-1, tok[:, None]).squeeze(-1).double() - log_z).float()  # [B]
    return tok, logp


@torch.inference_mode()
def sample(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    generator: torch.Generator | None = None,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool = False,
    stop_ids: Sequence[int] = (),
    pad_id: int = 0,
    use_cache: bool = True,
    generators: Sequence[torch.Generator] | None = None,
    draw: str = "race",
    share_prompts: bool = False,
    logprobs: str = "processed",
) -> Samples:
    """Sample continuations of `prompts` (lists of token ids, any lengths).

    Seeded by `generator` (same seed, same samples). `greedy=True` takes the argmax
    and ignores temperature/top-k/top-p. `use_cache=False` recomputes the whole
    sequence at every step (only for benchmarks and tests; same results).
    `generators` (one CPU generator per prompt, replaces `generator`): each row draws
    from its own stream, and only while it is unfinished, so a row's samples do not
    depend on which other rows share its batch (sharded rollouts, trajtune.engine.distributed).
    `draw`: "race" (torch.multinomial's draw, as HF `generate`) or "cdf" (one random number per row
    instead of one per vocabulary entry: far faster with a large vocabulary on a CPU; `pick_next`).
    `share_prompts`: prefill each distinct prompt once and copy its cache rows to every row that repeats
    it (a GRPO group's G completions of one prompt: 1/G of the prefill). The same samples to float
    rounding only (a matmul's rounding depends on its row count), so it is off unless asked; a model
    whose cache has no `select_rows` prefills every row.
    `logprobs`: "processed" (of the truncated distribution drawn from) or "raw" (of the full softmax; `Samples`).

    Per new token the loop runs one model step on [B, 1], the pick, and a handful of
    [B] ops: a finished row keeps being fed (its attention mask False, so no later
    query sees it) and is cut to its stop token at the end, never per step.
    """
    if not prompts:
        return Samples([], [], [])
    if any(len(p) == 0 for p in prompts):
        raise ValueError("sample: every prompt needs at least one token (e.g. bos)")
    if generators is not None and len(generators) != len(prompts):
        raise ValueError(f"sample: {len(generators)} generators for {len(prompts)} prompts")
    if temperature <= 0 and not greedy:
        raise ValueError("sample: temperature must be > 0 (use greedy=True for argmax)")
    if draw not in DRAWS:
        raise ValueError(f"sample: draw must be one of {DRAWS}, got {draw!r}")
    if logprobs not in LOGPROBS:
        raise ValueError(f"sample: logprobs must be one of {LOGPROBS}, got {logprobs!r}")
    device = next(model.parameters()).device
    B, P = len(prompts), max(len(p) for p in prompts)
    # left padding: the last column is every row's last prompt token
    ids = torch.tensor([[pad_id] * (P - len(p)) + list(p) for p in prompts], dtype=torch.long, device=device)  # [B, P]
    lengths = torch.tensor([len(p) for p in prompts], device=device)  # [B]
    real = torch.arange(P, device=device)[None] >= (P - lengths)[:, None]  # [B, P]
    stop = torch.as_tensor(list(stop_ids), dtype=torch.long, device=device)  # [S]

    out_tok = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)  # [B, N]
    out_lp = torch.zeros((B, max_new_tokens), device=device)  # [B, N]
    done = torch.zeros(B, dtype=torch.bool, device=device)  # [B] a stop token was sampled
    if use_cache:
        cache, logits = _prefill(model, ids, real, prompts, P + max_new_tokens, share_prompts)  # logits [B, V]
    else:
        cache, logits = None, model(ids, attention_mask=real)[:, -1]  # [B, V]
    steps = 0
    for step in range(max_new_tokens):
        active = ~done  # [B] rows still sampling: this step's token is theirs
        if generators is None:
            tok, lp = pick_next(logits, generator, temperature, top_k, top_p, greedy, draw=draw, logprobs=logprobs)
        else:
            tok, lp = _pick_per_row(logits, generators, active, temperature, top_k, top_p, greedy, draw, logprobs)
        out_tok[:, step] = tok
        out_lp[:, step] = lp
        steps = step + 1
        if len(stop):
            done |= (tok == stop[0]) if len(stop) == 1 else torch.isin(tok, stop)
        if step == max_new_tokens - 1 or (len(stop) and bool(done.all())):
            break
        if use_cache:
            logits = model(tok[:, None], attention_mask=active[:, None], cache=cache)[:, -1]
        else:
            ids = torch.cat([ids, tok[:, None]], 1)
            real = torch.cat([real, active[:, None]], 1)
            logits = model(ids, attention_mask=real)[:, -1]

    # each row ends at its first stop token (kept), or at the budget
    hit = torch.isin(out_tok[:, :steps], stop) if len(stop) else torch.zeros((B, steps), dtype=torch.bool)  # [B, n]
    stopped = hit.any(-1)  # [B]
    n_new = torch.where(stopped, hit.long().argmax(-1) + 1, steps).tolist()
    tokens_rows, lp_rows = out_tok[:, :steps].tolist(), out_lp[:, :steps].tolist()
    return Samples([row[:n] for row, n in zip(tokens_rows, n_new, strict=True)],
                   [row[:n] for row, n in zip(lp_rows, n_new, strict=True)], stopped.tolist())


def _prefill(model, ids: torch.Tensor, real: torch.Tensor, prompts: Sequence[Sequence[int]], capacity: int,
             share: bool):
    """A new cache holding the left-padded prompts ids [B, P] (real [B, P]) -> (cache, logits of each row's
    last prompt token [B, V]). share: each distinct prompt runs once, then the cache's `select_rows` copies
    its rows to the rows that repeat it (every prompt length is still there, so P and the padding are
    unchanged)."""
    B = ids.shape[0]
    if share:
        slot_of: dict[tuple, int] = {}
        first: list[int] = []  # row of each distinct prompt's first occurrence
        slot: list[int] = []  # each row's distinct prompt
        for b, p in enumerate(prompts):
            key = tuple(p)
            if key not in slot_of:
                slot_of[key] = len(first)
                first.append(b)
            slot.append(slot_of[key])
        if len(first) < B:
            cache = model.new_cache(len(first), capacity)
            if hasattr(cache, "select_rows"):
                u = torch.tensor(first, device=ids.device)  # [U]
                logits = model(ids[u], attention_mask=real[u], cache=cache)[:, -1]  # [U, V]
                index = torch.tensor(slot, device=ids.device)  # [B] into the U distinct prompts
                cache.select_rows(index)
                return cache, logits.index_select(0, index)
    cache = model.new_cache(B, capacity)
    return cache, model(ids, attention_mask=real, cache=cache)[:, -1]


def _pick_per_row(logits, generators, active, temperature, top_k, top_p, greedy,
                  draw, logprobs="processed") -> tuple[torch.Tensor, torch.Tensor]:
    """`pick_next` on the unfinished rows (`active` [B]), row b with `generators[b]` (drawn on CPU).
    logits [B, V] -> (tokens [B], logprobs [B]); finished rows get token 0, log-prob 0."""
    rows = active.nonzero().flatten()  # [A]
    tok = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    lp = torch.zeros(logits.shape[0], device=logits.device)
    if len(rows):
        t, l = pick_next(logits[rows].cpu(), None, temperature, top_k, top_p, greedy,
                         generators=None if greedy else [generators[b] for b in rows.tolist()], draw=draw,
                         logprobs=logprobs)
        tok[rows], lp[rows] = t.to(tok.device), l.to(lp.device)
    return tok, lp
