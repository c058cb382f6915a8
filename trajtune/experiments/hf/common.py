"""What every Hugging Face method shares: the model section, the sampling section, and the
plumbing of its one stage (load the model behind `ctx.engine`, periodic snapshots, the final save).

A method module (sft.py, rm.py, dpo.py, grpo.py, rft.py) is its config -- this
`ModelConfig`, the data file, the loop's own dataclass, `OptimConfig`, `OutputConfig`
-- plus one stage function that calls the loop (`stage_run`, `finish`: snapshots every --save-every, the newest
--save-total-limit kept, the saved model and how far its weights are from the input's, `weight_change`). The
recipe path they all take around that stage is `experiments/hf/recipe.py` (`run_method`, `preflight`).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

from ...config import check_choices, check_ranges, to_dict
from ...engine import OptimConfig
from ...metrics import TRACKERS
from ...runs.hooks import Hook
from .options import flag


def hf_optim() -> OptimConfig:
    """AdamW with a Hugging Face run's defaults, TRL's / transformers' (lr 1e-5, betas 0.9 / 0.999, the fused
    kernel: `adamw_torch_fused`)."""
    return OptimConfig(lr=1e-5, beta2=0.999, fused=True)


@dataclass
class OutputConfig:
    """What a Hugging Face run writes besides its model, and when; what it shows while it trains."""

    NO_EFFECT: ClassVar[tuple[str, ...]] = ("logging_steps", "report_to", "save_total_limit")
    """options that change what a run shows and keeps, never what it computes: a changed one never makes a
    run stale (a run cut short resumes with it; `trajtune.runs.rundir`)"""
    save_every: int = 0
    """write a checkpoint every this many steps: an HF-format snapshot (checkpoints/step-N) and the resume
    state (0: only the final model, and the resume state only on Ctrl-C / SIGTERM); a rerun resumes it"""
    save_total_limit: int = 0
    """keep only the newest this many checkpoints/step-N snapshots (0: keep all)"""
    logging_steps: int = 10
    """print a progress line (loss, reward or accuracy, KL, lr, tokens/s, ETA) every this many steps; a
    progress bar with those values on a terminal (0: neither)"""
    report_to: list[str] = field(default_factory=list)
    """also send the metrics to: tensorboard (run_dir/tb; pip install 'trajtune[tensorboard]'), wandb
    (offline in run_dir/wandb unless WANDB_MODE is set; pip install wandb)"""

    def __post_init__(self) -> None:
        check_ranges(self, "output", label=lambda n: flag(f"output.{n}"),
                     non_negative=("save_every", "save_total_limit", "logging_steps"))
        if isinstance(self.report_to, str) or not all(isinstance(n, str) for n in self.report_to):
            raise ValueError(f"output: {flag('output.report_to')} is a list of names, got {self.report_to!r}")
        bad = [n for n in self.report_to if n not in TRACKERS]
        if bad:
            raise ValueError(f"output: {flag('output.report_to')} {' '.join(bad)}: choose from {', '.join(TRACKERS)}")


def check_run(config, name: str) -> None:
    """The checks every method config makes: its own choice fields (e.g. --reward-model-combine), a model and a data
    file."""
    check_choices(config)
    if not config.model.path or not config.data:
        raise ValueError(f"{name}: --model and --data are required (model.path and data in a recipe)")


class Snapshots(Hook):
    """An HF-format snapshot `checkpoints/step-N` of the policy at every `every`-th completed step (what --save-every
    writes next to the resume state): a hook of the stage's `Run`."""

    def __init__(self, every: int, save: Callable[[int], Any]):
        self.every, self.save = every, save

    def on_save_point(self, engine, completed: int, allowed: bool) -> None:
        if allowed and self.every and completed % self.every == 0:
            self.save(completed)


