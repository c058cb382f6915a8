"""Data parallelism on torch.distributed: the engine seam under `torchrun` (DDP or FSDP2).

    torchrun --nproc-per-node 2 -m trajtune run addition          # one node, 2 processes
    torchrun --nnodes 2 --node-rank R --nproc-per-node 8 \\
        --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m trajtune run addition

`make_engine(model, optim)` returns a `DistributedEngine` when the process was
started by torchrun with WORLD_SIZE > 1 and a `LocalEngine` otherwise, so an
experiment builds its engine one way and algorithm loops never know which they got.

How the N processes reproduce the one-process run
-------------------------------------------------
Every rank holds the same GLOBAL batch (loops are unchanged: step s's data is a
function of (seed, s), and sharded rollouts are all-gathered, see below).
`forward_backward(batch, loss_fn)` runs `loss_fn` on this rank's rows only
(`shard_rows`; a preference pair batch keeps each pair on one rank) and weights
the shard's loss by its share of the global normaliser declared by the loss
function (`loss_fn.aggregation`, `trajtune.logprobs.aggregation_share`):

    token:              share = POLICY tokens in the shard / POLICY tokens in the batch
    sequence, constant: share = rows in the shard / rows in the batch      (the default)

so sum_r share_r * loss_r is exactly the one-process loss, and DDP / FSDP2's
gradient average (1/N sum_r) is undone by a factor N. Metrics are the same
share-weighted sums, reduced across ranks, so every rank returns global numbers.
`forward` (no gradient) shards rows too and all-gathers the outputs in batch order.

Sharded rollouts: `rollout.make_collect(..., shard=engine.shard)` runs only this
rank's contiguous share of the (task, episode) pairs, each episode with its own
generator seeded from (the step's generator, global episode index), then
all-gathers the trajectories, so group baselines see whole groups and the result
does not depend on how many processes ran it (use `episode_seeds=True` in the
one-process run to get the same samples). `sharded_map` does the same for evaluation.

Only rank 0 writes (`is_main()`); checkpoints are written atomically by rank 0
after the full state is gathered, and every rank reads them back.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch
import torch.distributed as dist

from .checkpoint import atomic_dir, load_tensors, read_json, save_tensors
from .engine import AUTOCAST_DTYPES, ForwardOutput, LocalEngine, LossFn, OptimConfig, micro_batches
from .logprobs import aggregation_share, token_log_probs
from .sampling import Samples
from .trajectory import Batch

Strategy = Literal["ddp", "fsdp"]


# --- process group -----------------------------------------------------------------
def launched_distributed() -> bool:
    """True when torchrun (or any launcher setting WORLD_SIZE) started more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_distributed(backend: str | None = None) -> tuple[int, int]:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR...) -> (rank, world_size).

    Backend: nccl on GPUs, gloo on CPU. A no-op returning (0, 1) outside torchrun,
    and idempotent inside it.
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if not launched_distributed():
        return 0, 1
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def is_main() -> bool:
    """True on rank 0 (and in a single process): the one process that writes logs, reports, checkpoints."""
    return not is_distributed() or dist.get_rank() == 0


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (identity in a single process)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def default_device() -> torch.device:
    """cuda:LOCAL_RANK when GPUs are visible, else cpu."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def make_engine(model: torch.nn.Module, optim: OptimConfig | None = None, *, strategy: Strategy = "ddp",
                device: str | torch.device | None = None, frozen: bool = False, **kw):
    """A `DistributedEngine` under torchrun (WORLD_SIZE > 1), else a `LocalEngine` (device default: cpu).

    `kw` (autocast, micro_batch_size) go to either engine; `strategy` ("ddp" or
    "fsdp") and `frozen` (an inference-only engine: a teacher, a reference) only
    matter under torchrun.
    """
    if launched_distributed():
        init_distributed()
        return DistributedEngine(model, optim, device, strategy=strategy, frozen=frozen, **kw)
    return LocalEngine(model, optim, device or "cpu", **kw)


# --- which rows a rank owns --------------------------------------------------------
def shard_rows(n: int, rank: int, world_size: int) -> torch.Tensor:
    """Rows of an n-row batch that `rank` computes: a contiguous share (sizes differ by at most 1).

    For even n, row i and row i + n/2 stay together, so a preference pair batch
    (chosen rows [0, P), rejected rows [P, 2P); algorithms.dpo.pair_batch) is split by pairs.
    """
    if n % 2:
        return torch.arange(n).tensor_split(world_size)[rank]
    half = torch.arange(n // 2).tensor_split(world_size)[rank]
    return torch.cat([half, half + n // 2])


def contiguous_rows(n: int, rank: int, world_size: int) -> list[int]:
    """This rank's contiguous share of n items (episodes, evaluation problems)."""
    return torch.arange(n).tensor_split(world_size)[rank].tolist()


