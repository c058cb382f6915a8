"""What every Hugging Face method shares: the model section, the sampling section, and the
plumbing of its one stage (load the model behind `ctx.engine`, periodic snapshots, the final save).

A method module (sft.py, rm.py, dpo.py, grpo.py, rft.py) is its config -- this
`ModelConfig`, the data file, the loop's own dataclass, `OptimConfig`, `OutputConfig`
-- plus one stage function that calls the loop. `run_method` is the recipe path they
all take: lock the run directory and check what an earlier run there means (its
`trajtune.runs.rundir.RunDir` policy), check everything before the model loads (the device,
the trackers, `prepare`), then begin the run there (--overwrite's clearing, config.json), run the stage through
`trajtune.runs.stages.run_stages` (progress lines every --logging-steps, snapshots every
--save-every, the newest --save-total-limit kept), refuse a run whose every step was
skipped, measure how far the saved weights are from the input's (`weight_change`), write view.html and
report.md / report.html with its curves, and end the terminal output with the report's warnings on stderr
(`report_and_say`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import shutil
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator

from ...config import ConfigError, check_choices, check_ranges, to_dict
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
        files = {f: stack.enter_context(open(f, "rb")) for f in {*(a[n][0] for n in common), *(b[n][0] for n in common)}}

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


# --- the recipe path ----------------------------------------------------------------------
def run_method(config, run_dir, stage_fn, prepare: Callable[[Any, Path], Any]) -> Path:
    """Check, then train as one stage named after the method, `stage_fn(ctx, config, prepared)`;
    returns the report's path.

    `run_dir`: a path (`trajtune run`'s policy: a finished run is read back) or a `RunDir` with its own
    policy (the HF commands': a finished run refused unless --overwrite). Holding its lock: what an earlier
    run there means (`RunDir.check`: a changed option on resume refused, naming it), then `prepare(config,
    run_dir)`, which checks the data and lengths before any model loads and returns what the stage takes,
    and only then `RunDir.begin` (--overwrite's clearing, config.json): a run refused by a check changes
    nothing. A user's mistake (a bad row, a missing file or model, an unusable device) is a `ConfigError`
    naming it."""
    from ...engine.distributed import is_main
    from ...runs.rundir import RunDir
    from ...runs.stages import Stage, StageOptions, run_stages

    run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(Path(run_dir))
    name = stage_name(config)
    resolve_models(config)
    with run_dir.lock():
        run_dir.check(config, [name])
        prepared = check(config, run_dir.path, prepare)
        run_dir.begin(config, [name])
        with user_errors():
            results = run_stages([Stage(name, stage_fn, args=(config, prepared))], config, run_dir.path,
                                 StageOptions(workers=1, checkpoint_every=config.output.save_every))[name]
        report = run_dir.path / "report.md"
        if is_main():
            report = report_and_say(run_dir.path, config, name, results, prepared)
    return report


def report_and_say(run_dir: Path, config, name: str, results: dict, prepared) -> Path:
    """The end of a command (rank 0): view.html of the episodes it recorded (`runs.view.write_view_if_recorded`),
    report.md / report.html (`runs.metrics_report.write_run_report`: the settings, the warnings, a few sampled
    completions, the curves), then on the terminal what was saved and where, and last, on stderr, the report's
    warnings (no learning signal, a loss that never moved, a gradient norm of 0, a model saved unchanged): what a
    user reads first after a run is why it learned nothing, if it did not. Returns report.md's path."""
    from ...metrics import read_metrics
    from ...models.hub import given_as
    from ...runs.recorder import FILE, read_episodes
    from ...runs.metrics_report import changed_weights, plain, run_warnings, write_run_report
    from ...runs.view import write_view_if_recorded

    write_view_if_recorded(run_dir)
    steps, change = results["steps"], results.get("weight_change")
    said = f"{steps} optimizer step{'s' * (steps != 1)}" + (f"; {changed_weights(change)}" if change else "")
    origin, about = model_origin(config.model.path)
    intro = (f"model: `{results['model']}` ({said}), trained from {origin} on `{config.data}`{about}\n\n"
             + settings_text(config))
    try:
        rows = read_metrics(run_dir)
    except (OSError, ValueError):
        rows = []
    warnings = run_warnings(rows, change)
    episodes = [e for path in sorted(run_dir.glob(f"*/{FILE}")) for e in read_episodes(path)]
    tokenizer = getattr(prepared, "tokenizer", None)
    decode = (lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True)) if tokenizer is not None else None
    report = write_run_report(run_dir, f"{name} on {given_as(config.model.path) or config.model.path}", intro,
                              warnings, episodes, decode)
    unchanged = " (unchanged from its input)" if change and not change.get("changed") else ""
    print(f"{name}: {steps} optimizer step{'s' * (steps != 1)}; model saved{unchanged} to {results['model']} "
          f"(load with AutoModelForCausalLM.from_pretrained({results['model']!r})); report {report}", flush=True)
    for w in warnings:
        print(f"trajtune: warning: {plain(w)}", file=sys.stderr, flush=True)
    return report


def resolve_models(config) -> None:
    """Every model a run names (--model, --reward-model, --reward-judge) resolved, in place, to its local folder
    (`trajtune.models.hub.resolve_model`: a hub id, a .gguf file or a catalog name such as smollm2-135m becomes
    the folder it is fetched or converted into, once), so that what loads, what vLLM is given and what
    config.json records is that folder. A local folder stays as the user wrote it; a second call changes nothing."""
    from ...models.hub import resolve_model

    def folder(spec: str) -> str:
        path = resolve_model(spec) if spec else None
        return spec if path is None or path == Path(spec).expanduser() else str(path)

    with user_errors():
        config.model.path = folder(config.model.path)
        if isinstance(getattr(config, "reward_model", None), list):
            config.reward_model = [folder(m) for m in config.reward_model]
        if getattr(config, "reward_judge", ""):
            config.reward_judge = folder(config.reward_judge)


def model_origin(path: str) -> tuple[str, str]:
    """How a run report names the model it started from -> (`spec` (the folder it resolved to), and for a converted
    checkpoint a paragraph saying what it is: `trajtune.models.cache.provenance`, e.g. a dequantized Q4_1 GGUF)."""
    from ...models.cache import provenance
    from ...models.hub import given_as

    spec = given_as(path)
    source = provenance(path) or {}
    about = (f"\n\nthe starting model: {source.get('note', '')}" + (f"; license {source['license']}" if
                                                                    source.get("license") else "")) if source else ""
    return (f"`{spec}` (`{path}`)" if spec else f"`{path}`"), about


def settings_text(config) -> str:
    """A run report's first lines: the reward sources (grpo, rft, dpo's on-policy pairs) and the key settings --
    steps, batch / group size, max new tokens, lr and the loss -- from the config of any HF command."""
    loop = next(getattr(config, f) for f in ("rl", "rft", "dpo", "rm", "sft") if hasattr(config, f))
    items = [("lr", f"{config.optim.lr:g}")]
    if config.model.lora_r:
        items.append(("LoRA r", str(config.model.lora_r)))
    if hasattr(loop, "rounds"):  # RFT: rounds of sample -> select -> SFT
        items += [("rounds", f"{loop.rounds} x {loop.steps_per_round} SFT steps"), ("batch", str(loop.batch_size)),
                  ("samples per prompt", str(loop.samples_per_task)),
                  ("loss", f"SFT on the samples selected by '{loop.select}' (threshold {loop.threshold:g})")]
    else:
        items.append(("steps", str(loop.steps)))
        if hasattr(loop, "group_size"):  # RL
            items += [("prompts per step", str(loop.tasks_per_step)), ("group size", str(loop.group_size)),
                      ("loss", f"advantage {loop.advantage}, surrogate {loop.surrogate}, KL coef {loop.kl_coef:g}")]
        else:
            items.append(("batch", str(loop.batch_size)))
            items.append(("loss", f"{loop.loss}, beta {loop.beta:g}" if hasattr(loop, "beta") else  # DPO family
                          f"reward model, objective {loop.objective}" if hasattr(loop, "objective") else
                          f"NLL on {loop.train_on} tokens"))  # SFT
    if hasattr(config, "sampling") and getattr(config, "online", True):  # offline DPO samples nothing
        items += [("max new tokens", str(config.sampling.max_new_tokens)),
                  ("temperature", f"{config.sampling.temperature:g}")]
    text = "settings: " + "; ".join(f"{k} {v}" for k, v in items)
    rewards = [f"`{r}`" for r in getattr(config, "reward", [])]
    models = getattr(config, "reward_model", [])
    rewards += [f"reward model `{m}`" for m in ([models] if isinstance(models, str) else models) if m]
    rewards += [f"judge `{config.reward_judge}`"] if getattr(config, "reward_judge", "") else []
    rewards += [f"rubric `{config.rubric}`"] if getattr(config, "rubric", "") else []
    if rewards:
        weights = getattr(config, "reward_weights", [])
        text = (f"reward: {' + '.join(rewards)}" + (f" (weights {', '.join(f'{w:g}' for w in weights)})" if weights
                                                    else "") + "\n\n" + text)
    return text


def check(config, run_dir: Path, prepare: Callable[[Any, Path], Any]):
    """Everything before the model loads: the device, the trackers, then `prepare` (rows, lengths,
    resume); what to expect of --steps 0 or a batch larger than the data (warnings). -> prepared"""
    from ...engine.distributed import is_main
    from ...metrics import check_tracker

    check_device(config.model.device)
    for tracker in config.output.report_to:
        check_tracker(tracker)
    with user_errors():
        prepared = prepare(config, run_dir)
    if is_main():  # the steps as the data resolved them (--num-train-epochs: prepared.overrides)
        resolved = dataclasses.replace(config, **getattr(prepared, "overrides", {}))
        for note in expectations(resolved, len(prepared.items)):
            print(f"trajtune: warning: {note}", file=sys.stderr, flush=True)
    return prepared


def preflight(config, run_dir: str | Path, prepare: Callable[[Any, Path], Any]) -> str:
    """A method's `dry_run` hook (`--dry-run`, `trajtune run --dry-run`): every check `run_method` makes
    before the model loads (device, trackers, the model's config and tokenizer, every row and length, the
    reward functions), nothing written, and a line saying what would run. (The run directory's policy is
    the caller's: `RunDir.check`.) A model spec is resolved as the run resolves it (`resolve_models`): a first
    fetch or conversion fills the model cache, never the run directory."""
    resolve_models(config)
    prepared = check(config, Path(run_dir), prepare)
    total = total_steps(dataclasses.replace(config, **getattr(prepared, "overrides", {})))
    return (f"dry run: the {len(prepared.items)} training items from {config.data} are valid, the model "
            f"{config.model.path} has a config and tokenizer, --device {config.model.device} is usable; "
            f"{total} optimizer step{'s' * (total != 1)} would run in {run_dir} (nothing trained)")


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn the user's mistakes met in the data, model files or templates into `ConfigError`s."""
    from ...sources.data import DataError
    from ...models.hf import ModelPathError
    from ...text.chat import TemplateError

    try:
        yield
    except (DataError, ModelPathError, TemplateError) as e:
        raise ConfigError(str(e)) from e


def check_device(device: str) -> None:
    """A device string torch knows and a device this machine has, before any model loads."""
    import torch

    try:
        d = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"--device {device!r} is not a device: use cpu, cuda, cuda:N or mps") from None
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {device}: CUDA is not available (torch {torch.__version__}"
                              f"{' has no CUDA build' if torch.version.cuda is None else ' sees no GPU'}); "
                              "use --device cpu, or install a CUDA build of torch on a machine with a GPU")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {device}: there are {torch.cuda.device_count()} GPUs (cuda:0 .. "
                              f"cuda:{torch.cuda.device_count() - 1})")
    elif d.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {device}: MPS (Apple GPU) is not available here; use --device cpu")
    elif d.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"--device {device!r}: trajtune trains on cpu, cuda or mps")


