"""The recipe path every Hugging Face method takes (`run_method`) and its dry run (`preflight`).

`run_method`: lock the run directory and check what an earlier run there means (its
`trajtune.runs.rundir.RunDir` policy), check everything before the model loads (the device,
the trackers, `prepare`), then begin the run there (--overwrite's clearing, config.json), run the stage through
`trajtune.runs.stages.run_stages` (progress lines every --logging-steps, snapshots every
--save-every, the newest --save-total-limit kept), refuse a run whose every step was
skipped, measure how far the saved weights are from the input's (`common.weight_change`), write view.html and
report.md / report.html with its curves, and end the terminal output with the report's warnings on stderr
(`report_and_say`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from ...config import ConfigError
from .common import total_steps
from .options import flag


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
        notes.append(f"--prompts-per-step ({flag('rl.tasks_per_step')}) {rl.tasks_per_step} is more than the {n} "
                     "prompts in "
                     f"{config.data}: every step samples each prompt, some of them twice or more")
    return notes


def stage_name(config) -> str:
    """The method's name, which is also its stage's: 'sft', 'rm', 'dpo', 'grpo', 'rft'."""
    return type(config).METHOD
