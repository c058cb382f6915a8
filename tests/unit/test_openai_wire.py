"""The endpoint's OpenAI wire format (trajtune.sources.endpoint.openai, .responses): every refusal is a 400 (a 404 for
a model not served) in OpenAI's error JSON naming its field; what the `openai` client sends parses, and what the
endpoint answers validates as the client's own pydantic types, plain and streamed, extensions included."""

import json
from dataclasses import replace

import pytest

from trajtune.sources.endpoint.openai import APIError, parse_chat, parse_completion, read_body
from trajtune.sources.endpoint.responses import (chat_chunks, chat_response, completion_chunks, completion_response,
                                                 finish_reason, models_response, sse)
from trajtune.sources.sampler import SamplerSettings

openai = pytest.importorskip("openai", reason="the openai client: pip install openai")
try:  # the client's HTTP library: httpx2 from openai 3.x on, httpx before
    import httpx2 as httpx
except ImportError:
    import httpx  # type: ignore[no-redef]
from openai.types import Completion, Model  # noqa: E402
from openai.types.chat import ChatCompletion, ChatCompletionChunk  # noqa: E402

SERVED = ["policy"]
RUN = SamplerSettings(max_new_tokens=64, temperature=1.0, top_k=0, top_p=1.0)
USER = {"role": "user", "content": "add 2 and 3"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
TOOL = {"type": "function", "function": {"name": "add", "description": "a + b",
                                         "parameters": {"type": "object", "properties": {"a": {}, "b": {}}}}}


def chat(**fields):
    return {"model": "policy", "messages": [USER], **fields}


def refused(parse, body, flexible=False) -> APIError:
    with pytest.raises(APIError) as info:
        parse(body, SERVED, RUN, flexible)
    error = info.value
    assert set(error.body()) == {"error"} and set(error.body()["error"]) == {"message", "type", "param", "code"}
    json.dumps(error.body())
    if error.param is not None:
        assert f"'{error.param}'" in error.message or error.status == 404
    return error


@pytest.mark.parametrize("body, param, words", [
    ({"messages": [USER]}, "model", "required"),
    (chat(model=3), "model", "expected a string"),
    (chat(messages=[]), "messages", "non-empty array"),
    (chat(messages="hi"), "messages", "non-empty array"),
    (chat(messages=[USER, "hi"]), "messages[1]", "expected an object"),
    (chat(messages=[USER, {"role": "bot", "content": "x"}]), "messages[1].role", "got \"bot\""),
    (chat(messages=[{"role": "user"}]), "messages[0].content", "required for a user message"),
    (chat(messages=[{"role": "user", "content": 5}]), "messages[0].content", "got a number"),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
     "messages[0].content[0].type", "only text parts"),
    (chat(messages=[{"role": "user", "content": [{"type": "text"}]}]), "messages[0].content[0].text", "required"),
    (chat(messages=[USER, {"role": "assistant", "tool_calls": {"id": "x"}}]), "messages[1].tool_calls",
     "expected an array"),
    (chat(messages=[USER, {"role": "assistant", "tool_calls": [{**CALL, "id": ""}]}]), "messages[1].tool_calls[0].id",
     "required"),
    (chat(messages=[USER, {"role": "assistant", "tool_calls": [CALL, CALL]}]), "messages[1].tool_calls[1].id",
     "two tool calls"),
    (chat(messages=[USER, {"role": "assistant", "tool_calls": [{**CALL, "type": "custom"}]}]),
     "messages[1].tool_calls[0].type", "only 'function'"),
    (chat(messages=[USER, {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "add"}}]}]),
     "messages[1].tool_calls[0].function.arguments", "JSON object"),
    (chat(messages=[USER, {"role": "assistant", "tool_calls": [
        {**CALL, "function": {"name": "add", "arguments": {"a": 2}}}]}]),
     "messages[1].tool_calls[0].function.arguments", "expected a string"),
    (chat(messages=[USER, {"role": "assistant", "tool_calls": [
        {**CALL, "function": {"name": "add", "arguments": "{a: 2"}}]}]),
     "messages[1].tool_calls[0].function.arguments", "JSON object"),
    (chat(messages=[USER, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "content": "5"}]),
     "messages[2].tool_call_id", "required"),
    (chat(messages=[USER, {"role": "assistant", "tool_calls": [CALL]},
                    {"role": "tool", "tool_call_id": "call_9", "content": "5"}]),
     "messages[2].tool_call_id", "'call_9' is not the id"),
    (chat(messages=[USER, {"role": "tool", "tool_call_id": "call_1", "content": "5"}]), "messages[1].role",
     "must follow an assistant message with tool_calls"),
    (chat(messages=[USER, {"role": "assistant", "tool_calls": [CALL]}, USER,
                    {"role": "tool", "tool_call_id": "call_1", "content": "5"}]), "messages[3].role", "must follow"),
    (chat(tools={"add": TOOL}), "tools", "expected an array"),
    (chat(tools=[{"type": "custom", "custom": {"name": "x"}}]), "tools[0].type", "only 'function' tools"),
    (chat(tools=[{"type": "function"}]), "tools[0].function", "required"),
    (chat(tools=[{"type": "function", "function": {"description": "x"}}]), "tools[0].function.name", "required"),
    (chat(tools=[TOOL, TOOL]), "tools[1].function.name", "two tools are named 'add'"),
    (chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "{}"}}]),
     "tools[0].function.parameters", "expected an object"),
    (chat(tools=[TOOL], tool_choice="required"), "tool_choice", "only 'auto' and 'none'"),
    (chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "add"}}), "tool_choice",
     "only 'auto' and 'none'"),
    (chat(tool_choice="any"), "tool_choice", "expected 'auto' or 'none'"),
    (chat(max_tokens=0), "max_tokens", "positive integer"),
    (chat(max_completion_tokens=2.5), "max_completion_tokens", "expected an integer"),
    (chat(max_tokens=True), "max_tokens", "got a boolean"),
    (chat(temperature=0.7), "temperature", "the RL run's temperature 1.0"),
    (chat(temperature=-1), "temperature", ">= 0"),
    (chat(temperature="hot"), "temperature", "expected a number"),
    (chat(top_p=0.9), "top_p", "the RL run's top_p 1.0"),
    (chat(top_p=0), "top_p", "(0, 1]"),
    (chat(top_k=40), "top_k", "the RL run's top_k 0"),
    (chat(top_k=-2), "top_k", "-1 or 0 (off)"),
    (chat(n=2), "n", "one continuation per request"),
    (chat(stop=["Observation:"]), "stop", "stop strings are not supported"),
    (chat(stop="\n"), "stop", "stop strings are not supported"),
    (chat(logprobs=1), "logprobs", "expected a boolean"),
    (chat(logprobs=True, top_logprobs=5), "top_logprobs", "no alternatives"),
    (chat(presence_penalty=0.5), "presence_penalty", "distribution"),
    (chat(frequency_penalty=-1), "frequency_penalty", "distribution"),
    (chat(logit_bias={"42": 100}), "logit_bias", "distribution"),
    (chat(response_format={"type": "json_object"}), "response_format.type", "only 'text'"),
    (chat(functions=[{"name": "f"}]), "functions", "send tools"),
    (chat(function_call="auto"), "function_call", "send tools"),
    (chat(audio={"voice": "alloy", "format": "wav"}), "audio", "in text"),
    (chat(stream="yes"), "stream", "expected a boolean"),
    (chat(stream_options={"include_usage": True}), "stream_options", "only allowed when stream is true"),
    (chat(stream=True, stream_options={"include_usage": 1}), "stream_options.include_usage", "expected a boolean"),
    (chat(user=7), "user", "expected a string"),
    (chat(seed="7"), "seed", "expected an integer"),
    (chat(return_token_ids="yes"), "return_token_ids", "expected a boolean"),
])
def test_a_malformed_chat_request_is_a_400_naming_its_field(body, param, words):
    error = refused(parse_chat, body)
    assert (error.status, error.param, error.type) == (400, param, "invalid_request_error")
    assert words in error.message, error.message
    assert error.body()["error"]["param"] == param


