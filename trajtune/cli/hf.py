"""`trajtune sft|rm|dpo|grpo|rft --model DIR --data FILE`: the command line of the Hugging Face recipes.

    trajtune sft  --model ./my-model --data chats.jsonl --steps 100 --lr 1e-5 --out runs/sft
    trajtune dpo  --model runs/sft/model --data pairs.jsonl --beta 0.1 --lora-r 16 --out runs/dpo
    trajtune grpo --model runs/sft/model --data prompts.jsonl --reward my_rewards.py:exact --out runs/grpo
    trajtune rm   --model ./my-model --data pairs.jsonl --out runs/rm
    trajtune rft  --model ./my-model --data prompts.jsonl --reward my_rewards:exact --rounds 4
    trajtune rm-eval --model runs/rm/model --data heldout.jsonl     (no training: accuracy, margin, per category)

A thin front: each command's flags are generated from its config dataclass
(`trajtune.experiments.hf`: SFTRun, RewardModelRun, DPORun, GRPORun, RFTRun) -- one flag
per leaf field of the nested sections (`rl.kl_coef` -> `--kl-coef`, `model.path` ->
`--model`; the field's docstring is its help, a Literal its choices, a bool
`--x/--no-x`). The flags given become the same nested table a TOML recipe's [config]
is, built by `trajtune.config.from_dict` and run by the experiment's `run(config,
run_dir)`: `trajtune grpo --kl-coef 0.05 ...` and `trajtune run` on a recipe with
`experiment = "hf_grpo"` and `[config.rl] kl_coef = 0.05` are the same run.

Aliases, kept from the earlier command line (listed in each command's --help):
    grpo  --prompts-per-step   = --tasks-per-step   (rl.tasks_per_step)
    rft   --steps              = --steps-per-round  (rft.steps_per_round)
    rft   --group-size         = --samples-per-task (rft.samples_per_task)
The run directory (`trajtune.runs.rundir.RunDir`, the owner `trajtune run` and the stage runner use
too): `--out DIR`, or a fresh `runs/<command>-<YYYYmmdd-HHMMSS>` (printed at start) so that no two runs
ever share one by default. A run holds a lock on it; a second run there is refused, naming the first.
The same command with the same --out again:
    a run cut short (Ctrl-C, SIGTERM, a periodic checkpoint)   resumes: "resuming from step N of M"
                                                                (changed options: only the command's
                                                                RESUMABLE ones, else refused naming them)
    a run killed before any checkpoint                          starts again from step 0 (says so;
                                                                its metric rows are dropped)
    a finished run                                              refused, unless --overwrite (which
                                                                deletes its outputs, once every check
                                                                passed, and starts afresh)
`--dry-run` makes every check that comes before the model loads, and stops; it writes nothing.
"""

from __future__ import annotations

import argparse
import importlib
import re
import types
import typing
from pathlib import Path
from typing import Literal, get_args, get_origin

from ..config import ConfigError, from_dict
from ..experiments.hf import METHODS
from ..experiments.hf.options import MOVED_FLAGS, flag, name_options, options, trl_names, trl_refusal
from ..experiments.hf.schedule import check_given
from ..runs.rundir import RUNS, RunDir

COMMANDS = {
    "sft": "supervised fine-tuning on conversations or prompt/completion rows",
    "rm": "train a Bradley-Terry reward model (value head) on preference pairs",
    "dpo": "direct preference optimisation (and ipo / simpo / orpo) on preference pairs",
    "grpo": "RL with group baselines (GRPO, RLOO, REINFORCE; PPO with --surrogate ppo) and a reward function",
    "rft": "rejection-sampling fine-tuning (expert iteration) with a reward function",
}
ALIASES = {
    "grpo": {"rl.tasks_per_step": ("--prompts-per-step",)},
    "rft": {"rft.steps_per_round": ("--steps",), "rft.samples_per_task": ("--group-size",)},
}
"""command -> config path -> extra flags for it (today's spellings)"""
REQUIRED = ("model.path", "data")
OUTPUTS = ("model", "checkpoints", "report.md", "report.html", "report-*.png", "tb", "wandb")
"""what a run writes in its directory besides config.json, metrics.jsonl and its stage directory (--overwrite
removes them all)"""


