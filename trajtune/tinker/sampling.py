"""Sampler weights of one trained model: snapshots taken at `save_weights_for_sampler`, each checked against the
trainer, and sampling with Tinker's SamplingParams.

    weights = SamplerWeights(engine, pad_id=tok.pad_token_id, decode=tok.decode, tolerance=1e-4)
    weights.save("step-3", probe_rows)      -> {"sync/logprob_diff": max, "sync/logprob_diff_mean": mean}
    weights.sample("step-3", prompt, 4, max_tokens=16, temperature=1.0, top_k=0, top_p=1.0, stop_ids=[2],
                   stop_strings=["\\n"], seed=7)        -> 4 x (tokens, log-probs, stopped)
    weights.prompt_logprobs(None, prompt)   -> [None, log p(prompt[1] | prompt[:1]), ...]   (None: the base model)
    weights.write("final", directory) / weights.read("final", directory)   (a named snapshot across a restart)

A snapshot holds what training can change: the trainable parameters (a LoRA model's adapters only; every parameter
of a full fine-tune), copied to CPU memory under their `named_parameters` names. The base model's snapshot (key None)
is taken when the object is made: make it before the first optimizer step (or state load). Unnamed snapshots (one
per RL step) are kept in memory, the newest `keep`; a named one until `forget`. Sampling an evicted or unknown key
raises `MissingSnapshot`.

The sampler holds one snapshot at a time, loaded when a call asks for another. backend "own" (`OwnSampler`): one
deep copy of the policy, made when first needed, in eval mode on the trainer's device, sampling with trajtune's
KV-cached sampler; a snapshot's tensors are copied into its parameters (`copy_`; its other tensors are the frozen
base's). backend "vllm" (`VLLMBackend`): a colocated vLLM engine started from the base model's directory, loaded
and checked as the RL loop's vLLM is (`trajtune.sources.vllm.WeightSync`). Every `save` checks the load with the
library's one sync check (`trajtune.sources.sync.check_sync`): the fingerprints of the tensors the sampler loaded
equal the trainer's (own) or the file's it was sent (vLLM, full weights), and its temperature-1 log-probs of the
probe rows equal the trainer's `engine.forward` within `tolerance` (max over every predicted token); a failure is
a `SyncError` naming what differs, and the snapshot is not kept.

Log-probs returned by `sample` are of the distribution drawn from: the model's logits / temperature, truncated by
top-k / top-p and renormalised (`trajtune.engine.decoding.Samples`, "processed"); at temperature 1 without a filter
they are the trainer's `forward`. Temperature 0 is greedy (the log-prob of the argmax at temperature 1).

Threads: the service calls `save` from the model's worker thread (the one that trains) and `sample` /
`prompt_logprobs` from others; one lock keeps a load of the copy and a sample from interleaving.
"""

from __future__ import annotations

import collections
import copy
import itertools
import math
import threading
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch

from .. import seeding
from ..checkpoint import CheckpointError, atomic_dir, load_tensors, read_json, save_tensors, write_json
from ..engine import Engine
from ..engine.decoding import sample as decode_sample
from ..engine.decoding import Samples
from ..sources.sync import (SyncProbe, check_sync, probe as sync_probe, sampler_logprobs,
                            tensor_fingerprints, weight_fingerprints)
from ..trajectory import Owner, Trajectory, collate

TOLERANCE = "the sampler weights' tolerance"
"""how a failed check names the tolerance"""
PROBE_ROWS = 4
"""the probe rows a save's check reads (the first of those given)"""
FIXED_PROBE_LENGTH = 16
"""a save given no probe rows checks one row of this many token ids, 1, 2, 3, ... (modulo the vocabulary)"""
WEIGHTS_FILE, META_FILE = "weights.safetensors", "sampler.json"
"""what `write` puts in its directory"""
FORMAT = "trajtune-sampler-weights"

Snapshot = dict[str, torch.Tensor]
"""parameter name -> a CPU copy of it (the trainable parameters only)"""
Sequenced = tuple[list[int], list[float], bool]
"""one sample: (new token ids, their log-probs, stopped: it ended at a stop token or stop string)"""

