"""torch.distributed for the engine: process-group helpers and the collective strategies.

    torchrun --nproc-per-node 2 -m trajtune run addition          # one node, 2 processes
    torchrun --nnodes 2 --node-rank R --nproc-per-node 8 \\
        --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m trajtune run addition

`trajtune.engine.make_engine(model, optim)` builds the one engine (`TorchEngine`) with
the strategy `make_collective` picks: `SingleProcess` outside torchrun, `DDP` (default)
or `FSDP` (strategy="fsdp") when torchrun started WORLD_SIZE > 1 processes. A strategy
owns what differs between them -- its rank and world size, preparing the module (DDP
wrapper, FSDP2 sharding, rank 0's weights everywhere), gathering a forward's rows,
reducing metrics, the "no gradient sync until the last micro-batch" context, and the
full state for checkpoints -- while the engine owns the forward, the loss weighting,
the non-finite guard and the checkpoint layout, once (see the engine's docstring for
how N processes reproduce the one-process run).

Sharded rollouts: `collect.make_collect(..., shard=engine.shard)` runs only this
rank's contiguous share of the (task, episode) pairs, each episode with its own
generator seeded from (the step's generator, global episode index), then all-gathers
the trajectories, so group baselines see whole groups and the result does not depend
on how many processes ran it (use `episode_seeds=True` in the one-process run to get
the same samples). `sharded_map` does the same for evaluation.

Only rank 0 writes (`is_main()`); checkpoints are written atomically by rank 0 after
the full state is gathered, and every rank reads them back.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch
import torch.distributed as dist

from ..checkpoint import load_model_weights, load_tensors
from ..metrics import combine_metric

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


# --- which rows a rank owns --------------------------------------------------------
def contiguous_rows(n: int, rank: int, world_size: int) -> list[int]:
    """This rank's contiguous share of n items (episodes, evaluation problems)."""
    return torch.arange(n).tensor_split(world_size)[rank].tolist()


class Shard:
    """This process's share of a list of items and the all-gather that undoes it (`collect.make_collect(shard=)`)."""

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
    one-process engine it is simply called on all items.
    """
    shard = getattr(engine, "shard", None)
    if shard is None:
        return list(fn(list(items)))
    mine = [items[i] for i in shard.rows(len(items))]
    return shard.gather(len(items), fn(mine) if mine else [])


# --- the strategies ------------------------------------------------------------------
class SingleProcess:
    """One process: nothing to shard, gather or reduce."""

    rank, world_size, is_main, shard = 0, 1, True, None

    def default_device(self) -> torch.device:
        return torch.device("cpu")

    def prepare(self, model: torch.nn.Module, device: torch.device, frozen: bool, prepared: bool) -> torch.nn.Module:
        """The module forward_backward runs (here the model itself)."""
        return model

    def gather_rows(self, local: torch.Tensor, mine: torch.Tensor, shards: list[torch.Tensor]) -> torch.Tensor:
        """This process's output rows `local` [rows, ...] for batch rows `mine` -> [n, ...] in batch order."""
        return local if torch.equal(mine, torch.arange(len(mine))) else local[mine.argsort().to(local.device)]

    def reduce_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        return sums

    def gather_suspects(self, suspects: list[str], device: torch.device) -> list[str]:
        return suspects

    def no_sync(self, module: torch.nn.Module, last: bool):
        return contextlib.nullcontext()

    def full_parameters(self, model: torch.nn.Module):
        return contextlib.nullcontext()

    def full_weights(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """The full weights to save, or None: save the module itself (it holds them whole)."""
        return None

    def optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, list]:
        """(state {parameter index: {name: tensor}}, param_groups): the checkpoint layout."""
        opt = optimizer.state_dict()
        return opt["state"], opt["param_groups"]

    def load_weights(self, model: torch.nn.Module, file: Path) -> None:
        load_model_weights(model, file)

    def load_optimizer_state(self, model, optimizer, state: dict, groups: list, device: torch.device) -> None:
        state = {i: {k: (v.to(device) if k != "step" else v) for k, v in st.items()} for i, st in state.items()}
        optimizer.load_state_dict({"state": state, "param_groups": groups})

    def barrier(self) -> None:
        pass


