"""The RL loop's KL reference: the stage's starting policy, frozen -- a resident copy, a LoRA model's base with its
adapters off, or the starting weights on disk swapped in for the logging steps' forward (`StartingWeights`); which
one `RLConfig.kl_coef` and `RLConfig.log_kl` ask for (`reference_for`), and at which steps it is read
(`reference_at`). And RL's Razor (`rl_razor`): what training moved the policy away from its starting point, as
forgetting on an old task and the forward KL on a new one.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import torch

from ..checkpoint import CheckpointError, atomic_dir, load_tensors, save_model_weights
from ..engine import Engine, ForwardOutput
from ..objectives.kl import forgetting_and_forward_kl
from ..runs.loop import Run
from ..trajectory import Batch, Trajectory, collate

if TYPE_CHECKING:
    from .rl import RLConfig


def reference_at(ref: Engine | StartingWeights | None, step: int) -> Engine | StartingWeights | None:
    """The reference the step scores against: `ref`, except between the logging steps of one on disk (None: no
    forward, no KL logged)."""
    return None if isinstance(ref, StartingWeights) and not ref.due(step) else ref


def reference_for(engine: Engine, run: Run, start: int, config: RLConfig) -> Engine | StartingWeights | None:
    """The KL reference: the stage's starting policy, frozen (`run.reference`: saved with the stage's checkpoint) --
    for the loss (kl_coef > 0), or only for the log (`log_kl`, see RLConfig): a resident copy ("copy"), a LoRA
    model's base with its adapters off ("auto": no copy), the starting weights on disk ("disk", and "auto" for any
    other model: `StartingWeights`, read back at the logging steps only); None with kl_coef 0 and log_kl "off"."""
    if config.kl_coef or config.log_kl == "copy":
        return run.reference(engine, start)
    if config.log_kl == "off":
        return None
    if config.log_kl == "auto" and getattr(getattr(engine, "model", None), "is_lora", False):
        return engine.reference_engine(adapters_off=True)
    if not StartingWeights.works_for(engine):  # weights sharded over processes (FSDP2): the copy, as before
        return run.reference(engine, start)
    return StartingWeights(engine, run, start, config.log_kl_every, config.steps)


class StartingWeights:
    """The KL reference of the log that costs no resident copy (log_kl "disk"): the stage's starting weights written
    to disk once -- `<checkpointer dir>/reference/model.safetensors`, kept across resumes, or a temporary folder
    without a checkpointer -- and, at the logging steps (`due`), read back and swapped into the policy's own
    parameters for one forward without gradient, then swapped out again: the same numbers as a frozen copy's
    forward (the same module, the same engine), the weights' memory held only during that forward (the scoring,
    before the update: no gradients are held then) and a step between logging steps pays nothing.

    Parameters are swapped by `.data` (the optimizer's parameter objects, and their state, stay); a process that
    holds its whole model (one process, DDP) does it alone, so a sharded model (FSDP2) keeps the copy (`works_for`)."""

    FILE = "model.safetensors"

    def __init__(self, engine: Engine, run: Run, start: int, every: int, last: int):
        self.engine, self.every, self.last = engine, every, last
        ck = run.checkpointer
        self._tmp = None if ck is not None else tempfile.TemporaryDirectory(prefix="trajtune-kl-reference-")
        folder = ck.directory / "reference" if ck is not None else Path(self._tmp.name)
        self.file = folder / self.FILE
        if start == 0 and (ck is None or engine.is_main):  # every process of a run without a checkpointer: its own
            with atomic_dir(folder) as tmp:
                save_model_weights(engine.model, tmp / self.FILE)
        if ck is not None:
            engine.collective.ranks.barrier()  # the others read rank 0's file
        if not self.file.exists():
            raise CheckpointError(f"{self.file}: the stage's starting weights (the KL reference of log_kl 'disk') "
                                  "are missing; start the stage again (a new --out)")

    @staticmethod
    def works_for(engine: Engine) -> bool:
        """The engine's process holds its model's parameters whole (no DTensor shards; a `TorchEngine`)."""
        model = getattr(engine, "model", None)
        return model is not None and hasattr(engine, "collective") and not any(
            type(p).__name__ == "DTensor" for p in model.parameters())

    def due(self, step: int) -> bool:
        """Is the KL logged after `step` completed steps: every `every` steps and at the last."""
        return step % self.every == 0 or step == self.last

    def forward(self, batch: Batch, **kw) -> ForwardOutput:
        """`engine.forward(batch, **kw)` with the starting weights in place of the policy's."""
        saved = load_tensors(self.file)
        by_name = dict(self.engine.model.named_parameters(remove_duplicate=False))
        swapped: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        try:
            for name, tensor in saved.items():  # a tied weight is in the file once, under one of its names
                p = by_name.get(name)
                if p is None:  # a buffer (rotary frequencies ...): not trained, the policy's own is the start's
                    continue
                swapped.append((p, p.data))
                p.data = tensor.to(p.device, p.dtype)
            return self.engine.forward(batch, **kw)
        finally:
            for p, current in swapped:
                p.data = current


def rl_razor(start: Engine, policy: Engine, old_task: Sequence[Trajectory], new_task: Sequence[Trajectory],
             pad_id: int) -> dict[str, float]:
    """RL's Razor as a metric (Shenfeld et al.; RLHF book ch.15; checklist 15.5): forgetting on the old task and the
    forward KL(pi_0 || pi) on the new task's inputs, by `objectives.kl.forgetting_and_forward_kl`.

    start pi_0 (the policy before training on the new task), policy pi (now); old_task: episodes of the old task
    (demonstrations or pi_0's own samples); new_task: episodes of the new task's prompts *sampled from pi_0* (the
    caller samples them, e.g. a source built on `start`, so the metric itself draws no random numbers).
    -> {razor/forgetting, razor/forward_kl} (nats per episode)."""
    if not old_task or not new_task:
        raise ValueError("rl_razor: needs old-task episodes and new-task episodes sampled from the starting policy")
    old, new = collate(list(old_task), pad_id), collate(list(new_task), pad_id)
    logp = [e.forward(b, positions="actions").logprobs for b in (old, new) for e in (start, policy)]
    out = forgetting_and_forward_kl(logp[0], logp[1], old.action_mask, logp[2], logp[3], new.action_mask)
    return {k: float(v) for k, v in out.items()}
