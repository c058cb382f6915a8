"""How long a Hugging Face run trains and how its learning rate moves, in TRL's terms.

    --num-train-epochs 3          steps = ceil(3 x rows / rows per step)        (exclusive with --steps)
    --warmup-ratio 0.1            linear warm-up over ceil(0.1 x steps) steps   (exclusive with --warmup-steps)
    --lr-scheduler-type cosine    after warm-up: constant (the default), or linear / cosine decay to 0 over
                                  the remaining steps (exclusive with --decay-steps)

These map onto the loop's `steps` and `OptimConfig`'s `warmup_steps` / `decay_steps` once the data
is read (the rows that fit --max-length), and the stage prints what they amount to -- and, for a
plain --steps, how many epochs that is:

    trajtune sft: 3 epochs of 120 samples at --batch-size 8 = 45 steps; lr 2e-05: warm-up 5 steps, then cosine

How this differs from TRL / transformers (docs/hf.md has them all):
1. An epoch is a count, not a pass: each step draws its batch afresh, a pure function of (seed, step)
   (exact resume), so over N epochs a row is seen N times on average, not exactly N times.
2. --lr-scheduler-type linear / cosine end at 0 as transformers' do; a recipe's own `optim.decay_steps`
   keeps the library's default end, lr * optim.min_lr_ratio (0.1).
3. The default is a constant learning rate (transformers' default is linear decay to 0).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from ...config import ConfigError, check_choices, check_ranges
from .options import flag


@dataclass
class ScheduleConfig:
    """How long the run trains and how its learning rate moves (TRL's names)."""

    num_train_epochs: float = 0.0
    """train this many epochs over the data instead of --steps: steps = ceil(epochs x rows / batch size),
    printed at start (0: use --steps)"""
    warmup_ratio: float = 0.0
    """share of the steps spent warming the learning rate up linearly (ceil(ratio x steps) steps, as
    transformers rounds; 0: --warmup-steps)"""
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = "constant"
    """after warm-up: constant (or, with --decay-steps N, the library's decay over N steps), or linear /
    cosine decay over all the remaining steps to 0, as transformers' schedules of those names"""

    def __post_init__(self) -> None:
        check_choices(self)
        check_ranges(self, "schedule", label=lambda n: flag(f"schedule.{n}"), non_negative=("num_train_epochs",))
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"schedule: {flag('schedule.warmup_ratio')} must be in [0, 1), got {self.warmup_ratio!r}")


def check_schedule(config, loop: str) -> None:
    """Refuse options that say the same thing twice: --num-train-epochs with --steps (a --steps other than
    the method's default), --warmup-ratio with --warmup-steps, --lr-scheduler-type linear / cosine with
    --decay-steps."""
    s, optim = config.schedule, config.optim
    default_steps = getattr(_default_of(type(config), loop), "steps")
    steps = getattr(config, loop).steps
    clashes = [(s.num_train_epochs and steps != default_steps, "schedule.num_train_epochs", f"{loop}.steps"),
               (s.warmup_ratio and optim.warmup_steps, "schedule.warmup_ratio", "optim.warmup_steps"),
               (s.lr_scheduler_type != "constant" and optim.decay_steps, "schedule.lr_scheduler_type",
                "optim.decay_steps")]
    for clash, a, b in clashes:
        if clash:
            raise ValueError(f"{config.METHOD}: {flag(a)} and {flag(b)} are exclusive (both set the same thing); "
                             f"give one of them")


def _default_of(cls, name: str):
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def resolve(config, loop: str, rows: int, per_step: int, noun: str):
    """(the loop config with its steps, the OptimConfig with its warm-up and decay, a line that says so)
    for `rows` training items drawn `per_step` per step (0: all of them, a full batch)."""
    s, optim, section = config.schedule, config.optim, getattr(config, loop)
    batch = min(per_step, rows) if per_step else rows
    size = f"--batch-size {per_step}" if per_step else "full batch"
    if s.num_train_epochs:
        steps = math.ceil(s.num_train_epochs * rows / batch)
        said = f"{s.num_train_epochs:g} epochs of {rows} {noun} at {size} = {steps} steps"
    else:
        steps = section.steps
        said = f"--steps {steps} at {size} over {rows} {noun} = {steps * batch / rows:.3g} epochs"
    warmup = math.ceil(s.warmup_ratio * steps) if s.warmup_ratio else optim.warmup_steps
    if s.lr_scheduler_type != "constant":  # transformers' linear / cosine: over the remaining steps, to 0
        optim = dataclasses.replace(optim, decay=s.lr_scheduler_type, min_lr_ratio=0.0,
                                    decay_steps=max(steps - warmup, 0))
    optim = dataclasses.replace(optim, warmup_steps=warmup)
    decay, end = optim.decay_steps, optim.lr * optim.min_lr_ratio
    lr = f"lr {optim.lr:g}" + (f": warm-up {warmup} steps" if warmup else "")
    lr += (", then" if warmup else ":") + (f" {optim.decay} to {end:g} over {decay} steps" if decay else " constant")
    return dataclasses.replace(section, steps=steps), optim, f"{said}; {lr}"


def check_given(paths) -> None:
    """On the command line, refuse --num-train-epochs with an explicit --steps (even one equal to the
    default, which `check_schedule` cannot see) and --warmup-ratio with an explicit --warmup-steps.
    `paths`: the leaf paths of the flags given."""
    paths = set(paths)
    for a, b in (("schedule.num_train_epochs", ".steps"), ("schedule.warmup_ratio", "optim.warmup_steps")):
        other = next((p for p in sorted(paths) if p.endswith(b) and not p.startswith("schedule.")), None)
        if a in paths and other is not None:
            raise ConfigError(f"{flag(a)} and {flag(other)} are exclusive (both set the same thing); give one of them")
