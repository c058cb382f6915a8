"""Dataset formats TRL users have -> trajectories, pairs and prompt tasks; malformed rows name line and field."""

import json

import pytest

pytest.importorskip("transformers")

from trajtune import data as D  # noqa: E402
from trajtune.models.hf_random import train_tokenizer  # noqa: E402
from trajtune.text.chat import ChatRenderer  # noqa: E402
from trajtune.trajectory import Owner  # noqa: E402


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer(train_tokenizer())


def _jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _policy_text(renderer, traj):
    return renderer.tokenizer.decode(traj.tokens_of(Owner.POLICY))


def test_messages_and_prompt_completion_render_the_same(renderer, tmp_path):
    rows = D.read_rows(_jsonl(tmp_path / "d.jsonl", [
        {"messages": [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"}]},
        {"prompt": "2+3?", "completion": "5"},
        {"prompt": [{"role": "user", "content": "2+3?"}], "completion": [{"role": "assistant", "content": "5"}]},
    ]))
    a, b, c = D.sft_trajectories(rows, renderer)
    assert a.ids == b.ids == c.ids and a.owners == b.owners
    assert _policy_text(renderer, a) == "5<|im_end|>"


def test_preference_explicit_and_implicit_prompt(renderer, tmp_path):
    prompt = [{"role": "user", "content": "2+3?"}]
    rows = D.read_rows(_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "2+3?", "chosen": "5", "rejected": "6"},
        {"prompt": prompt, "chosen": [{"role": "assistant", "content": "5"}], "rejected": [{"role": "assistant", "content": "6"}]},
        {"chosen": prompt + [{"role": "assistant", "content": "5"}], "rejected": prompt + [{"role": "assistant", "content": "6"}]},
    ]))
    pairs = D.preference_pairs(rows, renderer)
    assert len({(tuple(c.ids), tuple(r.ids)) for c, r in pairs}) == 1  # three spellings, one pair
    chosen, rejected = pairs[0]
    assert _policy_text(renderer, chosen) == "5<|im_end|>" and _policy_text(renderer, rejected) == "6<|im_end|>"


def test_prompt_rows_and_reward_function_from_a_file(tmp_path):
    (tmp_path / "my_rewards.py").write_text(
        "def exact(prompts, completions, answer, **kw):\n"
        "    return [float(c == a) for c, a in zip(completions, answer)]\n")
    rows = D.read_rows(_jsonl(tmp_path / "q.jsonl", [{"prompt": "2+3?", "answer": "5"}]))
    (task,) = D.prompt_tasks(rows)
    verify = D.reward_verifier(D.load_reward_function(f"{tmp_path / 'my_rewards.py'}:exact"))
    assert verify(task, "5") == (1.0, {}) and verify(task, "6") == (0.0, {})
    with pytest.raises(D.DataError, match="module:function"):
        D.load_reward_function("no_colon")
    with pytest.raises(D.DataError, match="no callable 'missing'"):
        D.load_reward_function(f"{tmp_path / 'my_rewards.py'}:missing")


def test_datasets_objects_are_accepted(renderer):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"prompt": "2+3?", "completion": "5"}])
    (traj,) = D.sft_trajectories(D.read_rows(ds), renderer)
    assert _policy_text(renderer, traj) == "5<|im_end|>"


@pytest.mark.parametrize("bad, message", [
    ('{"prompt": "x", "chosen": "a"}', r"d.jsonl:2: missing field 'rejected'"),
    ('{"messages": [{"role": "robot", "content": "x"}]}', r"d.jsonl:2: field 'messages'\[0\].role is 'robot'"),
    ('{"messages": "hello"}', r"d.jsonl:2: the conversation has no assistant message"),
    ('{"prompt": 3, "completion": "a"}', r"d.jsonl:2: field 'prompt' must be a string or a non-empty list"),
    ("not json", r"d.jsonl:2: not valid JSON"),
    ('{"text": "x"}', r"d.jsonl:2: cannot tell the format"),
    ('{"prompt": "x", "completion": ""}', r"d.jsonl:2: field 'completion' is empty \(''\)"),
    ('{"prompt": " \\n", "completion": "a"}', r"d.jsonl:2: field 'prompt' is empty"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": " "}]}',
     r"d.jsonl:2: field 'messages'\[1\].content is empty \(' '\): an empty assistant turn"),
    ('{"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "a"}]}',
     r"d.jsonl:2: field 'messages'\[0\].content is empty \(''\): an empty user message"),
    ('{"prompt": "x", "chosen": "", "rejected": "b"}', r"d.jsonl:2: field 'chosen' is empty"),
    ('{"chosen": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a"}], '
     '"rejected": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]}',
     r"d.jsonl:2: field 'rejected'\[1\].content is empty"),
])
def test_malformed_row_names_line_and_field(renderer, tmp_path, bad, message):
    good = {"prompt": "2+3?", "chosen": "5", "rejected": "6"} if "chosen" in bad else {"prompt": "a", "completion": "b"}
    path = _jsonl(tmp_path / "d.jsonl", [good, bad])
    with pytest.raises(D.DataError, match=message):
        rows = D.read_rows(path)
        (D.preference_pairs if "chosen" in bad else D.sft_trajectories)(rows, renderer)


def test_empty_system_and_tool_messages_and_tool_calls_are_allowed(renderer, tmp_path):
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]}
    rows = D.read_rows(_jsonl(tmp_path / "d.jsonl", [{"messages": [
        {"role": "system", "content": ""}, {"role": "user", "content": "x"}, call,
        {"role": "tool", "content": ""}, {"role": "assistant", "content": "done"}]}]))
    assert D.sft_trajectories(rows, renderer)


def test_wrong_format_for_the_command(renderer, tmp_path):
    rows = D.read_rows(_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}]))
    with pytest.raises(D.DataError, match="d.jsonl:1: a 'completion' row, but this command needs 'preference'"):
        D.preference_pairs(rows, renderer)