def add_hf_parsers(subparsers) -> None:
    """Add `sft rm dpo grpo rft` to an argparse subparsers object; each runs its experiment (`cmd_hf`); and
    `rm-eval` (a saved reward model on held-out pairs: `trajtune.experiments.hf.rm_eval`)."""
    for command, help_text in COMMANDS.items():
        module = importlib.import_module(METHODS[command])
        p = subparsers.add_parser(command, help=f"HF model: {help_text}", description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter,
                                  allow_abbrev=False)  # --beta is DPO's beta, never a prefix of --beta1
        p.add_argument("--out", help=f"run directory: metrics.jsonl, config.json, model/, checkpoints/, report.md "
                       f"(default: a fresh {RUNS}/{command}-YYYYmmdd-HHMMSS); the same command with the same --out "
                       "resumes a run cut short")
        p.add_argument("--overwrite", action="store_true", help="--out holds a finished (or unfinished) run: delete "
                       "its model, checkpoints, metrics and resume state, and train again from step 0")
        p.add_argument("--dry-run", action="store_true", help="check the model and data paths, every row and "
                       "length, the device and the options; then stop before the model loads")
        add_options(p, module.Config, ALIASES.get(command, {}))
        p.set_defaults(func=cmd_hf, hf_command=command)
    add_rm_eval_parser(subparsers)


