"""The collective strategies behind `protocol.Collective`: one process, DDP, FSDP2.

    SingleProcess   one process: nothing to shard, gather or reduce
    DDP             N processes, each with the whole model (DistributedDataParallel averages the gradients)
    FSDP            N processes sharing the parameters, gradients and optimizer state (FSDP2 `fully_shard`)

`make_collective(strategy)` picks one from how the process was launched (`SingleProcess` outside torchrun).
A strategy owns what differs between them, while the engine owns the forward, the loss weighting, the
non-finite guard and the checkpoint layout, once. It is three things, composed (no class extends another):

    ranks     `distributed.Ranks`: this process's rank, the world size, and the collectives on what is not a
              parameter (a forward's output rows, metrics, non-finite reports, barriers)
    layout    how the parameters are held (`protocol.Layout`): `Whole` on every process (one process, DDP) or
              `Sharded` over the processes (FSDP2) -- copying a model or its weights, gathering them for
              sampling, the full state for checkpoints and loading it back
    its own   the default device, preparing the module forward_backward runs (the DDP wrapper, FSDP2 sharding,
              rank 0's weights everywhere) and the "no gradient sync until the last micro-batch" context
"""

from __future__ import annotations

import contextlib
import copy
import warnings
import weakref
from pathlib import Path
from typing import Any, Iterator, Literal

import torch
import torch.distributed as dist

from ..checkpoint import load_model_weights, load_tensors
from .distributed import Ranks, default_device, init_distributed, launched_distributed

Strategy = Literal["ddp", "fsdp"]
STRATEGIES: tuple[str, ...] = ("ddp", "fsdp")


