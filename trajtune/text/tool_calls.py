"""Tool calls as text: the one parser of the calls a model writes, and how one model's chat template reads OpenAI
`tools` / `tool_calls` and writes calls (the environments' `envs/tools.py` and the OpenAI endpoint both use it).

    ToolCall(name, arguments, id)    one call; `arguments` a mapping of JSON values
    parse_tool_calls(text, syntax)   the calls of one assistant turn, several allowed:
                                     json   '<tool_call>{"name": f, "arguments": {...}}</tool_call>' blocks (the
                                            Hermes / Qwen layout; a bare JSON object or list of objects also parses)
                                     python 'f("Star Wars", year=1977)' lines (the book's example; literals only,
                                            parsed with `ast`, nothing is evaluated; positional arguments are named
                                            arg0, arg1, ...)
                                     -> (calls, errors): a malformed call is an error string, never an exception
    ToolFormat(tokenizer, syntax)    how one model reads tool schemas and writes calls:
      .template_messages(messages, tools) -> (messages, tools) for `apply_chat_template` / `ChatRenderer`
      .parse(text) -> (content, calls, errors)      a sampled assistant text (without its stop token)
      .openai_tool_calls(calls, prefix)             OpenAI `tool_calls` entries (arguments as a JSON string)
      .reads_as_calls(content)                      whether the parser would read calls in this content

The two ways a template takes tools (`ToolFormat.native`, found by rendering a probe call at construction):
- native: the template itself renders `tools` and assistant `tool_calls` as `<tool_call>{json}</tool_call>` blocks
  (Qwen2.5 / Hermes; `trajtune.models.hf_random.CHATML_TEMPLATE`). OpenAI messages become the form HF templates take
  (`function.arguments` a dict, not a JSON string) and `tools` go to the template. Whatever the template puts between
  an assistant's content and its first call (learned from the probe: "" for CHATML_TEMPLATE, "\\n" for Qwen2.5) is
  taken off the content when parsing.
- not native (a template that renders `content` only, like SmolLM2-135M-Instruct's plain ChatML; or syntax="python"):
  trajtune writes the calls into the assistant content itself -- json: content, then one `<tool_call>{"name": f,
  "arguments": {...}}</tool_call>` block per call, joined by "\\n"; python: content, "\\n", then one `f(x=1, y='a')`
  line per call (keyword arguments, Python literals) -- and describes the tools (their JSON schemas and how to call
  them) in the first system message (appended to it, or a new first one).

The round trip. Rendering a message is always faithful: the text says exactly what the message holds. Parsing is
exact for text in the layout above: `parse` of a rendered assistant turn gives back its content and calls, and
rendering those again gives the same text (tests/unit/test_tool_calls.py, property-tested per template and syntax).
What does not round-trip, and how it is handled:
- A turn with a malformed call (JSON that does not parse, a call without a name, arguments that are not an object of
  finite JSON values, non-literal Python arguments, text after the calls): `parse` returns the whole text as content,
  no calls, and the errors -- the turn is the text the model wrote, and re-renders as it.
- Content that the parser would read as calls (`reads_as_calls`: json: it holds "<tool_call>"; python: its last
  non-blank line is a call of a named function): an assistant message with such content AND `tool_calls` is refused
  (ValueError: the boundary between its content and its calls would move); without `tool_calls` it renders as
  written, and `parse` of that text reads the calls in it (the model would have written calls).
- Text the parser takes but does not write (whitespace around and between blocks other than the layout's, positional
  or double-quoted Python arguments, a JSON list of calls in one block, an "id" the model wrote): parsed into the same
  calls, but re-rendered in the layout above, so not as sampled. An endpoint keeps the sampled tokens and checks
  each new request against them; it never assumes the re-rendering matches.
- Content holding the template's own markers (e.g. "<|im_end|>") ends the turn when tokenized; not checked here.
- python syntax: names and argument keys must be Python identifiers that are not keywords and are NFKC-normal
  (Python normalizes identifiers), floats finite: anything else is refused when rendering (ValueError).
"""

