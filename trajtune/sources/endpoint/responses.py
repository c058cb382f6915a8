"""The OpenAI wire format of the endpoint's responses, pure: the parts of one sampled turn in (prompt ids, sampled
ids, their log-probs and texts, the parsed reply, the policy version), OpenAI's JSON bodies out.

Responses carry OpenAI's fields and trajtune's extensions: `policy_version` (top level: the version of the weights
that sampled it) and, when the request set `return_token_ids`, vLLM's `prompt_token_ids` (top level for chat, in the
choice for completions, as vLLM places them) and `token_ids` (in the choice: the sampled ids, exactly). Streams are
made after sampling (the sampler returns whole continuations): chat sends a role chunk, one chunk with the content,
the tool calls, the log-probs and the token ids, a finish chunk, and with include_usage a last chunk of usage alone;
completions send one chunk with everything, then the usage chunk. `sse` frames chunks as server-sent events.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Iterable, Literal, Mapping, Sequence

from .openai import ChatRequest, CompletionRequest

OWNED_BY = "trajtune"
"""`owned_by` of the models `/v1/models` lists"""


def finish_reason(stopped: bool, tool_calls: bool) -> Literal["stop", "length", "tool_calls"]:
    """OpenAI's finish reason: "length" where the token budget cut the turn (even if a tool call was parsed from
    it), else "tool_calls" where the model called tools, else "stop" (it sampled a stop token)."""
    return "length" if not stopped else "tool_calls" if tool_calls else "stop"


def _tool_call_entries(calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls as the renderer's parser gives them ({"id"?, "function": {"name", "arguments": dict or JSON
    text}}) -> OpenAI entries (arguments as JSON text, an id made where none is given)."""
    out = []
    for call in calls:
        function = call["function"]
        arguments = function["arguments"]
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        out.append({"id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                    "function": {"name": function["name"], "arguments": arguments}})
    return out


def _check_lengths(token_ids: Sequence[int], logprobs: Sequence[float], token_texts: Sequence[str]) -> None:
    if not len(token_ids) == len(logprobs) == len(token_texts):
        raise ValueError(f"one log-prob and one text per sampled token: {len(token_ids)} ids, {len(logprobs)} "
                         f"log-probs, {len(token_texts)} texts")


def _usage(prompt_ids: Sequence[int], token_ids: Sequence[int]) -> dict[str, int]:
    return {"prompt_tokens": len(prompt_ids), "completion_tokens": len(token_ids),
            "total_tokens": len(prompt_ids) + len(token_ids)}


def chat_response(request: ChatRequest, *, message: Mapping[str, Any], prompt_ids: Sequence[int],
                  token_ids: Sequence[int], logprobs: Sequence[float], token_texts: Sequence[str], stopped: bool,
                  policy_version: int, response_id: str | None = None, created: int | None = None) -> dict[str, Any]:
    """A `chat.completion` body for one sampled turn.

    message: the assistant's reply as parsed from the sampled text: {"content": str | None, "tool_calls"?: [...]}
        (tool calls with arguments a dict or JSON text; content None or "" is sent as null when there are calls)
    prompt_ids: the prompt's token ids; token_ids: the sampled ids; logprobs: their log-probs, as the sampler
        recorded them; token_texts: each sampled token's text (the log-probs' `token`; `bytes` is its UTF-8);
        stopped: the turn ended at a stop token (else the token budget cut it: finish_reason "length");
    policy_version: the version of the weights that sampled it."""
    _check_lengths(token_ids, logprobs, token_texts)
    calls = _tool_call_entries(message.get("tool_calls") or [])
    reply: dict[str, Any] = {"role": "assistant", "content": message.get("content") or (None if calls else "")}
    if calls:
        reply["tool_calls"] = calls
    choice: dict[str, Any] = {"index": 0, "message": reply, "finish_reason": finish_reason(stopped, bool(calls)),
                              "logprobs": _chat_logprobs(logprobs, token_texts) if request.logprobs else None}
    body: dict[str, Any] = {"id": response_id or f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                            "created": int(time.time()) if created is None else created, "model": request.model,
                            "choices": [choice], "usage": _usage(prompt_ids, token_ids),
                            "policy_version": policy_version}
    if request.return_token_ids:
        body["prompt_token_ids"], choice["token_ids"] = list(prompt_ids), list(token_ids)
    return body


def _chat_logprobs(logprobs: Sequence[float], token_texts: Sequence[str]) -> dict[str, Any]:
    return {"content": [{"token": text, "logprob": float(lp), "bytes": list(text.encode("utf-8")),
                         "top_logprobs": []} for text, lp in zip(token_texts, logprobs, strict=True)]}


def chat_chunks(request: ChatRequest, response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`chat_response`'s body as the `chat.completion.chunk`s of a stream (module doc: which chunks)."""
    choice, head = response["choices"][0], {k: response[k] for k in ("id", "created", "model", "policy_version")}
    usage = {"usage": None} if request.include_usage else {}

    def chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        part = {"index": 0, "delta": delta, "finish_reason": extra.pop("finish_reason", None),
                "logprobs": extra.pop("logprobs", None), **extra}
        return {**head, "object": "chat.completion.chunk", "choices": [part], **usage}

    message = choice["message"]
    content = message["content"]  # None: a reply of tool calls only (null in every delta, as OpenAI streams it)
    first = chunk({"role": "assistant", "content": None if content is None else ""})
    if "prompt_token_ids" in response:
        first["prompt_token_ids"] = response["prompt_token_ids"]
    delta: dict[str, Any] = {} if content is None else {"content": content}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
    ids = {"token_ids": choice["token_ids"]} if "token_ids" in choice else {}
    chunks = [first, chunk(delta, logprobs=choice["logprobs"], **ids),
              chunk({}, finish_reason=choice["finish_reason"])]
    if request.include_usage:
        chunks.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": response["usage"]})
    return chunks


def completion_response(request: CompletionRequest, *, text: str, prompt_ids: Sequence[int],
                        token_ids: Sequence[int], logprobs: Sequence[float], token_texts: Sequence[str],
                        stopped: bool, policy_version: int, response_id: str | None = None,
                        created: int | None = None) -> dict[str, Any]:
    """A `text_completion` body: `text` the sampled text, the rest as in `chat_response`."""
    _check_lengths(token_ids, logprobs, token_texts)
    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish_reason(stopped, False),
                              "logprobs": _completion_logprobs(logprobs, token_texts) if request.logprobs else None}
    if request.return_token_ids:
        choice["prompt_token_ids"], choice["token_ids"] = list(prompt_ids), list(token_ids)
    return {"id": response_id or f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()) if created is None else created, "model": request.model,
            "choices": [choice], "usage": _usage(prompt_ids, token_ids), "policy_version": policy_version}


def _completion_logprobs(logprobs: Sequence[float], token_texts: Sequence[str]) -> dict[str, Any]:
    offsets = [0]
    for text in token_texts[:-1]:
        offsets.append(offsets[-1] + len(text))
    return {"tokens": list(token_texts), "token_logprobs": [float(lp) for lp in logprobs], "top_logprobs": None,
            "text_offset": offsets[:len(token_texts)]}


def completion_chunks(request: CompletionRequest, response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`completion_response`'s body as a stream: one chunk with everything, then (include_usage) the usage."""
    head = {k: response[k] for k in ("id", "object", "created", "model", "policy_version")}
    if not request.include_usage:
        return [{**head, "choices": response["choices"]}]
    return [{**head, "choices": response["choices"], "usage": None},
            {**head, "choices": [], "usage": response["usage"]}]


# ---- models and framing ----

def models_response(served: Sequence[str], created: int | None = None) -> dict[str, Any]:
    """The `/v1/models` body: the names this endpoint serves."""
    created = int(time.time()) if created is None else created
    return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": OWNED_BY}
                                       for name in served]}


def sse(chunks: Iterable[Mapping[str, Any]]) -> bytes:
    """Chunks as server-sent events: `data: {json}\\n\\n` each, ending with `data: [DONE]\\n\\n`."""
    events = [b"data: " + json.dumps(chunk, ensure_ascii=False).encode("utf-8") + b"\n\n" for chunk in chunks]
    return b"".join(events) + b"data: [DONE]\n\n"
