"""Datasets in the formats TRL users already have -> trajectories, pairs and prompt tasks.

Rows come from a JSONL file (one JSON object per line) or a `datasets.Dataset`
(or any sequence of dicts). Four formats, told apart by their fields:

    format        fields                                   becomes
    messages      messages: [{role, content}, ...]          SFT trajectories (every assistant turn trained)
    completion    prompt, completion                        SFT trajectories (the completion trained)
    preference    [prompt,] chosen, rejected                (chosen, rejected) trajectory pairs
    prompt        prompt (+ any other columns)              `PromptTask`s for RL / rejection sampling

`prompt`, `completion`, `chosen` and `rejected` are either strings (the
"standard" format: a string prompt is one user message, a string completion one
assistant message) or lists of messages (the "conversational" format). A
preference row without `prompt` has an implicit prompt: `chosen` and `rejected`
are whole conversations that share every message but the last assistant turn(s).
Everything is rendered by `ChatRenderer`, the model's own chat template.

A malformed row fails with `DataError` naming the file, the line (1-based) and
the missing or wrong field. Empty text is malformed too: an empty or
whitespace-only string `prompt` / `completion` / `chosen` / `rejected`, an
assistant message with empty content (and no tool_calls: nothing to train on)
and a user message with empty content.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from .text.chat import ChatRenderer, TemplateError
from .trajectory import Trajectory

FORMATS = ("messages", "completion", "preference", "prompt")
ROLES = ("system", "user", "assistant", "tool")


class DataError(ValueError):
    """A dataset row that does not fit the expected format (the message names line and field)."""


@dataclass
class Row:
    """One dataset row and where it came from (`where` is 'file:line' or 'dataset row i')."""

    data: dict[str, Any]
    where: str


@dataclass(frozen=True)
class PromptTask:
    """A prompt-only row: what the policy is asked (`prompt`: text or messages) and the row's other
    columns (`columns`, passed to the reward function). `reset` of a single-turn env returns `prompt`."""

    name: str
    prompt: Any
    columns: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    where: str = field(default="", hash=False, compare=False)
    """the row it came from ('file:line' or 'dataset row i'), for error messages"""

    def __hash__(self) -> int:
        return hash(self.name)


def read_rows(source: str | os.PathLike | Iterable[dict]) -> list[Row]:
    """Rows of a JSONL file, a `datasets.Dataset` or a sequence of dicts (empty lines skipped)."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.exists():
            raise DataError(f"{path}: no such file")
        rows = []
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{n}: not valid JSON ({e.msg})") from e
                if not isinstance(obj, dict):
                    raise DataError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
                rows.append(Row(obj, f"{path}:{n}"))
        if not rows:
            raise DataError(f"{path}: no rows")
        return rows
    return [Row(dict(r), f"dataset row {i}") for i, r in enumerate(source)]


def detect_format(row: Row) -> str:
    """The format of one row (see the module docstring)."""
    d = row.data
    if "messages" in d:
        return "messages"
    if "chosen" in d or "rejected" in d:
        return "preference"
    if "completion" in d:
        return "completion"
    if "prompt" in d:
        return "prompt"
    raise DataError(f"{row.where}: cannot tell the format: expected a 'messages', 'prompt'/'completion', "
                    f"'chosen'/'rejected' or 'prompt' field; got fields {sorted(d)}")


def check_format(rows: Sequence[Row], expected: Sequence[str]) -> None:
    for row in rows:
        fmt = detect_format(row)
        if fmt not in expected:
            raise DataError(f"{row.where}: a {fmt!r} row, but this command needs {' or '.join(repr(e) for e in expected)} rows")


# --- field validation --------------------------------------------------------------
def _field(row: Row, name: str) -> Any:
    if name not in row.data or row.data[name] is None:
        raise DataError(f"{row.where}: missing field {name!r}")
    return row.data[name]


def _messages(row: Row, name: str, value: Any, default_role: str) -> list[dict]:
    """A field as a list of messages: a string becomes one `default_role` message.

    Empty text fails: an empty string field, an assistant message with empty content and
    no tool_calls, a user message with empty content (system and tool messages may be empty)."""
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{row.where}: field {name!r} is empty ({value!r})")
        return [{"role": default_role, "content": value}]
    if not isinstance(value, list) or not value:
        raise DataError(f"{row.where}: field {name!r} must be a string or a non-empty list of messages, got {type(value).__name__}")
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise DataError(f"{row.where}: field {name!r}[{i}] must be an object with 'role' and 'content'")
        if m.get("role") not in ROLES:
            raise DataError(f"{row.where}: field {name!r}[{i}].role is {m.get('role')!r}; expected one of {list(ROLES)}")
        content = m.get("content")
        if not isinstance(content, str) and not m.get("tool_calls"):
            raise DataError(f"{row.where}: field {name!r}[{i}].content must be a string (or the message needs tool_calls)")
        if m["role"] in ("user", "assistant") and not m.get("tool_calls") and not content.strip():
            what = "an empty assistant turn (nothing to train on)" if m["role"] == "assistant" else "an empty user message"
            raise DataError(f"{row.where}: field {name!r}[{i}].content is empty ({content!r}): {what}")
    return [dict(m) for m in value]


def _render(renderer: ChatRenderer, row: Row, messages: list[dict]) -> list[Trajectory]:
    try:
        return renderer.render_samples(messages, info={"source": row.where})
    except TemplateError as e:
        raise DataError(f"{row.where}: {e}") from e