class MissingSnapshot(LookupError):
    """A snapshot key that is not held: evicted (an unnamed snapshot older than the newest `keep`), forgotten, or
    never saved; str(e) says which. A user's error (the service answers it as one)."""


class SamplerWeights:
    """The sampler side of one trained model: its snapshots, the sampler's copy of the policy, sampling (module
    docstring).

    engine:    the trainer (`TorchEngine` of an `HFPolicy`, full weights or LoRA; one process)
    pad_id:    the tokenizer's padding id (the probe rows' padding)
    decode:    token ids -> text (the tokenizer's `decode`): what stop strings are looked for in
    tolerance: the largest |sampler - trainer| temperature-1 log-prob a save's check accepts (nats)
    backend:   "own" (trajtune's KV-cached sampler on a copy of the policy: `OwnSampler`) or "vllm" (a colocated
               vLLM engine started from `model_dir`, the base model's directory: `VLLMBackend`)
    keep:      unnamed snapshots kept in memory (the newest)
    seed:      where a sample call without a seed draws from: `seeding.derive(seed, k)` for its k-th call
    """

    def __init__(self, engine: Engine, *, pad_id: int, decode: Callable[[list[int]], str], tolerance: float,
                 backend: Literal["own", "vllm"] = "own", model_dir: str | Path | None = None, keep: int = 8,
                 seed: int = 0):
        if backend not in ("own", "vllm") or (backend == "vllm") != (model_dir is not None):
            raise ValueError(f"SamplerWeights: backend={backend!r} (model_dir={model_dir!r}); choose 'own', or "
                             "'vllm' with the base model's directory as model_dir")
        if keep < 1:
            raise ValueError(f"SamplerWeights: keep must be >= 1, got {keep}")
        if not tolerance >= 0:
            raise ValueError(f"SamplerWeights: tolerance must be >= 0, got {tolerance}")
        self.engine, self.pad_id, self.decode, self.tolerance = engine, pad_id, decode, tolerance
        self.backend, self.keep, self.seed = backend, keep, seed
        self._lock = threading.RLock()
        self._calls = 0  # sample calls without a seed so far (the k of their generators)
        with engine.policy_weights() as policy:
            self._base: Snapshot = _trainable(policy, None)
            self.max_len: int | None = int(getattr(policy, "max_len", 0)) or None
            self._vocab: int | None = getattr(getattr(policy, "base_config", None), "vocab_size", None)
        self._names = frozenset(self._base)
        self._recent: collections.OrderedDict[str, Snapshot] = collections.OrderedDict()  # unnamed, oldest first
        self._named: dict[str, Snapshot] = {}
        self._steps: dict[str | None, int] = {None: engine.step}  # the optimizer step each snapshot is of
        self._gone: dict[str, str] = {}  # key -> why it is no longer held
        self._loaded: object = _NOTHING  # the key whose snapshot the sampler holds
        self._sampler: OwnSampler | VLLMBackend = (
            OwnSampler(engine) if model_dir is None
            else VLLMBackend(engine, model_dir, tolerance, seed=seed, max_len=self.max_len))

    # --- snapshots -------------------------------------------------------------------------------------------------
    @property
    def names(self) -> frozenset[str]:
        """The parameter names a snapshot holds (LoRA: the adapters' `lora_A` / `lora_B`; full: every parameter)."""
        return self._names

    def snapshot(self, key: str | None) -> Snapshot:
        """The tensors of snapshot `key` (None: the base model's): read them, do not change them."""
        with self._lock:
            if key is None:
                return self._base
            held = self._named.get(key, self._recent.get(key))
            if held is None:
                raise MissingSnapshot(self._gone.get(key, f"no sampler weights were saved as {key!r}"))
            return held

    def keys(self) -> list[str]:
        """The snapshots held: named ones, then the unnamed ones oldest first."""
        with self._lock:
            return [*self._named, *self._recent]

    def save(self, key: str, probe: Sequence[Sequence[int]], *, named: bool = False) -> dict[str, float]:
        """A snapshot of the trainer's current weights as `key` (replacing one of that key), loaded into the sampler's
        copy and checked (module docstring). Call it from the thread that trains, between optimizer steps.

        probe: token id rows (e.g. the last trained datums' tokens) the check compares log-probs on, the first
               `PROBE_ROWS` (each cut to the model's context); none: `FIXED_PROBE_LENGTH` fixed ids
        named: kept until `forget` (else one of the newest `keep` unnamed snapshots)
        -> {"sync/logprob_diff": max, "sync/logprob_diff_mean": mean} |sampler - trainer| log-prob; raises
           `SyncError` naming what differs (the snapshot is then not kept)."""
        rows = self._probe_rows(probe)
        batch = collate([Trajectory(ids=r, owners=[int(Owner.POLICY)] * len(r), turns=[0] * len(r)) for r in rows],
                        self.pad_id, temperature=1.0)
        trainer = sync_probe(self.engine, batch)  # the trainer's log-probs [b, T-1] and fingerprints
        with self.engine.policy_weights() as policy:
            snap = _trainable(policy, self._names)
        with self._lock:
            self._store(key, snap, named, self.engine.step)
            try:
                worst, mean = self._load(key, (rows, trainer))
            except BaseException:
                self.forget(key)
                self._gone.pop(key, None)
                raise
        return {"sync/logprob_diff": worst, "sync/logprob_diff_mean": mean}

    def forget(self, key: str) -> None:
        """Drop snapshot `key` (sampling it then raises `MissingSnapshot`); an unknown key is ignored."""
        with self._lock:
            if self._named.pop(key, None) is not None or self._recent.pop(key, None) is not None:
                self._gone[key] = f"the sampler weights {key!r} were deleted"
                self._steps.pop(key, None)
            if self._loaded == key:
                self._loaded = _NOTHING

    def write(self, key: str | None, path: str | Path) -> None:
        """Snapshot `key` to directory `path` (written whole, then renamed into place: `checkpoint.atomic_dir`):
        `weights.safetensors` (its tensors) and `sampler.json` (format, key, optimizer step)."""
        with self._lock:
            snap, step = self.snapshot(key), self._steps.get(key, -1)
        with atomic_dir(path) as tmp:
            save_tensors(snap, tmp / WEIGHTS_FILE)
            write_json(tmp / META_FILE, {"format": FORMAT, "key": key, "step": step, "tensors": len(snap)})

    def read(self, key: str, path: str | Path) -> None:
        """Snapshot `key` (named) from a directory `write` wrote, loaded into the sampler's copy and checked: the
        fingerprints of what the copy loaded equal the file's (no log-prob check: the trainer has moved on).
        Raises `CheckpointError` for a missing, corrupted or foreign file (tensors of another model), `SyncError`
        for a load that did not take."""
        path = Path(path)
        meta = read_json(path / META_FILE)
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"{path / META_FILE}: not sampler weights (format {meta.get('format')!r})")
        snap = load_tensors(path / WEIGHTS_FILE)
        missing, extra = sorted(self._names - set(snap)), sorted(set(snap) - self._names)
        if missing or extra:
            raise CheckpointError(f"{path / WEIGHTS_FILE}: not this model's sampler weights (missing {len(missing)} "
                                  f"tensors {missing[:3]}, {len(extra)} unexpected {extra[:3]})")
        wrong = [k for k, v in snap.items() if v.shape != self._base[k].shape or v.dtype != self._base[k].dtype]
        if wrong:
            raise CheckpointError(f"{path / WEIGHTS_FILE}: tensors of another shape or dtype than this model's "
                                  f"({', '.join(wrong[:3])})")
        step = int(meta.get("step", -1))
        with self._lock:
            self._store(key, snap, True, step)
            try:
                self._load(key, None)
                self._sampler.check_file(snap, step, self.tolerance)
            except BaseException:
                self.forget(key)
                self._gone.pop(key, None)
                raise

    # --- sampling ------------------------------------------------------------------------------------------------
    def sample(self, key: str | None, prompt: Sequence[int], num_samples: int, *, max_tokens: int,
               temperature: float, top_k: int = 0, top_p: float = 1.0, stop_ids: Sequence[int] = (),
               stop_strings: Sequence[str] = (), seed: int | None = None) -> list[Sequenced]:
        """`num_samples` continuations of `prompt` (token ids) with snapshot `key`'s weights (None: the base model's).

        temperature 0: greedy; top_k 0 (or negative): off; top_p 1: off. Each continuation ends at its first stop
        token (included, stopped=True), at the first token whose decoded text (of the continuation so far)
        contains a stop string (that token included, stopped=True), or after `max_tokens` (stopped=False).
        Stop strings are looked for after sampling (the compute past the cut is wasted, the result exact).
        seed: the call's seed; its i-th continuation draws from its own stream `seeding.derive(seed, i)`, so the same
        seed and weights give the same samples whatever else is sampled with them (`sample_many`); None: the k-th
        unseeded request draws from `seeding.derive(self.seed, k)`.
        -> num_samples x (tokens [n], log-probs [n] of the distribution drawn from, stopped)."""
        return self.sample_many(key, [(prompt, num_samples, seed)], max_tokens=max_tokens, temperature=temperature,
                                top_k=top_k, top_p=top_p, stop_ids=stop_ids, stop_strings=stop_strings)[0]

    def sample_many(self, key: str | None, requests: Sequence[tuple[Sequence[int], int, int | None]], *,
                    max_tokens: int, temperature: float, top_k: int = 0, top_p: float = 1.0,
                    stop_ids: Sequence[int] = (), stop_strings: Sequence[str] = ()) -> list[list[Sequenced]]:
        """Several requests (prompt, num_samples, seed) with the same parameters, sampled in one call of the sampler
        (its rows batched: on a CPU 8 requests of 4 continuations were ~7x faster as one call than as eight) ->
        per request what `sample` returns for it alone, the same tokens (each row its own seeded stream)."""
        for prompt, n, _ in requests:
            self.check_request(prompt, max_tokens, n)
        if max_tokens < 1 or not (temperature >= 0 and math.isfinite(temperature)) or not 0 < top_p <= 1:
            raise ValueError("max_tokens must be >= 1, temperature a finite number >= 0 and top_p in (0, 1]; got "
                             f"{max_tokens}, {temperature}, {top_p}")
        greedy = temperature == 0
        with self._lock:
            rows: list[list[int]] = []
            seeds: list[int] = []
            for prompt, n, seed in requests:
                if seed is None:
                    seed, self._calls = seeding.derive(self.seed, self._calls), self._calls + 1
                rows += [list(prompt)] * n
                seeds += [seeding.derive(seed % 2**63, i) for i in range(n)]
            self._load(key)
            out = self._sampler.sample(rows, max_tokens, seeds, temperature=1.0 if greedy else float(temperature),
                                       top_k=max(int(top_k), 0), top_p=float(top_p), greedy=greedy,
                                       stop_ids=[int(t) for t in stop_ids], pad_id=self.pad_id)
        cut = [self._cut(t, lp, s, stop_strings) for t, lp, s in zip(out.tokens, out.logprobs, out.stopped,
                                                                        strict=True)]
        ends = [0, *itertools.accumulate(n for _, n, _ in requests)]
        return [cut[a:b] for a, b in itertools.pairwise(ends)]

    def prompt_logprobs(self, key: str | None, prompt: Sequence[int]) -> list[float | None]:
        """[None] + log p(prompt[t] | prompt[:t]) for t >= 1 at temperature 1 with snapshot `key`'s weights (None:
        the base model's): what `SamplingClient.compute_logprobs` returns. -> len(prompt) entries."""
        self.check_request(prompt, 0)
        if len(prompt) == 1:
            return [None]
        with self._lock:
            self._load(key)
            return [None, *self._sampler.logprobs([int(t) for t in prompt])]

    def close(self) -> None:
        """Stop the sampler (vLLM's engine, its weights directory); the snapshots stay readable."""
        with self._lock:
            self._sampler.close()
            self._loaded = _NOTHING

    # --- inside ---------------------------------------------------------------------------------------------------
    def _store(self, key: str, snap: Snapshot, named: bool, step: int) -> None:
        """Hold `snap` as `key` (under the lock); evict the oldest unnamed snapshots past `keep`."""
        self._named.pop(key, None)
        self._recent.pop(key, None)
        self._gone.pop(key, None)
        if self._loaded == key:
            self._loaded = _NOTHING
        self._steps[key] = step
        if named:
            self._named[key] = snap
            return
        self._recent[key] = snap
        while len(self._recent) > self.keep:
            old, _ = self._recent.popitem(last=False)
            self._steps.pop(old, None)
            self._gone[old] = (f"the sampler weights {old!r} were evicted: only the newest {self.keep} unnamed "
                               "snapshots are kept (save named weights to sample an older one)")

    def _load(self, key: str | None, check: tuple[list[list[int]], SyncProbe] | None = None) -> tuple[float, float]:
        """The sampler holding snapshot `key` (under the lock; loaded unless it holds it already). check: a save's
        (probe rows, the trainer's side): the full check; None: what the sampler checks at every load (vLLM: the
        fingerprints; own: nothing more than the save's check) -> (max, mean) log-prob difference (0, 0 unchecked)."""
        snap = self.snapshot(key)
        if self._loaded == key and check is None:
            return 0.0, 0.0
        self._loaded = _NOTHING  # (a load that fails half way leaves the sampler holding nothing known)
        diff = self._sampler.load(snap, self._steps.get(key, -1), check, self.tolerance)
        self._loaded = key
        return diff

    def check_request(self, prompt: Sequence[int], max_tokens: int, num_samples: int = 1) -> None:
        """A prompt, token budget and sample count the model can take, else ValueError naming the field."""
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        if len(prompt) == 0:
            raise ValueError("prompt: empty (it needs at least one token)")
        if self._vocab is not None and not all(0 <= int(t) < self._vocab for t in prompt):
            bad = next(int(t) for t in prompt if not 0 <= int(t) < self._vocab)
            raise ValueError(f"prompt: token id {bad} is outside the model's vocabulary (0..{self._vocab - 1})")
        if self.max_len is not None and len(prompt) + max_tokens > self.max_len:
            raise ValueError(f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) = "
                             f"{len(prompt) + max_tokens} is more than the model's context of {self.max_len} "
                             "tokens; shorten the prompt or lower max_tokens")

    def _probe_rows(self, probe: Sequence[Sequence[int]]) -> list[list[int]]:
        """The check's rows: the first `PROBE_ROWS` of `probe` with >= 2 tokens, cut to the context; or the fixed
        row."""
        limit = self.max_len or 1 << 30
        rows = [[int(t) for t in r[:limit]] for r in probe if len(r) >= 2][:PROBE_ROWS]
        if rows:
            return rows
        vocab = self._vocab or 1 << 30
        return [[1 + i % (vocab - 1) for i in range(min(FIXED_PROBE_LENGTH, limit))]]

    def _cut(self, tokens: list[int], logprobs: list[float], stopped: bool,
             stop_strings: Sequence[str]) -> Sequenced:
        """A sampled row cut after its first token whose text so far contains a stop string."""
        if stop_strings and any(s in self.decode(tokens) for s in stop_strings):
            for n in range(1, len(tokens) + 1):
                if any(s in self.decode(tokens[:n]) for s in stop_strings):
                    return tokens[:n], logprobs[:n], True
        return tokens, logprobs, stopped


