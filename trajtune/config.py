"""Recipes: TOML files that set fields of flat config dataclasses, validated before any work.

A recipe file:

    experiment = "addition_sft"          # which experiment (see `trajtune list`)
    description = "one line for `trajtune list`"

    [config]                             # fields of that experiment's config dataclass
    steps = 300
    [config.optim]                       # nested dataclass fields
    lr = 3e-3

Every key is checked against the dataclass: an unknown key fails naming the
file, the key and the closest valid key; a value of the wrong type fails naming
the key and the expected type. Nothing trains before the whole recipe is valid.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Callable, Literal, Sequence, get_args, get_origin


class ConfigError(ValueError):
    """An invalid recipe or option; the message names the file and key."""


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp, where: str):
    """Check `value` against annotation `tp`; return it (ints widen to float)."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for a in args:
            if a is type(None) and value is None:
                return None
            try:
                return _coerce(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{where}: {value!r} is not a {' or '.join(_type_name(a) for a in args)}")
    if origin is Literal:
        if value not in args:
            close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}: {value!r} is not one of {list(args)}{hint}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table of {tp.__name__} fields, got {value!r}")
        return from_dict(tp, value, where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item = args[0] if args else Any
        items = [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return dict(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number (float), got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp in (bool, str):
        if not isinstance(value, tp):
            raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported field type {_type_name(tp)}")


def _has_literal(tp) -> bool:
    return get_origin(tp) is Literal or any(_has_literal(a) for a in get_args(tp))


@functools.cache
def _choice_fields(cls) -> tuple[tuple[str, Any], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls) if _has_literal(hints[f.name]))


def check_choices(obj) -> None:
    """Raise ConfigError (a ValueError) naming the class and field where a field of dataclass `obj` typed
    with a Literal (`Literal["a", "b"]`, or an optional or a list of one) holds another value: the check
    `from_dict` makes for a recipe, for a config built in Python. Configs call it from `__post_init__`,
    so `RLConfig(advantage="grop")` fails there, not with a KeyError deep in the first step."""
    for name, tp in _choice_fields(type(obj)):
        _coerce(getattr(obj, name), tp, f"{type(obj).__name__}.{name}")


def from_dict(cls, data: dict, where: str = "config", base=None):
    """Build dataclass `cls` from a dict, checking every key and type (see module doc).

    A key the class lists in a `RENAMED` class attribute ({old key: new dotted key}) fails naming
    where it went. A table for a nested dataclass field starts from that field's default *instance* (e.g. an
    experiment's `rl: RLConfig = field(default_factory=lambda: RLConfig(steps=60, ...))`), so a
    recipe sets only what it changes; `base`, if given, is the instance to start from here."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        if key not in fields and key in getattr(cls, "RENAMED", {}):
            raise ConfigError(f"{where}: key {key!r} is now {cls.RENAMED[key]!r}")
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(fields)}"
            raise ConfigError(f"{where}: unknown key {key!r}{hint}")
        default = _default_of(fields[key], base)
        if dataclasses.is_dataclass(default) and isinstance(value, dict):
            kwargs[key] = from_dict(type(default), value, f"{where}.{key}", base=default)
        else:
            kwargs[key] = _coerce(value, hints[key], f"{where}.{key}")
    try:
        return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{where}: {e}") from e


def _default_of(f: dataclasses.Field, base):
    """The value field `f` has when a recipe does not set it: on `base`, or the field's default."""
    if base is not None:
        return getattr(base, f.name)
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def to_dict(config) -> dict:
    """A config dataclass as plain JSON/TOML-able data (saved with every run)."""
    return dataclasses.asdict(config)


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    """{'rl': {'steps': 6}} -> {'rl.steps': 6}: a nested config table (`to_dict`, a saved config.json) as dotted
    leaf paths (lists are leaves)."""
    out = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def set_dotted(data: dict, assignment: str, where: str = "--set") -> None:
    """Apply a command-line override `a.b=value` (value parsed as TOML, else a string)."""
    if "=" not in assignment:
        raise ConfigError(f"{where}: expected KEY=VALUE, got {assignment!r}")
    key, raw = assignment.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    node = data
    parts = key.strip().split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: {key!r} goes through a non-table value")
    node[parts[-1]] = value


@functools.lru_cache(maxsize=None)
def field_docs(cls) -> dict[str, str]:
    """The docstring under each field of a dataclass (read from its source and its dataclass bases', once
    per class), for --help and docs. Callers must not modify the dict returned."""
    import ast
    import inspect
    import textwrap

    docs: dict[str, str] = {}
    for base in cls.__mro__[1:]:  # inherited fields first; the class's own docstrings win
        if dataclasses.is_dataclass(base):
            docs.update(field_docs(base))
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return docs
    body = tree.body[0].body
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(getattr(b, "value", None),
                                                                                   ast.Constant):
            docs[a.target.id] = str(b.value.value).strip()
    return docs


def load_toml(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such recipe file")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML ({e})") from e


def check_ranges(obj, where: str, *, counts: Sequence[str] = (), non_negative: Sequence[str] = (),
                 positive: Sequence[str] = (), label: Callable[[str], str] = str) -> None:
    """Reject impossible numbers in a config's fields, naming the first offender:
    `counts` must be >= 1, `non_negative` >= 0, `positive` > 0; a NaN or infinite float fails
    every rule. `label` turns a field name into what the user typed (e.g. a command-line flag)."""
    for names, rule, ok in ((counts, ">= 1", lambda v: v >= 1), (non_negative, ">= 0", lambda v: v >= 0),
                            (positive, "> 0", lambda v: v > 0)):
        for name in names:
            v = getattr(obj, name)
            if not (ok(v) and (not isinstance(v, float) or math.isfinite(v))):
                raise ValueError(f"{where}: {label(name)} must be {rule}, got {v!r}")
