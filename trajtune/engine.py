"""The engine: the one seam between algorithm loops and the hardware.

Algorithm loops never touch the model, the optimizer or the device directly;
they call

    engine.forward(batch)                     -> ForwardOutput (no gradient)
    engine.forward_backward(batch, loss_fn)   -> metrics (gradients accumulate)
    engine.optim_step()                       -> metrics (clip, step, zero grads)
    engine.sample(prompts, max_new_tokens, generator, ...) -> Samples
    engine.save_state(dir) / engine.load_state(dir)
    engine.reference_engine()                 -> a frozen engine on the current policy (KL / DPO reference)

so the same loop runs on a laptop CPU (`LocalEngine`, this file) and, later,
under `torchrun` behind a distributed engine with the same methods.

`loss_fn(out: ForwardOutput, batch: Batch) -> (loss scalar, metrics dict)` is a
pure function of the forward output: it never samples and never steps.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Literal, Sequence

import torch

from .checkpoint import atomic_dir, load_model_weights, load_tensors, read_json, save_model_weights, save_tensors
from .logprobs import aggregation_share, token_log_probs
from .sampling import Samples, sample
from .trajectory import Batch


log = logging.getLogger("trajtune.engine")


@dataclass
class OptimConfig:
    """AdamW with linear warm-up and optional cosine decay."""

    lr: float = 1e-3
    """peak learning rate"""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay"""
    beta1: float = 0.9
    """Adam first-moment decay"""
    beta2: float = 0.95
    """Adam second-moment decay"""
    grad_clip: float = 1.0
    """clip the global gradient norm to this value (0 disables)"""
    warmup_steps: int = 0
    """linear warm-up from 0 to lr over this many optimizer steps"""
    decay_steps: int = 0
    """if > 0, cosine decay from lr to lr/10 over this many steps after warm-up"""
    on_nonfinite: Literal["skip", "stop"] = "skip"
    """a NaN/Inf gradient skips the step (logged as train/skipped) or stops the run"""

    def __post_init__(self) -> None:
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be positive and finite, got {self.lr}")
        for name in ("weight_decay", "grad_clip", "warmup_steps", "decay_steps"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be >= 0, got {v}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")

    def lr_at(self, step: int) -> float:
        if self.warmup_steps and step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.decay_steps:
            t = min(1.0, (step - self.warmup_steps) / self.decay_steps)
            return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))
        return self.lr


@dataclass
class ForwardOutput:
    """What a loss function sees.

    logits   [B, T, V]  raw next-token logits
    logprobs [B, T-1]   log pi(ids[:, t+1] | ids[:, :t+1])
    values   [B, T] | None   scalar head, if the model has one and it was asked for
    """

    logits: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor | None = None


class NonFiniteError(FloatingPointError):
    """A NaN or Inf loss or gradient, with `on_nonfinite = "stop"`."""


LossFn = Callable[[ForwardOutput, Batch], tuple[torch.Tensor, dict]]