class DDP(SingleProcess):
    """N processes, each with the whole model (DistributedDataParallel averages the gradients)."""

    def __init__(self):
        if not is_distributed():
            raise RuntimeError("DDP needs an initialised process group (init_distributed() under torchrun)")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.is_main = self.rank == 0
        self.shard = Shard(self.rank, self.world_size)

    def default_device(self) -> torch.device:
        return default_device()

    def prepare(self, model, device, frozen, prepared):
        if not prepared:
            _broadcast_parameters(model)  # every rank starts from rank 0's weights
        if frozen:
            return model
        ids = [device.index] if device.type == "cuda" else None
        # unused parameters are normal here (a value head during SFT); buffers are synced once above
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # broadcast_buffers is being renamed
            return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False,
                                                             find_unused_parameters=True)

    def gather_rows(self, local, mine, shards):
        """All ranks' rows of one output tensor (same tail shape everywhere) -> [n, ...] in batch order."""
        order = mine.argsort()  # micro-batches may interleave rows; shards list them in unit order
        assert torch.equal(mine[order], shards[self.rank].sort().values), "forward: rows do not match this rank's shard"
        local = local[order.to(local.device)]
        padded = local.new_zeros((max(len(s) for s in shards), *local.shape[1:]))
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded.contiguous())
        full = torch.cat([p[: len(s)] for p, s in zip(parts, shards, strict=True)])
        return full[torch.cat([s.sort().values for s in shards]).argsort().to(full.device)]

    def reduce_metrics(self, sums):
        """Every rank's share-weighted metrics combined (sums; extrema by max / min: `metrics.combine_metric`);
        ranks may hold different keys, e.g. one without rows."""
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, sums)
        out: dict[str, float] = {}
        for part in parts:
            for k, v in part.items():
                combine_metric(out, k, v)
        return out

    def gather_suspects(self, suspects, device):
        """Every rank's non-finite-loss reports, so all ranks skip the same steps (one all-reduce a step)."""
        flag = torch.tensor([float(len(suspects))], device=device)
        dist.all_reduce(flag)
        if not flag.item():
            return []
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, suspects)
        return [f"rank {r}: {s}" for r, part in enumerate(parts) for s in part]

    def no_sync(self, module, last):
        return module.no_sync() if (not last and hasattr(module, "no_sync")) else contextlib.nullcontext()

    def barrier(self) -> None:
        dist.barrier()


class FSDP(DDP):
    """N processes sharing the parameters, gradients and optimizer state (FSDP2 `fully_shard`)."""

    def prepare(self, model, device, frozen, prepared):
        if not prepared:
            _broadcast_parameters(model)
            _fully_shard(model)
        return model

    @contextlib.contextmanager
    def full_parameters(self, model):
        """Gather the parameters once (sampling then runs without per-layer communication)."""
        fsdp = [m for m in model.modules() if hasattr(m, "unshard") and hasattr(m, "set_reshard_after_forward")]
        for m in fsdp:
            m.set_reshard_after_forward(False, recurse=False)
            m.unshard()
        try:
            yield
        finally:
            for m in fsdp:
                m.reshard()
                m.set_reshard_after_forward(True, recurse=False)

    def full_weights(self, model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        keep = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
        return {k: v for k, v in weights.items() if k in keep}

    def optimizer_state(self, model, optimizer):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        optim = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.is_main:  # the full state is gathered on rank 0 only
            return {}, []
        index = {n: i for i, n in enumerate(_param_names(model))}
        state = {index[fqn]: dict(st) for fqn, st in optim["state"].items()}
        return state, [{**g, "params": [index[p] for p in g["params"]]} for g in optim["param_groups"]]

    def load_weights(self, model, file):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, load_tensors(file), options=StateDictOptions(full_state_dict=True, strict=False))

    def load_optimizer_state(self, model, optimizer, state, groups, device):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        names = _param_names(model)
        full = {"state": {names[i]: st for i, st in state.items()},
                "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in groups]}
        set_optimizer_state_dict(model, optimizer, full, options=StateDictOptions(full_state_dict=True))


Strategy = Literal["ddp", "fsdp"]


def make_collective(strategy: Strategy = "ddp") -> SingleProcess:
    """The strategy for this process: SingleProcess outside torchrun, else DDP or FSDP (joins the group)."""
    if strategy not in ("ddp", "fsdp"):
        raise ValueError(f"strategy={strategy!r}; choose 'ddp' or 'fsdp'")
    if not launched_distributed():
        return SingleProcess()
    init_distributed()
    return FSDP() if strategy == "fsdp" else DDP()


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
    """Names of the trainable parameters in optimizer order (the engine builds AdamW over these)."""
    return [n for n, p in model.named_parameters() if p.requires_grad]
