"""Tool calls in the model's own format (trajtune/text/tool_calls.py): random tool-call conversations rendered with
the chat template, each assistant turn parsed back from the rendered text and rendered again -- the same text, the
same calls -- for every supported template x syntax; and what cannot round-trip is refused or reported.

The templates: hf_random's CHATML_TEMPLATE (renders `tools` and `tool_calls` itself: native `<tool_call>` JSON, and
with syntax="python" written by trajtune), a Qwen2.5-style template (native, "\n" between content and calls, tool
results grouped in one user turn), and SmolLM2-135M-Instruct's plain ChatML (content only: json and python written by
trajtune). tests/real_model/test_tool_calls_real.py runs the same round trip on the real tokenizer."""

import json
import keyword
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trajtune.models.hf_random import CHATML_TEMPLATE, train_tokenizer
from trajtune.text.chat import ChatRenderer
from trajtune.text.tool_calls import ToolCall, ToolFormat

SMOLLM2_TEMPLATE = (  # ~/.cache/trajtune/models/gguf-b179c9523d0e6a0f/chat_template.jinja (SmolLM2-135M-Instruct)
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' "
    "+ message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
QWEN25_STYLE = (  # the tool layout of Qwen2.5's template (written short): "\n" before content and before each call
    "{%- if tools %}{{ '<|im_start|>system\n' }}{% if messages[0].role == 'system' %}{{ messages[0].content }}"
    "{% else %}{{ 'You are a helpful assistant.' }}{% endif %}{{ '\n\n# Tools\n<tools>' }}"
    "{% for t in tools %}{{ '\n' + t | tojson }}{% endfor %}{{ '\n</tools><|im_end|>\n' }}"
    "{%- elif messages[0].role == 'system' %}{{ '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) or (m.role == 'assistant' and not m.tool_calls)"
    " %}{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}"
    "{%- elif m.role == 'assistant' %}{{ '<|im_start|>assistant' }}{% if m.content %}{{ '\n' + m.content }}{% endif %}"
    "{%- for c in m.tool_calls %}{{ '\n<tool_call>\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' }}"
    "{{ c.function.arguments | tojson }}{{ '}\n</tool_call>' }}{%- endfor %}{{ '<|im_end|>\n' }}"
    "{%- elif m.role == 'tool' %}{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{ '<|im_start|>user' }}{% endif %}{{ '\n<tool_response>\n' + m.content + '\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\n' }}{% endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
STOP = "<|im_end|>"
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TRICKY = ["</tool_call>", "<tool_call>", "\n", " ", "\t", "\\", '"', "'", "é", "名", "🙂", "{", "}", "(", ")", "#"]
texts = st.lists(st.sampled_from(TRICKY) | st.text(max_size=6), max_size=5).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3), max_leaves=8)


def _identifier(s: str) -> bool:
    return s.isidentifier() and not keyword.iskeyword(s) and unicodedata.normalize("NFKC", s) == s


identifiers = st.text(alphabet="abxyzAZ_09éλ名", min_size=1, max_size=8).filter(_identifier)
openai_names = st.from_regex(r"[A-Za-z0-9_-]{1,16}", fullmatch=True)


@pytest.fixture(scope="module")
def chatml():
    return train_tokenizer()


@pytest.fixture(scope="module")
def smollm2():
    return train_tokenizer(chat_template=SMOLLM2_TEMPLATE)