class Shard:
    """This process's share of a list of items and the all-gather that undoes it (`rollout.make_collect(shard=)`)."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size

    def rows(self, n: int) -> list[int]:
        return contiguous_rows(n, self.rank, self.world_size)

    def gather(self, n: int, mine: Sequence[Any]) -> list[Any]:
        """All ranks' items of an n-item list, in global order (every rank gets the whole list)."""
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, list(mine))
        out = [x for part in parts for x in part]
        if len(out) != n:
            raise RuntimeError(f"Shard.gather: got {len(out)} items, expected {n}")
        return out


def sharded_map(engine, items: Sequence[Any], fn: Callable[[list[Any]], list[Any]]) -> list[Any]:
    """`fn(items)` computed in shares across ranks and gathered in order (evaluation).

    fn maps a list to a same-length list (e.g. prompts -> greedy answers); with a
    LocalEngine it is simply called on all items.
    """
    shard = getattr(engine, "shard", None)
    if shard is None:
        return list(fn(list(items)))
    mine = [items[i] for i in shard.rows(len(items))]
    return shard.gather(len(items), fn(mine) if mine else [])


# --- the engine ----------------------------------------------------------------------
class DistributedEngine:
    """The `LocalEngine` methods over N processes: DDP (default) or FSDP2 (`strategy="fsdp"`).

    Loops pass the global batch; see the module docstring for how a shard's loss
    is weighted so that gradients, losses and metrics equal the one-process run.
    Composes a `LocalEngine` on this rank's module (optimizer, learning-rate
    schedule, sampling, DDP checkpoints).
    """

    def __init__(self, model: torch.nn.Module, optim: OptimConfig | None = None,
                 device: str | torch.device | None = None, *, strategy: Strategy = "ddp",
                 autocast: str | None = None, micro_batch_size: int = 0, frozen: bool = False,
                 _sharded: bool = False):
        if not is_distributed():
            raise RuntimeError("DistributedEngine needs an initialised process group (init_distributed() under torchrun)")
        if strategy not in ("ddp", "fsdp"):
            raise ValueError(f"DistributedEngine: strategy={strategy!r}; choose 'ddp' or 'fsdp'")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.is_main = self.rank == 0
        self.shard = Shard(self.rank, self.world_size)
        self.strategy, self.frozen = strategy, frozen
        self.device = torch.device(device) if device is not None else default_device()
        model = model.to(self.device)
        if not _sharded:
            _broadcast_parameters(model)  # every rank starts from rank 0's weights
            if strategy == "fsdp":
                _fully_shard(model)
        self.local = LocalEngine(model, optim, self.device, autocast=autocast, micro_batch_size=micro_batch_size)
        self._train_module = model
        if strategy == "ddp" and not frozen:
            ids = [self.device.index] if self.device.type == "cuda" else None
            # unused parameters are normal here (a value head during SFT); buffers are synced once above
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # broadcast_buffers is being renamed
                self._train_module = torch.nn.parallel.DistributedDataParallel(
                    model, device_ids=ids, broadcast_buffers=False, find_unused_parameters=True)

    # --- the LocalEngine surface
    @property
    def model(self) -> torch.nn.Module:
        """This rank's module (unwrapped; under FSDP2 its parameters are sharded DTensors)."""
        return self.local.model

    @property
    def optim_config(self) -> OptimConfig:
        return self.local.optim_config

    @property
    def step(self) -> int:
        return self.local.step

    @step.setter
    def step(self, value: int) -> None:
        self.local.step = value

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.local.optimizer

    @property
    def autocast(self) -> str | None:
        return self.local.autocast

    @property
    def micro_batch_size(self) -> int:
        return self.local.micro_batch_size

    def zero_grad(self) -> None:
        self.local.zero_grad()

    # --- forward / backward
    def _run(self, module, batch: Batch, values: bool) -> ForwardOutput:
        batch = batch.to(self.device)
        ctx = torch.autocast(self.device.type, dtype=AUTOCAST_DTYPES[self.autocast]) if self.autocast else contextlib.nullcontext()
        with ctx:
            if values:
                logits, vals = module(batch.ids, attention_mask=batch.attention_mask, return_values=True)
            else:
                logits, vals = module(batch.ids, attention_mask=batch.attention_mask), None
        return ForwardOutput(logits, token_log_probs(logits, batch.ids), vals.float() if vals is not None else None)

    def _chunks(self, n: int) -> list[torch.Tensor | None]:
        """This rank's micro-batches (global row indices), padded with None to the count every rank runs.

        FSDP2 and DDP need every rank to run the same number of forward/backward passes;
        a rank with fewer rows runs zero-weight passes (None) to keep step.
        """
        def count(r: int) -> int:
            m = len(shard_rows(n, r, self.world_size))
            return len(micro_batches(m, self.micro_batch_size)) if m else 0

        rows = shard_rows(n, self.rank, self.world_size)
        mine: list[torch.Tensor | None] = [rows[c] for c in micro_batches(len(rows), self.micro_batch_size)] if len(rows) else []
        return mine + [None] * (max(max(count(r) for r in range(self.world_size)), 1) - len(mine))

    @torch.no_grad()
    def forward(self, batch: Batch, values: bool = False) -> ForwardOutput:
        """Forward without gradient on the global batch: each rank its rows, outputs all-gathered in batch order."""
        module = self.model
        was_training = module.training
        module.eval()
        try:
            outs, done = [], []
            for rows in self._chunks(batch.size):
                out = self._run(module, batch.select(rows if rows is not None else [0]), values)
                outs.append(out if rows is not None else _take(out, 0))  # a zero-row output keeps the shapes
                done.append(rows if rows is not None else torch.zeros(0, dtype=torch.long))
        finally:
            module.train(was_training)
        mine = torch.cat(done)
        cat = lambda xs: self._gather_rows(torch.cat(xs), mine, batch.size)  # noqa: E731
        return ForwardOutput(cat([o.logits for o in outs]), cat([o.logprobs for o in outs]),
                             cat([o.values for o in outs]) if values else None)

    def _gather_rows(self, local: torch.Tensor, mine: torch.Tensor, n: int) -> torch.Tensor:
        """All ranks' rows of one output tensor ([rows, ...] here, same tail shape everywhere) -> [n, ...] in batch order."""
        shards = [shard_rows(n, r, self.world_size) for r in range(self.world_size)]
        order = mine.argsort()  # micro-batches may interleave rows; shard_rows lists them ascending
        assert torch.equal(mine[order], shards[self.rank]), "forward: rows do not match this rank's shard"
        local = local[order.to(local.device)]
        padded = local.new_zeros((max(len(s) for s in shards), *local.shape[1:]))
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded.contiguous())
        full = torch.cat([p[: len(s)] for p, s in zip(parts, shards, strict=True)])
        return full[torch.cat(shards).argsort().to(full.device)]

    def forward_backward(self, batch: Batch, loss_fn: LossFn, scale: float = 1.0, values: bool = False) -> dict:
        """Accumulate `scale * grad(loss of the global batch)`; returns global metrics (as LocalEngine).

        `loss_fn.aggregation` ("token", "sequence" or "constant"; default "sequence",
        i.e. a mean over rows) declares the loss's normaliser, see the module docstring.
        """
        mode = getattr(loss_fn, "aggregation", "sequence")
        module = self._train_module
        module.train()
        chunks = self._chunks(batch.size)
        sums: dict[str, float] = {}
        for i, rows in enumerate(chunks):
            sync = i == len(chunks) - 1
            ctx = module.no_sync() if (not sync and hasattr(module, "no_sync")) else contextlib.nullcontext()
            with ctx:
                if rows is None:  # keep step with the other ranks: a pass that adds zero gradient
                    out = self._run(module, batch.select(micro_batches(batch.size, 2)[0]), values)
                    zero = out.logits.float().sum() * 0.0
                    (zero + (out.values.sum() * 0.0 if values else 0.0)).backward()
                    continue
                part = batch.select(rows)
                share = aggregation_share(part.action_mask, batch.action_mask, mode)
                out = self._run(module, part, values)
                loss, metrics = loss_fn(out, part.to(self.device))
                if loss.dim() != 0:
                    raise ValueError(f"loss_fn must return a scalar loss, got shape {tuple(loss.shape)}")
                (loss * (scale * share * self.world_size)).backward()
                for k, v in {"loss": loss, **metrics}.items():
                    sums[k] = sums.get(k, 0.0) + share * _to_float(v)
        return _sum_dicts(sums, self.world_size)

    def optim_step(self) -> dict:
        """Clip the global gradient norm, step, zero gradients (gradients are already reduced by
        DDP / FSDP2, so this is the local engine's step; under FSDP2 the norm is a DTensor)."""
        return self.local.optim_step()

    def reference_engine(self, **kw) -> "DistributedEngine":
        """A frozen engine on the current policy (KL / DPO reference), sharded like this one."""
        make = getattr(self.model, "frozen_reference", None)
        ref = make(**kw) if make is not None else copy.deepcopy(self.model)
        return DistributedEngine(ref.eval(), device=self.device, strategy=self.strategy, autocast=self.autocast,
                                 micro_batch_size=self.micro_batch_size, frozen=True,
                                 _sharded=self.strategy == "fsdp" and make is None)

    # --- sampling: each rank samples its own prompts (no collectives per token)
    def sample(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
               generator: torch.Generator | None = None, **kw) -> Samples:
        """Sample `prompts` on this rank only (see `trajtune.sampling.sample`).

        Collect through `make_collect(..., shard=engine.shard)` or `sharded_map` to
        spread prompts over ranks. Under FSDP2 the parameters are gathered once per
        call and the model runs without per-layer communication.
        """
        with self._full_parameters():
            return self.local.sample(prompts, max_new_tokens, generator, **kw)

    @contextlib.contextmanager
    def _full_parameters(self):
        if self.strategy != "fsdp":
            yield
            return
        fsdp = [m for m in self.model.modules() if hasattr(m, "unshard") and hasattr(m, "set_reshard_after_forward")]
        for m in fsdp:
            m.set_reshard_after_forward(False, recurse=False)
            m.unshard()
        try:
            yield
        finally:
            for m in fsdp:
                m.reshard()
                m.set_reshard_after_forward(True, recurse=False)

    # --- state: rank 0 writes, everyone reads (a shared file system on multi-node)
    def save_state(self, path: str | os.PathLike, extra: dict | None = None,
                   tensors: dict[str, torch.Tensor] | None = None) -> None:
        """Write model, optimizer state, step, `extra` and `tensors` atomically (rank 0; all ranks must call)."""
        if self.strategy == "ddp":
            if self.is_main:
                self.local.save_state(path, extra, tensors)
            barrier()
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(self.model, options=opts)
        optim = get_optimizer_state_dict(self.model, self.optimizer, options=opts) if self.local._optimizer is not None else None
        if self.is_main:
            names = _param_names(self.model)
            keep = {n for n, _ in self.model.named_parameters()} | {n for n, _ in self.model.named_buffers()}
            with atomic_dir(path) as tmp:
                save_tensors({k: v for k, v in weights.items() if k in keep}, tmp / "model.safetensors")
                if tensors:
                    save_tensors(tensors, tmp / "loop.safetensors")
                meta = {"step": self.step, "optim": asdict(self.optim_config), "extra": extra or {}}
                if optim is not None:  # the LocalEngine layout: "<param index>.<state name>"
                    index = {n: i for i, n in enumerate(names)}
                    tensors = {f"{index[fqn]}.{k}": (v if isinstance(v, torch.Tensor) else torch.tensor(v))
                               for fqn, st in optim["state"].items() for k, v in st.items()}
                    meta["param_groups"] = [{**g, "params": [index[p] for p in g["params"]]} for g in optim["param_groups"]]
                    save_tensors(tensors, tmp / "optimizer.safetensors")
                (tmp / "engine.json").write_text(json.dumps(meta, indent=1))
        barrier()

    def load_state(self, path: str | os.PathLike) -> dict:
        """Restore what `save_state` (this engine's or a LocalEngine's) wrote; every rank reads the files."""
        if self.strategy == "ddp":
            return self.local.load_state(path)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

        path = Path(path)
        if not (path / "engine.json").exists():
            raise FileNotFoundError(f"{path}: not an engine state directory (no engine.json)")
        meta = read_json(path / "engine.json")
        opts = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(self.model, load_tensors(path / "model.safetensors"), options=opts)
        self.local.step = int(meta["step"])
        if "param_groups" in meta:
            names = _param_names(self.model)
            state: dict[str, dict] = {}
            for key, v in load_tensors(path / "optimizer.safetensors").items():
                idx, name = key.split(".", 1)
                state.setdefault(names[int(idx)], {})[name] = v
            groups = [{**g, "params": [names[i] for i in g["params"]]} for g in meta["param_groups"]]
            set_optimizer_state_dict(self.model, self.optimizer, {"state": state, "param_groups": groups},
                                     options=StateDictOptions(full_state_dict=True))
        return meta.get("extra", {})