def test_a_model_not_served_is_a_404_model_not_found():
    error = refused(parse_chat, chat(model="gpt-4o"))
    assert error.status == 404
    assert error.body() == {"error": {
        "message": "The model 'gpt-4o' does not exist: this endpoint serves policy", "type": "invalid_request_error",
        "param": "model", "code": "model_not_found"}}
    assert refused(parse_completion, {"model": "gpt-4o", "prompt": "x"}).status == 404


def test_a_body_that_is_no_json_object_is_a_400():
    assert read_body(b'{"model": "policy"}') == {"model": "policy"}
    for raw, words in ((b"{", "not valid JSON"), (b"[1]", "not an array"), (b"\xff", "not valid JSON")):
        with pytest.raises(APIError) as info:
            read_body(raw)
        assert info.value.status == 400 and words in info.value.message and info.value.param is None


def test_a_chat_request_is_checked_and_normalized():
    parts = [{"type": "text", "text": "add"}, {"type": "text", "text": "2, 3"}]
    body = chat(messages=[{"role": "developer", "content": "be brief"},
                          {"role": "user", "content": parts, "name": "ann"},
                          {"role": "assistant", "content": None, "tool_calls": [CALL]},
                          {"role": "tool", "tool_call_id": "call_1", "content": "5"},
                          {"role": "assistant", "content": None},
                          {"role": "assistant", "content": "ok", "tool_calls": []}],
                tools=[TOOL], max_tokens=500, stream=True, stream_options={"include_usage": True}, logprobs=True,
                top_logprobs=0, temperature=1.0, top_p=None, seed=7, user="episode-3", return_token_ids=True,
                n=1, stop=[], presence_penalty=0, metadata={"a": "b"}, parallel_tool_calls=False, store=False)
    req = parse_chat(body, SERVED, RUN, flexible=False)
    assert req.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "add\n2, 3", "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "5", "tool_call_id": "call_1"},
        {"role": "assistant", "content": ""},
        {"role": "assistant", "content": "ok"}]
    assert req.tools == [TOOL] and req.tool_choice == "auto"
    assert req.settings == replace(RUN, max_new_tokens=64)  # 500 capped at the sampler's budget, the rest the run's
    assert (req.stream, req.include_usage, req.logprobs, req.return_token_ids) == (True, True, True, True)
    assert (req.user, req.seed, req.model) == ("episode-3", None, "policy")  # an RL run seeds requests itself
    small = parse_chat(chat(max_tokens=10, max_completion_tokens=20), SERVED, RUN, False)
    assert small.settings.max_new_tokens == 20 and small.tool_choice == "none" and not small.stream
    assert parse_chat(chat(tool_choice="none", tools=[TOOL]), SERVED, RUN, False).tool_choice == "none"


