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
    generators: Sequence[torch.Generator] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose one token per row. logits [B, V] -> (tokens [B] long, logprobs [B] float).

    `generators` (one per row, replaces `generator`): row b draws from `generators[b]` alone, the
    token `torch.multinomial(probs[b:b+1], 1, generator=generators[b])` would draw. That is how
    torch draws one sample, as an exponential race: argmax(probs / q) with q ~ Exp(1) drawn from the
    generator, [V] per row (tests/test_sampling.py checks the two agree). Drawing q row by row and
    the race batched keeps each row's stream its own without B separate softmaxes.
    """
    logits = logits.float()
    scaled = logits if greedy or temperature == 1.0 else logits / temperature
    logp = torch.log_softmax(scaled, dim=-1)  # [B, V]
    if greedy:
        tok = logits.argmax(-1)
    else:
        probs = torch.softmax(filter_logits(scaled, top_k, top_p), dim=-1)  # [B, V]
        if generators is None:
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        else:
            if len(generators) != probs.shape[0]:
                raise ValueError(f"pick_next: {len(generators)} generators for {probs.shape[0]} rows")
            q = torch.empty_like(probs)  # [B, V] Exp(1) noise, row b from generators[b]
            for row, g in zip(q, generators, strict=True):
                row.exponential_(generator=g)
            tok = (probs / q).argmax(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


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
) -> Samples:
    """Sample continuations of `prompts` (lists of token ids, any lengths).

    Seeded by `generator` (same seed, same samples). `greedy=True` takes the argmax
    and ignores temperature/top-k/top-p. `use_cache=False` recomputes the whole
    sequence at every step (only for benchmarks and tests; same results).
    `generators` (one CPU generator per prompt, replaces `generator`): each row draws
    from its own stream, and only while it is unfinished, so a row's samples do not
    depend on which other rows share its batch (sharded rollouts, trajtune.distributed).

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
    cache = model.new_cache(B, P + max_new_tokens) if use_cache else None
    logits = model(ids, attention_mask=real, cache=cache)[:, -1]  # [B, V]
    steps = 0
    for step in range(max_new_tokens):
        active = ~done  # [B] rows still sampling: this step's token is theirs
        if generators is None:
            tok, lp = pick_next(logits, generator, temperature, top_k, top_p, greedy)
        else:
            tok, lp = _pick_per_row(logits, generators, active, temperature, top_k, top_p, greedy)
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


def _pick_per_row(logits, generators, active, temperature, top_k, top_p, greedy) -> tuple[torch.Tensor, torch.Tensor]:
    """`pick_next` on the unfinished rows (`active` [B]), row b with `generators[b]` (drawn on CPU).
    logits [B, V] -> (tokens [B], logprobs [B]); finished rows get token 0, log-prob 0."""
    rows = active.nonzero().flatten()  # [A]
    tok = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    lp = torch.zeros(logits.shape[0], device=logits.device)
    if len(rows):
        t, l = pick_next(logits[rows].cpu(), None, temperature, top_k, top_p, greedy,
                         generators=None if greedy else [generators[b] for b in rows.tolist()])
        tok[rows], lp[rows] = t.to(tok.device), l.to(lp.device)
    return tok, lp