# --- helpers -------------------------------------------------------------------------
def _broadcast_parameters(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=0)


def _fully_shard(model: torch.nn.Module) -> None:
    """FSDP2: one unit per entry of every ModuleList (the transformer blocks), then the root."""
    from torch.distributed.fsdp import fully_shard

    for child in list(model.modules()):
        if isinstance(child, torch.nn.ModuleList):
            for block in child:
                fully_shard(block)
    fully_shard(model)


def _param_names(model: torch.nn.Module) -> list[str]:
    """Names of the trainable parameters in optimizer order (LocalEngine builds AdamW over these)."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def _take(out: ForwardOutput, n: int) -> ForwardOutput:
    return ForwardOutput(out.logits[:n], out.logprobs[:n], out.values[:n] if out.values is not None else None)


def _to_float(v) -> float:
    if isinstance(v, torch.Tensor):
        return float(v.detach().float().mean()) if v.numel() != 1 else float(v.detach())
    return float(v)


def _sum_dicts(local: dict[str, float], world_size: int) -> dict[str, float]:
    """Sum share-weighted metrics over ranks (ranks may hold different keys, e.g. one without rows)."""
    parts: list[Any] = [None] * world_size
    dist.all_gather_object(parts, local)
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            out[k] = out.get(k, 0.0) + v
    return out
