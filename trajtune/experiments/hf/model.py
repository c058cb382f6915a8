"""The model section of a Hugging Face run: which model, and how it trains (LoRA, precision, memory, lengths)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...config import check_ranges
from .options import flag


@dataclass
class ModelConfig:
    """The model a Hugging Face run trains, and how (LoRA, precision, memory, lengths)."""

    path: str = ""
    """local Hugging Face model directory (config.json, weights, tokenizer); the command line's --model"""
    lora_r: int = 0
    """LoRA rank (0: train all weights); the reference is then the base model with adapters off"""
    lora_alpha: float = 32.0
    """LoRA alpha"""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """autocast precision of forward passes (weights stay fp32)"""
    gradient_checkpointing: bool = False
    """recompute activations in backward to save memory"""
    device: str = "cpu"
    """torch device ("cpu", "cuda", "cuda:1", "mps"); under torchrun "cuda" is each process's own GPU"""
    micro_batch_size: int = 0
    """rows per forward/backward chunk (gradient accumulation; 0: whole batch at once)"""
    max_length: int = 2048
    """sft/rm/dpo: longest sample in tokens; grpo/rft: prompt + completion budget (capped at the model's context)"""
    drop_long: bool = False
    """skip samples / prompts that do not fit --max-length (default: stop with an error listing them)"""

    def __post_init__(self) -> None:
        check_ranges(self, "model", label=lambda n: flag(f"model.{n}"), counts=("max_length",),
                     non_negative=("micro_batch_size", "lora_r"), positive=("lora_alpha",))


def load_engine(ctx, model: ModelConfig, optim, *, value_head: bool = False, seed: int = 0):
    """(policy, engine): the model of `model.path` (LoRA, checkpointing, a value head) behind
    `ctx.engine` (one process, or DDP under torchrun), seeded for the head's initialisation."""
    import torch

    from ...distributed import launched_distributed
    from ...models import hf

    torch.manual_seed(seed)
    lora = hf.LoraSettings(r=model.lora_r, alpha=model.lora_alpha) if model.lora_r else None
    policy = hf.load_policy(model.path, value_head=value_head, lora=lora,
                            gradient_checkpointing=model.gradient_checkpointing)
    device = None if model.device == "cuda" and launched_distributed() else model.device  # cuda:LOCAL_RANK
    engine = ctx.engine(policy, optim, device=device, autocast=None if model.precision == "fp32" else model.precision,
                        micro_batch_size=model.micro_batch_size)
    return policy, engine
