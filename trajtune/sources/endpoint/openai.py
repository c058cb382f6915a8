"""The OpenAI wire format of the endpoint's requests, pure: a decoded JSON body in, a checked request out, or an
`APIError` with OpenAI's error JSON. No HTTP and no sampling here (the server calls these functions), so every rule
is tested on dicts.

Requests. `parse_chat(body, served, settings, flexible)` / `parse_completion(...)` check a decoded JSON body and
return a `ChatRequest` / `CompletionRequest`; anything malformed raises `APIError` (status 400, OpenAI's error JSON,
`param` naming the field: `messages[2].role`, `tools[0].function.name`), a model the endpoint does not serve 404
`model_not_found`. A field sent as `null` counts as absent (as OpenAI's and vLLM's servers read it).

    supported   model, messages (system / user / assistant / tool; developer is read as system; content a string,
                null or a list of text parts, joined with "\\n" as vLLM joins them), tools (function tools),
                tool_choice "auto" | "none", max_tokens / max_completion_tokens (capped at the sampler's token
                budget), temperature / top_p / top_k (see below), n = 1, stream + stream_options.include_usage,
                logprobs (the sampled tokens' log-probs), top_logprobs = 0, seed (see below), user, and vLLM's
                `return_token_ids`; completions: prompt (a string or a list of token ids, one prompt), logprobs = 0
    refused     n > 1 (one continuation per request: an agent's episode is one path); non-empty stop (the model's
                own stop tokens end a turn: a stop string cuts inside a token, and the tokens recorded would no
                longer be the text the agent gets back); top_logprobs > 0 / completions' logprobs > 0 (the sampler
                returns the log-prob of the token it drew, no alternatives); non-zero presence / frequency
                penalties, a logit_bias, a response_format other than text (each changes the distribution the
                policy's log-probs describe); tool_choice "required" or a named function (nothing constrains
                the model's output); the deprecated functions / function_call (use tools); audio; non-text
                content parts; completions' echo, suffix, best_of > 1
    ignored     unknown top-level fields (as vLLM does), among them metadata, store, service_tier,
                parallel_tool_calls (the model may call several tools in a turn either way), prompt_cache_key,
                prompt_cache_retention, safety_identifier, reasoning_effort, verbosity, modalities, prediction,
                web_search_options

Sampling settings. An RL run's endpoint is not `flexible`: the trainer's log-probs belong to the run's policy, so
temperature / top_p / top_k other than the run's are refused naming the field and the run's value (sending the
run's value, or leaving the field out, is fine); a greedy run's temperature is 0. A standalone server is flexible:
they set this request's settings (temperature 0: greedy). `top_k` is vLLM's extension (0 or -1: off). `seed`: a
flexible server keeps it (`request.seed`, the draw's seed); an RL run drops it and seeds every request from the
run's own seed (the agents of a group often send one seed, which would make their episodes the same draw).

The responses these requests get are built by `trajtune.sources.endpoint.responses`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any, Iterable, Literal, Mapping, Sequence

from ..sampler import SamplerSettings

ROLES = ("system", "user", "assistant", "tool", "developer")


class APIError(Exception):
    """A request the endpoint refuses: an HTTP status and OpenAI's error JSON (`body()`)."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        """`{"error": {"message", "type", "param", "code"}}`, what OpenAI's servers answer and its client reads."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str, message: str) -> APIError:
    """A 400 naming the field `param` in its message and in `param`."""
    return APIError(400, f"'{param}': {message}", param=param)


@dataclass(frozen=True)
class ChatRequest:
    """A checked `/v1/chat/completions` request."""

    model: str
    messages: list[dict[str, Any]]
    """role (developer read as system), content (a string; None only for an assistant message with tool calls),
    and where sent: name, tool_calls (OpenAI entries, arguments a JSON object's text), tool_call_id,
    reasoning_content"""
    tools: list[dict[str, Any]]
    """OpenAI function tools as sent: {"type": "function", "function": {"name", "description"?, "parameters"?}}"""
    tool_choice: Literal["auto", "none"]
    settings: SamplerSettings
    """this request's settings: the sampler's, max_new_tokens the request's budget (capped at the sampler's)"""
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    return_token_ids: bool = False
    user: str | None = None
    seed: int | None = None
    """the request's seed where the endpoint is flexible; None in an RL run (it seeds every request itself)"""


