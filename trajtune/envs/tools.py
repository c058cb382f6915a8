"""Function calling (RLHF book ch.13 "Tool Use", checklist 13.1-13.6): parse an assistant turn's calls, dispatch them,
truncate what comes back, and score calls against the expected ones.

    parse_tool_calls(text, syntax)   the calls of one assistant turn, several allowed:
                                     json   '<tool_call>{"name": f, "arguments": {...}}</tool_call>' blocks (the
                                            Hermes / Qwen layout; a bare JSON object or list of objects also parses)
                                     python 'f("Star Wars", year=1977)' lines (the book's example; literals only,
                                            parsed with `ast`, nothing is evaluated)
                                     -> (calls, errors): a malformed call is an error string, never an exception
                                     (`ToolCall` and `parse_tool_calls` live in `trajtune.text.tool_calls`, the one
                                     parser the environments and the OpenAI endpoint share; re-exported here)
    Tool(name, fn, parameters)       a function and its JSON Schema (`parameters`: "properties", "required")
    dispatch(calls, tools, max_chars)
                                     runs each call -> one tool message per call, in order:
                                     {"role": "tool", "tool_call_id": id, "name": f, "content": text}; an unknown
                                     tool, arguments that break the schema, or a raising tool is an error message
                                     for the model (counted in `errors`), the run goes on
    truncate(text, max_chars)        head and tail kept, '[... N characters cut ...]' between (ch.13: "truncate,
                                     summarize or paginate tool outputs to save context")
    call_match(predicted, expected)  ch.13.6's exact match: {"name": same tool, "arguments": same name and arguments}
    schema_errors(arguments, schema) what a call's arguments break in a JSON Schema (required, types, extras)
    ToolEnv                          the orchestration loop of ch.13.2 as an environment: each assistant turn's calls
                                     are run and their messages returned; a turn without calls is the final answer,
                                     scored by the task's `check(answer) -> float`

Every call gets an id (`call_<turn>_<i>`, or the one the model wrote) so a reply can be matched to its call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..text.tool_calls import ToolCall, parse_tool_calls
from .base import StepResult

__all__ = ["Tool", "ToolCall", "ToolEnv", "call_match", "dispatch", "parse_tool_calls", "schema_errors", "truncate"]

_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list,
               "null": type(None)}


@dataclass
class Tool:
    name: str
    fn: Callable[..., Any]
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    """the arguments' JSON Schema (OpenAI's `parameters`, Anthropic's `input_schema`, MCP's `inputSchema`)"""
    description: str = ""

    def schema(self) -> dict:
        """The OpenAI-style tool entry a chat template takes (`tools=[...]`)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": dict(self.parameters)}}


def schema_errors(arguments: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """What `arguments` break in the object schema `schema`: missing required keys, keys it does not declare
    (when it declares any and does not allow additionalProperties), and wrong JSON types of declared keys."""
    props = dict(schema.get("properties", {}))
    out = [f"missing required argument {k!r}" for k in schema.get("required", []) if k not in arguments]
    for k, v in arguments.items():
        if k not in props:
            if props and not schema.get("additionalProperties", False):
                out.append(f"unknown argument {k!r} (expected {', '.join(props)})")
            continue
        want = props[k].get("type")
        types = _JSON_TYPES.get(want) if isinstance(want, str) else None
        if types is not None and (not isinstance(v, types) or (want in ("integer", "number") and isinstance(v, bool))):
            out.append(f"argument {k!r} must be {want}, got {type(v).__name__}")
    return out


def truncate(text: str, max_chars: int) -> str:
    """`text` if it fits, else its first and last max_chars/2 characters around '[... N characters cut ...]'."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - head
    return f"{text[:head]}\n[... {len(text) - max_chars} characters cut ...]\n{text[len(text) - tail:]}"


def _bind_positional(call: ToolCall, tool: Tool) -> dict:
    """Python-syntax positional arguments (arg0, arg1 ...) bound to the schema's property order."""
    names = list(tool.parameters.get("properties", {}))
    args = {}
    for k, v in call.arguments.items():
        m = re.fullmatch(r"arg(\d+)", k)
        args[names[int(m.group(1))] if m and int(m.group(1)) < len(names) and k not in names else k] = v
    return args


def dispatch(calls: Sequence[ToolCall], tools: Mapping[str, Tool], max_chars: int = 0, turn: int = 0
             ) -> tuple[list[dict], list[str]]:
    """Run each call -> (one tool message per call, in order; the errors among them). Nothing raises: an unknown
    tool, a schema violation or an exception inside the tool becomes the message the model reads."""
    messages, errors = [], []
    for i, call in enumerate(calls):
        call_id = call.id or f"call_{turn}_{i}"
        tool = tools.get(call.name)
        if tool is None:
            content = f"error: unknown tool {call.name!r} (tools: {', '.join(sorted(tools)) or 'none'})"
        else:
            args = _bind_positional(call, tool)
            problems = schema_errors(args, tool.parameters)
            if problems:
                content = f"error: {call.name}: " + "; ".join(problems)
            else:
                try:
                    result = tool.fn(**args)
                    content = result if isinstance(result, str) else json.dumps(result, default=str)
                except Exception as e:  # noqa: BLE001 - the tool's failure is the model's observation
                    content = f"error: {call.name} raised {type(e).__name__}: {e}"
        if content.startswith("error:"):
            errors.append(content)
        messages.append({"role": "tool", "tool_call_id": call_id, "name": call.name,
                         "content": truncate(content, max_chars)})
    return messages, errors


def call_match(predicted: Sequence[ToolCall], expected: Sequence[ToolCall]) -> dict[str, float]:
    """Exact match of a turn's calls against the expected ones (ch.13.6), in order: {"name": 1.0 when the same tools
    are called in the same order, "arguments": 1.0 when names and arguments all match exactly} (0.0 otherwise)."""
    names = [c.name for c in predicted] == [c.name for c in expected]
    args = names and all(dict(p.arguments) == dict(e.arguments) for p, e in zip(predicted, expected))
    return {"name": float(names), "arguments": float(args)}


class ToolEnv:
    """The orchestration loop (ch.13.2) as an environment. A task has `.name`, `.prompt` (the user message) and
    `.check(answer: str) -> float`; `tools` maps names to `Tool`s. Each assistant turn with calls gets the tool
    messages back (as one observation, each line tagged with its tool_call_id); a turn with none is the answer."""

    task_attributes = ("prompt", "check")

    def __init__(self, tools: Sequence[Tool], syntax: str = "json", max_chars: int = 2000):
        self.tools = {t.name: t for t in tools}
        self.syntax, self.max_chars = syntax, max_chars

    def reset(self, task) -> str:
        self.task, self.turn = task, 0
        self.info = {"task": task.name, "actions": [], "n_invalid": 0, "n_calls": 0, "tool_errors": 0}
        return task.prompt

    def step(self, action: str) -> StepResult:
        self.info["actions"].append(action)
        calls, errors = parse_tool_calls(action, self.syntax)
        if errors:
            self.info["n_invalid"] += len(errors)
        if not calls and not errors:  # no call: the final answer
            return StepResult("", float(self.task.check(action)), True, dict(self.info))
        messages, failed = dispatch(calls, self.tools, self.max_chars, self.turn)
        self.turn += 1
        self.info["n_calls"] += len(calls)
        self.info["tool_errors"] += len(failed)
        lines = [f"[{m['tool_call_id']}] {m['name']}: {m['content']}" for m in messages]
        lines += [f"error: {e}" for e in errors]
        return StepResult("\n".join(lines), 0.0, False, dict(self.info))
