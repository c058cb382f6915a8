"""A run's one sampling section: `SamplingConfig` -- which sampler, how it draws, where it runs, how far behind.

    backend            sampler (trajtune's KV-cached sampler) | generate (HF `generate`) | vllm
    max_new_tokens, temperature, top_k, top_p, draw, share_prompts
                       how an action is drawn (`trajtune.sources.sampler.SamplerSettings`: `settings()`)
    max_staleness, stale, tokens_per_update, sampler_process, sampler_threads
                       where the episodes run, how far behind the trained policy, what becomes of stale work
                       (`trajtune.sources.overlap`, `trajtune.sources.staleness`)
    vllm_server, vllm_gpu_memory_utilization, vllm_weights_dir
                       where vLLM runs (`trajtune.sources.vllm`)
    sync_tolerance, sampler_timeout
                       the weight sync check and the longest wait, for every sampler that holds its own weights
    record, replay     keep the episodes the loop took; train on a recording instead of sampling
                       (`trajtune.sources.record`)
    sampler_dtype, logprobs
                       injected train-inference mismatch (the mismatch lab): the sampler process draws from a bf16 /
                       float8 copy of the weights; the built-in sampler records the full softmax's log-probs under
                       top-k / top-p

Every rule that ties these together (a backend x overlap x sharding x loop combination that cannot run) is
`check_sampling`, the one place they are written; the experiments call it from their configs' checks, the
builder (`trajtune.sources.build`) before anything starts. The keys of the sections it replaced (`overlap.*`,
`vllm.*`) are refused naming their place here (`MOVED`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

from ..config import ConfigError, check_choices, check_ranges
from ..objectives.corrections import active_correction
from .sampler import SamplerSettings

OVERLAP = ("max_staleness", "stale", "tokens_per_update", "sampler_process", "sampler_threads", "sampler_timeout",
           "sync_tolerance")
"""the fields of where the built-in sampler's episodes run (what a run that draws its own way reads: `reads`)"""
MOVED: dict[str, str] = {"overlap": "sampling", "vllm": "sampling"}
"""the sections `SamplingConfig` replaced -> where their keys are now (a config class's `RENAMED` entries): the
same names there, except vllm_timeout (sampling.sampler_timeout) and vllm_sync_tolerance (sampling.sync_tolerance),
which `SamplingConfig.RENAMED` names in turn"""


