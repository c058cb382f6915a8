"""Function calling (book ch.13): several calls per turn, ids, dispatch that never raises, truncation, exact match,
and the orchestration loop as an environment."""

import pytest

from trajtune.envs.tools import (Tool, ToolCall, ToolEnv, call_match, dispatch, parse_tool_calls, schema_errors,
                                 truncate)

SEARCH = Tool("search_movies", lambda title, year=None: f"found {title} ({year})",
              {"type": "object", "properties": {"title": {"type": "string"}, "year": {"type": "integer"}},
               "required": ["title"]})
ADD = Tool("add", lambda a, b: a + b, {"type": "object",
                                       "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                                       "required": ["a", "b"]})


def test_json_calls_several_per_turn():
    text = ('I will look. <tool_call>{"name": "search_movies", "arguments": {"title": "Star Wars"}}</tool_call>'
            '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}", "id": "c9"}</tool_call>')
    calls, errors = parse_tool_calls(text)
    assert calls == [ToolCall("search_movies", {"title": "Star Wars"}), ToolCall("add", {"a": 1, "b": 2}, "c9")]
    assert errors == []
    bad, errs = parse_tool_calls('<tool_call>{"name": "add", "arguments": {</tool_call><tool_call>[1]</tool_call>')
    assert bad == [] and len(errs) == 2 and "not valid JSON" in errs[0]
    assert parse_tool_calls("just an answer") == ([], [])
    assert parse_tool_calls('[{"name": "add", "arguments": {"a": 1, "b": 1}}]')[0][0].name == "add"


def test_python_calls_are_parsed_not_run():
    calls, errors = parse_tool_calls('search_movies("Star Wars", year=1977)\n__import__("os").system("x")', "python")
    assert calls == [ToolCall("search_movies", {"arg0": "Star Wars", "year": 1977})]
    assert "not a call of a named function" in errors[0]
    messages, failed = dispatch(calls, {"search_movies": SEARCH})
    assert messages[0]["content"] == "found Star Wars (1977)" and failed == []
    with pytest.raises(ValueError, match="syntax must be"):
        parse_tool_calls("x", "yaml")


def test_dispatch_ids_errors_and_truncation():
    calls = [ToolCall("add", {"a": 2, "b": 3}), ToolCall("nope", {}), ToolCall("add", {"a": "2"}, "mine"),
             ToolCall("add", {"a": 1, "b": 0.5})]
    messages, failed = dispatch(calls, {"add": ADD}, turn=4)
    assert [m["tool_call_id"] for m in messages] == ["call_4_0", "call_4_1", "mine", "call_4_3"]
    assert messages[0] == {"role": "tool", "tool_call_id": "call_4_0", "name": "add", "content": "5"}
    assert "unknown tool 'nope'" in messages[1]["content"]
    assert "missing required argument 'b'" in messages[2]["content"] and "must be number" in messages[2]["content"]
    assert messages[3]["content"] == "1.5" and len(failed) == 2
    boom = Tool("boom", lambda: 1 / 0)
    assert "raised ZeroDivisionError" in dispatch([ToolCall("boom", {})], {"boom": boom})[0][0]["content"]
    long = "x" * 50 + "y" * 50
    cut = truncate(long, 20)
    assert cut.startswith("x" * 10) and cut.endswith("y" * 10) and "[... 80 characters cut ...]" in cut
    assert truncate("short", 20) == "short"


def test_schema_and_exact_match():
    assert schema_errors({"title": "a", "year": True}, SEARCH.parameters) == [
        "argument 'year' must be integer, got bool"]
    assert schema_errors({"title": "a", "genre": "x"}, SEARCH.parameters) == [
        "unknown argument 'genre' (expected title, year)"]
    expected = [ToolCall("search_movies", {"title": "Star Wars"})]
    assert call_match([ToolCall("search_movies", {"title": "Star Wars"}, "id1")], expected) == {"name": 1.0,
                                                                                                "arguments": 1.0}
    assert call_match([ToolCall("search_movies", {"title": "star wars"})], expected) == {"name": 1.0, "arguments": 0.0}
    assert call_match([], expected) == {"name": 0.0, "arguments": 0.0}


class Sum:
    name = "sum-2-3"
    prompt = "What is 2 + 3? Use the add tool."

    def check(self, answer):
        return float(answer.strip() == "5")


def test_the_orchestration_loop():
    env = ToolEnv([ADD])
    assert env.reset(Sum()) == Sum.prompt
    obs = env.step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')
    assert obs.observation == "[call_0_0] add: 5" and not obs.done and obs.info["n_calls"] == 1
    bad = env.step("<tool_call>{oops</tool_call>")
    assert bad.info["n_invalid"] == 1 and not bad.done
    final = env.step("5")
    assert final.done and final.reward == 1.0