# --- the formats ----------------------------------------------------------------------
def conversation(row: Row) -> list[dict]:
    """The conversation of a 'messages' or 'completion' row."""
    d = row.data
    if "messages" in d:
        msgs = _messages(row, "messages", _field(row, "messages"), "user")
    else:
        msgs = _messages(row, "prompt", _field(row, "prompt"), "user") + \
            _messages(row, "completion", _field(row, "completion"), "assistant")
    if not any(m["role"] == "assistant" for m in msgs):
        raise DataError(f"{row.where}: the conversation has no assistant message to train on")
    return msgs


def sft_trajectories(rows: Sequence[Row], renderer: ChatRenderer) -> list[Trajectory]:
    """'messages' / 'completion' rows -> trajectories (a row may give several; see ChatRenderer)."""
    check_format(rows, ("messages", "completion"))
    out = []
    for row in rows:
        out += _render(renderer, row, conversation(row))
    return out


def preference_conversations(row: Row) -> tuple[list[dict], list[dict]]:
    """(chosen, rejected) conversations of a preference row, explicit or implicit prompt."""
    chosen, rejected = _field(row, "chosen"), _field(row, "rejected")
    if "prompt" in row.data:
        prompt = _messages(row, "prompt", _field(row, "prompt"), "user")
        return (prompt + _messages(row, "chosen", chosen, "assistant"),
                prompt + _messages(row, "rejected", rejected, "assistant"))
    c, r = _messages(row, "chosen", chosen, "assistant"), _messages(row, "rejected", rejected, "assistant")
    if isinstance(chosen, str) or isinstance(rejected, str):
        raise DataError(f"{row.where}: missing field 'prompt' (string 'chosen'/'rejected' need an explicit prompt)")
    shared = 0
    while shared < min(len(c), len(r)) and c[shared] == r[shared]:
        shared += 1
    if shared == 0:
        raise DataError(f"{row.where}: implicit prompt: 'chosen' and 'rejected' share no leading messages")
    return c, r


def preference_pairs(rows: Sequence[Row], renderer: ChatRenderer) -> list[tuple[Trajectory, Trajectory]]:
    """Preference rows -> (chosen, rejected) trajectory pairs (the last rendered sample of each side)."""
    check_format(rows, ("preference",))
    pairs = []
    for row in rows:
        sides = []
        for name, conv in zip(("chosen", "rejected"), preference_conversations(row), strict=True):
            samples = _render(renderer, row, conv)
            if not samples:
                raise DataError(f"{row.where}: field {name!r} has no assistant message to score")
            sides.append(samples[-1])
        pairs.append((sides[0], sides[1]))
    return pairs


def prompt_tasks(rows: Sequence[Row]) -> list[PromptTask]:
    """Rows with a 'prompt' (any format that has one) -> tasks; the other columns go to the reward function."""
    tasks = []
    for i, row in enumerate(rows):
        prompt = row.data.get("prompt")
        if prompt is None and "messages" in row.data:  # a conversation: everything before the first assistant turn
            msgs = _messages(row, "messages", row.data["messages"], "user")
            prompt = msgs[: next((k for k, m in enumerate(msgs) if m["role"] == "assistant"), len(msgs))]
        if prompt is None:
            raise DataError(f"{row.where}: missing field 'prompt'")
        checked = _messages(row, "prompt", prompt, "user")  # a string stays a string (the TRL form of the task)
        if not isinstance(prompt, str):
            prompt = checked
        columns = {k: v for k, v in row.data.items() if k not in ("prompt", "messages")}
        tasks.append(PromptTask(name=f"row{i}", prompt=prompt, columns=columns, where=row.where))
    return tasks


def load_reward_function(spec: str):
    """Import a reward function given as 'module:function' (module path or dotted name).

    The function follows TRL's convention: `fn(prompts, completions, **columns) -> list[float]`,
    one reward per completion; `columns` holds the dataset's other columns, one list each.
    """
    import importlib
    import importlib.util

    if ":" not in spec:
        raise DataError(f"reward function {spec!r}: expected 'module:function' (e.g. 'my_rewards:exact_match')")
    mod_name, fn_name = spec.rsplit(":", 1)
    try:
        if mod_name.endswith(".py") or os.sep in mod_name:
            s = importlib.util.spec_from_file_location(Path(mod_name).stem, mod_name)
            if s is None or s.loader is None:
                raise ImportError(f"cannot load {mod_name}")
            module = importlib.util.module_from_spec(s)
            s.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
    except (ImportError, FileNotFoundError) as e:
        raise DataError(f"reward function {spec!r}: cannot import {mod_name!r} ({e})") from e
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise DataError(f"reward function {spec!r}: {mod_name!r} has no callable {fn_name!r}")
    return fn


def reward_verifier(fn):
    """Wrap a TRL-style reward function as a trajtune verifier `(task, reply) -> (reward, checks)`.

    The completion is passed in the prompt's form: a string for string prompts, a
    one-message list `[{"role": "assistant", "content": reply}]` for conversational ones.
    """

    def verifier(task: PromptTask, reply: str):
        completion = reply if isinstance(task.prompt, str) else [{"role": "assistant", "content": reply}]
        out = fn(prompts=[task.prompt], completions=[completion], **{k: [v] for k, v in task.columns.items()})
        try:
            (reward,) = list(out)
            return float(reward), {}
        except (TypeError, ValueError) as e:
            raise DataError(f"reward function returned {out!r}; expected a list with one number per completion") from e

    return verifier
