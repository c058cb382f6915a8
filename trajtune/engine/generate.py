"""Hugging Face `generate` as a decoding backend of `Engine.sample` (`backend="generate"`).

`generate(policy, prompts, max_new_tokens, generator, ...)` has the signature of the built-in sampler
(`decoding.sample(model, prompts, ...)`) and returns the same data: new token ids (a stop token, if produced,
last), the log-prob of each under the distribution it was drawn from (logits / temperature, truncated by top-k /
top-p and renormalised: `decoding.Samples`), and whether the row stopped. So
rollouts, RL and rejection sampling do not care which one ran:

    engine.sample(prompts, n, g, backend="sampler")    trajtune's batched KV-cached sampler (the default)
    engine.sample(prompts, n, g, backend="generate")   `model.generate` of the wrapped HF model (HFPolicy only)

The engine runs either in eval mode under its collective's `full_parameters`. A vLLM backend would be a third
entry with the same signature.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .decoding import Samples


@torch.no_grad()
def generate(policy: torch.nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int,
             generator: torch.Generator | None = None, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             greedy: bool = False, stop_ids: Sequence[int] = (), pad_id: int = 0) -> Samples:
    """Sample continuations of `prompts` with `policy.model.generate` (a `trajtune.models.hf.HFPolicy`): the
    prompts left-padded with `pad_id` into ids [B, P], sampling (or greedy), and the log-probs of the tokens
    drawn, as the built-in sampler's (`decoding.Samples`): when sampling, the log-softmax of `generate`'s scores
    (`output_scores`: the logits after its processors -- temperature, top-k, top-p and whatever the model's
    generation config adds -- the distribution `generate` drew from; -inf where cut). Without a filter that is
    log_softmax(logits / temperature), the same floats as before (HF divides as we do; at temperature 1 the
    scores are the raw logits). Greedy records log_softmax of the raw logits, as the sampler does (its scores
    could hold processors' -inf, and no distribution was drawn from).

    Seeding: one seed is drawn from `generator` per call and `generate` runs under `torch.random.fork_rng`
    seeded with it, so the same generator state gives the same samples (`generate` draws from the global RNG).
    The caller sets eval mode (`Engine.sample` does).
    """
    model: Any = getattr(policy, "model", None)
    if not callable(getattr(model, "generate", None)):
        raise ValueError(f'sample: backend="generate" needs a Hugging Face model (trajtune.models.hf.HFPolicy, whose '
                         f'.model has `generate`), not a {type(policy).__name__}; use backend="sampler"')
    if not prompts:
        return Samples([], [], [])
    device = next(policy.parameters()).device
    B, P = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, P), pad_id, dtype=torch.long, device=device)  # [B, P] left-padded
    mask = torch.zeros((B, P), dtype=torch.long, device=device)  # [B, P] 1 on real tokens
    for b, p in enumerate(prompts):
        ids[b, P - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
        mask[b, P - len(p):] = 1
    seed = int(torch.randint(0, 2**62, (1,), generator=generator)) if generator is not None else 0
    with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device]):
        torch.manual_seed(seed)
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, min_new_tokens=0,
            do_sample=not greedy, temperature=None if greedy else temperature, top_k=top_k or None,
            top_p=top_p if top_p < 1.0 else None, eos_token_id=list(stop_ids) or None, pad_token_id=pad_id,
            output_logits=greedy, output_scores=not greedy, return_dict_in_generate=True, use_cache=True,
        )
    new = out.sequences[:, P:]  # [B, n]
    # greedy: the raw logits (before processors); sampling: the scores drawn from (after them)
    scores = torch.stack(out.logits if greedy else out.scores, 1).float()  # [B, n, V]
    lp = torch.log_softmax(scores, -1).gather(-1, new[..., None]).squeeze(-1)  # [B, n]
    stop = set(int(s) for s in stop_ids)
    tokens, logprobs, stopped = [], [], []
    for b in range(B):
        row = new[b].tolist()
        n = next((i + 1 for i, t in enumerate(row) if t in stop), len(row))
        tokens.append(row[:n])
        logprobs.append(lp[b, :n].tolist())
        stopped.append(n > 0 and row[n - 1] in stop)
    return Samples(tokens, logprobs, stopped)