from __future__ import annotations

import ast
import json
import keyword
import math
import unicodedata
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

OPEN, CLOSE = "<tool_call>", "</tool_call>"
ROLES = ("system", "user", "assistant", "tool")
PROBE = "trajtune_probe_fn"
"""the function name the probe render uses to tell whether a template renders tool calls itself"""
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any]
    id: str = ""


# --- parsing


def _from_object(obj: Any, where: str) -> tuple[ToolCall | None, str | None]:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None, f"{where}: a call needs a JSON object with a string 'name'"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI sends arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            return None, f"{where}: 'arguments' of {obj['name']} is not valid JSON ({e.msg})"
    if not isinstance(args, dict):
        return None, f"{where}: 'arguments' of {obj['name']} must be an object"
    return ToolCall(obj["name"], args, str(obj.get("id", ""))), None


def _blocks(text: str, start: int) -> tuple[list[tuple[int, int, Any, int]], list[str]]:
    """The `<tool_call> JSON </tool_call>` blocks from `start` on -> ([(begin, end, decoded JSON, block number)],
    errors). The JSON is decoded where it stands, so a string holding "</tool_call>" does not end its block."""
    found: list[tuple[int, int, Any, int]] = []
    errors: list[str] = []
    i = text.find(OPEN, start)
    while i >= 0:
        n = len(found) + len(errors)
        j = i + len(OPEN)
        j += len(text[j:]) - len(text[j:].lstrip())
        try:
            obj, k = _DECODER.raw_decode(text, j)
        except json.JSONDecodeError as e:
            errors.append(f"call {n}: not valid JSON ({e.msg} at character {e.pos - j})")
            close = text.find(CLOSE, i)
            i = text.find(OPEN, close + len(CLOSE)) if close >= 0 else -1
            continue
        k += len(text[k:]) - len(text[k:].lstrip())
        if not text.startswith(CLOSE, k):
            errors.append(f"call {n}: {OPEN} not closed by {CLOSE} after its JSON")
            i = text.find(OPEN, k)
            continue
        found.append((i, k + len(CLOSE), obj, n))
        i = text.find(OPEN, k + len(CLOSE))
    return found, errors


def _calls_of(obj: Any, n: int) -> tuple[list[ToolCall], list[str]]:
    calls, errors = [], []
    for j, item in enumerate(obj if isinstance(obj, list) else [obj]):
        call, err = _from_object(item, f"call {n}" + (f"[{j}]" if isinstance(obj, list) else ""))
        calls += [call] if call else []
        errors += [err] if err else []
    return calls, errors


def _parse_json(text: str) -> tuple[list[ToolCall], list[str]]:
    found, errors = _blocks(text, 0)
    if not found and not errors:
        stripped = text.strip()
        if not stripped.startswith(("{", "[")):
            return [], []
        try:
            found = [(0, len(text), json.loads(stripped), 0)]
        except json.JSONDecodeError as e:
            return [], [f"call 0: not valid JSON ({e.msg} at character {e.pos})"]
    calls: list[ToolCall] = []
    for _, _, obj, n in found:
        more, errs = _calls_of(obj, n)
        calls += more
        errors += errs
    return calls, errors


def _python_line(line: str) -> tuple[ToolCall | None, str | None, bool]:
    """One stripped line -> (call, error, whether it is a call of a named function at all)."""
    try:
        node = ast.parse(line, mode="eval").body
    except SyntaxError:
        return None, f"not a call: {line[:60]!r}", False
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return None, f"not a call of a named function: {line[:60]!r}", False
    if any(kw.arg is None for kw in node.keywords):
        return None, f"{node.func.id}: ** arguments are not allowed", True
    try:
        args = {f"arg{k}": ast.literal_eval(a) for k, a in enumerate(node.args)}
        args.update({kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg})
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None, f"{node.func.id}'s arguments must be literals", True
    return ToolCall(node.func.id, args), None, True


