"""The trainer's weights into vLLM, checked: `WeightSync(sampler, tolerance, weights_dir).sync(engine, rows)`.

  1. the trainer writes its model's state dict (Hugging Face names; a tied output layer as its own tensor) to
     one safetensors file, `<weights_dir>/weights.safetensors` (written whole, then renamed over the last);
  2. every vLLM engine loads it in place through vLLM's own reload (`vllm_worker.TrajtuneWorker`) and drops its
     prefix cache (those keys and values belong to the old weights);
  3. the one sync check (`trajtune.sources.sync.check_sync`): the fingerprints of the tensors each engine loaded
     equal the trainer's, tensor by tensor, and vLLM's log-probs of a few rows of the last episodes equal the
     trainer's within `sampling.sync_tolerance` (max over the rows' POLICY tokens; logged as sync/logprob_diff and
     sync/logprob_diff_mean). The log-prob check is the one that sees a load that did not take: vLLM's CPU
     build repacks its linear layers after loading, and a reload that skipped the tied output layer left
     log-probs 0.3 nats off while every received tensor was right.

LoRA (`--lora-r`): vLLM serves the base model (sent at the first sync) and the trainer's adapter, saved and loaded
as a new LoRA request at every sync; the log-prob check is its check.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol, Sequence

import torch

from ...config import ConfigError
from ...engine import Engine
from ...trajectory import Trajectory, collate
from ...engine.decoding import Samples
from ..sampler import Fingerprints, Seeds, WeightSampler
from ...metrics import register
from ..sync import check_sync, sampler_logprobs, tensor_fingerprints

register("sync/logprob_diff_mean", "mean |vLLM - trainer| log-prob of the probe rows' POLICY tokens after the "
         "step's weight sync (sources.vllm; sync/logprob_diff is the max)")
register("time/sync_s", "wall seconds the step's weight sync to vLLM took: write, load, checks (sources.vllm)")


class AdapterSampler(WeightSampler, Protocol):
    """A `WeightSampler` that also serves a LoRA adapter saved in a directory, and closes (`sampler.VLLMSampler`);
    its `sample` also takes a call's own budget (a partial rollout's cut)."""

    def sample(self, prompts: Sequence[Sequence[int]], stop_ids: Sequence[int], seeds: Seeds, *,
               max_new_tokens: int | None = None) -> Samples: ...

    def load_adapter(self, path: str) -> None: ...

    def close(self) -> None: ...


@dataclass
class PreparedSync:
    """One sync as `WeightSync.prepare` took it: the trainer's optimizer step, its weights under checkpoint names
    (a CPU copy; {} for a LoRA sync after the first), whether to send them, the saved adapter (LoRA), the probe
    rows, the trainer's log-probs of them [b, T-1] and their POLICY tokens [b, T-1] bool (None: nothing to probe)."""

    step: int
    state: dict[str, torch.Tensor]
    send_weights: bool
    adapter: Path | None
    rows: list[Trajectory]
    mine: torch.Tensor | None
    action_mask: torch.Tensor | None