def add_rm_eval_parser(subparsers) -> None:
    """`trajtune rm-eval --model DIR --data FILE`: no training, no run directory (`trajtune.experiments.hf.rm_eval`)."""
    from ..experiments.hf import rm_eval

    p = subparsers.add_parser("rm-eval", help="HF model: a reward model's pair accuracy and margin on held-out pairs",
                              description=rm_eval.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a reward model: the model/ folder `trajtune rm` saved (or a hub "
                   "id, .gguf file or catalog name that resolves to one)")
    p.add_argument("--data", required=True, help="preference rows ('prompt'/'chosen'/'rejected', optional 'category' "
                   "and 'margin'): .jsonl, .json, .parquet or a save_to_disk directory")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per forward pass (default 16)")
    p.add_argument("--max-length", type=int, default=1024, help="longest pair side in tokens; a longer row is an "
                   "error naming it (default 1024)")
    p.add_argument("--device", default="cpu", help="where the model runs (default cpu)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_rm_eval)


def cmd_rm_eval(args) -> int:
    """Score every held-out pair with the saved reward model and print the report (`rm_eval.evaluate_dir`)."""
    import json

    from ..experiments.hf import rm_eval

    _quiet_transformers()
    report = rm_eval.evaluate_dir(args.model, args.data, args.batch_size, args.max_length, args.device)
    print(json.dumps(report, indent=1) if args.json else rm_eval.format_report(report))
    return 0


def add_options(parser: argparse.ArgumentParser, cls, aliases: dict[str, tuple[str, ...]] | None = None) -> None:
    """One flag per leaf of config dataclass `cls` (dest = its dotted path; absent unless given),
    grouped by section, plus `aliases` (path -> extra flags)."""
    aliases = aliases or {}
    groups: dict[str, argparse._ArgumentGroup] = {}
    for o in options(cls):
        section = o.path.rpartition(".")[0]
        if section not in groups:
            groups[section] = parser.add_argument_group(f"[config.{section}]" if section else "[config]")
        default = f" (recipe: {o.path})" if o.path in REQUIRED else f" (default {o.default!r}; recipe: {o.path})"
        help_text = (o.doc.replace("\n", " ") + default).replace("%", "%%")
        groups[section].add_argument(o.flag, *o.aliases, *aliases.get(o.path, ()), dest=o.path,
                                     default=argparse.SUPPRESS, metavar=_metavar(o), required=o.path in REQUIRED,
                                     help=help_text, **_kind(o.type))
    for name in trl_names(cls):  # TRL's spelling of something trajtune spells or means differently
        parser.add_argument(name, nargs="*", action=_RefuseTRLName, const=trl_refusal(cls, name),
                            help=argparse.SUPPRESS)
    flags = {o.flag for o in options(cls)}
    for name, now in MOVED_FLAGS.items():  # the flags of the sections the sampling section replaced
        if now in flags:
            parser.add_argument(name, nargs="*", action=_RefuseTRLName, help=argparse.SUPPRESS,
                                const=f"{name} is now {now} (recipes: sampling.{now[2:].replace('-', '_')})")


class _RefuseTRLName(argparse.Action):
    """A TRL argument trajtune spells or means differently: an error that names the flag to use."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(self.const)


def _metavar(o) -> str | None:
    """None where argparse shows choices or a bool switch; else the leaf name (--kl-coef KL_COEF)."""
    if o.type is bool or get_origin(o.type) is Literal:
        return None
    return o.path.rsplit(".", 1)[-1].upper()


def _kind(tp) -> dict:
    """argparse keywords for a field annotation."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is bool:
        return {"action": argparse.BooleanOptionalAction}
    if origin is Literal:
        return {"choices": list(args), "type": type(args[0])}
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        return _kind(next(a for a in args if a is not type(None)))
    if origin in (typing.Union, types.UnionType) and any(get_origin(a) in (list, tuple) for a in args):
        return _kind(next(a for a in args if get_origin(a) in (list, tuple)))  # list[str] | str: a recipe's one string
    # --reward a.py:f --reward b.py:g and --reward a.py:f b.py:g alike (flags default to SUPPRESS)
    if origin in (list, tuple):
        return {"nargs": "*", "action": "extend",
                **{k: v for k, v in _kind(args[0] if args else str).items() if k != "action"}}
    if tp in (int, float, str):
        return {"type": tp}
    raise TypeError(f"no command-line flag for a field of type {tp!r}")


def config_from_args(args: argparse.Namespace, cls):
    """The config the given flags describe: their nested table through `from_dict`, as a recipe's."""
    check_given(o.path for o in options(cls) if hasattr(args, o.path))
    table: dict = {}
    for o in options(cls):
        if hasattr(args, o.path):
            *sections, leaf = o.path.split(".")
            node = table
            for s in sections:
                node = node.setdefault(s, {})
            node[leaf] = getattr(args, o.path)
    return build(cls, table)


def build(cls, table: dict):
    """`from_dict(cls, table)`, with the failing section's field names in the message as flags."""
    try:
        return from_dict(cls, table, where="options")
    except ConfigError as e:
        m = re.match(r"options(?:\.(\w+))?: (.*)", str(e), re.S)
        if not m:
            raise
        raise ConfigError(name_options(m.group(2), cls, m.group(1) or "")) from None


def cmd_hf(args) -> int:
    """Build the command's config from its flags and run the experiment's recipe path (`run_method`) in
    its run directory, under the commands' policy (`hf_run_dir`)."""
    from ..engine.distributed import init_distributed, is_main
    from ..experiments.hf.recipe import resolve_models, run_method

    module = importlib.import_module(METHODS[args.hf_command])
    config = config_from_args(args, module.Config)
    _quiet_transformers()
    init_distributed()  # under torchrun: join the process group (every rank runs the same stage)
    resolve_models(config)  # --model smollm2-135m -> its folder, before the run directory compares configs
    run_dir = hf_run_dir(args, config)
    if args.dry_run:
        run_dir.check_free()
        plan = run_dir.check(config, [module.Config.METHOD])
        line = module.dry_run(config, run_dir.path)  # every rank checks (and fails) alike
        if is_main():
            print(f"dry run: {plan.describe()}\n{line}")
        return 0
    if not args.out and is_main():
        print(f"trajtune {args.hf_command}: run directory {run_dir.path} (--out DIR to choose one)", flush=True)
    try:
        with run_dir.hold():
            run_method(config, run_dir, module.train, module.prepare)
    except KeyboardInterrupt as e:
        if not args.out:
            e.resume_hint = f"run the same command with --out {run_dir.path} to resume"
        raise
    return 0


def hf_run_dir(args: argparse.Namespace, config) -> RunDir:
    """--out, or a fresh runs/<command>-TIME (made now unless --dry-run), under the commands' policy: a finished
    run refused unless --overwrite; a run cut short resumed if only the command's RESUMABLE options changed;
    the outputs --overwrite removes; the options spelled as flags."""
    policy = dict(if_finished="refuse", overwrite=args.overwrite, outputs=(*OUTPUTS, config.METHOD),
                  command=args.hf_command, option="--out", spell=flag)
    if args.out:
        return RunDir(Path(args.out), **policy)
    return RunDir.fresh(args.hf_command, create=not args.dry_run, **policy)


def _quiet_transformers() -> None:
    """transformers' own bars ("Loading weights", "Writing model shards") would interleave with the run's
    metric lines in a log; the command's lines say what happens."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # the data checks run without the hf extra
        return
    hf_logging.disable_progress_bar()