def stage_run(ctx, policy, engine, tokenizer, save_every: int, home: str = "", config=None):
    """The loop's `Run`: the stage's logger (plus the --report-to trackers), checkpointer and console
    (a line every --logging-steps), with HF snapshots every `save_every` steps in
    run_dir/<home>/checkpoints/step-N (the newest --save-total-limit kept). `config`: the method's
    config, where the stage's `ctx.config` is another (a pipeline's)."""
    from ...runs.loop import Run
    from ...metrics import Console, make_tracker

    config = config if config is not None else ctx.config
    output = getattr(config, "output", None) or OutputConfig(save_every=save_every)
    root = ctx.run_dir / home / "checkpoints"

    def snapshot(step: int) -> None:
        save_pretrained(engine, policy, root / f"step-{step}", tokenizer, {"step": step})
        if engine.is_main:
            prune_snapshots(root, output.save_total_limit)

    console = None
    if ctx.logger is not None:  # rank 0
        for name in output.report_to:
            ctx.logger.add(make_tracker(name, ctx.run_dir, to_dict(config)))
        if output.logging_steps:
            console = Console(ctx.name, output.logging_steps, total_steps(config))
    hooks: list = [Snapshots(save_every, snapshot)]
    total = total_steps(config)
    if ctx.checkpointer is not None and total:  # a run shorter than the recorder's interval records its last step too
        from ...engine.distributed import is_main
        from ...runs.recorder import FILE, EpisodeRecorder

        recorder = EpisodeRecorder(ctx.checkpointer.directory.parent / FILE, write=is_main(), stage=ctx.name)
        recorder.every = min(recorder.every, total)
        hooks.insert(0, recorder)
    return Run(stage=ctx.name, logger=ctx.logger, checkpointer=ctx.checkpointer, console=console,
               hooks=hooks, counters=ctx.counters)


def prune_snapshots(root: Path, keep: int) -> list[Path]:
    """Remove all but the newest `keep` root/step-N snapshots (0: keep all); returns the removed."""
    steps = sorted((int(m.group(1)), p) for p in root.glob("step-*") if (m := re.fullmatch(r"step-(\d+)", p.name)))
    gone = [p for _, p in steps[:-keep]] if keep else []
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def total_steps(config) -> int | None:
    """The optimizer steps a method config asks for: its loop section's `steps`, or rounds x
    steps_per_round (rft); None where no section says."""
    for f in fields(config):
        section = getattr(config, f.name)
        if not is_dataclass(section):
            continue
        if hasattr(section, "rounds") and hasattr(section, "steps_per_round"):
            return section.rounds * section.steps_per_round
        if isinstance(getattr(section, "steps", None), int):
            return section.steps
    return None


def save_pretrained(engine, policy, path: Path, tokenizer, meta: dict) -> None:
    """`policy.save_pretrained` on rank 0 (the others wait)."""
    from ...engine.distributed import barrier

    if engine.is_main:
        policy.save_pretrained(path, tokenizer, meta=meta)
    barrier()


def announce(ctx, config, policy, n: int, noun: str) -> None:
    """One line on rank 0: the model, what it trains on, where it writes; and where it resumes from."""
    if ctx.logger is None:  # not rank 0
        return
    trained = policy.num_parameters(trainable=True)
    print(f"trajtune {ctx.name}: {config.model.path} ({policy.num_parameters():,} parameters, {trained:,} "
          f"trained), {n} {noun} from {config.data} -> {ctx.run_dir}", flush=True)
    if ctx.resuming:
        print(f"resuming from {resume_point(ctx.checkpointer.state_dir, total_steps(config))}", flush=True)


def resume_point(state_dir: Path, total: int | None) -> str:
    """'step 3 of 8 (checkpoint runs/x/sft/resume/state)'."""
    from ...checkpoint import CheckpointError, read_json

    try:
        done = int(read_json(state_dir / "engine.json").get("extra", {}).get("completed_steps", 0))
    except (CheckpointError, TypeError, ValueError):
        return f"the checkpoint {state_dir}"
    return f"step {done}" + (f" of {total}" if total is not None else "") + f" (checkpoint {state_dir})"


def finish(ctx, engine, policy, tokenizer, history: list[dict], home: str = "", start: str = "") -> dict:
    """Save run_dir/<home>/model (HF format: LoRA merged, the adapter in model/adapter, a value head
    next to it) and return the stage's results: the model, the optimizer steps, the last row and (rank 0) how
    far the saved weights are from those of `start`, the model folder the stage began from (`weight_change`). A
    run whose every optimizer step was skipped (a non-finite loss or gradient) trained nothing: `RunFailed`, and no
    model is written."""
    check_trained(engine, history, main=ctx.logger is not None)
    final = ctx.run_dir / home / "model"
    save_pretrained(engine, policy, final, tokenizer, {"command": ctx.name, "steps": engine.step})
    last = {k: v for k, v in (history[-1] if history else {}).items() if k not in ("time", "stage")}
    results = {"model": str(final), "steps": engine.step, "last": last}
    if start and engine.is_main and (change := weight_change(Path(start), final)) is not None:
        results["weight_change"] = change
    base = getattr(getattr(getattr(ctx, "config", None), "model", None), "path", "")
    if base:
        from ...models.cache import provenance

        results["base_model"] = {"path": str(base), **({"source": provenance(base)} if provenance(base) else {})}
    return results