@st.composite
def conversations(draw, fmt: ToolFormat):
    """(OpenAI messages, tools, the assistant messages' indices): 1-3 assistant turns of content or none and 0-3
    calls, each call answered by a tool message."""
    python = fmt.syntax == "python"
    names, keys = (identifiers, identifiers) if python else (openai_names, texts)
    contents = texts.filter(lambda s: STOP not in s and not fmt.reads_as_calls(s))
    messages: list[dict] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(contents)})
    messages.append({"role": "user", "content": draw(contents)})
    assistants, used = [], set()
    for turn in range(draw(st.integers(1, 3))):
        calls = [ToolCall(draw(names), draw(st.dictionaries(keys, json_values, max_size=3)))
                 for _ in range(draw(st.integers(0, 3)))]
        used |= {c.name for c in calls}
        message = {"role": "assistant", "content": draw(st.none() | contents)}
        if calls:
            message["tool_calls"] = fmt.openai_tool_calls(calls, f"call_{turn}")
        assistants.append(len(messages))
        messages.append(message)
        messages += [{"role": "tool", "tool_call_id": f"call_{turn}_{i}", "content": draw(contents)}
                     for i in range(len(calls))]
        messages.append({"role": "user", "content": draw(contents)})
    tools = [{"type": "function", "function": {"name": n, "description": draw(contents),
                                               "parameters": {"type": "object", "properties": {}}}}
             for n in sorted(used)]
    return messages, draw(st.sampled_from([tools, None])) if not used else tools, assistants


def round_trip(tokenizer, fmt: ToolFormat, messages: list[dict], tools, assistants: list[int]) -> None:
    """Render; parse each assistant turn out of the rendered text as a sampler would have written it (up to the
    stop token); the parsed content and calls are the originals, and the conversation rebuilt from them renders
    to the same text."""
    rendered, tools_arg = fmt.template_messages(messages, tools)
    renderer = ChatRenderer(tokenizer, tools=tools_arg)
    text = renderer.text(rendered)
    shift = len(rendered) - len(messages)  # a system message trajtune added for the tools
    rebuilt = list(messages)
    for turn, k in enumerate(assistants):
        head = renderer.text(rendered[:k + shift], generation_prompt=True)
        full = renderer.text(rendered[:k + shift + 1])
        assert full.startswith(head)
        said = full[len(head):full.index(STOP, len(head))]
        content, calls, errors = fmt.parse(said)
        assert errors == [], (said, errors)
        want = [(c["function"]["name"], c["function"]["arguments"]) for c in messages[k].get("tool_calls", [])]
        assert [(c.name, json.dumps(dict(c.arguments), ensure_ascii=False)) for c in calls] == want
        assert (content or None) == (messages[k]["content"] or None)
        rebuilt[k] = {"role": "assistant", "content": content}
        if calls:
            rebuilt[k]["tool_calls"] = fmt.openai_tool_calls(calls, f"call_{turn}")
    again, again_tools = fmt.template_messages(rebuilt, tools)
    assert again_tools == tools_arg
    assert ChatRenderer(tokenizer, tools=again_tools).text(again) == text


def check_round_trips(tokenizer, fmt: ToolFormat):
    @FAST
    @given(conversations(fmt))
    def check(case):
        round_trip(tokenizer, fmt, *case)

    check()


def test_chatml_native_round_trip(chatml):
    fmt = ToolFormat(chatml)
    assert fmt.native and fmt.syntax == "json" and fmt.separator == ""
    check_round_trips(chatml, fmt)


def test_qwen25_style_native_round_trip():
    tok = train_tokenizer(chat_template=QWEN25_STYLE)
    fmt = ToolFormat(tok)
    assert fmt.native and fmt.separator == "\n"
    check_round_trips(tok, fmt)


def test_chatml_python_round_trip(chatml):
    fmt = ToolFormat(chatml, "python")
    assert not fmt.native
    check_round_trips(chatml, fmt)


@pytest.mark.parametrize("syntax", ["json", "python"])
def test_smollm2_round_trip(smollm2, syntax):
    fmt = ToolFormat(smollm2, syntax)
    assert not fmt.native and fmt.syntax == syntax
    check_round_trips(smollm2, fmt)


