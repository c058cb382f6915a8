"""Smallest end-to-end run: teach a tiny character-level transformer 2-digit addition by SFT.

Demonstrations are `Q: 23+45\nA: ` (PROMPT) -> `68<eos>` (POLICY). We measure
greedy exact-match accuracy on held-out problems (pairs never seen in training)
before and after training, and print a few answers so you can see what it learned.

One stage (`sft`, on `trajtune.runs.stages.run_stages`): train, evaluate, save `sft/checkpoint`;
`run` then writes `report.md`. Under torchrun every rank trains its share of each batch
(`ctx.engine` is the distributed engine), evaluation is sharded (`sharded_map`) and only
rank 0 writes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..algorithms.sft import SFTConfig, train_sft
from ..config import check_ranges
from ..engine.distributed import init_distributed, is_main, sharded_map
from ..engine import Engine, OptimConfig
from ..models.tiny import TinyConfig, TinyTransformer
from ..runs.stages import Stage, StageOptions, run_stages
from ..text.tokenizers import CharTokenizer
from ..trajectory import Owner, Trajectory


@dataclass
class Config:
    seed: int = 0
    """one seed for model init, data split and batches"""
    n_train: int = 4000
    """training problems (a+b with a, b in 0..99; the rest of the 10,000 pairs is held out)"""
    n_eval: int = 300
    """held-out problems used for accuracy"""
    dim: int = 96
    """model width"""
    n_layers: int = 3
    """transformer blocks"""
    n_heads: int = 4
    """attention heads"""
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(steps=600, batch_size=64, eval_every=100))
    """the SFT loop's settings"""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=3e-3, warmup_steps=30, decay_steps=570))
    """optimizer settings"""
    runner: StageOptions = field(default_factory=lambda: StageOptions(workers=1))
    """the stage runner (one stage: nothing to run in parallel)"""

    def __post_init__(self) -> None:
        check_ranges(self, "addition", counts=("n_train", "n_eval", "dim", "n_layers", "n_heads"))
        if self.n_train + self.n_eval > 10_000:
            raise ValueError(f"addition: n_train + n_eval must be <= 10000 (the a+b pairs), "
                             f"got {self.n_train + self.n_eval}")
        if self.dim % self.n_heads:
            raise ValueError(f"addition: dim={self.dim} is not divisible by n_heads={self.n_heads}")


def problem_text(a: int, b: int) -> tuple[str, str]:
    return f"Q: {a}+{b}\nA: ", str(a + b)


def split_problems(seed: int, n_train: int, n_eval: int) -> tuple[list, list]:
    pairs = [(a, b) for a in range(100) for b in range(100)]
    random.Random(seed).shuffle(pairs)
    if n_train + n_eval > len(pairs):
        raise ValueError(f"n_train + n_eval must be <= {len(pairs)}")
    return pairs[:n_train], pairs[n_train : n_train + n_eval]


def demonstration(tok: CharTokenizer, a: int, b: int) -> Trajectory:
    q, ans = problem_text(a, b)
    t = Trajectory()
    t.append([tok.bos_id], Owner.TEMPLATE, 0)
    t.append(tok.encode(q), Owner.PROMPT, 0)
    t.append(tok.encode(ans) + [tok.eos_id], Owner.POLICY, 0)
    return t


def greedy_answers(engine: Engine, tok: CharTokenizer, problems) -> list[str]:
    prompts = [[tok.bos_id] + tok.encode(problem_text(a, b)[0]) for a, b in problems]
    out = engine.sample(prompts, 5, greedy=True, stop_ids=[tok.eos_id], pad_id=tok.pad_id)
    return [tok.decode(t, skip_special=True) for t in out.tokens]


def accuracy(engine, tok, problems) -> float:
    """Greedy exact match; under torchrun each rank answers its share of the problems."""
    answers = sharded_map(engine, problems, lambda part: greedy_answers(engine, tok, part))
    return sum(ans == str(a + b) for ans, (a, b) in zip(answers, problems, strict=True)) / len(problems)


def stage_sft(ctx) -> dict:
    """SFT from a fresh model; held-out accuracy before, during and after; a few answers."""
    config = ctx.config
    torch.manual_seed(config.seed)
    tok = CharTokenizer.from_corpus("0123456789+QA: \n")
    model = TinyTransformer(TinyConfig(tok.vocab_size, config.dim, config.n_layers, config.n_heads, max_len=32))
    engine = ctx.engine(model, config.optim)
    train, held_out = split_problems(config.seed, config.n_train, config.n_eval)
    demos = [demonstration(tok, a, b) for a, b in train]
    if engine.is_main:
        print(f"addition SFT: {model.num_parameters():,} parameters, {len(demos)} demonstrations, "
              f"{len(held_out)} held-out problems, {config.sft.steps} steps")

    before = accuracy(engine, tok, held_out)
    history = train_sft(engine, demos, config.sft, tok.pad_id,
                        ctx.run(lambda step: {"eval/accuracy": accuracy(engine, tok, held_out)}))
    shown = held_out[:8]
    answers = sharded_map(engine, shown, lambda part: greedy_answers(engine, tok, part))
    ctx.save_model(model, tok, "checkpoint", meta={"experiment": "addition_sft"})
    return {"before": before, "after": history[-1]["eval/accuracy"],
            "curve": [(r["step"], r["train/loss"], r["eval/accuracy"]) for r in history if "eval/accuracy" in r],
            "examples": [(a, b, ans) for (a, b), ans in zip(shown, answers, strict=True)]}


def run(config: Config, run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    report = run_dir / "report.md"
    init_distributed()  # under torchrun: join the process group (a no-op in one process, or if joined)
    result = run_stages([Stage("sft", stage_sft)], config, run_dir, config.runner)["sft"]
    if not is_main():
        return report
    lines = ["# Addition SFT", "",
             f"Held-out exact-match accuracy (greedy): **{result['before']:.1%} -> {result['after']:.1%}**", "",
             "| step | train loss | held-out accuracy |", "|---|---|---|"]
    lines += [f"| {step} | {loss:.3f} | {acc:.1%} |" for step, loss, acc in result["curve"]]
    lines += ["", "| problem | model's answer | correct |", "|---|---|---|"]
    for a, b, ans in result["examples"]:
        lines.append(f"| {a}+{b} | {ans} | {'yes' if ans == str(a + b) else 'no (' + str(a + b) + ')'} |")
    report.write_text("\n".join(lines) + "\n")
    right = sum(ans == str(a + b) for a, b, ans in result["examples"])
    print(f"held-out exact-match accuracy (greedy): {result['before']:.1%} -> {result['after']:.1%}; "
          f"{right} of {len(result['examples'])} shown problems right (the curve and the answers: report.md)")
    return report


# the experiment contract (`trajtune.experiments.base.Experiment`): what it offers beyond one run
run_over_seeds = None  # no report over seeds: `trajtune run --seeds` is refused
dry_run = None  # `trajtune run --dry-run`: the run directory's checks alone
parse_options = None  # no options of its own
