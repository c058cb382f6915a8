"""Tool calls on the real model's tokenizer (SmolLM2-135M-Instruct: its template renders `content` only): random
tool-call conversations -> render -> parse each assistant turn -> render again is the identity, with the calls written
by trajtune in json and in python syntax (the property of tests/unit/test_tool_calls.py, on the real template and
tokenizer); and a rendered calls turn, decoded from its POLICY tokens as a sampler's ids would be, parses back."""

import pytest
from test_tool_calls import SMOLLM2_TEMPLATE, check_round_trips

from trajtune.text.chat import ChatRenderer
from trajtune.text.tool_calls import ToolCall, ToolFormat
from trajtune.trajectory import Owner


@pytest.mark.parametrize("syntax", ["json", "python"])
def test_tool_calls_round_trip_on_the_real_template(real_model, syntax):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(real_model))
    assert tok.chat_template == SMOLLM2_TEMPLATE  # the unit tier's copy is the real one
    fmt = ToolFormat(tok, syntax)
    assert not fmt.native
    check_round_trips(tok, fmt)
    messages, _ = fmt.template_messages(
        [{"role": "user", "content": "2 * 21?"},
         {"role": "assistant", "content": "Let me compute.",
          "tool_calls": fmt.openai_tool_calls([ToolCall("multiply", {"a": 2, "b": 21})], "c")},
         {"role": "tool", "tool_call_id": "c_0", "content": "42"}],
        [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object"}}}])
    trajectory = ChatRenderer(tok).render(messages)  # the calls' turn as a sampler would have written it
    policy = [i for i, o in zip(trajectory.ids, trajectory.owners) if o == Owner.POLICY]
    said = tok.decode(policy)
    assert said.endswith("<|im_end|>")
    assert fmt.parse(said[:-len("<|im_end|>")]) == ("Let me compute.", [ToolCall("multiply", {"a": 2, "b": 21})], [])
