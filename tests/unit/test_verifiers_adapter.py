"""The verifiers adapter (trajtune/sources/endpoint/verifiers.py) against a canned OpenAI chat server: the requests a
verifiers environment's rollout sends through `verifiers_agent` (the session's base URL, the served model name, the
tools, the tool results fed back), the rubric's reward it returns, which failures are the policy's (scored) and which
raise (an ENV_ERROR episode), the tasks `verifiers_tasks` makes, and the one-line errors without verifiers.

The tests that run verifiers carry the `verifiers` marker (`.ci/run` installs it: `pip install -e '.[verifiers]'`)
and skip, saying that command, where it is absent."""

import asyncio
import json
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trajtune.sources.data import PromptTask
from trajtune.sources.endpoint.verifiers import (INSTALL, RolloutFailed, VerifiersError, VerifiersTask,
                                                 load_verifiers_env, verifiers_agent, verifiers_tasks)


def needs_verifiers():
    return pytest.importorskip("verifiers", reason=f"needs the verifiers package: {INSTALL}")


class ChatServer:
    """A canned OpenAI chat server on 127.0.0.1: `reply(body) -> (status, message or error payload)`; every
    request's (path, body) is kept in `seen`."""

    def __init__(self, reply):
        self.reply, self.seen = reply, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.seen.append((self.path, body))
                status, payload = server.reply(body)
                if status == 200:
                    finish = "tool_calls" if payload.get("tool_calls") else "stop"
                    payload = {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                               "choices": [{"index": 0, "message": {"role": "assistant", **payload},
                                            "finish_reason": finish}],
                               "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
                out = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def base_url(self, session):
        return f"http://127.0.0.1:{self.http.server_address[1]}/s/{session}/v1"

    def close(self):
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(reply):
        servers.append(ChatServer(reply))
        return servers[-1]
    yield start
    for s in servers:
        s.close()


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def correct(completion, answer) -> float:
    return 1.0 if completion and answer in str(completion[-1].content) else 0.0


def adding_env(vf):
    from datasets import Dataset

    rows = [{"question": "What is 2+3? Use the add tool.", "answer": "5", "info": {"a": 2, "b": 3}},
            {"question": "What is 4+4? Use the add tool.", "answer": "8", "info": {"a": 4, "b": 4}}]
    return vf.ToolEnv(dataset=Dataset.from_list(rows), tools=[add], rubric=vf.Rubric(funcs=[correct]), max_turns=4)


def tool_then(answer):
    """A canned policy: first the add tool on the task's numbers, then `answer` (a function of the tool's result)."""
    def reply(body):
        results = [m for m in body["messages"] if m["role"] == "tool"]
        if not results:
            return 200, {"content": None, "tool_calls": [{"id": "call-1", "type": "function", "function": {
                "name": "add", "arguments": json.dumps({"a": 2, "b": 3})}}]}
        return 200, {"content": answer(results[-1]["content"])}
    return reply


def play(agent, task, server, session):
    return asyncio.run(agent(task, server.base_url(session), session))


@pytest.mark.verifiers
def test_a_tool_environment_runs_through_the_session_url_and_returns_the_rubric_reward(serve):
    vf = needs_verifiers()
    env = adding_env(vf)
    tasks = verifiers_tasks(env)
    assert [t.name for t in tasks] == ["ToolEnv:0", "ToolEnv:1"]
    assert tasks[0].answer == "5" and tasks[0].info == {"a": 2, "b": 3}
    assert tasks[0].prompt == [{"role": "user", "content": "What is 2+3? Use the add tool."}]
    server = serve(tool_then(lambda result: f"The answer is {result}"))
    agent = verifiers_agent(env)
    assert play(agent, tasks[0], server, "ep-7") == 1.0
    assert [path for path, _ in server.seen] == ["/s/ep-7/v1/chat/completions"] * 2
    first, second = (body for _, body in server.seen)
    assert first["model"] == second["model"] == "policy"
    assert [t["function"]["name"] for t in first["tools"]] == ["add"]
    assert first["messages"] == [{"role": "user", "content": "What is 2+3? Use the add tool."}]
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "tool"]
    assert second["messages"][1]["tool_calls"][0]["function"]["name"] == "add"
    assert second["messages"][2] == {"role": "tool", "tool_call_id": "call-1", "content": "5"}
    # the second task's answer is 8: the same replies score 0 (the reward is the rubric's, per task)
    assert play(agent, tasks[1], server, "ep-8") == 0.0
    # a dataset row works as a task too; sampling_args go out with every request (OpenAI's names)
    agent = verifiers_agent(env, model="other", sampling_args={"max_tokens": 12, "temperature": 0.5})
    assert play(agent, dict(tasks[0].row), server, "ep-9") == 1.0
    body = server.seen[-1][1]
    assert body["model"] == "other" and body["max_completion_tokens"] == 12 and body["temperature"] == 0.5
    # a prompt row of `trajtune grpo --data FILE --agent ...`: its prompt and its columns are the row
    row = PromptTask("r", tasks[1].prompt, {"answer": "5", "info": {"a": 4, "b": 4}})
    assert play(verifiers_agent(env), row, server, "ep-10") == 1.0
    assert server.seen[-2][1]["messages"] == [{"role": "user", "content": "What is 4+4? Use the add tool."}]
    with pytest.raises(VerifiersError, match="is not a VerifiersTask, a dataset row or a prompt row"):
        play(agent, "4+4", server, "ep-11")