BATCHES = (("sft", "batch_size", "samples"), ("rm", "batch_size", "pairs"), ("dpo", "batch_size", "pairs"))
"""(loop section, field, what the data holds): a batch drawn without repeats from the rows"""


def expectations(config, n: int) -> list[str]:
    """What a run that can go ahead will do where the user may not expect it: no step at all, or a
    batch larger than the data."""
    notes = []
    total = total_steps(config)
    if total == 0:
        notes.append("0 optimizer steps asked for (--steps 0): nothing will be trained; model/ will be the "
                     "input model, unchanged")
    online = bool(getattr(config, "online", False))  # online DPO: a step's pairs are --pair-prompts fresh ones
    for section, name, noun in BATCHES:
        size = getattr(getattr(config, section, None), name, 0)
        if online and size and size > config.pair_prompts:
            notes.append(f"{flag(f'{section}.{name}')} {size} is larger than the {config.pair_prompts} pairs "
                         f"--pair-prompts makes each round: every step trains on all of them")
        elif not online and size and size > n:
            notes.append(f"{flag(f'{section}.{name}')} {size} is larger than the {n} {noun} in {config.data}: "
                         f"every step trains on all {n} (a batch of {n}, not {size})")
    rl = getattr(config, "rl", None)
    if rl is not None and rl.tasks_per_step > n:
        notes.append(f"--prompts-per-step ({flag('rl.tasks_per_step')}) {rl.tasks_per_step} is more than the {n} prompts in "
                     f"{config.data}: every step samples each prompt, some of them twice or more")
    return notes


def stage_name(config) -> str:
    """The method's name, which is also its stage's: 'sft', 'rm', 'dpo', 'grpo', 'rft'."""
    return type(config).METHOD