def make_collective(strategy: Strategy = "ddp") -> SingleProcess | DDP | FSDP:
    """The strategy for this process: SingleProcess outside torchrun, else DDP or FSDP (joins the group)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}; choose one of {STRATEGIES}")
    if not launched_distributed():
        return SingleProcess()
    init_distributed()
    return FSDP() if strategy == "fsdp" else DDP()


# --- the strategies --------------------------------------------------------------------------
class SingleProcess:
    """One process: nothing to shard, gather or reduce."""

    def __init__(self) -> None:
        self.ranks, self.layout = Ranks(), Whole()

    def default_device(self) -> torch.device:
        return torch.device("cpu")

    def prepare(self, model: torch.nn.Module, device: torch.device, frozen: bool, prepared: bool) -> torch.nn.Module:
        """The module forward_backward runs (here the model itself)."""
        return model

    def no_sync(self, module: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext()


class DDP:
    """N processes, each with the whole model (DistributedDataParallel averages the gradients)."""

    def __init__(self) -> None:
        self.ranks, self.layout = Ranks.joined("DDP"), Whole()

    def default_device(self) -> torch.device:
        return default_device()

    def prepare(self, model: torch.nn.Module, device: torch.device, frozen: bool, prepared: bool) -> torch.nn.Module:
        """The DDP wrapper of `model` (the model itself when frozen), every rank starting from rank 0's weights."""
        if not prepared:
            _broadcast_parameters(model)
        if frozen:
            return model
        ids = [device.index] if device.type == "cuda" else None
        # unused parameters are normal here (a value head during SFT); buffers are synced once above
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # broadcast_buffers is being renamed
            return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False,
                                                             find_unused_parameters=True)

    def no_sync(self, module: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager[object]:
        """No gradient all-reduce before the last micro-batch of a step (DDP's `no_sync`)."""
        skip = getattr(module, "no_sync", None)
        return skip() if (not last and skip is not None) else contextlib.nullcontext()


class FSDP:
    """N processes sharing the parameters, gradients and optimizer state (FSDP2 `fully_shard`)."""

    def __init__(self) -> None:
        self.ranks = Ranks.joined("FSDP")
        self.layout = Sharded(self.ranks)

    def default_device(self) -> torch.device:
        return default_device()

    def prepare(self, model: torch.nn.Module, device: torch.device, frozen: bool, prepared: bool) -> torch.nn.Module:
        """`model` sharded in place (`Sharded.shard`), every rank starting from rank 0's weights."""
        if not prepared:
            _broadcast_parameters(model)
            self.layout.shard(model, device)
        return model

    def no_sync(self, module: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext()  # FSDP2 reduce-scatters after every backward


# --- the layouts of the parameters ----------------------------------------------------------
class Whole:
    """Every process holds the whole model (one process, DDP: the ranks hold the same weights): copied, saved and
    loaded as they are, each process its own module."""

    def copy_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return copy.deepcopy(model)

    def copy_weights(self, dst: torch.nn.Module, src: torch.nn.Module) -> None:
        _copy_whole(dst, src)

    def full_parameters(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[object]:
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

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict,
                             groups: list, device: torch.device) -> None:
        state = {i: {k: (v.to(device) if k != "step" else v) for k, v in st.items()} for i, st in state.items()}
        optimizer.load_state_dict({"state": state, "param_groups": groups})


class Sharded:
    """FSDP2: each parameter is a DTensor whose shard [n / world_size, ...] lives on one rank. The full weights
    and optimizer state are gathered to rank 0 for checkpoints; copies go shard to shard."""

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks
        # every model sharded here -> (its structure on the meta device, its device): what `copy_model` rebuilds
        self._skeletons: weakref.WeakKeyDictionary[torch.nn.Module, tuple[torch.nn.Module, torch.device]] = \
            weakref.WeakKeyDictionary()

    def shard(self, model: torch.nn.Module, device: torch.device) -> None:
        """Shard `model` in place (`_fully_shard`), keeping its structure (meta tensors: no memory) so that
        `copy_model` can build another one like it."""
        skeleton = _meta_skeleton(model)
        _fully_shard(model)
        self._skeletons[model] = (skeleton, device)

    def copy_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """A new model sharded like `model` with its weights: its structure built anew (an FSDP2 module cannot
        be deep-copied), sharded the same way, then each rank's shards copied (no communication)."""
        if model not in self._skeletons:
            raise ValueError("FSDP copy_model: this model was not sharded by this strategy (prepare)")
        skeleton, device = self._skeletons[model]
        twin = copy.deepcopy(skeleton).to_empty(device=device)
        _fully_shard(twin)
        self._skeletons[twin] = (skeleton, device)
        _copy_shards(twin, model)
        return twin

    def copy_weights(self, dst: torch.nn.Module, src: torch.nn.Module) -> None:
        """Each rank copies its shard of every parameter into the same shard of `dst` (no gathering)."""
        _copy_shards(dst, src)

    @contextlib.contextmanager
    def full_parameters(self, model: torch.nn.Module) -> Iterator[None]:
        """Gather the parameters once (sampling then runs without per-layer communication)."""
        fsdp: list[Any] = [m for m in model.modules()
                           if hasattr(m, "unshard") and hasattr(m, "set_reshard_after_forward")]
        for m in fsdp:
            m.set_reshard_after_forward(False, recurse=False)
            m.unshard()
        try:
            yield
        finally:
            for m in fsdp:
                m.reshard()
                m.set_reshard_after_forward(True, recurse=False)

    def full_weights(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """The full weights, gathered to rank 0's CPU (every rank must call it)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        weights: dict[str, Any] = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                                       cpu_offload=True))
        keep = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
        return {k: v for k, v in weights.items() if k in keep}

    def optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, list]:
        """The full optimizer state in the checkpoint layout, on rank 0 (empty elsewhere)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        optim: Any = get_optimizer_state_dict(model, optimizer,
                                              options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.ranks.is_main:  # the full state is gathered on rank 0 only
            return {}, []
        index = {n: i for i, n in enumerate(_param_names(model))}
        state = {index[fqn]: dict(st) for fqn, st in optim["state"].items()}
        return state, [{**g, "params": [index[p] for p in g["params"]]} for g in optim["param_groups"]]

    def load_weights(self, model: torch.nn.Module, file: Path) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        weights: dict[str, Any] = load_tensors(file)
        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict,
                             groups: list, device: torch.device) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        names = _param_names(model)
        full: Any = {"state": {names[i]: st for i, st in state.items()},
                     "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in groups]}
        set_optimizer_state_dict(model, optimizer, full, options=StateDictOptions(full_state_dict=True))


# --- helpers ---------------------------------------------------------------------------------
def _broadcast_parameters(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=0)


def _tensor_pairs(dst: torch.nn.Module, src: torch.nn.Module) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, dst tensor, src tensor) for every parameter and buffer, by name; the two models must have the same
    names and shapes (else a ValueError naming the first difference)."""
    def tensors(m: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {**dict(m.named_parameters()), **dict(m.named_buffers())}

    d, s = tensors(dst), tensors(src)
    if d.keys() != s.keys():
        only = sorted(d.keys() ^ s.keys())
        raise ValueError(f"copy_weights: the models differ in their parameters and buffers ({len(only)} names in one "
                         f"only, e.g. {only[:3]}); copy between engines of the same architecture")
    for name, t in d.items():
        if t.shape != s[name].shape:
            raise ValueError(f"copy_weights: {name} is {tuple(t.shape)} here and {tuple(s[name].shape)} in the source")
    return [(name, t, s[name]) for name, t in d.items()]


def _copy_whole(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """Every tensor of `src` into the same-named tensor of `dst` (both held whole by this process)."""
    with torch.no_grad():
        for _, d, s in _tensor_pairs(dst, src):
            if d is not s:
                d.copy_(s)


def _copy_shards(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """FSDP2: every rank copies its local shard of each parameter of `src` into the same shard of `dst` (the same
    mesh and placements, so the same rows on the same rank: no gathering); buffers are whole on every rank.
    Both models are resharded first: after a forward without backward (a frozen engine's), FSDP2 leaves the
    root's parameters gathered, registered as whole tensors."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    for m in [*dst.modules(), *src.modules()]:
        if isinstance(m, FSDPModule):
            m.reshard()
    with torch.no_grad():
        for name, d, s in _tensor_pairs(dst, src):
            if isinstance(d, DTensor) and isinstance(s, DTensor):
                if d.device_mesh != s.device_mesh or d.placements != s.placements:
                    raise ValueError(f"copy_weights: {name} is sharded differently ({d.placements} vs {s.placements})")
                d, s = d.to_local(), s.to_local()  # this rank's shards, the same rows of the parameter
            elif isinstance(d, DTensor) or isinstance(s, DTensor):
                raise ValueError(f"copy_weights: {name} is an FSDP2 shard in one model only; copy between engines "
                                 "of the same strategy")
            if d is not s:
                d.copy_(s)


def _meta_skeleton(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` whose parameters and buffers are empty meta tensors (the structure, no memory; shared
    tensors stay shared): `skeleton.to_empty(device=...)` is then a new model of the same architecture."""
    memo: dict[int, Any] = {}
    for t in [*model.parameters(), *model.buffers()]:
        meta = torch.empty_like(t, device="meta")
        memo[id(t)] = torch.nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) \
            else meta
    return copy.deepcopy(model, memo)


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
