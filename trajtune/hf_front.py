"""`trajtune sft|rm|dpo|grpo|rft --model DIR --data FILE`: the command line of the Hugging Face recipes.

    trajtune sft  --model ./my-model --data chats.jsonl --steps 100 --lr 1e-5 --out runs/sft
    trajtune dpo  --model runs/sft/model --data pairs.jsonl --beta 0.1 --lora-r 16 --out runs/dpo
    trajtune grpo --model runs/sft/model --data prompts.jsonl --reward my_rewards.py:exact --out runs/grpo
    trajtune rm   --model ./my-model --data pairs.jsonl --out runs/rm
    trajtune rft  --model ./my-model --data prompts.jsonl --reward my_rewards:exact --rounds 4

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
`--out` (default runs/hf) is the run directory; the same command again resumes a run cut short.
"""

from __future__ import annotations

import argparse
import importlib
import re
import types
import typing
from pathlib import Path
from typing import Literal, get_args, get_origin

from .config import ConfigError, from_dict
from .experiments.hf import METHODS
from .experiments.hf.options import name_options, options

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
DEFAULT_OUT = "runs/hf"


def add_hf_parsers(subparsers) -> None:
    """Add `sft rm dpo grpo rft` to an argparse subparsers object; each runs its experiment (`cmd_hf`)."""
    for command, help_text in COMMANDS.items():
        module = importlib.import_module(METHODS[command])
        p = subparsers.add_parser(command, help=f"HF model: {help_text}", description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter,
                                  allow_abbrev=False)  # --beta is DPO's beta, never a prefix of --beta1
        p.add_argument("--out", default=DEFAULT_OUT, help=f"run directory: metrics.jsonl, config.json, model/, "
                       f"checkpoints/ (default {DEFAULT_OUT}); the same command again resumes a run cut short")
        add_options(p, module.Config, ALIASES.get(command, {}))
        p.set_defaults(func=cmd_hf, hf_command=command)


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
        groups[section].add_argument(o.flag, *aliases.get(o.path, ()), dest=o.path, default=argparse.SUPPRESS,
                                     metavar=_metavar(o), required=o.path in REQUIRED, help=help_text, **_kind(o.type))


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
    if origin in (list, tuple):
        return {"nargs": "*", **{k: v for k, v in _kind(args[0] if args else str).items() if k != "action"}}
    if tp in (int, float, str):
        return {"type": tp}
    raise TypeError(f"no command-line flag for a field of type {tp!r}")


def config_from_args(args: argparse.Namespace, cls):
    """The config the given flags describe: their nested table through `from_dict`, as a recipe's."""
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
    """Build the command's config from its flags and run the experiment (the recipe path)."""
    from .distributed import init_distributed

    module = importlib.import_module(METHODS[args.hf_command])
    config = config_from_args(args, module.Config)
    init_distributed()  # under torchrun: join the process group (every rank runs the same stage)
    module.run(config, Path(args.out))
    return 0
