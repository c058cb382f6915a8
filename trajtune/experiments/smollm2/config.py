"""The smollm2 recipe's config: the model, the task, every stage's loop, optimizer and sampling (a recipe's
[config])."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...algorithms.rl import RLConfig
from ...algorithms.sft import SFTConfig
from ...config import check_ranges
from ...engine import OptimConfig
from ...runs.stages import StageOptions
from ..hf.common import OutputConfig
from ..hf.model import ModelConfig
from ...sources.sampling import SamplingConfig

MODEL_STAGES = ("base", "sft", "grpo")
"""the models the report scores: the pretrained one, after the warm start, after RL"""
OPS = ("+", "-", "*")


@dataclass
class Config:
    seed: int = 0
    """one seed: the training problem streams, every loop's batches and samples, the sampled evaluation"""
    model: ModelConfig = field(default_factory=lambda: ModelConfig(path="smollm2-135m", max_length=64))
    """the commands' model section for the pretrained model (path: a Hugging Face folder or a short name such as
    smollm2-135m; LoRA, precision, lengths); SFT trains `path`, GRPO the SFT stage's model/"""
    output: OutputConfig = field(default_factory=lambda: OutputConfig(logging_steps=10))
    """the commands' output section (a console line every logging_steps)"""
    system: str = "Reply with the number only."
    """the system turn of every prompt (it replaces the template's default one, and keeps prompts short)"""
    ops: list[str] = field(default_factory=lambda: list(OPS))
    """the operations problems are drawn from: a+b and a-b with 2-digit a, b (a >= b), a*d with a 2-digit a
    and a 1-digit d (2..9)"""
    n_sft: int = 2_000
    """SFT demonstrations (system, question, the right answer)"""
    n_grpo: int = 2_000
    """GRPO prompt rows"""
    n_eval: int = 128
    """held-out problems (one fixed set for every seed, never in a training file)"""
    eval_samples: int = 2
    """sampled replies per held-out problem (the sampling section's temperature): sampled accuracy and format"""
    n_examples: int = 8
    """held-out problems shown side by side in the report (base / sft / grpo replies)"""
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(steps=40, batch_size=8))
    """the warm start: SFT on demonstrations (the assistant turn trained)"""
    sft_optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=3e-5, beta2=0.999, warmup_steps=4))
    """SFT's AdamW"""
    grpo: RLConfig = field(default_factory=lambda: RLConfig(steps=30, tasks_per_step=4, group_size=8,
                                                            advantage="grpo", log_kl="off"))
    """GRPO (the grpo command's rl section)"""
    grpo_optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5, beta2=0.999))
    """GRPO's AdamW"""
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_new_tokens=5, temperature=1.0))
    """GRPO's sampling section, also the sampled evaluation's temperature (an answer is at most 3 digits, a
    minus sign is never right, and the stop token)"""
    runner: StageOptions = field(default_factory=lambda: StageOptions(workers=1))
    """the stage runner (a chain: nothing runs in parallel)"""

    def __post_init__(self) -> None:
        check_ranges(self, "smollm2", counts=("n_sft", "n_grpo", "n_eval", "eval_samples"),
                     non_negative=("n_examples",))
        bad = [op for op in self.ops if op not in OPS]
        if bad or not self.ops:
            raise ValueError(f"smollm2: ops must be a non-empty list of {', '.join(OPS)}; got {self.ops!r}")
        if not self.model.path:
            raise ValueError("smollm2: model.path is empty (a Hugging Face folder or a short name: smollm2-135m)")
        self.sft = replace(self.sft, seed=self.seed)
        self.grpo = replace(self.grpo, seed=self.seed)
