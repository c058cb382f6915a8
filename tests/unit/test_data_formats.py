"""Dataset formats TRL users have -> trajectories, pairs and prompt tasks; malformed rows name line and field."""

import json

import pytest

pytest.importorskip("transformers")

from trajtune.sources import data as D  # noqa: E402
from trajtune.sources import rewards as R  # noqa: E402
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
        {"prompt": prompt, "chosen": [{"role": "assistant", "content": "5"}],
         "rejected": [{"role": "assistant", "content": "6"}]},
        {"chosen": prompt + [{"role": "assistant", "content": "5"}],
         "rejected": prompt + [{"role": "assistant", "content": "6"}]},
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
    verify = R.reward_verifier(R.load_reward_function(f"{tmp_path / 'my_rewards.py'}:exact"))
    assert verify(task, "5") == (1.0, {}) and verify(task, "6") == (0.0, {})
    with pytest.raises(R.RewardError, match="module:function"):
        R.load_reward_function("no_colon")
    with pytest.raises(R.RewardError, match="no callable 'missing'"):
        R.load_reward_function(f"{tmp_path / 'my_rewards.py'}:missing")


def test_datasets_objects_are_accepted(renderer):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"prompt": "2+3?", "completion": "5"}])
    (traj,) = D.sft_trajectories(D.read_rows(ds), renderer)
    assert _policy_text(renderer, traj) == "5<|im_end|>"


@pytest.mark.parametrize("bad, message", [
    ('{"prompt": "x", "chosen": "a"}', r"d.jsonl:2: missing field 'rejected'"),
    ('{"messages": [{"role": "robot", "content": "x"}]}', r"d.jsonl:2: field 'messages'\[0\].role is 'robot'"),
    ('{"messages": "hello"}', r"d.jsonl:2: field 'messages' is a string \('hello'\); it must be a list of"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', r"d.jsonl:2: the conversation has no assistant message"),
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
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]}
    rows = D.read_rows(_jsonl(tmp_path / "d.jsonl", [{"messages": [
        {"role": "system", "content": ""}, {"role": "user", "content": "x"}, call,
        {"role": "tool", "content": ""}, {"role": "assistant", "content": "done"}]}]))
    assert D.sft_trajectories(rows, renderer)


def test_wrong_format_for_the_command(renderer, tmp_path):
    rows = D.read_rows(_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}]))
    with pytest.raises(D.DataError, match="d.jsonl:1: a 'completion' row, but this command needs 'preference'"):
        D.preference_pairs(rows, renderer)


def _tables(tmp_path, rows):
    """The same rows in every on-disk form read_rows takes -> {name: path}."""
    datasets = pytest.importorskip("datasets")
    paths = {"jsonl": _jsonl(tmp_path / "d.jsonl", rows)}
    (tmp_path / "array.json").write_text("[\n" + ",\n\n".join(json.dumps(r) for r in rows) + "\n]\n")  # lines 2, 4
    paths["json array"] = tmp_path / "array.json"
    paths["json lines"] = _jsonl(tmp_path / "lines.json", rows)
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    paths["parquet"] = tmp_path / "d.parquet"
    ds.save_to_disk(str(tmp_path / "saved"))
    paths["save_to_disk"] = tmp_path / "saved"
    paths["arrow"] = next((tmp_path / "saved").glob("*.arrow"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "dict"))
    paths["DatasetDict, one split"] = tmp_path / "dict"
    return paths


def test_every_file_format_reads_the_same_rows(renderer, tmp_path):
    rows = [{"prompt": [{"role": "user", "content": f"2+{i}?"}],
             "completion": [{"role": "assistant", "content": str(2 + i)}]}
            for i in (3, 4)]
    paths = _tables(tmp_path, rows)
    expected = [t.ids for t in D.sft_trajectories(D.read_rows(paths["jsonl"]), renderer)]
    for name, path in paths.items():
        read = D.read_rows(path)
        assert [r.data for r in read] == rows, name
        assert [t.ids for t in D.sft_trajectories(read, renderer)] == expected, name
    assert [r.where for r in D.read_rows(paths["json array"])] == [f"{paths['json array']}:2",
                                                                   f"{paths['json array']}:4"]
    assert [r.where for r in D.read_rows(paths["parquet"])] == [f"{paths['parquet']} row 0",
                                                                f"{paths['parquet']} row 1"]


