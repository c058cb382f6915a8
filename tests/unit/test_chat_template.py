"""Chat-template rendering with owners: token-exact against apply_chat_template, tool calls, turns,
non-prefix-preserving templates, and the rollout path against the render path."""

import pytest

pytest.importorskip("transformers")

from trajtune.models.hf_random import DROP_THINK_TEMPLATE, train_tokenizer  # noqa: E402
from trajtune.text.chat import ChatRenderer, TemplateError  # noqa: E402
from trajtune.trajectory import Owner  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object"}}}]
CALL = {"type": "function", "function": {"name": "run_tests", "arguments": {"path": "clamp.py"}}}
CONVERSATION = [
    {"role": "system", "content": "You are a careful engineer."},
    {"role": "user", "content": "fix the bug in clamp"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "1 failed"},
    {"role": "assistant", "content": "the answer is 5"},
]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer()


def _runs(traj, tok):
    """(owner, turn, text) runs of a trajectory."""
    out, start = [], 0
    for i in range(1, len(traj) + 1):
        if i == len(traj) or (traj.owners[i], traj.turns[i]) != (traj.owners[start], traj.turns[start]):
            out.append((Owner(traj.owners[start]), traj.turns[start], tok.decode(traj.ids[start:i])))
            start = i
    return out


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_ids_equal_apply_chat_template_and_only_assistant_is_trained(tok, tools):
    r = ChatRenderer(tok, tools=tools)
    traj = r.render(CONVERSATION)
    assert traj.ids == r.template_ids(CONVERSATION)
    policy = [(turn, text) for owner, turn, text in _runs(traj, tok) if owner == Owner.POLICY]
    assert policy == [(0, '<tool_call>{"name": "run_tests", "arguments": {"path": "clamp.py"}}</tool_call><|im_end|>'),
                      (1, "the answer is 5<|im_end|>")]
    texts = {owner: "".join(t for o, _, t in _runs(traj, tok) if o == owner) for owner in Owner}
    assert texts[Owner.PROMPT] == "You are a careful engineer.fix the bug in clamp"
    assert texts[Owner.TOOL] == "1 failed"
    assert "<|im_start|>assistant\n" in texts[Owner.TEMPLATE]
    # the tool result is part of turn 0 (the observation answering action 0)
    assert [turn for o, turn, _ in _runs(traj, tok) if o == Owner.TOOL] == [0]


def test_rollout_path_matches_render_path(tok):
    r = ChatRenderer(tok)
    msgs = [{"role": "user", "content": "what is 2 + 3?"}, {"role": "assistant", "content": "let me run tests"},
            {"role": "tool", "content": "passed"}, {"role": "assistant", "content": "the answer is 5"}]
    transcript = r.start(msgs[:1])
    traj = transcript.traj
    assert r.prompt_ids(transcript) == r.generation_prompt(msgs[:1])
    for turn, k in enumerate((1, 3)):
        tokens = tok(msgs[k]["content"], add_special_tokens=False)["input_ids"] + [r.stop_ids[0]]
        r.append_sampled(transcript, tokens, [-1.0] * len(tokens), turn)
        assert r.action_text(tokens) == msgs[k]["content"]
        if k == 1:
            r.append_message(transcript, msgs[2], turn)
            assert r.prompt_ids(transcript) == r.generation_prompt(msgs[:3])
    rendered = r.render(msgs)
    assert (traj.ids, traj.owners, traj.turns) == (rendered.ids, rendered.owners, rendered.turns)