def _parse_python(text: str) -> tuple[list[ToolCall], list[str]]:
    calls, errors = [], []
    for i, line in enumerate(s.strip() for s in text.strip().splitlines() if s.strip()):
        call, err, _ = _python_line(line)
        calls += [call] if call else []
        errors += [f"line {i}: {err}"] if err else []
    return calls, errors


def parse_tool_calls(text: str, syntax: str = "json") -> tuple[list[ToolCall], list[str]]:
    """The calls in one assistant turn and the errors of those that did not parse (module docstring). Python
    syntax names positional arguments arg0, arg1, ... (bind them with the tool's schema order in `dispatch`)."""
    if syntax == "json":
        return _parse_json(text)
    if syntax == "python":
        return _parse_python(text)
    raise ValueError(f"parse_tool_calls: syntax must be 'json' or 'python', got {syntax!r}")


# --- one model's format


def _json_problem(value: Any, where: str) -> str | None:
    """Why `value` is not a JSON value that round-trips (finite floats, string keys), or None."""
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where} is {value} (JSON has finite numbers only)"
    if isinstance(value, list):
        return next((p for i, v in enumerate(value) if (p := _json_problem(v, f"{where}[{i}]"))), None)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return f"{where} has a key that is not a string"
        return next((p for k, v in value.items() if (p := _json_problem(v, f"{where}[{k!r}]"))), None)
    return f"{where} is a {type(value).__name__}, not a JSON value"


def _identifier(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name) and unicodedata.normalize("NFKC", name) == name


def _text(content: Any, where: str) -> str:
    """An OpenAI `content` (None, a string, or a list of text parts) as one string (text parts joined by newlines)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"{where}[{i}]: only text parts are supported ({{'type': 'text', 'text': ...}}), "
                                 f"got {kind!r}")
            texts.append(part["text"])
        return "\n".join(texts)
    raise ValueError(f"{where}: must be a string, null or a list of text parts, got {type(content).__name__}")


def _openai_calls(tool_calls: Any, where: str) -> list[ToolCall]:
    """An assistant message's OpenAI `tool_calls` -> ToolCalls (ValueError naming the field when malformed)."""
    if tool_calls is None:
        return []
    if not isinstance(tool_calls, list):
        raise ValueError(f"{where}: must be a list")
    calls = []
    for j, c in enumerate(tool_calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict):
            raise ValueError(f"{where}[{j}].function: missing (an entry is {{'id', 'type': 'function', 'function': "
                             "{'name', 'arguments'}}})")
        call, err = _from_object({"name": fn.get("name"), "arguments": fn.get("arguments", {}), "id": c.get("id", "")},
                                 f"{where}[{j}].function")
        if err:
            raise ValueError(err)
        assert call is not None
        problem = _json_problem(dict(call.arguments), f"{where}[{j}].function.arguments")
        if problem:
            raise ValueError(problem)
        calls.append(call)
    return calls


def _check_tools(tools: Any) -> list[dict]:
    if not tools:
        return []
    if not isinstance(tools, list):
        raise ValueError("tools: must be a list of {'type': 'function', 'function': {'name', 'parameters'}}")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"tools[{i}]: must be {{'type': 'function', 'function': {{'name': str, 'parameters': "
                             "{...}}}}")
    return list(tools)


HOW_TO_CALL = {
    "json": ("To call functions, end your reply with one block per call:\n"
             '<tool_call>{"name": "<function name>", "arguments": {<the arguments as a JSON object>}}</tool_call>'),
    "python": ("To call functions, end your reply with one line per call, keyword arguments as Python literals:\n"
               "function_name(argument=value, ...)"),
}
"""the call instructions of the system message a not-native format writes (after the tools' schemas)"""