def test_not_native_formats_describe_tools_in_the_first_system_message(smollm2):
    fmt = ToolFormat(smollm2)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    call = fmt.openai_tool_calls([ToolCall("add", {"a": 1, "b": [2.5, "x"]})], "c")
    assert call == [{"id": "c_0", "type": "function",
                     "function": {"name": "add", "arguments": '{"a": 1, "b": [2.5, "x"]}'}}]
    messages = [{"role": "user", "content": [{"type": "text", "text": "add"}, {"type": "text", "text": "them"}]},
                {"role": "assistant", "content": None, "tool_calls": call},
                {"role": "tool", "tool_call_id": "c_0", "content": "3.5"}]
    out, tools_arg = fmt.template_messages(messages, tools)
    assert tools_arg is None and out[0]["role"] == "system" and '"name": "add"' in out[0]["content"]
    assert "<tool_call>" in out[0]["content"] and out[1] == {"role": "user", "content": "add\nthem"}
    assert out[2] == {"role": "assistant", "content": '<tool_call>{"name": "add", "arguments": {"a": 1, "b": [2.5, '
                                                      '"x"]}}</tool_call>'}
    assert out[3] == {"role": "tool", "content": "3.5", "tool_call_id": "c_0"}
    merged, _ = fmt.template_messages([{"role": "system", "content": "Be brief."}] + messages, tools)
    assert merged[0]["content"].startswith("Be brief.\n\n# Tools") and len(merged) == 4
    assert fmt.template_messages(messages[:1], None)[0] == out[1:2]  # no tools: nothing added
    python = ToolFormat(smollm2, "python").template_messages(messages[1:2], tools)[0]
    assert python[1]["content"] == "add(a=1, b=[2.5, 'x'])" and "add(argument=value" not in python[0]["content"]
    assert "function_name(argument=value, ...)" in python[0]["content"]


def test_native_format_gives_the_template_dict_arguments_and_the_tools(chatml):
    fmt = ToolFormat(chatml)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "Sure.", "tool_calls": fmt.openai_tool_calls(
                    [ToolCall("add", {"b": 1, "a": 2})], "c")}]
    out, tools_arg = fmt.template_messages(messages, tools)
    assert tools_arg == tools and out[1]["tool_calls"] == [
        {"id": "c_0", "type": "function", "function": {"name": "add", "arguments": {"b": 1, "a": 2}}}]
    text = ChatRenderer(chatml, tools=tools_arg).text(out)
    assert 'Sure.<tool_call>{"name": "add", "arguments": {"b": 1, "a": 2}}</tool_call><|im_end|>' in text


def test_malformed_turns_are_text_with_errors(chatml, smollm2):
    fmt = ToolFormat(chatml)
    for said, why in [('<tool_call>{"name": "add", "arguments": {</tool_call>', "not valid JSON"),
                      ('<tool_call>{"arguments": {}}</tool_call>', "string 'name'"),
                      ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "must be an object"),
                      ('<tool_call>{"name": "f", "arguments": {}}</tool_call> done', "text after the tool calls"),
                      ('<tool_call>{"name": "f"}</tool_call> x <tool_call>{"name": "g"}</tool_call>', "between"),
                      ('<tool_call>{"name": "f"} x</tool_call>', "not closed"),
                      ('<tool_call>{"name": "f", "arguments": {"x": NaN}}</tool_call>', "finite")]:
        content, calls, errors = fmt.parse(said)
        assert content == said and calls == [] and errors and why in errors[0], (said, errors)
    # a string holding the closing tag stays inside its call; whitespace the layout does not write still parses
    content, calls, errors = fmt.parse('Hm.\n<tool_call>\n{"name": "f", "arguments": {"s": "</tool_call>"}}\n'
                                       '</tool_call>\n')
    assert (content, calls, errors) == ("Hm.\n", [ToolCall("f", {"s": "</tool_call>"})], [])
    assert fmt.parse("just an answer { }") == ("just an answer { }", [], [])
    python = ToolFormat(smollm2, "python")
    for said, why in [("Let me see.\nf(x=y)", "must be literals"), ("f(**{'a': 1})", "** arguments"),
                      ("f(x={1, 2})", "set, not a JSON value")]:
        content, calls, errors = python.parse(said)
        assert content == said and calls == [] and errors and why in errors[0], (said, errors)
    assert python.parse("I think\nf(1, y='a')\n\ng()\n") == ("I think", [ToolCall("f", {"arg0": 1, "y": "a"}),
                                                                         ToolCall("g", {})], [])
    assert python.parse("x = f(1)\nThe answer is 4.") == ("x = f(1)\nThe answer is 4.", [], [])