class LocalEngine:
    """One process, one device (CPU or a single GPU)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optim: OptimConfig | None = None,
        device: str | torch.device = "cpu",
        *,
        autocast: str | None = None,
        micro_batch_size: int = 0,
    ):
        """autocast: None (full precision), "bf16" or "fp16": mixed-precision forward passes
        (weights and optimizer stay in their own dtype). micro_batch_size: if > 0, `forward`
        and `forward_backward` split a batch into chunks of at most this many rows and
        accumulate (gradient accumulation at fixed memory); see `micro_batches`."""
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.optim_config = optim or OptimConfig()
        self.step = 0  # optimizer steps taken
        self.skipped_steps = 0  # steps whose gradient was NaN/Inf (weights left unchanged)
        self._suspects: list[str] = []  # batches with a non-finite loss since the last optim_step
        self._optimizer: torch.optim.Optimizer | None = None
        if autocast not in AUTOCAST_DTYPES:
            raise ValueError(f"LocalEngine: autocast={autocast!r}; choose one of {list(AUTOCAST_DTYPES)}")
        if micro_batch_size < 0:
            raise ValueError(f"LocalEngine: micro_batch_size must be >= 0, got {micro_batch_size}")
        self.autocast = autocast
        self.micro_batch_size = micro_batch_size

    # --- optimizer (created lazily: inference-only engines never allocate Adam state)
    @property
    def optimizer(self) -> torch.optim.Optimizer:
        if self._optimizer is None:
            c = self.optim_config
            params = [p for p in self.model.parameters() if p.requires_grad]
            self._optimizer = torch.optim.AdamW(
                params, lr=c.lr, betas=(c.beta1, c.beta2), weight_decay=c.weight_decay
            )
        return self._optimizer

    # --- forward / backward ----------------------------------------------------
    def _autocast(self):
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=AUTOCAST_DTYPES[self.autocast])

    def _forward(self, batch: Batch, values: bool) -> ForwardOutput:
        batch = batch.to(self.device)
        with self._autocast():
            if values:
                logits, vals = self.model(batch.ids, attention_mask=batch.attention_mask, return_values=True)
            else:
                logits, vals = self.model(batch.ids, attention_mask=batch.attention_mask), None
        vals = vals.float() if vals is not None else None
        return ForwardOutput(logits, token_log_probs(logits, batch.ids), vals)

    @torch.no_grad()
    def forward(self, batch: Batch, values: bool = False) -> ForwardOutput:
        """Forward without gradient (reference / old log-probs, evaluation); micro-batched if configured."""
        was_training = self.model.training
        self.model.eval()
        try:
            chunks = micro_batches(batch.size, self.micro_batch_size)
            if len(chunks) == 1:
                return self._forward(batch, values)
            outs = [self._forward(batch.select(rows), values) for rows in chunks]
            order = torch.cat(chunks).argsort().to(self.device)  # back to the batch's row order
            cat = lambda xs: torch.cat(xs)[order]  # noqa: E731
            return ForwardOutput(cat([o.logits for o in outs]), cat([o.logprobs for o in outs]),
                                 cat([o.values for o in outs]) if values else None)
        finally:
            self.model.train(was_training)

    def forward_backward(self, batch: Batch, loss_fn: LossFn, scale: float = 1.0, values: bool = False) -> dict:
        """Run `loss_fn` on a forward pass and accumulate `scale * grad(loss)`.

        Call several times before `optim_step()` for gradient accumulation (the
        caller picks `scale`, e.g. 1/num_micro_batches). Returns loss_fn's metrics
        (floats) plus `loss`. With `micro_batch_size` set, the batch is split by
        `micro_batches` and each chunk's loss is weighted by its share of the whole
        batch's normaliser, declared by `loss_fn.aggregation` ("token": share of POLICY
        tokens; "sequence" / "constant" or undeclared: share of rows; see
        `logprobs.aggregation_share`), so the accumulated gradient equals the
        one-chunk gradient. Metrics are the same weighted means.
        """
        self.model.train()
        mode = getattr(loss_fn, "aggregation", "sequence")
        chunks = micro_batches(batch.size, self.micro_batch_size)
        result: dict[str, float] = {}
        for rows in chunks:
            part = batch if len(chunks) == 1 else batch.select(rows)
            share = 1.0 if len(chunks) == 1 else aggregation_share(part.action_mask, batch.action_mask, mode)
            out = self._forward(part, values)
            loss, metrics = loss_fn(out, part.to(self.device))
            if loss.dim() != 0:
                raise ValueError(f"loss_fn must return a scalar loss, got shape {tuple(loss.shape)}")
            if not bool(torch.isfinite(loss.detach())):
                self._suspects.append(nonfinite_rows(part, out.logprobs))
            (loss * scale * share).backward()
            for k, v in {"loss": loss, **metrics}.items():
                result[k] = result.get(k, 0.0) + share * _to_float(v)
        return result

    def optim_step(self) -> dict:
        """Clip gradients, step the optimizer with this step's learning rate, zero gradients.

        A NaN or Inf gradient, or a NaN / Inf loss since the last step (whose gradient may
        look finite: a NaN that entered without touching a weight), never reaches the weights: the step is
        skipped (`skipped` = 1 in the returned metrics, the loop logs it with its step, and a
        warning names the rows whose loss or log-probs were not finite: their task or
        file:line) or, with `OptimConfig.on_nonfinite = "stop"`, `NonFiniteError` is raised
        with the same message.
        """
        c = self.optim_config
        lr = c.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, c.grad_clip if c.grad_clip > 0 else float("inf"))
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: the global norm, same on every rank
        suspects, self._suspects = self._suspects, []
        finite = bool(torch.isfinite(norm)) and not suspects
        if finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        if not finite:
            self.skipped_steps += 1
            culprit = "; ".join(suspects) if suspects else "the loss was finite: the gradient overflowed"
            message = f"non-finite loss or gradient (norm {float(norm)}) at optimizer step {self.step}: {culprit}"
            if c.on_nonfinite == "stop":
                raise NonFiniteError(message)
            log.warning("%s (step skipped, weights unchanged)", message)
        return {"grad_norm": float(norm), "lr": lr, "skipped": 0.0 if finite else 1.0}

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=True)

    def reference_engine(self, **kw) -> "LocalEngine":
        """A frozen engine on the *current* policy: the KL / DPO reference.

        A model may provide `frozen_reference()` to give one without a second copy of
        its weights (the Hugging Face adapter with fresh LoRA adapters: the base weights
        with adapters disabled); otherwise this is a deep copy. Same device, autocast
        and micro-batching as this engine; it never builds an optimizer. `kw` go to the
        model's `frozen_reference` (e.g. adapters_off=True).
        """
        make = getattr(self.model, "frozen_reference", None)
        ref = make(**kw) if make is not None else copy.deepcopy(self.model)
        return LocalEngine(ref.eval(), device=self.device, autocast=self.autocast, micro_batch_size=self.micro_batch_size)

    # --- sampling --------------------------------------------------------------
    def sample(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, generator: torch.Generator | None = None, **kw) -> Samples:
        """Batched KV-cached sampling (see `trajtune.sampling.sample` for the options)."""
        was_training = self.model.training
        self.model.eval()
        try:
            return sample(self.model, prompts, max_new_tokens, generator, **kw)
        finally:
            self.model.train(was_training)

    # --- state -----------------------------------------------------------------
    def save_state(self, path: str | os.PathLike, extra: dict | None = None,
                   tensors: dict[str, torch.Tensor] | None = None) -> None:
        """Write model, optimizer state, step, `extra` (JSON) and `tensors` (a loop's own state,
        `loop.safetensors`) atomically to directory `path`."""
        with atomic_dir(path) as tmp:
            if tensors:
                save_tensors(tensors, tmp / "loop.safetensors")
            save_model_weights(self.model, tmp / "model.safetensors")
            opt = self._optimizer.state_dict() if self._optimizer is not None else None
            tensors, meta = {}, {"step": self.step, "optim": asdict(self.optim_config), "extra": extra or {}}
            if opt is not None:
                for idx, st in opt["state"].items():
                    for name, v in st.items():
                        tensors[f"{idx}.{name}"] = v if isinstance(v, torch.Tensor) else torch.tensor(v)
                meta["param_groups"] = opt["param_groups"]
                save_tensors(tensors, tmp / "optimizer.safetensors")
            (tmp / "engine.json").write_text(json.dumps(meta, indent=1))

    def load_state(self, path: str | os.PathLike) -> dict:
        """Restore what `save_state` wrote; returns its `extra` dict."""
        path = Path(path)
        meta_file = path / "engine.json"
        if not meta_file.exists():
            raise FileNotFoundError(f"{path}: not an engine state directory (no engine.json)")
        meta = read_json(meta_file)
        load_model_weights(self.model, path / "model.safetensors")
        self.step = int(meta["step"])
        if "param_groups" in meta:
            tensors = load_tensors(path / "optimizer.safetensors")
            state: dict[int, dict] = {}
            for key, v in tensors.items():
                idx, name = key.split(".", 1)
                state.setdefault(int(idx), {})[name] = v.to(self.device) if name != "step" else v
            self.optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
        return meta.get("extra", {})


AUTOCAST_DTYPES: dict[str | None, torch.dtype | None] = {None: None, "bf16": torch.bfloat16, "fp16": torch.float16}


def nonfinite_rows(batch: Batch, logprobs: torch.Tensor, show: int = 5) -> str:
    """Name the rows of a batch whose loss was not finite: those with non-finite log-probs
    (`logprobs` [B, T-1]) where there are some, else every row; each by its task or source."""
    bad = (~torch.isfinite(logprobs.detach()) & batch.action_mask.to(logprobs.device).bool()).any(-1)
    rows = bad.nonzero().flatten().tolist() or list(range(batch.size))
    what = "non-finite log-probs in" if bad.any() else "non-finite loss on a batch of"

    def name(i: int) -> str:
        info = batch.infos[i] if i < len(batch.infos) else {}
        return str(info.get("task") or info.get("source") or f"row {int(batch.index[i])}")

    names = ", ".join(name(i) for i in rows[:show]) + (f" and {len(rows) - show} more" if len(rows) > show else "")
    return f"{what} {len(rows)} row(s): {names}"


def micro_batches(n: int, size: int) -> list[torch.Tensor]:
    """Row indices of the micro-batches of an `n`-row batch with at most `size` rows each (0: one chunk).

    Rows i and i + n/2 always land in the same chunk when n is even, so a pair batch
    (chosen rows [0, P), rejected rows [P, 2P); algorithms.dpo.pair_batch) keeps every
    pair together; any row-separable loss is indifferent to the grouping.
    """
    if size <= 0 or n <= size:
        return [torch.arange(n)]
    if n % 2:
        return list(torch.arange(n).split(size))
    half, per = n // 2, max(1, size // 2)
    return [torch.cat([torch.arange(i, min(i + per, half)), torch.arange(i + half, min(i + per, half) + half)])
            for i in range(0, half, per)]


def _to_float(v) -> float:
    if isinstance(v, torch.Tensor):
        return float(v.detach().float().mean()) if v.numel() != 1 else float(v.detach())
    return float(v)
