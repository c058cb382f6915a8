"""vLLM as a `trajtune.sources.sampler.WeightSampler`: `VLLMSampler(client, settings)` over a colocated engine or
servers (`clients.VLLMEngine`).

Every row is one request with its own seed (one draw of the row's generator, or of the call's), so an episode's
tokens depend on its seed and the weights, not on the batch. The log-prob recorded for a token is vLLM's
`processed_logprobs`: under the distribution it was drawn from (temperature, top-k, top-p), the convention of
the built-in sampler and HF `generate` (`trajtune.engine.decoding.Samples`). Greedy is temperature 0. `draw` and
`share_prompts` are the built-in sampler's and mean nothing here (vLLM draws its own way and always shares
prefixes)."""

from __future__ import annotations

from typing import Sequence

import torch

from ...engine.decoding import Samples
from ..sampler import Fingerprints, SamplerSettings, Seeds
from .clients import Request, VLLMEngine


class VLLMSampler:
    """Samples with vLLM (`client`: `clients.Colocated` or `clients.Servers`) under `settings`; loads weights
    (a safetensors file in checkpoint names) and LoRA adapters, and answers its log-probs of rows."""

    def __init__(self, client: VLLMEngine, settings: SamplerSettings = SamplerSettings()):
        self.client, self._settings = client, settings

    @property
    def settings(self) -> SamplerSettings:
        return self._settings

    def sample(self, prompts: Sequence[Sequence[int]], stop_ids: Sequence[int], seeds: Seeds, *,
               max_new_tokens: int | None = None) -> Samples:
        """`max_new_tokens`: this call's budget instead of the settings' (a partial rollout's cut, resubmitted with
        the tokens so far in the prompt: `trajtune.sources.partial`)."""
        s = self._settings
        gens = [seeds] * len(prompts) if seeds is None or isinstance(seeds, torch.Generator) else list(seeds)
        if len(gens) != len(prompts):
            raise ValueError(f"sample: {len(gens)} generators for {len(prompts)} prompts")
        row_seeds = [int(torch.randint(0, 2**62, (1,), generator=g)) for g in gens]
        stops = [int(t) for t in stop_ids]
        budget = s.max_new_tokens if max_new_tokens is None else max_new_tokens
        requests = [Request(list(p), budget, seed, 0.0 if s.greedy else s.temperature,
                            0 if s.greedy else s.top_k, 1.0 if s.greedy else s.top_p, stops)
                    for p, seed in zip(prompts, row_seeds, strict=True)]
        return self.client.sample(requests) if requests else Samples([], [], [])

    def load(self, weights: str) -> list[Fingerprints]:
        """Load the safetensors file `weights` in place (every engine; the prefix cache dropped) -> per engine, the
        fingerprints of the tensors it loaded."""
        return [{k: (int(v[0]), int(v[1]), int(v[2])) for k, v in got.items()}
                for got in self.client.load_weights(weights)]

    def load_adapter(self, path: str) -> None:
        """Serve the LoRA adapter saved in directory `path` (peft's format) on the base model from now on."""
        self.client.load_adapter(path)

    def logprobs(self, rows: Sequence[Sequence[int]]) -> list[list[float]]:
        return self.client.prompt_logprobs(rows)

    def close(self) -> None:
        self.client.close()