def test_non_prefix_preserving_template_starts_a_new_sample(tok):
    tok = train_tokenizer(chat_template=DROP_THINK_TEMPLATE)
    r = ChatRenderer(tok)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think> hmm </think> hello"},
            {"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "<think> add </think> 5"}]
    with pytest.raises(TemplateError, match="not prefix-preserving"):
        r.render(msgs)
    first, second = r.render_samples(msgs)
    # each sample is exactly what the template renders for its prefix: tokens the model really saw
    assert first.ids == r.template_ids(msgs[:2])
    assert second.ids == r.template_ids(msgs)
    assert tok.decode(first.tokens_of(Owner.POLICY)) == "<think> hmm </think> hello<|im_end|>"
    assert tok.decode(second.tokens_of(Owner.POLICY)) == "<think> add </think> 5<|im_end|>"
    # the earlier turn appears in the second sample without its reasoning, as context only
    assert "hmm" not in tok.decode(second.ids) and second.turns[-1] == 1


def test_missing_template_is_a_clear_error(tok):
    bare = train_tokenizer()
    bare.chat_template = None
    with pytest.raises(TemplateError, match="no chat_template"):
        ChatRenderer(bare)


def test_assistant_turns_in_the_prompt_are_context_not_trained(tok):
    """render_samples(context=k): the first k messages are the prompt; an assistant turn among them is
    PROMPT-owned (TRL's conversational prompt), the ids stay exactly the template's."""
    r = ChatRenderer(tok)
    msgs = [{"role": "user", "content": "what is 2 + 3?"}, {"role": "assistant", "content": "6"},
            {"role": "user", "content": "no, try again."}, {"role": "assistant", "content": "the answer is 5"}]
    every = r.render(msgs)  # a 'messages' row: every assistant turn trained
    (ctx,) = r.render_samples(msgs, context=3)
    assert ctx.ids == every.ids == r.template_ids(msgs)
    assert tok.decode(every.tokens_of(Owner.POLICY)) == "6<|im_end|>the answer is 5<|im_end|>"
    assert tok.decode(ctx.tokens_of(Owner.POLICY)) == "the answer is 5<|im_end|>"
    prompt = [text for owner, _, text in _runs(ctx, tok) if owner == Owner.PROMPT]
    assert prompt == ["what is 2 + 3?", "6", "no, try again."] and set(ctx.turns) == {0}
    # the rollout path from the same prompt: the same ids and owners up to the generation prompt
    transcript = r.start(msgs[:3])
    n = len(transcript.traj)
    assert r.prompt_ids(transcript) == r.generation_prompt(msgs[:3])
    assert (transcript.traj.ids, transcript.traj.owners) == (ctx.ids[:n], ctx.owners[:n])
    with pytest.raises(TemplateError, match="ends with an assistant turn"):
        r.start(msgs[:2])


def test_context_turns_with_a_non_prefix_preserving_template(tok):
    tok = train_tokenizer(chat_template=DROP_THINK_TEMPLATE)
    r = ChatRenderer(tok)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think> hmm </think> hello"},
            {"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "<think> add </think> 5"}]
    (only,) = r.render_samples(msgs, context=3)  # the context's own sample has nothing to train: dropped
    assert only.ids == r.template_ids(msgs)
    assert tok.decode(only.tokens_of(Owner.POLICY)) == "<think> add </think> 5<|im_end|>"


def test_renderings_are_cached_per_conversation_including_tool_calls(tok):
    # the renderer caches template renderings keyed by each message's fields; a tool call (a list,
    # not a str) is keyed by its JSON, so a conversation that differs only there renders anew
    r = ChatRenderer(tok, tools=TOOLS)
    other = {"type": "function", "function": {"name": "run_tests", "arguments": {"path": "other.py"}}}
    changed = CONVERSATION[:2] + [{**CONVERSATION[2], "tool_calls": [other]}] + CONVERSATION[3:]
    first, second = r.render(CONVERSATION), r.render(changed)
    assert first.ids == r.template_ids(CONVERSATION) and second.ids == r.template_ids(changed)
    assert "other.py" in tok.decode(second.ids) and "other.py" not in tok.decode(first.ids)


def test_episodes_from_one_opening_share_no_state(tok):
    # a group's episodes start from the same messages (the second start is served from the renderer's
    # cache); each transcript then grows on its own, and its memo of renderings stays its own
    r = ChatRenderer(tok)
    opening = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is 2 + 3?"}]
    a, b = r.start(opening), r.start(opening)
    assert ((a.traj.ids, a.traj.owners) == (b.traj.ids, b.traj.owners)
            and r.prompt_ids(b) == r.generation_prompt(opening))
    tokens = tok("5", add_special_tokens=False)["input_ids"] + [r.stop_ids[0]]
    r.append_sampled(a, tokens, [-1.0] * len(tokens), 0)
    r.append_message(a, {"role": "tool", "content": "ok"}, 0)
    after = opening + [{"role": "assistant", "content": "5"}, {"role": "tool", "content": "ok"}]
    assert r.prompt_ids(a) == r.generation_prompt(after)
    assert r.prompt_ids(b) == r.generation_prompt(opening) and len(b.traj) < len(a.traj)
    assert r.start(opening).traj.ids == b.traj.ids