def test_a_greedy_run_takes_temperature_zero_and_refuses_the_rest():
    greedy = replace(RUN, greedy=True)
    assert parse_chat(chat(temperature=0), SERVED, greedy, False).settings == greedy
    with pytest.raises(APIError, match="the RL run's temperature 0.0"):
        parse_chat(chat(temperature=1.0), SERVED, greedy, False)


def test_a_flexible_endpoint_takes_the_request_settings():
    req = parse_chat(chat(temperature=0.7, top_p=0.9, top_k=40, seed=3, max_tokens=8), SERVED, RUN, True)
    assert req.settings == replace(RUN, temperature=0.7, top_p=0.9, top_k=40, max_new_tokens=8) and req.seed == 3
    assert parse_chat(chat(temperature=0, top_k=-1), SERVED, RUN, True).settings == replace(RUN, greedy=True, top_k=0)
    assert parse_chat(chat(), SERVED, replace(RUN, greedy=True), True).settings.greedy
    assert not parse_chat(chat(temperature=0.5), SERVED, replace(RUN, greedy=True), True).settings.greedy


@pytest.mark.parametrize("body, param, words", [
    ({"model": "policy"}, "prompt", "required"),
    ({"model": "policy", "prompt": ""}, "prompt", "required"),
    ({"model": "policy", "prompt": ["a", "b"]}, "prompt", "one prompt per request, got 2"),
    ({"model": "policy", "prompt": [[1, 2], [3]]}, "prompt", "one prompt per request"),
    ({"model": "policy", "prompt": [1, -2]}, "prompt", "[0, None), got [-2]"),
    ({"model": "policy", "prompt": [1, True]}, "prompt", "required"),
    ({"model": "policy", "prompt": "x", "logprobs": 2}, "logprobs", "no alternatives"),
    ({"model": "policy", "prompt": "x", "logprobs": True}, "logprobs", "expected an integer"),
    ({"model": "policy", "prompt": "x", "echo": True}, "echo", "completion only"),
    ({"model": "policy", "prompt": "x", "best_of": 3}, "best_of", "one continuation"),
    ({"model": "policy", "prompt": "x", "suffix": "y"}, "suffix", "insertion"),
    ({"model": "policy", "prompt": "x", "max_tokens": -1}, "max_tokens", "positive integer"),
    ({"model": "policy", "prompt": "x", "n": 4}, "n", "one continuation"),
    ({"model": "policy", "prompt": "x", "stop": ["\n\n"]}, "stop", "stop strings"),
    ({"model": "policy", "prompt": "x", "temperature": 0.2}, "temperature", "the RL run's temperature 1.0"),
])
def test_a_malformed_completion_request_is_a_400_naming_its_field(body, param, words):
    error = refused(parse_completion, body)
    assert (error.status, error.param) == (400, param)
    assert words in error.message, error.message