@dataclass
class SamplingConfig:
    """How a run's episodes are sampled (module docstring)."""

    RENAMED: ClassVar[dict[str, str]] = {"vllm_timeout": "sampling.sampler_timeout",
                                         "vllm_sync_tolerance": "sampling.sync_tolerance"}

    backend: Literal["sampler", "generate", "vllm"] = "sampler"
    """generation backend: trajtune's KV-cached sampler, HF model.generate, or vLLM (colocated, or the
    vllm_server servers; its weights synced and checked after every update: trajtune.sources.vllm)"""
    max_new_tokens: int = 64
    """token budget of one sampled action (a completion, a turn's reply)"""
    temperature: float = 1.0
    """sampling temperature"""
    top_k: int = 0
    """sample from the k most likely tokens only (0: off). A sampling-only choice: the trainer's policy stays
    softmax(logits / temperature); the sampler records the log-probs of the truncated distribution it drew from,
    and the loop's tis_cap importance weight (policy / sampler) corrects for the cut
    (trajtune.engine.decoding.Samples)"""
    top_p: float = 1.0
    """sample from the smallest set of most likely tokens whose probability reaches top_p (nucleus; 1.0: off);
    after top_k, sampling-only as it"""
    draw: Literal["cdf", "race"] = "cdf"
    """how the built-in sampler draws a token: cdf (inverse CDF, one random number per completion and token) or
    race (torch.multinomial's draw, as HF generate: one per vocabulary entry, ~300 ms per token for 64 completions
    over a 151,936-token vocabulary on one CPU core); the same distribution (trajtune.engine.decoding.pick_next).
    backend generate and vllm draw their own way"""
    share_prompts: bool = True
    """prefill each prompt once for its whole group of completions (the KV cache rows copied, as vLLM's prefix
    cache shares them), not once per completion; the same samples to float rounding (trajtune.engine.decoding.sample).
    backend generate prefills every completion"""
    max_staleness: int = 0
    """how many updates the sampling policy lags: 0 samples step s with the policy step s updates (on-policy);
    K >= 1 samples steps s+1 .. s+K while step s trains, in a sampler process holding its own copy of the weights
    (or vLLM; one process, not torchrun), each step's episodes exactly K updates behind, whatever the timing
    (trajtune.sources.overlap; needs an importance correction of the RL loop: tis_cap > 0, or rl.correction)"""
    stale: Literal["pace", "discard", "partial"] = "pace"
    """what happens to the work a slow rollout makes stale, decided on a virtual clock (tokens_per_update), exactly
    (trajtune.sources.staleness): pace (no rollout starts more than K behind; the trainer waits for the slow ones,
    nothing is thrown away), discard (a group that would arrive after its step trains is dropped, as TRL's and
    Tinker's async loops do: the slow problems starve), partial (nothing is dropped; an episode's tokens past each
    update are sampled with the newer weights, several versions per episode). Not pace: max_staleness >= 1"""
    tokens_per_update: int = 0
    """the virtual clock of stale: decode steps of the sampler (one token of every running episode) per trainer
    update; an episode's duration is its batch's decode steps until its last token over this (needed by discard
    and partial)"""
    sampler_process: bool = False
    """run the episodes in a separate process with its own copy of the weights, synced and checked after every
    update (implied by max_staleness 1 with backend sampler; with 0 a run equals the one-process run: bit for bit
    when sampler_threads is the trainer's torch thread count, else up to float rounding)"""
    sampler_threads: int = 1
    """torch threads of the sampler process (1: the sampler on one core, the trainer on the others)"""
    sampler_timeout: float = 600.0
    """longest wait for a sampler that holds its own weights (the sampler process, vLLM) to answer one call (a
    step's episodes, a weight sync) before the run stops with an error (0: no limit)"""
    sync_tolerance: float = 0.0
    """after every weight sync the sampler's and the trainer's log-probs of the same tokens (a few rows of the last
    episodes) must agree to this (max abs difference, nats; logged as sync/logprob_diff), and its weights must
    equal the trainer's, or the run stops; 0: 1e-3 in float32, 5e-2 in bf16 / fp16 (their rounding)"""
    vllm_server: list[str] = field(default_factory=list)
    """URLs of `trajtune vllm-serve` servers (e.g. http://127.0.0.1:8000); several share each step's prompts
    (data-parallel inference). Empty: a vLLM engine colocated with the trainer (started by the run)"""
    vllm_gpu_memory_utilization: float = 0.3
    """colocated vLLM: the share of the device's memory vLLM may take (weights + KV cache), the rest is the
    trainer's"""
    vllm_weights_dir: str = ""
    """where the trainer writes the weights each vLLM sync loads (servers on other machines: a shared file
    system); empty: a temporary directory (in /dev/shm where there is one)"""
    record: bool = False
    """write every step's episodes as the loop takes them (tokens, owners, rewards, the sampler's log-probs,
    versions, the draw's generator) to the stage's recording/ directory, for a replay (trajtune.sources.record)"""
    replay: str = ""
    """train on a recording instead of sampling: a run directory that recorded (sampling.record; its
    <stage>/recording) or a recording directory. The same training settings give the recorded run's weights bit
    for bit; `trajtune replay RUN_DIR` reruns a recorded run this way (trajtune.sources.record)"""
    sampler_dtype: Literal["fp32", "bf16", "fp8"] = "fp32"
    """the sampler process draws from its copy of the weights rounded to bf16 or float8 (e4m3, "fake quantisation":
    cast and back to fp32) after every sync, while the trainer trains fp32: a controlled train-inference mismatch.
    The sync check compares the weights the process received (before the rounding) and the log-probs after it, so
    set sync_tolerance above the rounding's difference (logged as sync/logprob_diff). Needs the sampler process
    (sampler_process or max_staleness >= 1, backend sampler)"""
    logprobs: Literal["processed", "raw"] = "processed"
    """which log-probs the built-in sampler records for its tokens under top_k / top_p: processed, those of the
    truncated distribution it drew from (the correction sees the cut), or raw, the full softmax's (as vLLM's
    raw_logprobs: the trainer's own, the cut hidden) (trajtune.engine.decoding.Samples); backend sampler"""

    def __post_init__(self) -> None:
        check_choices(self)
        check_ranges(self, "sampling", counts=("max_new_tokens", "sampler_threads"), non_negative=(
            "top_k", "sampler_timeout", "sync_tolerance", "max_staleness", "tokens_per_update"),
                     positive=("temperature", "top_p"))
        if not self.top_p <= 1.0:
            raise ValueError(f"sampling: top_p must be in (0, 1], got {self.top_p!r}")
        if self.stale != "pace" and not (self.max_staleness >= 1 and self.tokens_per_update >= 1):
            raise ValueError(f"sampling: stale {self.stale} decides on a virtual clock what becomes of a slow "
                             f"rollout's late work; it needs max_staleness >= 1 and tokens_per_update >= 1 (decode "
                             f"steps per update), got {self.max_staleness} and {self.tokens_per_update}")
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(f"sampling: vllm_gpu_memory_utilization must be in (0, 1], got "
                             f"{self.vllm_gpu_memory_utilization}")
        for url in self.vllm_server:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"sampling: vllm_server {url!r} is not a URL; give http://HOST:PORT of a "
                                 "`trajtune vllm-serve`")

    @property
    def own_seeds(self) -> bool:
        """The backend can sample every episode from its own seed (the built-in sampler, vLLM); HF generate draws
        one seed per call."""
        return self.backend in ("sampler", "vllm")

    @property
    def in_process(self) -> bool:
        """Whether the built-in sampler's episodes run in a sampler process."""
        return bool(self.sampler_process or self.max_staleness)

    def in_trainer(self, **changes: Any) -> "SamplingConfig":
        """The same sampling on-policy, in the trainer, neither recorded nor replayed (what an evaluation or a probe
        beside an overlapped run samples with): the fields of where and how far behind it runs at their defaults,
        then `changes`."""
        return replace(self, **{**{k: getattr(SamplingConfig, k) for k in (
            "max_staleness", "stale", "tokens_per_update", "sampler_process", "record", "replay", "sampler_dtype")},
            **changes})

    def settings(self) -> SamplerSettings:
        """How an action is drawn (`SamplerSettings`); the built-in sampler's own options (draw, share_prompts) are
        off for the backends that draw their own way."""
        own = self.backend == "sampler"
        return SamplerSettings(self.max_new_tokens, self.temperature, self.top_k, self.top_p,
                               draw=self.draw if own else "race", share_prompts=self.share_prompts and own,
                               logprobs=self.logprobs, weights_dtype=self.sampler_dtype)

    def tolerance(self, precision: str = "fp32") -> float:
        """The sync check's tolerance: `sync_tolerance`, or the default of `precision`."""
        return self.sync_tolerance or (1e-3 if precision == "fp32" else 5e-2)


