"""Batched autoregressive sampling with a KV cache.

Prompts of different lengths are left-padded into one batch, prefilled once,
then every step feeds one new token per row through the cache. Finished rows
(stop token or budget) keep riding along as padding that nobody attends to, so
there is no per-row Python loop in the hot path.

Model contract: `model(ids [B,t], attention_mask=[B,t], cache=cache) -> logits [B,t,V]`
and `model.new_cache(batch_size, max_len)`; `TinyTransformer` and the Hugging Face
adapter both provide it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class Samples:
    """What the sampler returns, one entry per prompt.

    tokens:   the new token ids (a stop token, if one was produced, is included last)
    logprobs: log-prob of each new token under the temperature-scaled model
              distribution (before top-k/top-p truncation; at temperature 1 this is
              log pi(token), the behaviour log-prob RL needs)
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose one token per row. logits [B, V] -> (tokens [B] long, logprobs [B] float)."""
    logits = logits.float()
    scaled = logits if greedy or temperature == 1.0 else logits / temperature
    logp = torch.log_softmax(scaled, dim=-1)  # [B, V]
    if greedy:
        tok = logits.argmax(-1)
    else:
        probs = torch.softmax(filter_logits(scaled, top_k, top_p), dim=-1)
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


@torch.no_grad()
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
) -> Samples:
    """Sample continuations of `prompts` (lists of token ids, any lengths).

    Seeded by `generator` (same seed, same samples). `greedy=True` takes the argmax
    and ignores temperature/top-k/top-p. `use_cache=False` recomputes the whole
    sequence at every step (only for benchmarks and tests; same results).
    `generators` (one CPU generator per prompt, replaces `generator`): each row draws
    from its own stream, and only while it is unfinished, so a row's samples do not
    depend on which other rows share its batch (sharded rollouts, trajtune.distributed).
    """
    if not prompts:
        return Samples([], [], [])
    if any(len(p) == 0 for p in prompts):
        raise ValueError("sample: every prompt needs at least one token (e.g. bos)")
    if generators is not None and len(generators) != len(prompts):
        raise ValueError(f"sample: {len(generators)} generators for {len(prompts)} prompts")
    if temperature <= 0 and not greedy:
        raise ValueError("sample: temperature must be > 0 (use greedy=True for argmax)")
    device = next(model.parameters()).device
    B, P = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, P), pad_id, dtype=torch.long, device=device)
    real = torch.zeros((B, P), dtype=torch.bool, device=device)
    for b, p in enumerate(prompts):  # left padding: the last column is every row's last prompt token
        ids[b, P - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
        real[b, P - len(p) :] = True
    stop = torch.as_tensor(list(stop_ids), dtype=torch.long, device=device)

    out_tok = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)
    out_lp = torch.zeros((B, max_new_tokens), device=device)
    n_new = torch.zeros(B, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    stopped = torch.zeros(B, dtype=torch.bool, device=device)

    cache = model.new_cache(B, P + max_new_tokens) if use_cache else None
    logits = model(ids, attention_mask=real, cache=cache)[:, -1]  # [B, V]
    for step in range(max_new_tokens):
        if generators is None:
            tok, lp = pick_next(logits, generator, temperature, top_k, top_p, greedy)
        else:
            tok, lp = _pick_per_row(logits, generators, done, temperature, top_k, top_p, greedy)
        active = ~done
        tok = torch.where(active, tok, torch.full_like(tok, pad_id))
        out_tok[:, step] = tok
        out_lp[:, step] = torch.where(active, lp, torch.zeros_like(lp))
        n_new += active.long()
        hit = active & torch.isin(tok, stop) if len(stop) else torch.zeros_like(active)
        stopped |= hit
        done |= hit
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        if use_cache:
            logits = model(tok[:, None], attention_mask=active[:, None], cache=cache)[:, -1]
        else:
            ids = torch.cat([ids, tok[:, None]], 1)
            real = torch.cat([real, active[:, None]], 1)
            logits = model(ids, attention_mask=real)[:, -1]

    tokens, logprobs = [], []
    for b in range(B):
        n = int(n_new[b])
        tokens.append(out_tok[b, :n].tolist())
        logprobs.append(out_lp[b, :n].tolist())
    return Samples(tokens, logprobs, stopped.tolist())


def _pick_per_row(logits, generators, done, temperature, top_k, top_p, greedy) -> tuple[torch.Tensor, torch.Tensor]:
    """`pick_next` row by row, each unfinished row with its own generator (drawn on CPU). logits [B, V]."""
    tok = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    lp = torch.zeros(logits.shape[0], device=logits.device)
    for b in (~done).nonzero().flatten().tolist():
        t, l = pick_next(logits[b : b + 1].cpu(), generators[b], temperature, top_k, top_p, greedy)
        tok[b], lp[b] = t[0], l[0]
    return tok, lp
