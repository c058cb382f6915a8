"""The sampler seam (after tinker-cookbook's `TokenCompleter`): `Sampler`, `WeightSampler`, their settings, `Decoder`.

A `Sampler` is made with its settings (`SamplerSettings`: token budget, temperature, top-k, top-p, greedy, draw,
shared prompt prefill), fixed for its life; the episode loop (`rollout.rollout_batch`) only asks it for tokens:

    sampler.sample(prompts, stop_ids, seeds) -> Samples      prompts: token ids per row; seeds: one generator for
                                                             the call, or one per row (their own streams)

A sampler that holds its own copy of the weights (vLLM, colocated or served: `trajtune.sources.vllm`) is a
`WeightSampler`: it also answers `load(weights) -> fingerprints` (per engine it runs, of the tensors it loaded)
and `logprobs(rows)` (its log-probs of rows at temperature 1), the two halves of the one sync check
(`trajtune.sources.sync.SyncCheck`).

Implementations: `Decoder` (this module: the trainer's engine in this process, `engine.sample` with the
built-in KV-cached sampler or Hugging Face `generate`, or any function with `trajtune.engine.decoding.sample`'s
signature), `trajtune.sources.vllm.VLLMSampler` (vLLM, colocated or served); the sampler process
(`trajtune.sources.process.SamplerProcess`) runs a `Decoder` on its own copy of the weights.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Callable, Literal, Protocol, Sequence, Union

import torch

from ..config import check_choices
from ..engine.decoding import Samples
from ..engine.protocol import Backend

Seeds = Union[torch.Generator, Sequence[torch.Generator], None]
"""what a sampler draws from: one generator for the whole call, one per row (each row its own stream, so its
samples do not depend on the batch), or None (the global stream)"""
Fingerprints = dict[str, tuple[int, int, int]]
"""`trajtune.sources.sync.weight_fingerprints`: per tensor name, three int64 sums of its bytes"""


@dataclass(frozen=True)
class SamplerSettings:
    """How a sampler draws, fixed when it is made."""

    max_new_tokens: int = 16
    """token budget of one sampled action (a turn's reply)"""
    temperature: float = 1.0
    top_k: int = 0
    """the k most likely tokens only (0: off)"""
    top_p: float = 1.0
    """the nucleus of probability top_p (1.0: off)"""
    greedy: bool = False
    """take the argmax (temperature, top-k and top-p ignored)"""
    draw: Literal["race", "cdf"] = "race"
    """how the built-in sampler draws a token (`trajtune.engine.decoding.pick_next`)"""
    share_prompts: bool = False
    """the built-in sampler prefills each distinct prompt of a call once (`trajtune.engine.decoding.sample`)"""
    logprobs: Literal["processed", "raw"] = "processed"
    """the built-in sampler records the log-probs of the distribution it drew from (processed: after top-k / top-p)
    or of the full softmax (raw; `trajtune.engine.decoding.Samples`)"""
    weights_dtype: Literal["fp32", "bf16", "fp8"] = "fp32"
    """the precision of the weights the sampler process draws with: it rounds its copy of the trainer's fp32
    weights to bf16 or float8 (e4m3) and back after every load (`trajtune.sources.serve.round_weights`)"""

    def __post_init__(self) -> None:
        check_choices(self)

    @property
    def policy_temperature(self) -> float:
        """The temperature of the policy the samples' log-probs belong to (greedy: 1.0), what a Trajectory records."""
        return 1.0 if self.greedy else float(self.temperature)


class Sampler(Protocol):
    """Token ids in, token ids out, with the settings it was made with."""

    @property
    def settings(self) -> SamplerSettings: ...

    def sample(self, prompts: Sequence[Sequence[int]], stop_ids: Sequence[int], seeds: Seeds) -> Samples:
        """One continuation per prompt, each ending at its first stop token or at the token budget."""
        ...


class WeightSampler(Sampler, Protocol):
    """A sampler that holds its own copy of the policy's weights (synced and checked: `sync.SyncCheck`)."""

    def load(self, weights: str) -> list[Fingerprints]:
        """Load `weights` (a safetensors file of the policy's tensors under their checkpoint names) in place of the
        ones it holds -> per engine it runs, the fingerprints of the tensors it loaded."""
        ...

    def logprobs(self, rows: Sequence[Sequence[int]]) -> list[list[float]]:
        """log pi(row[t] | row[:t]) for t >= 1 at temperature 1, no truncation -> one list of len(row) - 1 per row."""
        ...


class Decoder:
    """A `Sampler` in this process: `decode` (`engine.sample`, `functools.partial(engine.sample, backend="generate",
    pad_id=...)` or `functools.partial(trajtune.engine.decoding.sample, model)`) with `settings`. `draw`,
    `share_prompts` and `logprobs` are passed only when they are not the defaults, so a decoder without them (HF
    `generate`) works."""

    def __init__(self, decode: Callable[..., Samples], settings: SamplerSettings = SamplerSettings()):
        self.decode, self._settings = decode, settings

    @property
    def settings(self) -> SamplerSettings:
        return self._settings

    def sample(self, prompts: Sequence[Sequence[int]], stop_ids: Sequence[int], seeds: Seeds, *,
               max_new_tokens: int | None = None) -> Samples:
        """`max_new_tokens`: this call's token budget instead of the settings' (an endpoint request's `max_tokens`,
        `trajtune.sources.endpoint`; as `SamplerProcess.sample` and the vLLM samplers take it)."""
        s = self._settings
        kw: dict[str, Any] = {}
        generator = seeds if seeds is None or isinstance(seeds, torch.Generator) else None
        if generator is None and seeds is not None:
            kw["generators"] = list(seeds)  # type: ignore[arg-type]
        if s.draw != "race":
            kw["draw"] = s.draw
        if s.share_prompts:
            kw["share_prompts"] = True
        if s.logprobs != "processed":
            kw["logprobs"] = s.logprobs
        budget = s.max_new_tokens if max_new_tokens is None else max_new_tokens
        return self.decode(prompts, budget, generator, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                           greedy=s.greedy, stop_ids=stop_ids, **kw)



def engine_sampler(engine: Any, settings: SamplerSettings, backend: Backend = "sampler", pad_id: int = 0) -> Decoder:
    """The trainer's engine as a `Sampler`: its KV-cached sampler, or (`backend="generate"`) Hugging Face
    `generate`, which draws as `torch.multinomial` and prefills every row (so `draw` / `share_prompts` are off)."""
    if backend == "generate":
        return Decoder(functools.partial(engine.sample, backend="generate", pad_id=pad_id),
                       replace(settings, draw="race", share_prompts=False))
    return Decoder(functools.partial(engine.sample, pad_id=pad_id) if pad_id else engine.sample, settings)