class ToolFormat:
    """How one model reads tool schemas and writes tool calls (module docstring).

    tokenizer: a Hugging Face tokenizer with `chat_template`.
    syntax: None (the template's own format where it renders tool calls, else json), "json" or "python" (python is
      always written by trajtune into the content)."""

    def __init__(self, tokenizer, syntax: str | None = None):
        if syntax not in (None, "json", "python"):
            raise ValueError(f"tool call syntax must be 'json' or 'python', got {syntax!r}")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat_template: tool calls are rendered with the model's template")
        self.tokenizer = tokenizer
        self.native, self.separator = False, ""
        if syntax != "python":
            self.native, self.separator, layout = self._probe()
            if layout and syntax is None:
                raise ValueError(f"the chat template renders tool calls, but not as {OPEN}JSON{CLOSE} blocks (it "
                                 f"wrote {layout!r}): pass syntax='json' or 'python' to have trajtune write the calls "
                                 "into the content instead")
        self.syntax = syntax or "json"

    def _probe(self) -> tuple[bool, str, str]:
        """(native, what the template puts between content and the first call, the unknown layout or ""): renders
        one assistant turn with content and a probe call, and parses it back."""
        user = {"role": "user", "content": "hi"}
        call = {"type": "function", "function": {"name": PROBE, "arguments": {"x": 1}}}
        tools = [{"type": "function", "function": {"name": PROBE, "description": "", "parameters": {}}}]
        render = self.tokenizer.apply_chat_template
        try:
            head = render([user], tools=tools, tokenize=False, add_generation_prompt=True)
            full = render([user, {"role": "assistant", "content": "Ok.", "tool_calls": [call]}], tools=tools,
                          tokenize=False)
        except Exception:  # noqa: BLE001 - a template that fails on tool_calls (e.g. content + None) renders none
            return False, "", ""
        if PROBE not in head or not full.startswith(head) or PROBE not in full[len(head):]:
            return False, "", ""
        body = full[len(head):]
        found, _ = _blocks(body, 0)
        if not body.startswith("Ok.") or not found or _calls_of(found[0][2], 0)[0] != [ToolCall(PROBE, {"x": 1})]:
            return False, "", body[:80]
        return True, body[len("Ok."):found[0][0]], ""

    # --- rendering
    def reads_as_calls(self, content: str) -> bool:
        """Whether `parse` would read (part of) `content` as tool calls: json: it holds "<tool_call>"; python: its
        last non-blank line is a call of a named function."""
        if self.syntax == "json":
            return OPEN in content
        lines = [s.strip() for s in content.split("\n") if s.strip()]
        return bool(lines) and _python_line(lines[-1])[2]

    def _write(self, content: str, calls: Sequence[ToolCall], where: str) -> str:
        """The assistant text for `content` and `calls` in a not-native format (the layout of the module docstring)."""
        if not calls:
            return content
        if self.syntax == "json":
            blocks = [OPEN + json.dumps({"name": c.name, "arguments": dict(c.arguments)}, ensure_ascii=False) + CLOSE
                      for c in calls]
            return content + "\n".join(blocks)
        lines = []
        for j, c in enumerate(calls):
            bad = [k for k in [c.name, *c.arguments] if not _identifier(k)]
            if bad:
                raise ValueError(f"{where}[{j}]: {bad[0]!r} cannot be written in python call syntax (names and "
                                 "argument keys must be Python identifiers, not keywords, NFKC-normal)")
            lines.append(f"{c.name}({', '.join(f'{k}={v!r}' for k, v in c.arguments.items())})")
        return (content + "\n" if content else "") + "\n".join(lines)

    def _tools_text(self, tools: list[dict]) -> str:
        schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        return f"# Tools\n\nYou can call these functions (their JSON schemas):\n{schemas}\n\n{HOW_TO_CALL[self.syntax]}"

    def template_messages(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
                          ) -> tuple[list[dict], list[dict] | None]:
        """OpenAI chat messages and tools -> (the messages for `apply_chat_template` / `ChatRenderer`, its `tools`
        argument or None). Raises ValueError naming the field (`messages[i].content`, `tools[i]`) on bad input."""
        tool_list = _check_tools(tools)
        out: list[dict] = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping):
                raise ValueError(f"messages[{i}]: must be an object with 'role' and 'content'")
            role = m.get("role")
            if role not in ROLES:
                raise ValueError(f"messages[{i}].role: {role!r} is not one of {', '.join(ROLES)}")
            content = _text(m.get("content"), f"messages[{i}].content")
            msg: dict[str, Any] = {"role": role, "content": content}
            if role == "assistant":
                calls = _openai_calls(m.get("tool_calls"), f"messages[{i}].tool_calls")
                if calls and self.reads_as_calls(content):
                    raise ValueError(f"messages[{i}].content: reads as tool calls in the model's {self.syntax} call "
                                     "format, and the message has tool_calls too (which would not parse back apart)")
                if not self.native:
                    msg["content"] = self._write(content, calls, f"messages[{i}].tool_calls")
                elif calls:
                    msg["tool_calls"] = [{"id": c.id, "type": "function",
                                          "function": {"name": c.name, "arguments": dict(c.arguments)}} for c in calls]
            elif m.get("tool_calls"):
                raise ValueError(f"messages[{i}].tool_calls: only assistant messages have tool calls")
            if role == "tool":
                msg.update({k: m[k] for k in ("tool_call_id", "name") if isinstance(m.get(k), str)})
            out.append(msg)
        if self.native or not tool_list:
            return out, tool_list or None
        described = self._tools_text(tool_list)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{described}" if out[0]["content"] else described
        else:
            out.insert(0, {"role": "system", "content": described})
        return out, None

    # --- parsing
    def parse(self, text: str) -> tuple[str | None, list[ToolCall], list[str]]:
        """A sampled assistant text (without its stop token) -> (content or None, calls, errors). With errors the
        turn is text: (text, [], errors), so it re-renders as written (module docstring)."""
        calls, errors, begin = self._parse_python(text) if self.syntax == "python" else self._parse_json(text)
        for n, c in enumerate(calls):
            problem = _json_problem(dict(c.arguments), f"call {n}: {c.name}'s arguments")
            errors += [problem] if problem else []
        if errors:
            return text, [], errors
        if not calls:
            return text, [], []
        before = text[:begin]
        sep = self.separator if self.native else ("\n" if self.syntax == "python" else "")
        if sep and before.endswith(sep):
            before = before[: len(before) - len(sep)]
        return before or None, calls, []

    def _parse_json(self, text: str) -> tuple[list[ToolCall], list[str], int]:
        calls, errors = _parse_json(text) if OPEN in text else ([], [])
        found, _ = _blocks(text, 0)
        ends = [e for _, e, _, _ in found]
        for n, (b, _, _, _) in enumerate(found):
            gap = text[ends[n - 1]:b] if n else ""
            if gap.strip():
                errors.append(f"text between tool calls {n - 1} and {n}: {gap.strip()[:60]!r}")
        if found and text[ends[-1]:].strip():
            errors.append(f"text after the tool calls (content goes before them): {text[ends[-1]:].strip()[:60]!r}")
        return calls, errors, (found[0][0] if found else len(text))

    def _parse_python(self, text: str) -> tuple[list[ToolCall], list[str], int]:
        lines = text.split("\n")
        starts = [0]
        for line in lines[:-1]:
            starts.append(starts[-1] + len(line) + 1)
        calls: list[ToolCall] = []
        errors: list[str] = []
        begin = len(text)
        for j in reversed(range(len(lines))):
            stripped = lines[j].strip()
            if not stripped:
                continue
            call, err, is_call = _python_line(stripped)
            if not is_call:
                break
            calls += [call] if call else []
            errors += [f"line {j}: {err}"] if err else []
            begin = starts[j]
        return calls[::-1], errors, begin

    def openai_tool_calls(self, calls: Sequence[ToolCall], prefix: str) -> list[dict]:
        """The OpenAI `tool_calls` entries of `calls`: ids f"{prefix}_{i}", arguments as a JSON string."""
        return [{"id": f"{prefix}_{i}", "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments), ensure_ascii=False)}}
                for i, c in enumerate(calls)]