@pytest.mark.parametrize("name, content, message", [
    ("bad.jsonl", b'{"prompt": "a", "completion": "b"}\n{"prompt": "caf\xe9", "completion": "b"}\n',
     r"bad\.jsonl:2: not UTF-8 text \(byte b'\\xe9' at column 16\)"),
    ("bad.json", b'[\n {"prompt": "a", "completion": "b"},\n {"prompt": "a" "completion": "b"}\n]',
     r"bad\.json:3: not valid JSON \(Expecting ',' delimiter\) in element 1 of the JSON array"),
    ("bad.json", b'[{"prompt": "a", "completion": "b"},]',
     r"bad\.json:1: not valid JSON: a ',' after the last element"),
    ("bad.json", b'{\n "prompt": "a"\n}\n',
     r"bad\.json: one JSON value spread over several lines; expected JSON lines"),
    ("bad.json", b'[{"prompt": "a", "completion": "b"}, 3]',
     r"bad\.json:1: expected a JSON object \(one row\), got int"),
    ("bad.json", b'[{"prompt": "a", "completion": "b"},\n {"prompt": "a", "completion": ""}]',
     r"bad\.json:2: field 'completion' is empty"),
    ("bad.parquet", b"not parquet", r"bad\.parquet: not a readable \.parquet file"),
    ("empty.json", b"[]", r"empty\.json: no rows"),
])
def test_a_bad_file_names_file_line_and_field(renderer, tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(D.DataError, match=message):
        D.sft_trajectories(D.read_rows(path), renderer)


def test_a_bad_table_row_or_directory_names_it(renderer, tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": None}])
    ds.to_parquet(str(tmp_path / "d.parquet"))
    with pytest.raises(D.DataError, match=r"d\.parquet row 1: missing field 'completion'"):
        D.sft_trajectories(D.read_rows(tmp_path / "d.parquet"), renderer)
    (tmp_path / "notes").mkdir()
    with pytest.raises(D.DataError, match=r"notes: a directory, but not a dataset written by datasets' save_to_disk"):
        D.read_rows(tmp_path / "notes")
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(D.DataError, match=r"dict: a DatasetDict with splits \['test', 'train'\]; pass one split's "
                                          r"directory \(e\.g\. .*dict/train\)"):
        D.read_rows(tmp_path / "dict")
    with pytest.raises(D.DataError, match=r"missing\.jsonl: no such file or directory"):
        D.read_rows(tmp_path / "missing.jsonl")


def test_assistant_turns_in_a_prompt_are_context(renderer, tmp_path):
    """TRL's convention: a conversational prompt's assistant turns are never trained or scored -- in an
    explicit prompt, in the shared prefix of an implicit one, and in an SFT prompt/completion row."""
    prompt = [{"role": "user", "content": "what is 10 + 3?"}, {"role": "assistant", "content": "12"},
              {"role": "user", "content": "no, it is not."}]
    good, bad = [{"role": "assistant", "content": "13"}], [{"role": "assistant", "content": "14"}]
    rows = D.read_rows(_jsonl(tmp_path / "p.jsonl", [{"prompt": prompt, "chosen": good, "rejected": bad},
                                                      {"chosen": prompt + good, "rejected": prompt + bad}]))
    (c1, r1), (c2, r2) = D.preference_pairs(rows, renderer)
    assert (c1.ids, c1.owners, r1.ids) == (c2.ids, c2.owners, r2.ids)
    assert _policy_text(renderer, c1) == "13<|im_end|>" and _policy_text(renderer, r1) == "14<|im_end|>"
    (sft,) = D.sft_trajectories(D.read_rows(_jsonl(tmp_path / "s.jsonl", [{"prompt": prompt, "completion": good}])),
                                renderer)
    assert sft.ids == c1.ids and _policy_text(renderer, sft) == "13<|im_end|>"
    (task,) = D.prompt_tasks(D.read_rows(_jsonl(tmp_path / "q.jsonl", [{"prompt": prompt}])))
    assert renderer.prompt_ids(renderer.start(task.prompt)) == renderer.generation_prompt(prompt)
    only_context = {"prompt": prompt + good, "completion": [{"role": "user", "content": "thanks"}]}
    with pytest.raises(D.DataError, match=r"s2\.jsonl:1: field 'completion' has no assistant message to train on"):
        D.sft_trajectories(D.read_rows(_jsonl(tmp_path / "s2.jsonl", [only_context])), renderer)


ADD_TOOL = {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}
PLAIN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("template", ["native", "plain"])
def test_a_tools_column_renders_as_the_endpoint_renders_the_request(tmp_path, template):
    from trajtune.text.tool_calls import ToolFormat

    tok = train_tokenizer() if template == "native" else train_tokenizer(chat_template=PLAIN_TEMPLATE)
    call = {"id": "c0", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    messages = [{"role": "user", "content": "2 + 3?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c0", "content": "5"}, {"role": "assistant", "content": "5"}]
    [traj] = D.sft_trajectories(D.read_rows(_jsonl(tmp_path / "d.jsonl", [
        {"messages": messages, "tools": [ADD_TOOL]}])), ChatRenderer(tok))
    converted, tools = ToolFormat(tok).template_messages(messages, [ADD_TOOL])  # what the endpoint sends
    assert tok.decode(traj.ids) == tok.apply_chat_template(converted, tools=tools, tokenize=False)
    said = tok.decode(traj.tokens_of(Owner.POLICY))
    assert said == '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call><|im_end|>5<|im_end|>'
    assert tok.decode(traj.tokens_of(Owner.TOOL)) == "5"
    first = traj.owners.index(Owner.POLICY)
    assert '"description": "a + b"' in tok.decode(traj.ids[:first])  # the tool described in the prompt


def test_a_bad_tools_column_names_the_row(renderer, tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"messages": [{"role": "user", "content": "x"},
                                                       {"role": "assistant", "content": "y"}],
                                          "tools": [{"type": "function", "function": {}}]}])
    with pytest.raises(D.DataError, match=r"d.jsonl:1: tools\[0\]"):
        D.sft_trajectories(D.read_rows(path), renderer)