@pytest.mark.verifiers
def test_an_empty_reply_is_scored_and_a_refused_request_raises(serve):
    vf = needs_verifiers()
    env = adding_env(vf)
    task = verifiers_tasks(env)[0]
    agent = verifiers_agent(env)
    empty = serve(lambda body: (200, {"content": ""}))
    assert play(agent, task, empty, "e") == 0.0  # the policy said nothing: the rubric's 0, not a failure
    refused = serve(lambda body: (400, {"error": {"message": "session e2 reached its turn limit", "type":
                                                  "invalid_request_error", "param": None, "code": "turn_limit"}}))
    with pytest.raises(RolloutFailed, match="ToolEnv:0 .*session e2.*turn limit"):
        play(agent, task, refused, "e2")
    # the endpoint's token budget (OpenAI's context-length error): the rollout ends truncated and is scored
    budget = serve(lambda body: (400, {"error": {"message": "This model's maximum context length is 64 tokens",
                                                 "type": "invalid_request_error", "param": "messages",
                                                 "code": "context_length_exceeded"}}))
    assert play(agent, task, budget, "e3") == 0.0


@pytest.mark.verifiers
def test_environments_the_adapter_cannot_run_are_one_line_errors(tmp_path, monkeypatch):
    vf = needs_verifiers()
    from datasets import Dataset

    async def group_reward(completions, answers) -> list[float]:
        return [0.0 for _ in completions]
    rubric = vf.Rubric(funcs=[correct])
    rubric.add_reward_func(group_reward)
    grouped = vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": "q", "answer": "a"}]), rubric=rubric)
    assert grouped.requires_group_rollouts
    with pytest.raises(VerifiersError, match="scores groups of rollouts together"):
        verifiers_agent(grouped)
    with pytest.raises(VerifiersError, match="expected a verifiers Environment"):
        verifiers_agent(object())
    with pytest.raises(VerifiersError, match="split 'test': expected 'train' or 'eval'"):
        verifiers_tasks(adding_env(vf), split="test")
    with pytest.raises(VerifiersError, match="'no-such-env'.*pip install"):
        load_verifiers_env("no-such-env")
    # an installed environment: a module named after the id with load_environment(**args)
    (tmp_path / "tiny_adding.py").write_text(
        "import verifiers as vf\nfrom datasets import Dataset\n\n"
        "def load_environment(n=2):\n"
        "    rows = [{'question': f'{i}+1?', 'answer': str(i + 1)} for i in range(n)]\n"
        "    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[]))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    env = load_verifiers_env("tiny-adding", n=3)
    assert [t.name for t in verifiers_tasks(env)] == ["tiny-adding:0", "tiny-adding:1", "tiny-adding:2"]
    assert [t.answer for t in verifiers_tasks(env, n=2)] == ["1", "2"]


def test_without_verifiers_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers", None)  # import verifiers -> ImportError
    for call in (lambda: verifiers_tasks(object()), lambda: verifiers_agent(object()),
                 lambda: load_verifiers_env("x")):
        with pytest.raises(VerifiersError) as e:
            call()
        assert str(e.value) == f"the verifiers adapter needs the verifiers package: {INSTALL}"
    newer = types.ModuleType("verifiers")
    newer.__version__ = "0.4.0"  # the v1 stack only: no classic Environment
    monkeypatch.setitem(sys.modules, "verifiers", newer)
    with pytest.raises(VerifiersError, match=r"verifiers 0\.4\.0 is installed.*classic Environment API.*0\.2-0\.3"):
        verifiers_tasks(object())
    assert VerifiersTask("t", {"prompt": [], "answer": "1"}).answer == "1"