def test_what_cannot_round_trip_is_refused(chatml, smollm2):
    json_fmt, python = ToolFormat(chatml), ToolFormat(smollm2, "python")
    call = json_fmt.openai_tool_calls([ToolCall("f", {})], "c")
    with pytest.raises(ValueError, match=r"messages\[1\].content: reads as tool calls"):
        json_fmt.template_messages([{"role": "user", "content": "x"},
                                    {"role": "assistant", "content": "see <tool_call>", "tool_calls": call}])
    with pytest.raises(ValueError, match=r"messages\[0\].content: reads as tool calls"):
        python.template_messages([{"role": "assistant", "content": "first\ng(1)\n", "tool_calls": call}])
    # without tool_calls the content renders as written (a malformed turn sent back is the text the model wrote)
    assert json_fmt.template_messages([{"role": "assistant", "content": "<tool_call>{"}])[0][0]["content"] == \
        "<tool_call>{"
    for bad, match in [({"name": "my-tool", "arguments": "{}"}, "'my-tool' cannot be written in python"),
                       ({"name": "f", "arguments": '{"class": 1}'}, "'class' cannot be written"),
                       ({"name": "f", "arguments": '{"ﬁ": 1}'}, "cannot be written"),
                       ({"name": "f", "arguments": '{"x": Infinity}'}, r"tool_calls\[0\].function.arguments"),
                       ({"name": "f", "arguments": "{oops"}, "not valid JSON"),
                       ({"name": "f", "arguments": "[1]"}, "must be an object"),
                       ({"arguments": "{}"}, "string 'name'")]:
        with pytest.raises(ValueError, match=match):
            python.template_messages([{"role": "assistant", "content": None,
                                       "tool_calls": [{"id": "c", "type": "function", "function": bad}]}])
    for messages, tools, match in [
            ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], None,
             r"messages\[0\].content\[0\]: only text parts"),
            ([{"role": "robot", "content": "x"}], None, r"messages\[0\].role"),
            ([{"role": "user", "content": 3}], None, r"messages\[0\].content: must be a string"),
            ([{"role": "user", "content": "x", "tool_calls": call}], None, "only assistant messages"),
            ([{"role": "user", "content": "x"}], [{"type": "function"}], r"tools\[0\]")]:
        with pytest.raises(ValueError, match=match):
            json_fmt.template_messages(messages, tools)


def test_a_template_with_another_native_call_layout_needs_a_syntax():
    other = CHATML_TEMPLATE.replace("<tool_call>{{ c.function | tojson }}</tool_call>", "[CALL]{{ c.function.name }}")
    tok = train_tokenizer(chat_template=other)
    with pytest.raises(ValueError, match="not as <tool_call>JSON</tool_call> blocks"):
        ToolFormat(tok)
    assert not ToolFormat(tok, "json").native
    with pytest.raises(ValueError, match="syntax must be"):
        ToolFormat(tok, "yaml")


def test_the_renderer_cache_keeps_the_order_of_arguments(chatml):
    """ChatRenderer memoizes renderings by message; a call's argument order is rendered, so it is part of the key
    (the round trip above renders a parsed call again: another order would be another text)."""
    fmt, renderer = ToolFormat(chatml), ChatRenderer(chatml)
    ab, ba = ({"a": 1, "b": 2}, {"b": 2, "a": 1})
    texts = [renderer.text(fmt.template_messages([{"role": "user", "content": "x"}, {
        "role": "assistant", "content": None, "tool_calls": fmt.openai_tool_calls([ToolCall("f", args)], "c")}])[0])
        for args in (ab, ba)]
    assert '{"a": 1, "b": 2}' in texts[0] and '{"b": 2, "a": 1}' in texts[1]