def weight_change(before: Path, after: Path) -> dict | None:
    """How far the weights saved in folder `after` are from those in folder `before` (their *.safetensors files),
    over the tensors both have, by name: {"tensors": compared, "changed": how many differ in any element, "l2":
    |after - before| over all of them, "relative": l2 / |before|, "input": before, "model": after}. One tensor at a
    time, read with plain file reads (no memory map keeps both models resident): equal bytes are an unchanged
    tensor; the others are compared as float32 (a tensor of another dtype or shape that cannot be read as one is
    changed, and not measured). None when either folder has no safetensors weights or they share no
    tensor name (a model saved another way: nothing to compare)."""
    import torch

    def index(folder: Path) -> dict[str, tuple[Path, str, list[int], int, int]]:
        return {name: (f, *entry) for f in sorted(Path(folder).glob("*.safetensors"))
                if f.name != "value_head.safetensors" for name, entry in _safetensors_index(f).items()}

    a, b = index(before), index(after)
    common = [n for n in a if n in b]
    if not common:
        return None
    changed, d2, w2 = 0, 0.0, 0.0
    with contextlib.ExitStack() as stack:
        files = {f: stack.enter_context(open(f, "rb")) for f in {*(a[n][0] for n in common),
                                                                 *(b[n][0] for n in common)}}

        def read(entry) -> bytearray:
            f, _, _, start, end = entry
            raw = bytearray(end - start)
            files[f].seek(start)
            files[f].readinto(raw)
            return raw

        def tensor(entry, raw: bytearray):
            _, dtype, shape, _, _ = entry
            kind = getattr(torch, SAFETENSORS_DTYPES.get(dtype, ""), None)
            if kind is None:
                return None
            return torch.frombuffer(raw, dtype=kind).reshape(shape).float() if raw else torch.zeros(shape)

        for n in common:
            x_raw, y_raw = read(a[n]), read(b[n])
            x = tensor(a[n], x_raw)
            w2 += float(torch.linalg.vector_norm(x)) ** 2 if x is not None else 0.0
            if a[n][1:3] == b[n][1:3] and x_raw == y_raw:  # the same bytes: unchanged
                continue
            y = tensor(b[n], y_raw)
            comparable = x is not None and y is not None and x.shape == y.shape
            if comparable and torch.equal(x, y):  # another dtype holding the same values
                continue
            changed += 1
            if comparable:
                d2 += float(torch.linalg.vector_norm(y - x)) ** 2
    return {"tensors": len(common), "changed": changed, "l2": d2 ** 0.5,
            "relative": (d2 / w2) ** 0.5 if w2 else None, "input": str(before), "model": str(after)}


SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                      "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
"""a safetensors header's dtype -> the name of its torch dtype (torch is imported only when weights are read)"""


def _safetensors_index(path: Path) -> dict[str, tuple[str, list[int], int, int]]:
    """name -> (dtype, shape, first byte, end byte) of every tensor in a .safetensors file (its JSON header)."""
    import json

    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    return {name: (t["dtype"], list(t["shape"]), 8 + size + t["data_offsets"][0], 8 + size + t["data_offsets"][1])
            for name, t in header.items() if name != "__metadata__"}


def check_trained(engine, history: list[dict], main: bool = True) -> None:
    """Raise `RunFailed` when every optimizer step was skipped; warn (rank 0) when some were, or none was taken.

    The rows' train/skipped count (they survive a resume); RFT's rows do not carry it, so there
    this process's `engine.skipped_steps` against `engine.step`."""
    from ...runs.stages import RunFailed

    flags = [float(r["train/skipped"]) for r in history if "train/skipped" in r]
    steps, skipped = (len(flags), int(sum(f == 1.0 for f in flags))) if flags else (engine.step, engine.skipped_steps)
    if steps and skipped == steps:
        raise RunFailed(f"{'the one optimizer step' if steps == 1 else f'every one of the {steps} optimizer steps'} "
                        "was skipped: the loss or gradient was not finite "
                        "(NaN / Inf) at each step, so the weights never changed and no model was saved. The warnings "
                        "above name the rows of each step: check those rows and the reward function (a NaN / Inf "
                        "reward), lower --lr, or pass --on-nonfinite stop to stop at the first such step")
    if not main:
        return
    if skipped:
        print(f"trajtune: warning: {skipped} of {steps} optimizer steps were skipped (a non-finite loss or "
              "gradient; weights unchanged at those steps)", file=sys.stderr, flush=True)
    elif engine.step == 0 and history:  # steps ran but none updated (e.g. every group's rewards equal)
        print("trajtune: warning: no optimizer step was taken; the saved model is the input model, unchanged",
              file=sys.stderr, flush=True)
