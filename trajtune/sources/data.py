"""Datasets in the formats TRL users already have -> trajectories, pairs and prompt tasks.

Rows come from a file or directory -- JSON lines (.jsonl), a JSON array or JSON
lines (.json), .parquet, a `Dataset.save_to_disk` directory (see `read_rows`) -- or
a `datasets.Dataset` (or any sequence of dicts). Four formats, told apart by their fields:

    format        fields                                   becomes
    messages      messages: [{role, content}, ...]          SFT trajectories (every assistant turn trained, or the
                                                            last, or one sample per turn: `train_on`)
    completion    prompt, completion                        SFT trajectories (the completion trained)
    preference    [prompt,] chosen, rejected                (chosen, rejected) trajectory pairs
    prompt        prompt (+ any other columns)              `PromptTask`s for RL / rejection sampling

and, for reward models (`trajtune rm --objective ...`; book ch.5), columns that the rows of a format carry:

    a preference row's  margin: a number >= 0        Llama 2's rating-difference margin of that pair (BT loss)
                        score_chosen, score_rejected: numbers (both or neither; UltraFeedback-binarized's
                                                     names) the two sides' ratings or reward-model scores
                        category: a string           the pair's group in `trajtune rm-eval`'s table

A pair's score difference (score_chosen - score_rejected, else margin; `trajtune.algorithms.dpo.score_difference`
reads it from the chosen episode's info) is ODPO's offset and REBEL's regression target (`trajtune dpo --loss
odpo|rebel`, book ch.8.2). Ranked lists, outcome labels (ORM, KTO) and step labels (PRM) are rows of their own:
`sources/reward_data.py`.

`prompt`, `completion`, `chosen` and `rejected` are either strings (the
"standard" format: a string prompt is one user message, a string completion one
assistant message) or lists of messages (the "conversational" format). A
preference row without `prompt` has an implicit prompt: `chosen` and `rejected`
are whole conversations that share every message but the last assistant turn(s).
Everything is rendered by `ChatRenderer`, the model's own chat template.

A conversation may use OpenAI tool calling, as TRL's tool-calling datasets do: assistant messages with
`tool_calls` (`{"type": "function", "function": {"name", "arguments"}}`), `tool` messages, and a `tools` column (the
function tools, OpenAI's schema). A row with `tools` is rendered as the endpoint renders an agent's request
(`trajtune.text.tool_calls.ToolFormat`): the calls in the model's own format, the tools in its template's place (or
described in the system message where the template has none), so demonstrations and RL see the same prompts.

What is trained (TRL's convention): every assistant turn of a `messages` row; of a
`completion` or preference row only the completion. Assistant turns inside a
conversational `prompt` (an earlier answer the user corrects, few-shot examples)
are context -- PROMPT-owned, never trained or scored -- and a GRPO / RFT prompt may
hold them too (it must end with a user, system or tool message).

A malformed row fails with `DataError` naming the file, the line (1-based; for a
table -- parquet, arrow, save_to_disk -- the row index, 0-based) and
the missing or wrong field. Empty text is malformed too: an empty or
whitespace-only string `prompt` / `completion` / `chosen` / `rejected`, an
assistant message with empty content (and no tool_calls: nothing to train on)
and a user message with empty content.
"""

from __future__ import annotations

