"""What every Hugging Face method shares: the model section, the sampling section, and the
plumbing of its one stage (load the model behind `ctx.engine`, periodic snapshots, the final save).

A method module (sft.py, rm.py, dpo.py, grpo.py, rft.py) is its config -- this
`ModelConfig`, the data file, the loop's own dataclass, `OptimConfig`, `OutputConfig`
-- plus one stage function that calls the loop. `run_method` is the recipe path they
all take: check everything before the model loads (`prepare`), write config.json,
run the stage through `trajtune.stages.run_stages`, write the report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ...config import ConfigError, check_ranges, to_dict
from ...engine import OptimConfig
from .options import flag


def hf_optim() -> OptimConfig:
    """AdamW with a Hugging Face run's defaults, TRL's / transformers' (lr 1e-5, betas 0.9 / 0.999)."""
    return OptimConfig(lr=1e-5, beta2=0.999)


@dataclass
class OutputConfig:
    """What a Hugging Face run writes besides its model, and when."""

    save_every: int = 0
    """write a checkpoint every this many steps: an HF-format snapshot (checkpoints/step-N) and the resume
    state (0: only the final model, and the resume state only on Ctrl-C / SIGTERM); a rerun resumes it"""

    def __post_init__(self) -> None:
        check_ranges(self, "output", label=lambda n: flag(f"output.{n}"), non_negative=("save_every",))


def check_run(config, name: str) -> None:
    """The checks every method config makes: a model and a data file."""
    if not config.model.path or not config.data:
        raise ValueError(f"{name}: --model and --data are required (model.path and data in a recipe)")


class SnapshotEvery:
    """The stage's checkpointer, plus an HF-format snapshot `checkpoints/step-N` of the policy at
    every `every`-th completed step (what --save-every writes next to the resume state).
    Everything else is the wrapped `trajtune.resume.Checkpointer`'s."""

    def __init__(self, checkpointer, every: int, save: Callable[[int], Any]):
        self._checkpointer, self.every, self._save = checkpointer, every, save

    def step_done(self, engine, completed: int, state=None, tensors=None, allowed: bool = True) -> None:
        if allowed and self.every and completed % self.every == 0:
            self._save(completed)
        self._checkpointer.step_done(engine, completed, state, tensors, allowed)

    def __getattr__(self, name: str):
        return getattr(self._checkpointer, name)


def stage_run(ctx, policy, engine, tokenizer, save_every: int, home: str = ""):
    """The loop's `Run`: the stage's logger and checkpointer, with HF snapshots every `save_every` steps
    in run_dir/<home>/checkpoints/step-N."""
    from ...loop import Run

    def snapshot(step: int) -> None:
        save_pretrained(engine, policy, ctx.run_dir / home / "checkpoints" / f"step-{step}", tokenizer, {"step": step})

    return Run(stage=ctx.name, logger=ctx.logger, checkpointer=SnapshotEvery(ctx.checkpointer, save_every, snapshot))


def save_pretrained(engine, policy, path: Path, tokenizer, meta: dict) -> None:
    """`policy.save_pretrained` on rank 0 (the others wait)."""
    from ...distributed import barrier

    if engine.is_main:
        policy.save_pretrained(path, tokenizer, meta=meta)
    barrier()


def announce(ctx, config, policy, n: int, noun: str) -> None:
    """One line on rank 0: the model, what it trains on, where it writes (and that it resumes)."""
    if ctx.logger is None:  # not rank 0
        return
    trained = policy.num_parameters(trainable=True)
    print(f"trajtune {ctx.name}: {config.model.path} ({policy.num_parameters():,} parameters, {trained:,} "
          f"trained), {n} {noun} from {config.data} -> {ctx.run_dir}", flush=True)
    if ctx.resuming:
        print(f"resuming from {ctx.checkpointer.state_dir}", flush=True)


def finish(ctx, engine, policy, tokenizer, history: list[dict], home: str = "") -> dict:
    """Save run_dir/<home>/model (HF format: LoRA merged, the adapter in model/adapter, a value head
    next to it) and return the stage's results."""
    final = ctx.run_dir / home / "model"
    save_pretrained(engine, policy, final, tokenizer, {"command": ctx.name, "steps": engine.step})
    last = {k: v for k, v in (history[-1] if history else {}).items() if k not in ("time", "stage")}
    return {"model": str(final), "steps": engine.step, "last": last}


# --- the recipe path ----------------------------------------------------------------------
def run_method(config, run_dir: str | Path, stage_fn, prepare: Callable[[Any, Path], Any]) -> Path:
    """Check, then train as one stage named after the method, `stage_fn(ctx, config, prepared)`;
    returns the report's path.

    `prepare(config, run_dir)` checks the data, lengths and the resume compatibility before
    any model loads and returns what the stage takes. A user's mistake (a bad row, a missing
    file or model, a changed option on resume) is a `ConfigError` naming it."""
    from ...data import DataError
    from ...distributed import barrier, is_main
    from ...models.hf import ModelPathError
    from ...stages import Stage, StageOptions, run_stages
    from ...text.chat import TemplateError

    run_dir = Path(run_dir)
    name = stage_name(config)
    try:
        prepared = prepare(config, run_dir)
        if is_main():
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.json").write_text(json.dumps(to_dict(config), indent=1))
        barrier()
        results = run_stages([Stage(name, stage_fn, args=(config, prepared))], config, run_dir,
                             StageOptions(workers=1, checkpoint_every=config.output.save_every))[name]
    except (DataError, ModelPathError, TemplateError) as e:
        raise ConfigError(str(e)) from e
    report = run_dir / "report.md"
    if is_main():
        report.write_text(f"# {name} on {config.model.path}\n\nmodel: `{results['model']}` "
                          f"({results['steps']} optimizer steps)\n\nlast logged row: `{results['last']}`\n")
        print(f"{name}: {results['steps']} optimizer steps; model saved to {results['model']} "
              f"(load with AutoModelForCausalLM.from_pretrained({results['model']!r}))", flush=True)
    return report


def stage_name(config) -> str:
    """The method's name, which is also its stage's: 'sft', 'rm', 'dpo', 'grpo', 'rft'."""
    return type(config).METHOD