class WeightSync:
    """Sends the trainer's weights (or its LoRA adapter) to `sampler` and checks them (module docstring)."""

    def __init__(self, sampler: AdapterSampler, tolerance: float, weights_dir: str | os.PathLike = ""):
        self.sampler, self.tolerance = sampler, tolerance
        self._own_dir = not weights_dir
        self._weights_dir = Path(weights_dir) if weights_dir else None  # made at the first sync
        self.syncs = 0  # weight syncs sent (rank 0)
        self._base_sent = False  # LoRA: the base weights went to vLLM (at the first sync)

    @property
    def weights_dir(self) -> Path:
        """Where the syncs write (`sampling.vllm_weights_dir`, or a temporary directory in /dev/shm where there is one),
        made when first asked for: a sampler that only samples (`trajtune chat`) writes nothing."""
        if self._weights_dir is None:
            base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
            self._weights_dir = Path(tempfile.mkdtemp(prefix=f"trajtune-vllm-{os.getpid()}-", dir=base))
            _remove_orphans(self._weights_dir.parent)
        self._weights_dir.mkdir(parents=True, exist_ok=True)
        return self._weights_dir

    def sync(self, engine: Engine, rows: Sequence[Trajectory]) -> dict[str, float]:
        """Write, load, check (module docstring): `send(prepare(engine, rows))`. Every rank calls it: the full
        weights are collective under FSDP; rank 0 alone computes the check's log-probs of `rows` (the probe, []
        before any episode) and talks to vLLM. LoRA: the base weights at the first sync (a server may hold another
        run's), then the adapter alone."""
        prepared = self.prepare(engine, rows)
        return self.send(prepared) if prepared is not None else {}

    def prepare(self, engine: Engine, rows: Sequence[Trajectory]) -> "PreparedSync | None":
        """What a sync sends and checks, taken now (in the thread that trains, every rank): the trainer's log-probs
        of the probe rows, its weights (a CPU copy) or its LoRA adapter (saved), the optimizer step. None on the
        ranks other than 0. `send` may run later: an overlapped source holds it (`VLLMRunner.hold_syncs`)."""
        batch = collate(list(rows), 0, temperature=1.0) if rows else None  # the check reads the raw model (T=1)
        mine = None  # [b, T-1] the trainer's log-probs of the probe rows (rank 0: the rows are its own episodes)
        state: dict[str, torch.Tensor] = {}
        with engine.policy_weights() as policy:
            model = getattr(policy, "model", None)
            if model is None or not hasattr(model, "state_dict"):
                raise ConfigError(f"--backend vllm samples a Hugging Face model; the engine trains a "
                                  f"{type(policy).__name__}")
            lora = bool(getattr(policy, "is_lora", False))
            send_weights = not lora or not self._base_sent
            self.syncs += 1
            adapter = self.weights_dir / f"adapter-{self.syncs}"
            if engine.is_main and batch is not None:  # the local module, no collective (other ranks hold other rows)
                was = policy.training
                policy.eval()
                try:
                    mine = sampler_logprobs(policy, batch.ids, batch.attention_mask, engine.autocast)
                finally:
                    policy.train(was)
            if engine.is_main and send_weights:
                state = _checkpoint_state(model, lora)
            if engine.is_main and lora:
                model.save_pretrained(str(adapter))  # the adapter alone (peft's format)
        self._base_sent = self._base_sent or send_weights  # (sent by the first `send`, in order)
        if not engine.is_main:
            return None
        return PreparedSync(engine.step, state, send_weights, adapter if lora else None, list(rows), mine,
                            batch.action_mask.bool() if batch is not None else None)

    def send(self, p: "PreparedSync") -> dict[str, float]:
        """Load `p` into every vLLM engine and check it (rank 0) -> sync/logprob_diff, sync/logprob_diff_mean."""
        wanted: Fingerprints = {}
        loaded: list[Fingerprints] = []
        if p.send_weights:
            wanted = tensor_fingerprints(p.state)
            loaded = self.sampler.load(self._write(p.state))
        if p.adapter is not None:
            self._sync_adapter(p.adapter)
        if p.mine is None or p.action_mask is None:  # nothing to probe yet: the fingerprints alone
            check_sync(p.step, wanted, loaded, torch.zeros(0), torch.zeros(0), torch.zeros(0, dtype=torch.bool),
                       self.tolerance, sampler="vLLM", option="sampling.sync_tolerance")
            return {}
        theirs = torch.zeros_like(p.mine)  # [b, T-1]
        for b, lps in enumerate(self.sampler.logprobs([t.ids for t in p.rows])):
            theirs[b, : len(lps)] = torch.tensor(lps)
        worst, mean = check_sync(p.step, wanted, loaded, p.mine, theirs, p.action_mask, self.tolerance,
                                 sampler="vLLM", option="sampling.sync_tolerance")
        return {"sync/logprob_diff": worst, "sync/logprob_diff_mean": mean}

    def _write(self, state: dict[str, torch.Tensor]) -> str:
        """`state` (checkpoint names) as the weights file every engine loads -> its path."""
        from safetensors.torch import save_file

        path, tmp = self.weights_dir / "weights.safetensors", self.weights_dir / "weights.safetensors.tmp"
        save_file(state, str(tmp))  # every tensor its own copy: a tied output layer is sent as well
        os.replace(tmp, path)
        return str(path)

    def _sync_adapter(self, path: Path) -> None:
        """LoRA: vLLM serves the base model and the trainer's adapter saved at `path`, loaded anew after every
        update -- the base weights never move. vLLM keeps no fingerprint of an adapter it loaded: the log-prob
        check is the sync's check."""
        self.sampler.load_adapter(str(path))
        number = int(path.name.split("-")[1])
        for old in self.weights_dir.glob("adapter-*"):  # the one before stays until this one is in use; later ones
            if old.name.split("-")[1].isdigit() and int(old.name.split("-")[1]) < number - 1:  # (held) wait
                shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        if self._own_dir and self._weights_dir is not None:
            shutil.rmtree(self._weights_dir, ignore_errors=True)


def _remove_orphans(base: Path) -> None:
    """Remove the weights directories of trainers that died without closing (a `kill -9` leaves its copy of the
    weights in /dev/shm, memory until the machine restarts): those whose process no longer exists."""
    for d in base.glob("trajtune-vllm-*-*"):
        pid = d.name.split("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:  # another user's, alive
            pass


def _checkpoint_state(model: torch.nn.Module, lora: bool) -> dict[str, torch.Tensor]:
    """The Hugging Face model's weights under their checkpoint names, each its own CPU copy; for a peft model its
    base model's (the adapters left out, `.base_layer.` dropped from the wrapped layers' names)."""
    items: Iterable[tuple[str, torch.Tensor]]
    if not lora:
        items = model.state_dict().items()
    else:
        base = getattr(model, "get_base_model")()
        items = ((k.replace(".base_layer.", "."), v) for k, v in base.state_dict().items() if "lora_" not in k)
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in items}


def lora_rank(policy: torch.nn.Module) -> int:
    """The LoRA rank of an `HFPolicy` with adapters (0 without)."""
    if not getattr(policy, "is_lora", False):
        return 0
    return max(int(c.r) for c in getattr(policy, "model").peft_config.values())