import json
import math
import os
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..text.chat import ChatRenderer, TemplateError
from ..text.render import TrainOn, select_turns
from ..text.tool_calls import ToolFormat
from ..trajectory import Trajectory

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
    """Rows of a dataset file or directory, a `datasets.Dataset` or a sequence of dicts.

    A path is read by what it is (the formats `datasets` reads and writes):
        directory            written by `Dataset.save_to_disk` (a DatasetDict directory: one split's folder)
        .parquet / .arrow    one row per table row ('file row i', 0-based, in messages)
        .json / .jsonl / any a JSON array of objects, or JSON lines: one object per line, empty lines
                             skipped ('file:line', 1-based); told apart by the first character
    """
    if not isinstance(source, (str, os.PathLike)):
        return [Row(dict(r), f"dataset row {i}") for i, r in enumerate(source)]
    path = Path(source)
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    if path.is_dir() or path.suffix in (".parquet", ".arrow"):  # a table: a null cell reads as a missing field
        table = _saved_dataset(path) if path.is_dir() else _table_rows(path)
        rows = [Row(r, f"{path} row {i}") for i, r in enumerate(table)]
    else:
        rows = _json_rows(path)
    if not rows:
        raise DataError(f"{path}: no rows")
    for row in rows:
        if not isinstance(row.data, dict):
            raise DataError(f"{row.where}: expected a JSON object (one row), got {type(row.data).__name__}")
    return rows


