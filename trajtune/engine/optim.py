"""The optimizer's settings: AdamW with linear warm-up and an optional cosine or linear decay (`OptimConfig`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ..config import check_choices


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
    eps: float = 1e-8
    """Adam's epsilon (torch's default; the Tinker API's default is 1e-12, and its clients send theirs)"""
    grad_clip: float = 1.0
    """clip the global gradient norm to this value (0 disables)"""
    warmup_steps: int = 0
    """linear warm-up from 0 to lr over this many optimizer steps"""
    decay_steps: int = 0
    """if > 0, decay from lr to lr * min_lr_ratio over this many steps after warm-up"""
    decay: Literal["cosine", "linear"] = "cosine"
    """the shape of that decay: cosine (nanoGPT's) or linear (transformers' "linear")"""
    min_lr_ratio: float = 0.1
    """the decay ends at lr * min_lr_ratio (0: where transformers' schedules end)"""
    on_nonfinite: Literal["skip", "stop"] = "skip"
    """a NaN/Inf gradient skips the step (logged as train/skipped) or stops the run"""
    fused: bool = False
    """AdamW's fused kernel (TRL's default; on in the Hugging Face commands): one kernel over every parameter,
    faster than the multi-tensor ("foreach") AdamW, but it rounds differently, so the built-in experiments keep
    foreach (their numbers, bit for bit)"""

    def __post_init__(self) -> None:
        check_choices(self)
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be positive and finite, got {self.lr}")
        if not (self.eps > 0 and math.isfinite(self.eps)):
            raise ValueError(f"eps must be positive and finite, got {self.eps}")
        for name in ("weight_decay", "grad_clip", "warmup_steps", "decay_steps"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be >= 0, got {v}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")

    def lr_at(self, step: int) -> float:
        # 1. warm-up: linear from lr / warmup_steps to lr
        if self.warmup_steps and step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        # 2. decay: cosine or linear from lr to lr * min_lr_ratio over decay_steps, then flat there
        if self.decay_steps:
            t = min(1.0, (step - self.warmup_steps) / self.decay_steps)
            shape = 0.5 * (1 + math.cos(math.pi * t)) if self.decay == "cosine" else 1.0 - t
            return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * shape)
        # 3. constant
        return self.lr