def check_sampling(s: SamplingConfig, where: str, *, rl: Any = None, sharded: bool = False,
                   backends: tuple[str, ...] = ("sampler", "generate", "vllm"), reads: tuple[str, ...] | None = None,
                   name: Callable[[str], str] = lambda n: f"sampling.{n}", agent: bool = False) -> None:
    """THE rules of a sampling section that cannot run (module docstring), each once. `where`: the config's name
    in the messages; `rl`: the RL loop's config (its tis_cap), if the run has one; `sharded`: under torchrun;
    `agent`: the episodes are an agent program's sessions with the endpoint (`trajtune.sources.endpoint`);
    `backends`: those the run can use; `reads`: the only fields the run reads (None: all), the others must stay at
    their defaults; `name(field)`: how the messages spell a field (a flag, or its key)."""
    if reads is not None:
        default = SamplingConfig()
        unread = [f.name for f in fields(s) if f.name not in reads and getattr(s, f.name) != getattr(default, f.name)]
        if unread:
            raise ValueError(f"{where}: {', '.join(name(n) for n in unread)} set, but this run draws its actions its "
                             f"own way and reads only {', '.join(name(n) for n in reads)} of the sampling section")
    if s.backend not in backends:
        raise ValueError(f"{where}: {name('backend')} {s.backend} is not one of this run's: {', '.join(backends)}")
    if agent and s.stale == "partial":
        raise ValueError(f"{where}: {name('stale')} partial cuts the built-in episode loop's lockstep turns; an "
                         "agent's requests arrive when its program sends them: use pace or discard with an agent")
    if s.backend == "vllm" and s.sampler_process:
        raise ValueError(f"{where}: {name('sampler_process')} runs the built-in sampler in a process of its own; "
                         f"{name('backend')} vllm samples in vLLM (drop {name('sampler_process')}; "
                         f"{name('max_staleness')} 1 overlaps vLLM too)")
    if s.backend == "generate" and s.in_process:
        raise ValueError(f"{where}: {name('max_staleness')} {s.max_staleness} / {name('sampler_process')} sample in "
                         f"a separate process with the built-in sampler; {name('backend')} generate samples from the "
                         f"trainer's own model: use {name('backend')} sampler (or vllm)")
    if s.max_staleness and rl is not None and active_correction(rl.correction, rl.tis_cap) == "none":
        raise ValueError(f"{where}: max_staleness {s.max_staleness} samples with the policy {s.max_staleness} "
                         "update(s) behind; set the RL loop's "
                         "tis_cap (recipes: [config.rl] tis_cap; the command line: --tis-cap), e.g. 2.0, so the "
                         "truncated importance weight against the sampler's log-probs corrects the lag, or choose "
                         "another correction (recipes: [config.rl] correction; the command line: --correction)")
    if sharded:
        if s.backend == "generate":
            raise ConfigError(f"{where}: {name('backend')} generate cannot sample sharded under torchrun (it has no "
                              f"per-episode seeds); use {name('backend')} sampler (or vllm)")
        if s.in_process and s.backend == "sampler":
            raise ConfigError(f"{where}: {name('max_staleness')} / {name('sampler_process')} need a one-process "
                              "engine (not torchrun: every rank would need its own sampler process)")
        if s.backend == "vllm" and s.max_staleness:
            raise ConfigError(f"{where}: {name('max_staleness')} with {name('backend')} vllm needs one process (not "
                              "torchrun): rank 0 sends each held weight sync from its background thread, which the "
                              f"other ranks' rollouts cannot wait for; use {name('max_staleness')} 0 under torchrun")
        if s.backend == "vllm" and not s.vllm_server:
            raise ConfigError(f"{where}: {name('backend')} vllm under torchrun needs {name('vllm_server')} URL (a "
                              "`trajtune vllm-serve` the ranks share); a colocated vLLM engine per rank is not "
                              "supported")
    if s.sampler_dtype != "fp32" and (s.backend != "sampler" or not s.in_process):
        raise ValueError(f"{where}: {name('sampler_dtype')} {s.sampler_dtype} rounds the weights of the sampler "
                         f"process; set {name('sampler_process')} (or {name('max_staleness')} >= 1) with "
                         f"{name('backend')} sampler")
    if s.sampler_dtype != "fp32" and not s.sync_tolerance:
        raise ValueError(f"{where}: {name('sampler_dtype')} {s.sampler_dtype}: the sampler's log-probs differ from "
                         f"the trainer's by design; set {name('sync_tolerance')} (nats, e.g. 1.0 for bf16, 5.0 for "
                         "fp8) to the difference the weight sync check may accept")
    if s.logprobs != "processed" and s.backend != "sampler":
        raise ValueError(f"{where}: {name('logprobs')} {s.logprobs} is the built-in sampler's option; "
                         f"{name('backend')} {s.backend} records its own log-probs")
    if s.replay:
        if s.record:
            raise ValueError(f"{where}: {name('replay')} trains on a recording and {name('record')} makes one; set "
                             "one of them")
        if s.max_staleness or s.sampler_process or s.backend == "vllm":
            raise ValueError(f"{where}: {name('replay')} trains on recorded episodes without sampling; drop "
                             f"{name('max_staleness')} / {name('sampler_process')} / {name('backend')} vllm (the "
                             "recording keeps how far behind its episodes were sampled)")
        if not Path(s.replay).is_dir():
            raise ValueError(f"{where}: {name('replay')} {s.replay}: no such directory (give a run directory that "
                             f"recorded with {name('record')}, or its <stage>/recording)")