class OwnSampler:
    """trajtune's KV-cached sampler (`decoding.sample`) on one deep copy of the policy (made when first needed, in
    eval mode, on the trainer's device): a snapshot is loaded by `copy_into` its parameters."""

    NAME = "the sampler's copy"

    def __init__(self, engine: Engine):
        self.engine = engine
        self.model: torch.nn.Module | None = None
        self.params: dict[str, torch.nn.Parameter] = {}  # the copy's parameters by name

    def _model(self) -> torch.nn.Module:
        if self.model is None:
            with self.engine.policy_weights() as policy:
                model = copy.deepcopy(policy)
            model.eval()
            model.requires_grad_(False)
            self.model, self.params = model, dict(model.named_parameters())
        return self.model

    def load(self, snap: Snapshot, step: int, check: tuple[list[list[int]], SyncProbe] | None,
             tolerance: float) -> tuple[float, float]:
        """Copy `snap` in; check (a save's probe rows and trainer side): every tensor's fingerprint is the
        trainer's and the copy's log-probs of the probe rows are its within `tolerance` -> (max, mean) difference."""
        model = self._model()
        copy_into(self.params, snap)
        if check is not None:
            p = check[1]
            theirs = sampler_logprobs(model, p.ids, p.mask, self.engine.autocast)  # [b, T-1]
            return check_sync(p.step, p.fingerprints, [weight_fingerprints(model)], p.logprobs, theirs,
                              p.action_mask, tolerance, sampler=self.NAME, option=TOLERANCE)
        return 0.0, 0.0

    def check_file(self, snap: Snapshot, step: int, tolerance: float) -> None:
        """After loading `snap` read from a file: the copy's fingerprints are the file's tensors'."""
        none = torch.zeros(0)
        check_sync(step, tensor_fingerprints(snap), [weight_fingerprints(self._model())], none, none, none.bool(),
                   tolerance, sampler=self.NAME, option=TOLERANCE)

    def sample(self, prompts: list[list[int]], max_tokens: int, seeds: list[int], **kw) -> Samples:
        """`decoding.sample` of `prompts`, row i drawing from its own generator seeded `seeds[i]`; kw: its options."""
        generators = [torch.Generator().manual_seed(s) for s in seeds]
        return decode_sample(self._model(), prompts, max_tokens, None, generators=generators,
                             share_prompts=len(prompts) > 1, **kw)

    def logprobs(self, row: list[int]) -> list[float]:
        """log p(row[t] | row[:t]) for t >= 1, temperature 1 -> [len(row) - 1]."""
        ids = torch.tensor([row], dtype=torch.long)  # [1, L]
        return sampler_logprobs(self._model(), ids, torch.ones_like(ids, dtype=torch.bool),
                                self.engine.autocast)[0].tolist()

    def close(self) -> None:
        self.model, self.params = None, {}


