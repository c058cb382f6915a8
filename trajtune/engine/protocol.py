"""The engine's contracts: the `Engine` Protocol algorithm loops call, the `Collective` Protocol the engine calls
for everything that differs between one process, DDP and FSDP2 (with its parameters' `Layout`), and the types
that cross the seam (`Loss`, `ForwardOutput`, `Positions`, `Backend`). The implementations:
`torch_engine.TorchEngine`, and `collectives`' strategies and layouts; tests/unit/test_protocols.py assigns each to its
Protocol and tests/unit/test_types.py type-checks them (mypy)."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Protocol, Sequence

import torch

from ..config import check_choices
from ..logprobs import Aggregation, aggregation_share
from ..trajectory import Batch
from .decoding import Samples
from .distributed import Ranks, Shard
from .optim import OptimConfig


@dataclass
class ForwardOutput:
    """What a loss function sees. The whole logits are never computed unless asked for: the log-probs
    (and entropy) come from the output layer in chunks of positions (`trajtune.logprobs.TokenHead`).

    logprobs [B, T-1]          log pi(ids[:, t+1] | ids[:, :t+1]) (of `batch.extras[trajectory.TARGETS][:, t]`
                               where the batch has them) at the positions the forward was asked for:
                               with the engine's head_positions="actions" and a reader that reads only the
                               POLICY tokens (`Loss.positions` / `forward(positions=)` = "actions"), the
                               positions where `batch.action_mask` is nonzero, and exactly 0.0 at the others;
                               else every position
    values   [B, T] | None     scalar head, if the model has one and it was asked for (every position)
    entropy  [B, T-1] | None   entropy (nats) of the next-token distribution at t, if asked for (the same
                               positions as the log-probs, 0.0 at the others)
    logits   [B, T, V] | None  raw next-token logits, only if asked for (full-vocabulary losses; every position)
    """

    logprobs: torch.Tensor
    values: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    logits: torch.Tensor | None = None


LossFn = Callable[[ForwardOutput, Batch], tuple[torch.Tensor, dict]]

Positions = Literal["actions", "all"]
POSITIONS: tuple[str, ...] = ("actions", "all")
"""Where a reader of the log-probs reads them (`Loss.positions`, `forward(positions=)`) and where an engine
computes them (`make_engine(head_positions=)`): "actions" -- where `Batch.action_mask` is nonzero; "all"."""


@dataclass(frozen=True)
class Loss:
    """A loss for `Engine.forward_backward`: a pure function of (forward output, batch) and its normaliser.

    fn:         fn(out, batch) -> (scalar loss, metrics); reads per-row step tensors from `batch.pg` (policy
                gradient) or `batch.extras`
    normalizer: what the scalar is a mean over -- "token" (POLICY tokens), "sequence" (rows) or
                "constant" (rows, over a fixed constant): how a part of the batch is weighted
    values:     the forward pass must also return the value head's output (`ForwardOutput.values`)
    entropy:    ... and the per-token entropy (`ForwardOutput.entropy`, chunked like the log-probs)
    logits:     ... and the whole logits [B, T, V] (`ForwardOutput.logits`): full-vocabulary losses only
    positions:  where fn reads `out.logprobs` / `out.entropy`: "actions" (only where `batch.action_mask` is
                nonzero, as every loss of the library does: the POLICY tokens) lets an engine with
                head_positions="actions" run the output layer there only (0.0 elsewhere); "all": fn reads
                other positions too (a prompt's NLL, an unmasked metric), so they are always computed
    """

    fn: LossFn
    normalizer: Aggregation
    values: bool = False
    entropy: bool = False
    logits: bool = False
    positions: Positions = "actions"

    def __post_init__(self) -> None:
        check_choices(self)

    def __call__(self, out: ForwardOutput, batch: Batch) -> tuple[torch.Tensor, dict]:
        return self.fn(out, batch)

    def share(self, part: Batch, whole: Batch) -> float:
        """Weight of `part`'s loss in `whole`'s: sum over the parts of share * loss(part) == loss(whole)."""
        return aggregation_share(part.action_mask, whole.action_mask, self.normalizer)


class NonFiniteError(FloatingPointError):
    """A NaN or Inf loss or gradient, with `on_nonfinite = "stop"`."""


Backend = Literal["sampler", "generate"]
"""How `Engine.sample` decodes: "sampler" -- trajtune's batched KV-cached sampler (`decoding.sample`, any model
with the cache contract); "generate" -- Hugging Face `model.generate` (`generate.generate`, HF models only)."""


class Engine(Protocol):
    """The contract between algorithm loops and the hardware (`trajtune.engine`'s docstring). Loops annotate this."""

    device: torch.device
    model: torch.nn.Module
    optim_config: OptimConfig
    step: int
    """optimizer steps taken (including skipped ones)"""
    autocast: str | None
    """None (full precision), "bf16" or "fp16": the forward's mixed precision (a sampler's check computes as it)"""

    @property
    def shard(self) -> Shard | None:
        """This process's share of a list (`distributed.Shard`) for sharded rollouts, or None."""
        ...

    @property
    def is_main(self) -> bool:
        """True in the one process that writes files (rank 0, or a single process)."""
        ...

    def forward(self, batch: Batch, values: bool = False, entropy: bool = False, logits: bool = False,
                positions: Positions = "all") -> ForwardOutput: ...

    def forward_backward(self, batch: Batch, loss: Loss, scale: float = 1.0, buckets: int = 1) -> dict: ...

    def optim_step(self) -> dict: ...

    def sample(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, generator: torch.Generator | None = None,
               *, backend: Backend = "sampler", **kw) -> Samples: ...

    def policy_weights(self) -> AbstractContextManager[torch.nn.Module]:
        """The policy module with its full parameters while the context lasts (gathered once under FSDP; every rank
        enters it): what a sampler that holds its own weights copies, fingerprints and checks its log-probs
        against (`trajtune.sources.sync`). Read it, do not train it."""
        ...

    def copy_weights_from(self, other: Engine) -> None:
        """This engine's weights := `other`'s (the same architecture under the same strategy), on every rank."""
        ...

    def save_state(self, path: str | os.PathLike, extra: dict | None = None,
                   tensors: dict[str, torch.Tensor] | None = None) -> None: ...

    def load_state(self, path: str | os.PathLike) -> dict: ...

    def reference_engine(self, **kw) -> Engine: ...


class Collective(Protocol):
    """What differs between one process, DDP and FSDP2 (`trajtune.engine.collectives`); the engine reaches
    torch.distributed only through this: its `ranks`, its parameters' `layout`, and the three below."""

    @property
    def ranks(self) -> Ranks:
        """This process among the run's: rank, world size, its `Shard` of a list, and the collectives on what is not
        a parameter (a forward's rows, metrics, non-finite reports, barriers): `distributed.Ranks`."""
        ...

    @property
    def layout(self) -> Layout:
        """How the parameters are held: whole on every process, or sharded over them."""
        ...

    def default_device(self) -> torch.device: ...

    def prepare(self, model: torch.nn.Module, device: torch.device, frozen: bool, prepared: bool) -> torch.nn.Module:
        """The module forward_backward runs (the model, a DDP wrapper, or the model sharded in place), every rank
        starting from rank 0's weights; `prepared`: `model` is laid out already (`Layout.copy_model`'s)."""
        ...

    def no_sync(self, module: torch.nn.Module, last: bool) -> AbstractContextManager[object]:
        """The context of a backward that is not the last of a step (DDP: no gradient all-reduce yet)."""
        ...


class Layout(Protocol):
    """How a strategy holds the parameters (`collectives.Whole`: every process the whole model; `Sharded`: FSDP2
    shards): how they are copied, gathered for sampling, saved and loaded."""

    def copy_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """A new model with `model`'s current weights, laid out like it (a frozen reference's model)."""
        ...

    def copy_weights(self, dst: torch.nn.Module, src: torch.nn.Module) -> None:
        """`dst`'s parameters and buffers := `src`'s, each process its own part (no communication)."""
        ...

    def full_parameters(self, model: torch.nn.Module) -> AbstractContextManager[object]:
        """A context in which `model` computes without gathering parameters per layer (sampling)."""
        ...

    def full_weights(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """The full weights to save (None: save the module itself, it holds them whole); every rank calls it."""
        ...

    def optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, list]:
        """(state {parameter index: {name: tensor}}, param_groups): the checkpoint layout, whole on rank 0."""
        ...

    def load_weights(self, model: torch.nn.Module, file: Path) -> None: ...

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict,
                             groups: list, device: torch.device) -> None: ...
