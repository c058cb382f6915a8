"""The option table of a Hugging Face run config: every leaf field of the nested dataclasses,
its one command-line name, its type, default and docstring.

    options(GRPORun) -> [Option("model.path", "--model", str, "", "the model: a local Hugging Face folder ..."),
                         Option("rl.kl_coef", "--kl-coef", float, 0.0, "weight of KL(pi || ref) ..."), ...]

A leaf is spelled `--<its field name>` (`rl.kl_coef` -> `--kl-coef`), except where
`RENAMES` says otherwise (`model.path` -> `--model`). Two leaves with the same name in
one config are an error here (`options` raises), so every option has exactly one flag.
`ALIASES` adds TRL's spelling where it means the same thing (`--learning-rate` for `--lr`,
`--eval-steps` for `--eval-every`); `TRL_NAMES` lists TRL arguments trajtune spells or means
differently, each refused with what to type instead (`trl_refusal`).
The command line (`trajtune.cli.hf`) renders this table as argparse flags; the
configs' own messages (validation, the resume check) use the same names, so what a
message names is what the user types. A TOML recipe sets the same leaves by path
(`[config.rl] kl_coef = 0.05`).
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass
from typing import Any

from ...config import field_docs

RENAMES = {"model.path": "model", "agent.run": "agent"}
"""leaf path -> option name where the field name alone would be unclear"""

ALIASES = {"lr": ("--learning-rate",), "eval_every": ("--eval-steps",)}
"""leaf name -> TRL's flags for it (the same meaning: accepted, listed in --help)"""

TRL_NAMES = {
    "--per-device-train-batch-size": ("batch_size", "the rows of one optimizer step over all processes, which is "
                                      "TRL's per_device_train_batch_size x processes x gradient_accumulation_steps"),
    "--gradient-accumulation-steps": ("micro_batch_size", "rows per forward/backward chunk; the batch size stays "
                                      "the rows of one optimizer step"),
    "--max-steps": ("steps", ""),
    "--output-dir": (None, "the run directory is --out"),
    "--model-name-or-path": ("path", "a local model folder, a hub id, a .gguf file or a catalog name"),
    "--dataset-name": ("data", "a local .jsonl / .json / .parquet file or save_to_disk directory"),
    "--save-steps": ("save_every", ""),
    "--bf16": ("precision", "--precision bf16"),
    "--fp16": ("precision", "--precision fp16"),
    "--use-peft": ("lora_r", "LoRA is on when it is > 0, e.g. --lora-r 16"),
    "--adam-beta1": ("beta1", ""),
    "--adam-beta2": ("beta2", ""),
    "--max-grad-norm": ("grad_clip", ""),
    "--loss-type": ("loss", ""),
    "--eval-strategy": ("eval_every", "--eval-steps N evaluates every N steps (0: after the last step only)"),
    "--use-vllm": ("backend", "--backend vllm"),
    "--vllm-mode": (None, "--backend vllm is colocated; --vllm-server URL samples on `trajtune vllm-serve` servers"),
    "--vllm-server-base-url": ("vllm_server", ""),
}
"""TRL argument -> (the leaf name that does it here, or None; a note): refused, with the flag to use"""


MOVED_FLAGS = {"--vllm-timeout": "--sampler-timeout", "--vllm-sync-tolerance": "--sync-tolerance"}
"""flags of the sections the one sampling section replaced (trajtune.sources.sampling) -> their flag now: refused"""


@dataclass(frozen=True)
class Option:
    path: str
    """dotted path in the config ('rl.kl_coef'), the key of a TOML recipe's [config] table"""
    flag: str
    """the command-line flag ('--kl-coef')"""
    type: Any
    """the field's annotation (int, float, str, bool, a Literal, list[...], X | None)"""
    default: Any
    """the default of the method's config (dataclasses.MISSING when required)"""
    doc: str
    """the field's docstring"""
    aliases: tuple[str, ...] = ()
    """TRL's flags for the same leaf (`ALIASES`)"""


def flag(path: str) -> str:
    """'rl.kl_coef' -> '--kl-coef'; 'model.path' -> '--model' (RENAMES)."""
    name = RENAMES.get(path, path.rsplit(".", 1)[-1])
    return "--" + name.replace("_", "-")


def options(cls, prefix: str = "", defaults: Any = dataclasses.MISSING) -> list[Option]:
    """Every leaf of config dataclass `cls` (nested dataclass fields flattened), in field order."""
    out = _leaves(cls, prefix, defaults)
    seen: dict[str, str] = {}
    for o in out:
        for name in (o.flag, *o.aliases):
            if name in seen:
                raise ValueError(f"{cls.__name__}: {seen[name]} and {o.path} would both be {name}; "
                                 f"add one of them to trajtune.experiments.hf.options.RENAMES")
            seen[name] = o.path
    return out


def trl_names(cls) -> list[str]:
    """The `TRL_NAMES` that are not a flag of config `cls` (each to be refused with `trl_refusal`)."""
    taken = {name for o in options(cls) for name in (o.flag, *o.aliases)}
    return [name for name in TRL_NAMES if name not in taken]


def trl_refusal(cls, trl_flag: str) -> str:
    """Why `trl_flag` is refused by the command of config `cls`, and what to type instead."""
    leaf, note = TRL_NAMES[trl_flag]
    ours = [o.flag for o in options(cls) if leaf is not None and o.path.rsplit(".", 1)[-1] == leaf]
    if ours:
        use = note if note.startswith("--") else f"use {ours[0]}" + (f": {note}" if note else "")
        return f"{trl_flag} is TRL's name; here {use}"
    return f"{trl_flag} is TRL's name and not an option of this command" + (f"; {note}" if note else "")


def _leaves(cls, prefix: str, defaults: Any) -> list[Option]:
    hints, docs = typing.get_type_hints(cls), {}
    for base in reversed(cls.__mro__[:-1]):  # a subclass that only changes defaults keeps its base's docs
        docs.update(field_docs(base))
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if defaults is not dataclasses.MISSING:
            value = getattr(defaults, f.name)
        elif f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = dataclasses.MISSING
        path = prefix + f.name
        if dataclasses.is_dataclass(hints[f.name]):
            out += _leaves(hints[f.name], path + ".", value)
        else:
            aliases = ALIASES.get(f.name, ()) if path not in RENAMES else ()
            out.append(Option(path, flag(path), hints[f.name], value, docs.get(f.name, ""), aliases))
    return out


def name_options(message: str, cls, section: str) -> str:
    """Rewrite the field names of section `section` of `cls` in a validation message as flags
    ('RLConfig: advantage='grpo' needs group_size >= 2' -> '... --advantage='grpo' needs --group-size >= 2'),
    so a command-line user reads the option they typed. The top-level section's messages are the run
    config's own, which name flags already."""
    if not section:
        return message
    names = {o.path.rsplit(".", 1)[-1]: o.flag for o in options(cls) if o.path.rpartition(".")[0] == section}
    if not names:
        return message
    alternatives = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    pattern = re.compile(r"(?<![\w.'-])(" + alternatives + r")(?![\w'-])")
    return pattern.sub(lambda m: names[m.group(1)], message)
