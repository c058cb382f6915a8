"""Generation backends behind one interface: the built-in sampler and Hugging Face `generate`.

A backend is a callable with the `rollout.Sampler` signature

    backend(prompts: list[list[int]], max_new_tokens, generator, *, temperature, top_k, top_p,
            greedy, stop_ids, pad_id?) -> sampling.Samples

returning new token ids (a stop token, if produced, last), the log-prob of each
under the temperature-scaled model distribution, and whether the row stopped.
Both backends return the same data for the same model, so rollouts, RL and
rejection sampling do not care which one runs:

    make_backend("sampler", engine)    trajtune's batched KV-cached sampler (engine.sample)
    make_backend("generate", engine)   `model.generate` of the wrapped HF model (HFPolicy only)

A vLLM backend would be a third entry with the same signature.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .decoding import Samples


class HFGenerate:
    """`transformers` `generate` as a backend: left-padded prompts, sampling (or greedy),
    raw logits turned into the same temperature-scaled log-probs as the built-in sampler.

    Seeding: one seed is drawn from `generator` per call and `generate` runs under
    `torch.random.fork_rng` seeded with it, so the same generator state gives the same samples
    (`generate` draws from the global RNG).
    """

    def __init__(self, policy, pad_id: int):
        self.policy = policy
        self.pad_id = pad_id

    @torch.no_grad()
    def __call__(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, generator: torch.Generator | None = None,
                 *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, greedy: bool = False,
                 stop_ids: Sequence[int] = (), pad_id: int | None = None) -> Samples:
        if not prompts:
            return Samples([], [], [])
        pad = self.pad_id if pad_id is None else pad_id
        model = self.policy.model
        device = next(self.policy.parameters()).device
        B, P = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((B, P), pad, dtype=torch.long, device=device)
        mask = torch.zeros((B, P), dtype=torch.long, device=device)
        for b, p in enumerate(prompts):
            ids[b, P - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
            mask[b, P - len(p):] = 1
        seed = int(torch.randint(0, 2**62, (1,), generator=generator)) if generator is not None else 0
        was = self.policy.training
        self.policy.eval()
        try:
            with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device]):
                torch.manual_seed(seed)
                out = model.generate(
                    input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, min_new_tokens=0,
                    do_sample=not greedy, temperature=None if greedy else temperature, top_k=top_k or None,
                    top_p=top_p if top_p < 1.0 else None, eos_token_id=list(stop_ids) or None, pad_token_id=pad,
                    output_logits=True, return_dict_in_generate=True, use_cache=True,
                )
        finally:
            self.policy.train(was)
        new = out.sequences[:, P:]  # [B, n]
        logits = torch.stack(out.logits, 1).float()  # [B, n, V] raw (before processors)
        scaled = logits if greedy or temperature == 1.0 else logits / temperature
        lp = torch.log_softmax(scaled, -1).gather(-1, new[..., None]).squeeze(-1)  # [B, n]
        stop = set(int(s) for s in stop_ids)
        tokens, logprobs, stopped = [], [], []
        for b in range(B):
            row = new[b].tolist()
            n = next((i + 1 for i, t in enumerate(row) if t in stop), len(row))
            tokens.append(row[:n])
            logprobs.append(lp[b, :n].tolist())
            stopped.append(n > 0 and row[n - 1] in stop)
        return Samples(tokens, logprobs, stopped)


def make_backend(name: str, engine, pad_id: int = 0):
    """The sampler callable for `name` ("sampler" or "generate") on `engine.model`."""
    if name == "sampler":
        return engine.sample
    if name == "generate":
        if not hasattr(engine.model, "model") or not hasattr(engine.model.model, "generate"):
            raise ValueError("backend 'generate' needs a Hugging Face model (trajtune.models.hf.HFPolicy)")
        return HFGenerate(engine.model, pad_id)
    raise ValueError(f"unknown generation backend {name!r}; choose 'sampler' or 'generate'")