@dataclass(frozen=True)
class CompletionRequest:
    """A checked `/v1/completions` request."""

    model: str
    prompt: str | list[int]
    """the prompt text, or its token ids (used as they are)"""
    settings: SamplerSettings
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    return_token_ids: bool = False
    user: str | None = None
    seed: int | None = None


# ---- checked reads of one field ----

def read_body(raw: bytes) -> dict[str, Any]:
    """An HTTP body -> the JSON object it holds; 400 when it is not one."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON ({e})") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, not {_kind(body)}")
    return body


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


KINDS: dict[str, tuple[type, ...]] = {"a string": (str,), "a boolean": (bool,), "an integer": (int,),
                                      "a number": (int, float), "an object": (dict,), "an array": (list,)}


def _get(obj: Mapping[str, Any], key: str, what: str, where: str = "") -> Any:
    """`obj[key]` when it is `what` (a key of KINDS; a boolean is no number), None when absent or null, else 400."""
    value, types = obj.get(key), KINDS[what]
    if value is None:
        return None
    if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
        raise bad(where + key, f"expected {what}, got {_kind(value)}")
    if what != "a number":
        return value
    number = float(obj[key])
    if not math.isfinite(number):
        raise bad(where + key, f"expected a finite number, got {number}")
    return number


def _only(body: Mapping[str, Any], key: str, allowed: Iterable[Any], why: str) -> None:
    """Refuse `key` unless it is absent or one of `allowed` (compared as sent)."""
    value = body.get(key)
    if value is not None and value not in list(allowed):
        raise bad(key, f"{json.dumps(value)} is not supported: {why}")


# ---- the parts both endpoints share ----

def _model(body: Mapping[str, Any], served: Sequence[str]) -> str:
    model = _get(body, "model", "a string")
    if model is None:
        raise bad("model", "required: one of " + ", ".join(served))
    if model not in served:
        raise APIError(404, f"The model '{model}' does not exist: this endpoint serves " + ", ".join(served),
                       param="model", code="model_not_found")
    return model


def _settings(body: Mapping[str, Any], settings: SamplerSettings, flexible: bool, budget_keys: Sequence[str]
              ) -> SamplerSettings:
    """This request's sampler settings: its token budget (capped at the sampler's), and temperature / top_p / top_k
    (flexible: the request's; else refused unless the run's)."""
    budget = settings.max_new_tokens
    for key in budget_keys:  # the first present wins (max_completion_tokens replaced max_tokens)
        n = _get(body, key, "an integer")
        if n is not None:
            if n < 1:
                raise bad(key, f"must be a positive integer, got {n}")
            budget = min(n, settings.max_new_tokens)
            break
    temperature, top_p = _get(body, "temperature", "a number"), _get(body, "top_p", "a number")
    top_k = _get(body, "top_k", "an integer")
    if temperature is not None and temperature < 0:
        raise bad("temperature", f"must be >= 0, got {temperature}")
    if top_p is not None and not 0 < top_p <= 1:
        raise bad("top_p", f"must be in (0, 1], got {top_p}")
    if top_k is not None and top_k < -1:
        raise bad("top_k", f"must be -1 or 0 (off) or a positive integer, got {top_k}")
    top_k = None if top_k is None else max(top_k, 0)
    if not flexible:
        run = {"temperature": 0.0 if settings.greedy else settings.temperature, "top_p": settings.top_p,
               "top_k": settings.top_k}
        for key, value in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k)):
            if value is not None and value != run[key]:
                raise bad(key, f"this endpoint samples with the RL run's {key} {run[key]} (the trainer's log-probs "
                          f"belong to the run's policy): send {run[key]} or leave it out, not {value}")
        return replace(settings, max_new_tokens=budget)
    greedy = settings.greedy if temperature is None else temperature == 0
    return replace(settings, max_new_tokens=budget, greedy=greedy,
                   temperature=settings.temperature if temperature is None or temperature == 0 else temperature,
                   top_p=settings.top_p if top_p is None else top_p, top_k=settings.top_k if top_k is None else top_k)


def _common(body: Mapping[str, Any], flexible: bool) -> dict[str, Any]:
    """The fields chat and completions share: n, stop, penalties, logit_bias, stream, user, seed."""
    _only(body, "n", [1], "one continuation per request")
    stop = body.get("stop")
    if stop not in (None, "", []):
        raise bad("stop", "stop strings are not supported: the model's own stop tokens end a turn (a stop string "
                  "cuts inside a token, and the recorded tokens would not be the text returned)")
    for key in ("presence_penalty", "frequency_penalty"):
        _only(body, key, [0], "it would change the distribution the policy's log-probs describe")
    if _get(body, "logit_bias", "an object"):
        raise bad("logit_bias", "not supported: it would change the distribution the policy's log-probs describe")
    stream = bool(_get(body, "stream", "a boolean"))
    options = _get(body, "stream_options", "an object")
    if options is not None and not stream:
        raise bad("stream_options", "only allowed when stream is true")
    seed = _get(body, "seed", "an integer")
    include_usage = bool(_get(options or {}, "include_usage", "a boolean", "stream_options."))
    return {"stream": stream, "include_usage": include_usage,
            "return_token_ids": bool(_get(body, "return_token_ids", "a boolean")),
            "user": _get(body, "user", "a string"), "seed": seed if flexible else None}


# ---- chat ----

def parse_chat(body: Mapping[str, Any], served: Sequence[str], settings: SamplerSettings, flexible: bool
               ) -> ChatRequest:
    """A `/v1/chat/completions` body -> `ChatRequest`; raises `APIError` naming the field (module doc: what is
    supported, refused, ignored). max_tokens / max_completion_tokens above the sampler's budget
    (`settings.max_new_tokens`) are capped to it, not refused."""
    model = _model(body, served)
    for key in ("functions", "function_call"):
        if body.get(key) is not None:
            raise bad(key, "the deprecated functions API is not supported: send tools")
    if body.get("audio") is not None:
        raise bad("audio", "not supported: this endpoint answers in text")
    response_format = _get(body, "response_format", "an object")
    if response_format is not None and response_format.get("type") != "text":
        raise bad("response_format.type", "only 'text' is supported: nothing constrains the model's output")
    top_logprobs = _get(body, "top_logprobs", "an integer")
    if top_logprobs:
        raise bad("top_logprobs", "only 0: the sampler returns the log-prob of the token it drew, no alternatives")
    tools = _tools(body)
    tool_choice = body.get("tool_choice")
    if tool_choice == "required" or isinstance(tool_choice, dict):
        raise bad("tool_choice", f"{json.dumps(tool_choice)} is not supported, only 'auto' and 'none': nothing "
                  "constrains the model's output to a tool call")
    if tool_choice not in (None, "auto", "none"):
        raise bad("tool_choice", f"expected 'auto' or 'none', got {json.dumps(tool_choice)}")
    choice: Literal["auto", "none"] = "none" if tool_choice == "none" or (tool_choice is None and not tools) else "auto"
    return ChatRequest(model=model, messages=_messages(body), tools=tools, tool_choice=choice,
                       settings=_settings(body, settings, flexible, ("max_completion_tokens", "max_tokens")),
                       logprobs=bool(_get(body, "logprobs", "a boolean")), **_common(body, flexible))


def _tools(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    tools, names = _get(body, "tools", "an array") or [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad(where, f"expected an object, got {_kind(tool)}")
        if tool.get("type") != "function":
            raise bad(where + ".type", f"only 'function' tools are supported, got {json.dumps(tool.get('type'))}")
        function = _get(tool, "function", "an object", where + ".")
        if function is None:
            raise bad(where + ".function", "required")
        name = _get(function, "name", "a string", where + ".function.")
        if not name:
            raise bad(where + ".function.name", "required: a non-empty string")
        if name in names:
            raise bad(where + ".function.name", f"two tools are named '{name}'")
        names.add(name)
        _get(function, "description", "a string", where + ".function.")
        _get(function, "parameters", "an object", where + ".function.")
    return tools


def _content(message: Mapping[str, Any], where: str) -> str | None:
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(where + "content", f"expected a string, null or an array of text parts, got {_kind(content)}")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}content[{j}]"
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else _kind(part)
            raise bad(at + ".type", f"only text parts are supported, got {json.dumps(kind)}")
        text = _get(part, "text", "a string", at + ".")
        if text is None:
            raise bad(at + ".text", "required")
        texts.append(text)
    return "\n".join(texts)


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise bad(where, f"expected an array, got {_kind(calls)}")
    out, ids = [], set()
    for k, call in enumerate(calls):
        at = f"{where}[{k}]"
        if not isinstance(call, dict):
            raise bad(at, f"expected an object, got {_kind(call)}")
        call_id = _get(call, "id", "a string", at + ".")
        if not call_id:
            raise bad(at + ".id", "required: a non-empty string")
        if call_id in ids:
            raise bad(at + ".id", f"two tool calls have the id '{call_id}'")
        ids.add(call_id)
        if call.get("type", "function") != "function":
            raise bad(at + ".type", f"only 'function' tool calls are supported, got {json.dumps(call.get('type'))}")
        function = _get(call, "function", "an object", at + ".")
        if function is None:
            raise bad(at + ".function", "required")
        name = _get(function, "name", "a string", at + ".function.")
        arguments = _get(function, "arguments", "a string", at + ".function.")
        if not name:
            raise bad(at + ".function.name", "required: a non-empty string")
        try:
            ok = isinstance(json.loads(arguments or ""), dict)
        except json.JSONDecodeError:
            ok = False
        if not ok:
            raise bad(at + ".function.arguments", "expected the text of a JSON object (OpenAI sends arguments as a "
                      f"string), got {json.dumps(arguments)}")
        out.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
    return out


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "required: a non-empty array of messages")
    out: list[dict[str, Any]] = []
    answerable: set[str] | None = None  # the ids of the tool calls a tool message may answer here
    for i, message in enumerate(messages):
        where = f"messages[{i}]."
        if not isinstance(message, dict):
            raise bad(f"messages[{i}]", f"expected an object, got {_kind(message)}")
        role = message.get("role")
        if role not in ROLES:
            raise bad(where + "role", f"expected one of {', '.join(ROLES)}, got {json.dumps(role)}")
        item: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": _content(message, where)}
        for key in ("name", "reasoning_content"):
            if _get(message, key, "a string", where) is not None:
                item[key] = message[key]
        if role == "assistant" and message.get("tool_calls") not in (None, []):
            item["tool_calls"] = _tool_calls(message["tool_calls"], where + "tool_calls")
            answerable = {c["id"] for c in item["tool_calls"]}
        elif role == "tool":
            call_id = _get(message, "tool_call_id", "a string", where)
            if not call_id:
                raise bad(where + "tool_call_id", "required: the id of the tool call this message answers")
            if answerable is None:
                raise bad(where + "role", "a tool message must follow an assistant message with tool_calls")
            if call_id not in answerable:
                raise bad(where + "tool_call_id", f"'{call_id}' is not the id of a tool call of the assistant message "
                          "before it")
            item["tool_call_id"] = call_id
        else:
            answerable = None
        if item["content"] is None and "tool_calls" not in item:
            if role != "assistant":
                raise bad(where + "content", f"required for a {role} message")
            item["content"] = ""
        out.append(item)
    return out


# ---- completions ----

def parse_completion(body: Mapping[str, Any], served: Sequence[str], settings: SamplerSettings, flexible: bool,
                     vocab_size: int | None = None) -> CompletionRequest:
    """A `/v1/completions` body -> `CompletionRequest`; raises `APIError` naming the field. max_tokens above the
    sampler's budget is capped to it; token ids of a prompt must lie in [0, vocab_size) where it is given."""
    model = _model(body, served)
    _only(body, "echo", [False], "the response holds the completion only")
    _only(body, "best_of", [1], "one continuation per request")
    if body.get("suffix") is not None:
        raise bad("suffix", "not supported (no insertion mode)")
    logprobs = _get(body, "logprobs", "an integer")
    if logprobs:
        raise bad("logprobs", "only 0 (or null): the sampler returns the log-prob of the token it drew, no "
                  "alternatives")
    return CompletionRequest(model=model, prompt=_prompt(body, vocab_size), logprobs=logprobs == 0,
                             settings=_settings(body, settings, flexible, ("max_tokens",)), **_common(body, flexible))


def _prompt(body: Mapping[str, Any], vocab_size: int | None) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # one prompt in a list of prompts
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if bad_ids := [t for t in prompt if t < 0 or (vocab_size is not None and t >= vocab_size)]:
            raise bad("prompt", f"token ids must lie in [0, {vocab_size}), got {bad_ids[:5]}")
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise bad("prompt", f"one prompt per request, got {len(prompt)}")
    raise bad("prompt", "required: a non-empty string or a non-empty array of token ids")