class VLLMBackend:
    """A colocated vLLM engine (`sources.vllm.Colocated`, started from the base model's directory when first
    needed) synced and checked as the RL loop's (`sources.vllm.WeightSync.send`): a full fine-tune's snapshot is
    written as the weights file vLLM loads (checkpoint names, a tied output layer as its own tensor) and every
    tensor's fingerprint checked; a LoRA snapshot is written as a peft adapter directory vLLM serves on the base
    model (no fingerprints: the log-prob check of a save is its check). A save also checks vLLM's temperature-1
    log-probs of the probe rows against the trainer's."""

    NAME = "vLLM"

    def __init__(self, engine: Engine, model_dir: str | Path, tolerance: float, *, seed: int, max_len: int | None):
        from ..sources.vllm.weights import lora_rank

        self.engine, self.model_dir, self.tolerance, self.seed, self.max_len = (engine, model_dir, tolerance, seed,
                                                                               max_len)
        self._client: Any = None
        self._sync: Any = None
        self._adapters = 0  # adapter directories written
        with engine.policy_weights() as policy:
            self.lora = lora_rank(policy)
            model = getattr(policy, "model")
            self._peft = model if self.lora else None
            self.dtype = str(next(policy.parameters()).dtype).removeprefix("torch.")
            names = {id(p): f"model.{n}" for n, p in model.named_parameters()}  # the HFPolicy's names
            self._checkpoint = {k: names[id(v)] for k, v in model.state_dict(keep_vars=True).items()
                                if id(v) in names}  # checkpoint name -> parameter name (a tied layer: twice)

    def _started(self) -> tuple[Any, Any]:
        if self._client is None:
            from ..sources.vllm import Colocated, VLLMSampler as Sampler, WeightSync

            self._client = Sampler(Colocated(self.model_dir, dtype=self.dtype, max_model_len=self.max_len,
                                             seed=self.seed, lora_rank=self.lora))
            self._sync = WeightSync(self._client, self.tolerance)
        return self._client, self._sync

    def load(self, snap: Snapshot, step: int, check: tuple[list[list[int]], SyncProbe] | None,
             tolerance: float) -> tuple[float, float]:
        """Send `snap` to vLLM and check it (class docstring) -> (max, mean) log-prob difference ((0, 0) without
        probe rows: a switch of snapshot, a read)."""
        from ..sources.vllm.weights import PreparedSync

        client, sync = self._started()
        state: dict[str, torch.Tensor] = {}
        adapter = None
        if self._peft is None:
            seen: set[str] = set()
            for k, n in self._checkpoint.items():  # every name its own tensor (safetensors refuses shared ones)
                state[k] = snap[n] if n not in seen else snap[n].clone()
                seen.add(n)
        else:
            from peft import get_peft_model_state_dict

            self._adapters += 1
            adapter = sync.weights_dir / f"adapter-{self._adapters}"
            adapter.mkdir()
            tensors = get_peft_model_state_dict(self._peft, state_dict={k.removeprefix("model."): v
                                                                        for k, v in snap.items()})
            save_tensors(tensors, adapter / "adapter_model.safetensors")
            self._peft.peft_config["default"].save_pretrained(str(adapter))
        rows, p = check if check is not None else ([], None)
        metrics = sync.send(PreparedSync(step, state, self._peft is None, adapter,
                                         [Trajectory(ids=r, owners=[int(Owner.POLICY)] * len(r), turns=[0] * len(r))
                                          for r in rows], None if p is None else p.logprobs,
                                         None if p is None else p.action_mask))
        return metrics.get("sync/logprob_diff", 0.0), metrics.get("sync/logprob_diff_mean", 0.0)

    def check_file(self, snap: Snapshot, step: int, tolerance: float) -> None:
        """(`load` checked the fingerprints of what vLLM loaded against what was written)"""

    def sample(self, prompts: list[list[int]], max_tokens: int, seeds: list[int], *, temperature: float, top_k: int,
               top_p: float, greedy: bool, stop_ids: list[int], pad_id: int) -> Samples:
        """vLLM's samples, one request per row, row i seeded by one draw of a generator seeded `seeds[i]`."""
        from ..sources.sampler import SamplerSettings

        client, _ = self._started()
        settings = SamplerSettings(max_new_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                   greedy=greedy)
        return type(client)(client.client, settings).sample(prompts, stop_ids,
                                                             [torch.Generator().manual_seed(s) for s in seeds])

    def logprobs(self, row: list[int]) -> list[float]:
        return self._started()[0].logprobs([row])[0]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._sync.close()
            self._client = self._sync = None


_NOTHING = object()
"""`SamplerWeights._loaded` when the copy holds no known snapshot"""


@torch.no_grad()
def copy_into(params: dict[str, torch.nn.Parameter], snap: Snapshot) -> None:
    """Load a snapshot: each of its tensors copied into the parameter of its name (`copy_`, across devices)."""
    for name, tensor in snap.items():
        params[name].copy_(tensor)


@torch.no_grad()
def _trainable(policy: torch.nn.Module, names: frozenset[str] | None) -> Snapshot:
    """A CPU copy of `policy`'s trainable parameters (names None: those with requires_grad), or of those named."""
    return {n: p.detach().to("cpu", copy=True) for n, p in policy.named_parameters()
            if (p.requires_grad if names is None else n in names)}
