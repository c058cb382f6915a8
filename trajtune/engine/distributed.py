"""torch.distributed for the engine: the process group and which items each process owns.

    torchrun --nproc-per-node 2 -m trajtune run addition          # one node, 2 processes
    torchrun --nnodes 2 --node-rank R --nproc-per-node 8 \\
        --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m trajtune run addition

`trajtune.engine.make_engine(model, optim)` builds the one engine (`TorchEngine`) with the collective strategy
(`trajtune.engine.collectives`: one process, DDP or FSDP2) that `make_collective` picks from how the process was
launched; this module is what the strategies, the loops and the experiments share: joining the process group
(`init_distributed`, `close_distributed`), who writes (`is_main`), `barrier`, `broadcast_object`, the device of
a rank, the split of a list of items over the ranks (`contiguous_rows`, `Shard`, `sharded_map`), and `Ranks`: a
strategy's rank and its collectives on what is not a parameter (output rows, metrics, non-finite reports).

Sharded rollouts: `sources.episodes.EpisodeSource(..., shard=engine.shard)` runs only this
rank's contiguous share of the (task, episode) pairs, each episode with its own
generator seeded from (the step's generator, global episode index), then all-gathers
the trajectories, so group baselines see whole groups and the result does not depend
on how many processes ran it (use `episode_seeds=True` in the one-process run to get
the same samples). `sharded_map` does the same for evaluation.

Only rank 0 writes (`is_main()`); checkpoints are written atomically by rank 0 after
the full state is gathered, and every rank reads them back.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

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


def close_distributed(failed: bool = False) -> None:
    """Leave the process group before the interpreter shuts down (a no-op outside it). Without this, gloo's worker
    threads may still hold work objects whose tensors are freed during interpreter finalization, which aborts the
    process (SIGABRT, "terminate called without an active exception") after a run that succeeded. On a failure
    (`failed`) an NCCL group is not destroyed: its destroy is collective and would wait on ranks that may never
    come; the process exits and torchrun ends the others."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if failed and dist.get_backend() == "nccl":
        return
    dist.destroy_process_group()


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
    """This process's share of a list of items and the all-gather that undoes it (`EpisodeSource(shard=)`)."""

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


class Ranks:
    """This process among the processes of a run -- its rank, the world size, its `Shard` of a list -- and the
    collectives the engine runs on what is not a parameter: a forward's output rows, metrics, non-finite reports,
    barriers. Every strategy holds one (`Collective.ranks`): `Ranks()` is one process (each collective an
    identity), `Ranks.joined(...)` the initialised process group."""

    def __init__(self, rank: int = 0, world_size: int = 1) -> None:
        self.rank, self.world_size = rank, world_size
        self.is_main = rank == 0
        self.shard = Shard(rank, world_size) if world_size > 1 else None

    @classmethod
    def joined(cls, who: str) -> Ranks:
        """This process's place in the initialised process group (`who` needs one: named in the error)."""
        if not is_distributed():
            raise RuntimeError(f"{who} needs an initialised process group (init_distributed() under torchrun)")
        return cls(dist.get_rank(), dist.get_world_size())

    def gather_rows(self, local: torch.Tensor, mine: torch.Tensor, shards: list[torch.Tensor]) -> torch.Tensor:
        """All ranks' rows of one output tensor (same tail shape everywhere): this rank's local [rows, ...] for
        batch rows mine [rows] (shards[rank], in any order) -> [n, ...] in batch order."""
        if self.world_size == 1:
            return local if torch.equal(mine, torch.arange(len(mine))) else local[mine.argsort().to(local.device)]
        order = mine.argsort()  # micro-batches may interleave rows; shards list them in unit order
        assert torch.equal(mine[order], shards[self.rank].sort().values), "forward: rows do not match this rank's shard"
        local = local[order.to(local.device)]
        padded = local.new_zeros((max(len(s) for s in shards), *local.shape[1:]))
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded.contiguous())
        full = torch.cat([p[: len(s)] for p, s in zip(parts, shards, strict=True)])
        return full[torch.cat([s.sort().values for s in shards]).argsort().to(full.device)]

    def reduce_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """Every rank's share-weighted metrics combined (sums; extrema by max / min: `metrics.combine_metric`);
        ranks may hold different keys, e.g. one without rows."""
        if self.world_size == 1:
            return sums
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, sums)
        out: dict[str, float] = {}
        for part in parts:
            for k, v in part.items():
                combine_metric(out, k, v)
        return out

    def gather_suspects(self, suspects: list[str], device: torch.device) -> list[str]:
        """Every rank's non-finite-loss reports, so all ranks skip the same steps (one all-reduce a step)."""
        if self.world_size == 1:
            return suspects
        flag = torch.tensor([float(len(suspects))], device=device)
        dist.all_reduce(flag)
        if not flag.item():
            return []
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, suspects)
        return [f"rank {r}: {s}" for r, part in enumerate(parts) for s in part]

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


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
