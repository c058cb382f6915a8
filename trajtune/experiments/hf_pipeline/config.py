"""The HF pipeline's config: the model's shape, every stage's loop, optimizer and schedule (a recipe's [config])."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...algorithms.dpo import DPOConfig
from ...algorithms.rl import RLConfig
from ...algorithms.sft import SFTConfig
from ...config import check_ranges
from ...engine import OptimConfig
from ...runs.stages import StageOptions
from ..hf.common import OutputConfig
from ..hf.model import ModelConfig
from ...sources.sampling import SamplingConfig
from ..hf.schedule import ScheduleConfig


MAX_ANSWER = 4
"""evaluation reply budget in tokens: up to three digits and the stop token"""
TRAINING = ("pretrain", "sft", "dpo", "grpo")
MODEL_STAGES = ("base",) + TRAINING


@dataclass
class LlamaShape:
    """The Llama built from a config (transformers.LlamaConfig fields) and its tokenizer's size."""

    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int = 128
    """the context; a chat-formatted problem is ~30 tokens"""
    vocab_size: int = 320
    """BPE vocabulary target (256 bytes + 3 specials + merges such as 'What', 'assistant')"""
    tie_word_embeddings: bool = False
    """one matrix for input and output embeddings"""

    def __post_init__(self) -> None:
        check_ranges(self, "llama", counts=("hidden_size", "intermediate_size", "num_hidden_layers",
                                             "num_attention_heads", "num_key_value_heads", "max_position_embeddings"))
        if self.hidden_size % self.num_attention_heads or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"llama: hidden_size ({self.hidden_size}) must divide by num_attention_heads "
                             f"({self.num_attention_heads}), and that by num_key_value_heads "
                             f"({self.num_key_value_heads})")
        if self.vocab_size < 260:
            raise ValueError(f"llama: vocab_size must be >= 260 (256 bytes, 3 specials), got {self.vocab_size}")


def adam(lr: float, warmup: int = 0) -> OptimConfig:
    """AdamW with TRL's betas (0.9, 0.999) and `warmup` warm-up steps."""
    return OptimConfig(lr=lr, beta2=0.999, warmup_steps=warmup)


def cosine() -> ScheduleConfig:
    """The sft command's schedule section: after warm-up, cosine decay over the stage's remaining steps."""
    return ScheduleConfig(lr_scheduler_type="cosine")


@dataclass
class Config:
    seed: int = 0
    """one seed: model init, the problem streams, every loop's batches and samples"""
    llama: LlamaShape = field(default_factory=LlamaShape)
    """the model built from a config"""
    model: ModelConfig = field(default_factory=lambda: ModelConfig(max_length=128))
    """how every HF stage trains (device, precision, LoRA, lengths) as the commands' model section;
    `path` stays empty: each stage trains the previous stage's model/"""
    output: OutputConfig = field(default_factory=lambda: OutputConfig(logging_steps=100))
    """the commands' output section: a console line every logging_steps, HF snapshots every save_every
    steps in <stage>/checkpoints (0: only each stage's model/)"""
    n_pretrain: int = 40_000
    """raw-text problems in the pretraining corpus (a stream: pairs repeat)"""
    chat_share: float = 0.1
    """share of pretraining documents that are conversations in the chat template (`<|im_start|>user\\n
    What is a+b?<|im_end|>...`, every token trained, as chat data in a pretraining mix); the rest `a+b=c`"""
    n_sft: int = 8_000
    """chat rows for SFT"""
    n_pair_prompts: int = 4_096
    """fresh problems the SFT model is sampled on for DPO pairs"""
    pair_samples: int = 4
    """samples per pair problem (a problem gives a pair when one of them is wrong)"""
    n_grpo: int = 4_000
    """prompt rows for GRPO"""
    n_eval: int = 256
    """held-out problems evaluated (the first n of the fixed 256)"""
    eval_samples: int = 8
    """sampled replies per held-out problem (temperature 1): sampled pass@1 and pass@k"""
    pretrain: SFTConfig = field(default_factory=lambda: SFTConfig(steps=1000, batch_size=128))
    """pretraining: every token of the raw text trained"""
    pretrain_optim: OptimConfig = field(default_factory=lambda: adam(3e-3, 20))
    """pretraining's AdamW (a random model takes a high learning rate)"""
    pretrain_schedule: ScheduleConfig = field(default_factory=cosine)
    """the sft command's schedule section for pretraining (epochs, warm-up ratio, cosine)"""
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(steps=100, batch_size=64))
    """SFT on the chat rows (the assistant turn trained)"""
    sft_optim: OptimConfig = field(default_factory=lambda: adam(1e-3, 10))
    """SFT's AdamW"""
    sft_schedule: ScheduleConfig = field(default_factory=cosine)
    """the sft command's schedule section for SFT"""
    dpo: DPOConfig = field(default_factory=lambda: DPOConfig(steps=100, batch_size=32, beta=0.1, nll_weight=1.0))
    """DPO on the on-policy pairs, plus the chosen side's NLL (DPO + NLL as in RPO, Pang et al. 2024, for
    math; without it DPO lowered held-out pass@1 in our runs: pairs that differ in one digit)"""
    dpo_optim: OptimConfig = field(default_factory=lambda: adam(1e-4))
    """DPO's AdamW"""
    dpo_schedule: ScheduleConfig = field(default_factory=lambda: ScheduleConfig(num_train_epochs=2.0))
    """the dpo command's schedule section: epochs over the pairs (their number depends on the SFT model's
    errors), so dpo.steps stays the command's default"""
    grpo: RLConfig = field(default_factory=lambda: RLConfig(steps=100, tasks_per_step=32, group_size=8,
                                                            advantage="grpo"))
    """GRPO (the grpo command's rl section)"""
    grpo_optim: OptimConfig = field(default_factory=lambda: replace(adam(1e-4), grad_clip=0.0))
    """GRPO's AdamW (no gradient clipping, as chapter 13's GRPO)"""
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_new_tokens=4))
    """GRPO's sampling section (an answer is at most 3 digits + the stop token)"""
    runner: StageOptions = field(default_factory=lambda: StageOptions(workers=1))
    """the stage runner (a chain: nothing runs in parallel)"""

    def __post_init__(self) -> None:
        check_ranges(self, "hf_pipeline", counts=("n_pretrain", "n_sft", "n_pair_prompts", "pair_samples",
                                                   "n_grpo", "n_eval", "eval_samples"))
        if not 0 <= self.chat_share <= 1:
            raise ValueError(f"hf_pipeline: chat_share must be in [0, 1], got {self.chat_share}")
        if self.model.path:
            raise ValueError("hf_pipeline: model.path is set by the pipeline (each stage trains the previous "
                             "stage's model/); leave it empty")
        if not 1 <= self.n_eval <= 256:
            raise ValueError(f"hf_pipeline: n_eval must be in 1..256 (the held-out set), got {self.n_eval}")
        for name in ("pretrain", "sft", "dpo", "grpo"):
            setattr(self, name, replace(getattr(self, name), seed=self.seed))