def _text(path: Path) -> str:
    """The file as UTF-8 text (a leading byte-order mark dropped); bytes that are not UTF-8 name their line."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(f"{path}:{line}: not UTF-8 text (byte {raw[e.start:e.start + 1]!r} at column {column}); "
                        "save the file as UTF-8") from None


def _json_rows(path: Path) -> list[Row]:
    """JSON lines, or one JSON array of objects (each element named by the line it starts on)."""
    text = _text(path)
    if text.lstrip().startswith("["):
        return _json_array(path, text)
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(Row(json.loads(line), f"{path}:{n}"))
        except json.JSONDecodeError as e:
            if not rows and _is_json(text):
                raise DataError(f"{path}: one JSON value spread over several lines; expected JSON lines (one "
                                "object per line) or a JSON array of objects") from None
            raise DataError(f"{path}:{n}: not valid JSON ({e.msg}); expected JSON lines (one object per line) "
                            "or a JSON array of objects") from e
    return rows


def _json_array(path: Path, text: str) -> list[Row]:
    """The elements of a JSON array, each named by the line it starts on."""
    decoder, rows = json.JSONDecoder(), []
    i = _skip_space(text, text.index("[") + 1)
    while not text.startswith("]", i):
        line = _line(text, i)
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{_line(text, e.pos)}: not valid JSON ({e.msg}) in element {len(rows)} "
                            "of the JSON array") from e
        rows.append(Row(obj, f"{path}:{line}"))
        i = _skip_space(text, i)
        if text.startswith(",", i):
            i = _skip_space(text, i + 1)
            if text.startswith("]", i):
                raise DataError(f"{path}:{_line(text, i)}: not valid JSON: a ',' after the last element of the JSON "
                                "array")
        elif not text.startswith("]", i):
            raise DataError(f"{path}:{_line(text, i)}: not valid JSON: expected ',' or ']' after element "
                            f"{len(rows) - 1} of the JSON array")
    if _skip_space(text, i + 1) < len(text):
        raise DataError(f"{path}:{_line(text, i + 1)}: not valid JSON: text after the JSON array")
    return rows


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _line(text: str, i: int) -> int:
    return text.count("\n", 0, i) + 1


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except json.JSONDecodeError:
        return False


def _table_rows(path: Path) -> list[dict]:
    """Rows of a .parquet file or a .arrow file (a `datasets` shard)."""
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        import datasets

        return datasets.Dataset.from_file(str(path)).to_list()
    except ImportError as e:
        raise DataError(f"{path}: reading {path.suffix} files needs pyarrow and datasets "
                        "(pip install 'trajtune[hf]')") from e
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(f"{path}: not a readable {path.suffix} file ({type(e).__name__}: {e})") from e


def _saved_dataset(path: Path) -> list[dict]:
    """Rows of a `Dataset.save_to_disk` directory; a DatasetDict directory must name its split."""
    if (path / "dataset_dict.json").exists():
        splits = sorted(p.name for p in path.iterdir() if (p / "state.json").exists())
        if len(splits) != 1:
            raise DataError(f"{path}: a DatasetDict with splits {splits}; pass one split's directory "
                            f"(e.g. {path / ('train' if 'train' in splits or not splits else splits[0])})")
        path = path / splits[0]
    if not (path / "state.json").exists():
        raise DataError(f"{path}: a directory, but not a dataset written by datasets' save_to_disk (no state.json); "
                        "pass a .jsonl / .json / .parquet file or a save_to_disk directory")
    try:
        import datasets

        return datasets.load_from_disk(str(path)).to_list()
    except ImportError as e:
        raise DataError(f"{path}: reading a save_to_disk directory needs datasets (pip install 'trajtune[hf]')") from e
    except (OSError, ValueError, FileNotFoundError) as e:
        raise DataError(f"{path}: cannot read the saved dataset ({type(e).__name__}: {e})") from e


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
            raise DataError(f"{row.where}: a {fmt!r} row, but this command needs "
                            f"{' or '.join(repr(e) for e in expected)} rows")


# --- field validation --------------------------------------------------------------
def row_field(row: Row, name: str) -> Any:
    if name not in row.data or row.data[name] is None:
        raise DataError(f"{row.where}: missing field {name!r}")
    return row.data[name]


def row_messages(row: Row, name: str, value: Any, default_role: str) -> list[dict]:
    """A field as a list of messages: a string becomes one `default_role` message.

    Empty text fails: an empty string field, an assistant message with empty content and
    no tool_calls, a user message with empty content (system and tool messages may be empty)."""
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{row.where}: field {name!r} is empty ({value!r})")
        return [{"role": default_role, "content": value}]
    if not isinstance(value, list) or not value:
        raise DataError(f"{row.where}: field {name!r} must be a string or a non-empty list of messages, got "
                        f"{type(value).__name__}")
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise DataError(f"{row.where}: field {name!r}[{i}] must be an object with 'role' and 'content'")
        if m.get("role") not in ROLES:
            raise DataError(f"{row.where}: field {name!r}[{i}].role is {m.get('role')!r}; expected one of "
                            f"{list(ROLES)}")
        content = m.get("content")
        if not isinstance(content, str) and not m.get("tool_calls"):
            raise DataError(f"{row.where}: field {name!r}[{i}].content must be a string (or the message needs "
                            "tool_calls)")
        if m["role"] in ("user", "assistant") and not m.get("tool_calls") and not content.strip():
            what = ("an empty assistant turn (nothing to train on)" if m["role"] == "assistant"
                    else "an empty user message")
            raise DataError(f"{row.where}: field {name!r}[{i}].content is empty ({content!r}): {what}")
    return [dict(m) for m in value]


def _message_list(row: Row) -> list[dict]:
    """The 'messages' field: a list of messages (a string is not a conversation in TRL's formats either)."""
    value = row_field(row, "messages")
    if isinstance(value, str):
        raise DataError(f"{row.where}: field 'messages' is a string ({value[:40]!r}); it must be a list of "
                        '{"role": ..., "content": ...} messages (for a prompt and its answer as two strings, use '
                        "'prompt' and 'completion' fields)")
    return row_messages(row, "messages", value, "user")


def render_row(renderer: ChatRenderer, row: Row, messages: list[dict], context: int = 0) -> list[Trajectory]:
    """Render a row's conversation; the first `context` messages are its prompt (never trained). A row with a
    `tools` column is rendered as the endpoint renders an OpenAI request (`tool_renderer`)."""
    if row.data.get("tools") is not None:
        renderer, messages = tool_renderer(renderer, row, messages)
    try:
        return renderer.render_samples(messages, info={"source": row.where}, context=context)
    except TemplateError as e:
        raise DataError(f"{row.where}: {e}") from e


_TOOL_RENDERERS: "weakref.WeakKeyDictionary[ChatRenderer, dict]" = weakref.WeakKeyDictionary()


def tool_renderer(renderer: ChatRenderer, row: Row, messages: list[dict]) -> tuple[ChatRenderer, list[dict]]:
    """(the renderer, the messages) of a row with a `tools` column (OpenAI function tools, TRL's column): the
    messages' OpenAI `tool_calls` and the tools go through `ToolFormat.template_messages`, as the endpoint sends an
    agent's request to the template -- a native template reads the tools, others get them described in the system
    message and the calls written into the content -- so SFT on demonstrations sees the prompts RL will."""
    cache = _TOOL_RENDERERS.setdefault(renderer, {})
    try:
        if "format" not in cache:
            cache["format"] = ToolFormat(renderer.tokenizer)
        converted, tools = cache["format"].template_messages(messages, row.data["tools"])
    except ValueError as e:
        raise DataError(f"{row.where}: {e}") from None
    key = json.dumps(tools, sort_keys=True)
    if key not in cache:
        cache[key] = ChatRenderer(renderer.tokenizer, tools=tools, stop_ids=renderer.stop_ids,
                                  template_kwargs=renderer.template_kwargs)
    return cache[key], converted


# --- the formats ----------------------------------------------------------------------
def conversation(row: Row) -> tuple[list[dict], int]:
    """(the conversation, its prompt length in messages) of a 'messages' row (prompt length 0: every
    assistant turn trained) or a 'completion' row (the prompt's messages, assistant turns included,
    are context: only the completion is trained, as in TRL)."""
    d = row.data
    if "messages" in d:
        msgs, context = _message_list(row), 0
    else:
        prompt = row_messages(row, "prompt", row_field(row, "prompt"), "user")
        completion = row_messages(row, "completion", row_field(row, "completion"), "assistant")
        if not any(m["role"] == "assistant" for m in completion):
            raise DataError(f"{row.where}: field 'completion' has no assistant message to train on "
                            "(the prompt's messages are context, never trained)")
        msgs, context = prompt + completion, len(prompt)
    if not any(m["role"] == "assistant" for m in msgs):
        raise DataError(f"{row.where}: the conversation has no assistant message to train on")
    return msgs, context


def sft_trajectories(rows: Sequence[Row], renderer: ChatRenderer, train_on: TrainOn = "all") -> list[Trajectory]:
    """'messages' / 'completion' rows -> trajectories (a row may give several; see ChatRenderer).
    `train_on`: which of a row's trained assistant turns stay trained -- all, the last, or one sample per
    turn ('unroll'; `trajtune.text.render.select_turns`, RLHF book ch.4.4)."""
    check_format(rows, ("messages", "completion"))
    out = []
    for row in rows:
        out += select_turns(render_row(renderer, row, *conversation(row)), train_on)
    return out


def preference_conversations(row: Row) -> tuple[list[dict], list[dict], int]:
    """(chosen, rejected, prompt length in messages) of a preference row. The prompt is explicit
    ('prompt') or implicit: the longest run of leading messages `chosen` and `rejected` share (TRL's
    `extract_prompt`). Its assistant turns are context; only what follows it is scored."""
    chosen, rejected = row_field(row, "chosen"), row_field(row, "rejected")
    if "prompt" in row.data:
        prompt = row_messages(row, "prompt", row_field(row, "prompt"), "user")
        return (prompt + row_messages(row, "chosen", chosen, "assistant"),
                prompt + row_messages(row, "rejected", rejected, "assistant"), len(prompt))
    c, r = row_messages(row, "chosen", chosen, "assistant"), row_messages(row, "rejected", rejected, "assistant")
    if isinstance(chosen, str) or isinstance(rejected, str):
        raise DataError(f"{row.where}: missing field 'prompt' (string 'chosen'/'rejected' need an explicit prompt)")
    if c == r:
        raise DataError(f"{row.where}: 'chosen' and 'rejected' are the same conversation (with no 'prompt' field the "
                        "prompt is their shared leading messages, which leaves neither side anything to score)")
    shared = 0
    while shared < min(len(c), len(r)) and c[shared] == r[shared]:
        shared += 1
    if shared == 0:
        raise DataError(f"{row.where}: implicit prompt: 'chosen' and 'rejected' share no leading messages")
    return c, r, shared


def preference_pairs(rows: Sequence[Row], renderer: ChatRenderer) -> list[tuple[Trajectory, Trajectory]]:
    """Preference rows -> (chosen, rejected) trajectory pairs (the last rendered sample of each side;
    the prompt's tokens, assistant turns included, are context: only the completions are scored)."""
    check_format(rows, ("preference",))
    pairs = []
    for row in rows:
        sides = []
        chosen, rejected, context = preference_conversations(row)
        for name, conv in zip(("chosen", "rejected"), (chosen, rejected), strict=True):
            samples = render_row(renderer, row, conv, context)
            if not samples:
                raise DataError(f"{row.where}: field {name!r} has no assistant message to score")
            sides.append(samples[-1])
        sides[0].info.update(pair_columns(row))  # margin, category: read by the reward-model loop and rm-eval
        pairs.append((sides[0], sides[1]))
    return pairs


def prompt_tasks(rows: Sequence[Row]) -> list[PromptTask]:
    """Rows with a 'prompt' (any format that has one) -> tasks; the other columns go to the reward function."""
    tasks = []
    for i, row in enumerate(rows):
        prompt = row.data.get("prompt")
        if prompt is None and "messages" in row.data:  # a conversation: everything before the first assistant turn
            msgs = _message_list(row)
            prompt = msgs[: next((k for k, m in enumerate(msgs) if m["role"] == "assistant"), len(msgs))]
        if prompt is None:
            raise DataError(f"{row.where}: missing field 'prompt'")
        checked = row_messages(row, "prompt", prompt, "user")  # a string stays a string (the TRL form of the task)
        if not isinstance(prompt, str):
            prompt = checked
        columns = {k: v for k, v in row.data.items() if k not in ("prompt", "messages")}
        tasks.append(PromptTask(name=f"row{i}", prompt=prompt, columns=columns, where=row.where))
    return tasks



# --- a preference row's reward-model columns (ranked lists, outcome and step labels: reward_data.py) ---------
def row_number(row: Row, name: str, value: Any, index: int | None = None) -> float:
    """A finite number (not a bool) from field `name` (its element `index`)."""
    where = f"{name!r}" if index is None else f"{name!r}[{index}]"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DataError(f"{row.where}: field {where} must be a finite number, got {value!r}")
    return float(value)


def pair_columns(row: Row) -> dict[str, Any]:
    """A preference row's optional columns: 'margin' (a number >= 0), 'score_chosen' and 'score_rejected'
    (numbers, both or neither; with a margin too, it must equal their difference) and 'category' (a string)."""
    out: dict[str, Any] = {}
    if row.data.get("margin") is not None:
        out["margin"] = row_number(row, "margin", row.data["margin"])
        if out["margin"] < 0:
            raise DataError(f"{row.where}: field 'margin' must be >= 0 (how much better 'chosen' is), got "
                            f"{row.data['margin']!r}")
    scores = [k for k in SCORE_COLUMNS if row.data.get(k) is not None]
    if len(scores) == 1:
        other = next(k for k in SCORE_COLUMNS if k not in scores)
        raise DataError(f"{row.where}: field {scores[0]!r} without {other!r} (a pair's scores come in twos)")
    if scores:
        for k in SCORE_COLUMNS:
            out[k] = row_number(row, k, row.data[k])
        diff = out["score_chosen"] - out["score_rejected"]
        if "margin" in out and not math.isclose(out["margin"], diff, rel_tol=1e-6, abs_tol=1e-9):
            raise DataError(f"{row.where}: field 'margin' ({out['margin']}) is not 'score_chosen' - 'score_rejected' "
                            f"({diff}); give one of them, or make them agree")
    if row.data.get("category") is not None:
        if not isinstance(row.data["category"], str) or not row.data["category"].strip():
            raise DataError(f"{row.where}: field 'category' must be a non-empty string, got {row.data['category']!r}")
        out["category"] = row.data["category"]
    return out


SCORE_COLUMNS = ("score_chosen", "score_rejected")
"""a preference row's per-side scores (the names of UltraFeedback-binarized, TRL's usual DPO data)"""