def test_a_completion_request_is_checked():
    req = parse_completion({"model": "policy", "prompt": [[5, 6, 7]], "logprobs": 0, "max_tokens": 3,
                            "return_token_ids": True, "echo": False}, SERVED, RUN, False)
    assert (req.prompt, req.logprobs, req.settings.max_new_tokens, req.return_token_ids) == ([5, 6, 7], True, 3, True)
    assert parse_completion({"model": "policy", "prompt": ["hi"]}, SERVED, RUN, False).prompt == "hi"
    with pytest.raises(APIError, match=r"\[0, 10\), got \[12\]"):
        parse_completion({"model": "policy", "prompt": [3, 12]}, SERVED, RUN, False, vocab_size=10)


def test_finish_reasons():
    assert finish_reason(stopped=True, tool_calls=False) == "stop"
    assert finish_reason(stopped=True, tool_calls=True) == "tool_calls"
    assert finish_reason(stopped=False, tool_calls=True) == "length"


# ---- responses, written out by hand, then read by the client's own types ----

REPLY = {"content": "", "tool_calls": [{"id": "call_7", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]}
TURN = dict(message=REPLY, prompt_ids=[1, 2, 3, 4], token_ids=[10, 11, 12], logprobs=[-0.5, -0.25, 0.0],
            token_texts=["<tool_call>", "{\"name\"", "é"], stopped=True, policy_version=7, response_id="chatcmpl-1",
            created=1700000000)


def test_a_chat_response_carries_the_reply_the_versions_and_the_token_ids():
    req = parse_chat(chat(logprobs=True, return_token_ids=True), SERVED, RUN, False)
    body = chat_response(req, **TURN)
    assert body == {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "policy",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "token_ids": [10, 11, 12],
                     "message": {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "call_7", "type": "function",
                          "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
                     "logprobs": {"content": [
                         {"token": "<tool_call>", "logprob": -0.5, "bytes": list(b"<tool_call>"), "top_logprobs": []},
                         {"token": "{\"name\"", "logprob": -0.25, "bytes": list(b"{\"name\""), "top_logprobs": []},
                         {"token": "é", "logprob": 0.0, "bytes": [195, 169], "top_logprobs": []}]}}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
        "policy_version": 7, "prompt_token_ids": [1, 2, 3, 4]}
    parsed = ChatCompletion.model_validate(body)
    call = parsed.choices[0].message.tool_calls[0]
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == ("call_7", "add", {"a": 2, "b": 3})
    assert parsed.choices[0].logprobs.content[2].bytes == [195, 169] and parsed.usage.total_tokens == 7
    assert parsed.model_extra == {"policy_version": 7, "prompt_token_ids": [1, 2, 3, 4]}
    assert parsed.choices[0].model_extra == {"token_ids": [10, 11, 12]}

    plain = chat_response(parse_chat(chat(), SERVED, RUN, False),
                          **{**TURN, "message": {"content": "5"}, "stopped": False})
    assert plain["choices"][0] == {"index": 0, "message": {"role": "assistant", "content": "5"},
                                   "finish_reason": "length", "logprobs": None}
    assert "prompt_token_ids" not in plain and plain["policy_version"] == 7
    ChatCompletion.model_validate(plain)
    made = chat_response(parse_chat(chat(), SERVED, RUN, False),
                         **{**TURN, "message": {"content": None, "tool_calls": [{"function": {
                             "name": "add", "arguments": '{"a": 1}'}}]}})
    call = made["choices"][0]["message"]["tool_calls"][0]
    assert call["id"].startswith("call_") and call["function"]["arguments"] == '{"a": 1}'
    with pytest.raises(ValueError, match="3 ids, 2 log-probs"):
        chat_response(req, **{**TURN, "logprobs": [-1.0, -1.0]})


def test_a_chat_stream_is_chunks_the_client_reads():
    req = parse_chat(chat(stream=True, stream_options={"include_usage": True}, logprobs=True, return_token_ids=True),
                     SERVED, RUN, False)
    chunks = chat_chunks(req, chat_response(req, **TURN))
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "policy",
            "policy_version": 7}
    assert [c["choices"][0]["delta"] if c["choices"] else None for c in chunks] == [
        {"role": "assistant", "content": None},
        {"tool_calls": [{"index": 0, "id": "call_7", "type": "function",
                                        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
        {}, None]
    assert chunks[0]["prompt_token_ids"] == [1, 2, 3, 4] and chunks[1]["choices"][0]["token_ids"] == [10, 11, 12]
    assert [c["choices"][0]["finish_reason"] if c["choices"] else None for c in chunks] == [None, None, "tool_calls",
                                                                                          None]
    assert [c["usage"] for c in chunks] == [None, None, None, {"prompt_tokens": 4, "completion_tokens": 3,
                                                              "total_tokens": 7}]
    assert all({k: c[k] for k in head} == head for c in chunks)
    for c in chunks:
        ChatCompletionChunk.model_validate(c)
    assert ChatCompletionChunk.model_validate(chunks[1]).choices[0].logprobs.content[0].logprob == -0.5
    quiet = chat_chunks(parse_chat(chat(stream=True), SERVED, RUN, False),
                        chat_response(parse_chat(chat(stream=True), SERVED, RUN, False),
                                      **{**TURN, "message": {"content": "5"}}))
    assert len(quiet) == 3 and all("usage" not in c for c in quiet)
    assert [c["choices"][0]["delta"] for c in quiet] == [{"role": "assistant", "content": ""}, {"content": "5"}, {}]
    assert "prompt_token_ids" not in quiet[0]


def test_a_completion_response_and_its_stream():
    req = parse_completion({"model": "policy", "prompt": "2+3=", "logprobs": 0, "return_token_ids": True,
                            "stream": True, "stream_options": {"include_usage": True}}, SERVED, RUN, False)
    body = completion_response(req, text="5 ok", prompt_ids=[1, 2], token_ids=[20, 21], logprobs=[-1.0, -2.0],
                               token_texts=["5", " ok"], stopped=True, policy_version=2, response_id="cmpl-1",
                               created=5)
    assert body == {"id": "cmpl-1", "object": "text_completion", "created": 5, "model": "policy",
                    "choices": [{"index": 0, "text": "5 ok", "finish_reason": "stop",
                                 "logprobs": {"tokens": ["5", " ok"], "token_logprobs": [-1.0, -2.0],
                                              "top_logprobs": None, "text_offset": [0, 1]},
                                 "prompt_token_ids": [1, 2], "token_ids": [20, 21]}],
                    "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}, "policy_version": 2}
    parsed = Completion.model_validate(body)
    assert parsed.choices[0].logprobs.text_offset == [0, 1] and parsed.model_extra == {"policy_version": 2}
    chunks = completion_chunks(req, body)
    assert [len(c["choices"]) for c in chunks] == [1, 0] and chunks[1]["usage"]["total_tokens"] == 4
    assert chunks[0]["usage"] is None and chunks[0]["choices"][0]["text"] == "5 ok"
    for c in chunks:
        Completion.model_validate(c)


def test_models_and_server_sent_events():
    body = models_response(["policy", "policy@7"], created=9)
    assert body == {"object": "list", "data": [
        {"id": "policy", "object": "model", "created": 9, "owned_by": "trajtune"},
        {"id": "policy@7", "object": "model", "created": 9, "owned_by": "trajtune"}]}
    assert [Model.model_validate(m).id for m in body["data"]] == ["policy", "policy@7"]
    assert sse([{"a": 1}, {"b": "é"}]) == b'data: {"a": 1}\n\ndata: {"b": "\xc3\xa9"}\n\ndata: [DONE]\n\n'
    assert sse([]) == b"data: [DONE]\n\n"


# ---- the real client against a dummy transport: what it sends parses, what it gets back it reads ----

def client_for(answer):
    """An `openai.OpenAI` whose requests go to `answer(path, body) -> (status, body bytes, content type)`; the
    bodies it sent are in `client.sent`."""
    sent = []

    def handler(request):
        body = json.loads(request.content) if request.content else None
        sent.append(body)
        status, content, kind = answer(request.url.path, body)
        return httpx.Response(status, content=content, headers={"content-type": kind})

    client = openai.OpenAI(base_url="http://endpoint.test/s/episode-1/v1", api_key="none", max_retries=0,
                           http_client=httpx.Client(transport=httpx.MockTransport(handler)))
    client.sent = sent
    return client


def serve(path, body, reply=REPLY):
    """What the endpoint's server does with these functions, minus sampling: a fixed sampled turn."""
    try:
        if path.endswith("/models"):
            return 200, json.dumps(models_response(SERVED)).encode(), "application/json"
        if path.endswith("/completions") and "chat" not in path:
            req = parse_completion(body, SERVED, RUN, False)
            out = completion_response(req, text="5", prompt_ids=[1, 2], token_ids=[20], logprobs=[-0.1],
                                      token_texts=["5"], stopped=True, policy_version=4)
            if req.stream:
                return 200, sse(completion_chunks(req, out)), "text/event-stream"
            return 200, json.dumps(out).encode(), "application/json"
        req = parse_chat(body, SERVED, RUN, False)
        out = chat_response(req, **{**TURN, "message": reply, "response_id": None, "created": None})
        if req.stream:
            return 200, sse(chat_chunks(req, out)), "text/event-stream"
        return 200, json.dumps(out).encode(), "application/json"
    except APIError as e:
        return e.status, json.dumps(e.body()).encode(), "application/json"


HISTORY = [{"role": "system", "content": "You add numbers with the add tool."}, USER,
           {"role": "assistant", "content": None, "tool_calls": [CALL]},
           {"role": "tool", "tool_call_id": "call_1", "content": "5"}]


def test_the_client_request_parses_and_its_answer_reads():
    client = client_for(serve)
    answer = client.chat.completions.create(model="policy", messages=HISTORY, tools=[TOOL], tool_choice="auto",
                                            max_completion_tokens=32, logprobs=True, temperature=1.0,
                                            extra_body={"return_token_ids": True})
    sent = client.sent[0]
    req = parse_chat(sent, SERVED, RUN, False)
    assert req.messages == [{"role": "system", "content": "You add numbers with the add tool."}, USER,
                            {"role": "assistant", "content": None, "tool_calls": [CALL]},
                            {"role": "tool", "content": "5", "tool_call_id": "call_1"}]
    assert req.tools == [TOOL] and req.settings.max_new_tokens == 32 and req.return_token_ids
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason == "tool_calls" and message.content is None
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("call_7", "add", '{"a": 2, "b": 3}')]
    assert answer.policy_version == 7 and answer.prompt_token_ids == [1, 2, 3, 4]
    assert answer.choices[0].token_ids == [10, 11, 12]
    # the reply goes back into the history as the client serializes it, and parses again
    answered = {"role": "tool", "tool_call_id": "call_7", "content": "5"}
    client.chat.completions.create(model="policy", messages=[*HISTORY, message.model_dump(exclude_none=True), answered])
    assert parse_chat(client.sent[1], SERVED, RUN, False).messages[-2] == {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": "call_7", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]}


def test_the_client_reads_a_stream_and_an_error():
    client = client_for(serve)
    chunks = list(client.chat.completions.create(model="policy", messages=HISTORY, tools=[TOOL], stream=True,
                                                 stream_options={"include_usage": True}))
    assert [type(c) for c in chunks] == [ChatCompletionChunk] * 4 and chunks[-1].usage.completion_tokens == 3
    assert chunks[1].choices[0].delta.tool_calls[0].function.arguments == '{"a": 2, "b": 3}'
    with client.chat.completions.stream(model="policy", messages=HISTORY, tools=[TOOL]) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.name == "add" and final.choices[0].message.content is None
    assert final.choices[0].finish_reason == "tool_calls"
    text = client_for(lambda path, body: serve(path, body, reply={"content": "It is 5."}))
    with text.chat.completions.stream(model="policy", messages=HISTORY) as stream:
        assert stream.get_final_completion().choices[0].message.content == "It is 5."
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="policy", messages=HISTORY, n=2)
    assert (info.value.status_code, info.value.param, info.value.type) == (400, "n", "invalid_request_error")
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=HISTORY)
    assert (missing.value.code, missing.value.param) == ("model_not_found", "model")
    assert [m.id for m in client.models.list()] == ["policy"]


def test_the_client_completions_plain_and_streamed():
    client = client_for(serve)
    out = client.completions.create(model="policy", prompt=[5, 6, 7], max_tokens=4, logprobs=0,
                                    extra_body={"return_token_ids": True})
    req = parse_completion(client.sent[0], SERVED, RUN, False)
    assert (req.prompt, req.settings.max_new_tokens, req.logprobs) == ([5, 6, 7], 4, True)
    assert out.choices[0].text == "5" and out.choices[0].token_ids == [20] and out.policy_version == 4
    streamed = list(client.completions.create(model="policy", prompt="2+3=", stream=True))
    assert [c.choices[0].text for c in streamed] == ["5"] and streamed[0].choices[0].finish_reason == "stop"
