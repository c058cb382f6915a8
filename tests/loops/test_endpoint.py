"""The OpenAI-compatible endpoint (trajtune.sources.endpoint): sessions become episodes with the sampled ids kept
exactly, through the real `openai` client and plain HTTP; limits, failures and refusals; agents as a source."""

import json
import threading
import urllib.error
import urllib.request

import pytest
import torch

pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

from trajtune.config import ConfigError  # noqa: E402
from trajtune.engine import make_engine  # noqa: E402
from trajtune.engine.decoding import Samples  # noqa: E402
from trajtune.models.hf import load_policy, load_tokenizer  # noqa: E402
from trajtune.models.hf_random import make_random_model  # noqa: E402
from trajtune.sources.base import Draw  # noqa: E402
from trajtune.sources.endpoint.agents import AgentSource  # noqa: E402
from trajtune.sources.endpoint.server import Endpoint  # noqa: E402
from trajtune.sources.sampler import SamplerSettings, engine_sampler  # noqa: E402
from trajtune.trajectory import Outcome, Owner, collate  # noqa: E402

ADD = {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_random_model(tmp_path_factory.mktemp("endpoint") / "m", "qwen2", "tiny")


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def engine(model_dir):
    torch.manual_seed(0)
    return make_engine(load_policy(model_dir))


class Scripted:
    """A sampler that answers each call with the next scripted token ids (stop token appended): the ids are chosen,
    not drawn, so a test can give the endpoint a tokenization the tokenizer would never produce from the text."""

    def __init__(self, replies, stop_id, settings=SamplerSettings(32)):
        self.replies, self.stop_id, self.settings = list(replies), stop_id, settings
        self.prompts = []

    def sample(self, prompts, stop_ids, seeds, max_new_tokens=None):
        self.prompts += [list(p) for p in prompts]
        out = [list(self.replies.pop(0)) + [self.stop_id] for _ in prompts]
        return Samples(out, [[-0.5] * len(t) for t in out], [True] * len(out))


def char_ids(tokenizer, text):
    """`text` as one token per character: a valid tokenization the tokenizer itself would not choose."""
    return [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(c))[0] for c in text]


def test_a_tool_using_session_keeps_the_sampled_ids_through_the_openai_client(tokenizer):
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    first, second = char_ids(tokenizer, call), char_ids(tokenizer, "the answer is 5")
    assert first != tokenizer(call, add_special_tokens=False)["input_ids"]  # re-tokenizing would change them
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    sampler = Scripted([first, second], stop)
    with Endpoint(sampler, tokenizer, served=["policy"]) as endpoint:
        endpoint.open("e1", seed=1, version=7)
        client = openai.OpenAI(base_url=endpoint.base_url("e1"), api_key="-")
        messages = [{"role": "user", "content": "What is 2 + 3?"}]
        r1 = client.chat.completions.create(model="policy", messages=messages, tools=[ADD])
        calls = r1.choices[0].message.tool_calls
        assert r1.choices[0].finish_reason == "tool_calls" and calls[0].function.name == "add"
        assert json.loads(calls[0].function.arguments) == {"a": 2, "b": 3}
        messages += [r1.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": calls[0].id, "content": "5"}]
        r2 = client.chat.completions.create(model="policy", messages=messages, tools=[ADD])
        assert r2.choices[0].message.content == "the answer is 5" and r2.policy_version == 7
        session = endpoint.finish("e1")
        traj = endpoint.trajectory(session)
    # the second prompt continues the first prompt and the sampled ids, exactly
    p1, p2 = sampler.prompts
    assert p2[: len(p1) + len(first) + 1] == p1 + first + [stop]
    policy = [i for i, o in zip(traj.ids, traj.owners) if o == Owner.POLICY]
    assert policy == first + [stop] + second + [stop]
    assert traj.ids[: len(p2)] == p2 and traj.ids[len(p2):] == second + [stop]
    assert {v for v, o in zip(traj.versions, traj.owners) if o == Owner.POLICY} == {7}
    tool = tokenizer.decode([i for i, o in zip(traj.ids, traj.owners) if o == Owner.TOOL])
    assert tool == "5"
    assert session.edited_at is None and session.turns == 2


def test_an_edited_history_ends_the_recorded_episode_there(tokenizer):
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    sampler = Scripted([char_ids(tokenizer, "one"), char_ids(tokenizer, "two")], stop)
    with Endpoint(sampler, tokenizer) as endpoint:
        endpoint.open("e", seed=0)
        client = openai.OpenAI(base_url=endpoint.base_url("e"), api_key="-")
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "a"}])
        edited = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "ONE"},
                  {"role": "user", "content": "b"}]
        r = client.chat.completions.create(model="policy", messages=edited)
        assert r.choices[0].message.content == "two"  # still served
        session = endpoint.finish("e")
        traj = endpoint.trajectory(session)
    assert session.edited_at == 1 and session.actions == ["one"]
    assert tokenizer.decode(traj.tokens_of(Owner.POLICY)) == "one<|im_end|>"


def test_sampled_logprobs_match_the_trainer_and_plain_http_works(tokenizer, engine):
    sampler = engine_sampler(engine, SamplerSettings(8), pad_id=tokenizer.pad_token_id)
    with Endpoint(sampler, tokenizer) as endpoint:
        endpoint.open("h", seed=3)
        body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hello"}],
                           "logprobs": True, "return_token_ids": True}).encode()
        request = urllib.request.Request(endpoint.base_url("h") + "/chat/completions", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request) as response:
            out = json.loads(response.read())
        traj = endpoint.trajectory(endpoint.finish("h"))
    assert out["choices"][0]["token_ids"] == traj.tokens_of(Owner.POLICY)
    assert out["prompt_token_ids"] == traj.ids[: len(out["prompt_token_ids"])]
    batch = collate([traj], tokenizer.pad_token_id)
    with torch.no_grad():
        trainer = engine.forward(batch).logprobs[0]
    mask = batch.action_mask[0] > 0
    assert torch.allclose(trainer[mask], batch.old_logprobs[0][mask], atol=1e-4)


def test_refusals_are_openai_errors_naming_the_field(tokenizer):
    sampler = Scripted([], 0)
    with Endpoint(sampler, tokenizer, served=["policy"]) as endpoint:
        endpoint.open("r")
        client = openai.OpenAI(base_url=endpoint.base_url("r"), api_key="-", max_retries=0)
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="policy", messages=[{"role": "robot", "content": "x"}])
        assert e.value.body["param"].startswith("messages[0]")
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}],
                                           temperature=0.3)
        assert e.value.body["param"] == "temperature"
        plain = openai.OpenAI(base_url=endpoint.base_url(), api_key="-", max_retries=0)  # no session
        with pytest.raises(openai.BadRequestError):
            plain.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(ConfigError, match="cannot listen"):
            Endpoint(sampler, tokenizer, port=endpoint.port).start()
        request = urllib.request.Request(endpoint.base_url("r") + "/chat/completions", b"{not json",
                                         {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as http:
            urllib.request.urlopen(request)
        assert http.value.code == 400 and "error" in json.loads(http.value.read())


def test_the_turn_and_token_limits_end_an_episode(tokenizer):
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    sampler = Scripted([char_ids(tokenizer, "x")] * 3, stop)
    with Endpoint(sampler, tokenizer) as endpoint:
        endpoint.open("t", max_turns=2)
        client = openai.OpenAI(base_url=endpoint.base_url("t"), api_key="-", max_retries=0)
        messages = [{"role": "user", "content": "go"}]
        for _ in range(2):
            r = client.chat.completions.create(model="policy", messages=messages)
            messages += [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "user", "content": "again"}]
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="policy", messages=messages)
        assert e.value.body["code"] == "turn_limit"
        assert endpoint.finish("t").stop_reason == "max_turns"
        endpoint.open("b", max_tokens=10)
        client = openai.OpenAI(base_url=endpoint.base_url("b"), api_key="-", max_retries=0)
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "a long prompt"}])
        assert e.value.body["code"] == "context_length_exceeded"
        assert endpoint.finish("b").stop_reason == "token_budget"


class Task:
    def __init__(self, name, a, b):
        self.name, self.a, self.b = name, a, b


def test_agents_run_at_once_grouped_by_task_with_typed_failures(tokenizer, engine):
    sampler = engine_sampler(engine, SamplerSettings(6), pad_id=tokenizer.pad_token_id)

    def agent(task, base_url, session):
        if task.name == "raises":
            raise RuntimeError("the agent's own bug")
        client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0)
        messages = [{"role": "user", "content": f"{task.a} + {task.b}"}]
        for _ in range(2):
            r = client.chat.completions.create(model="policy", messages=messages)
            messages += [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "user", "content": "more"}]
        return float(len(r.choices[0].message.content or "") % 2)

    tasks = [Task("t0", 1, 2), Task("t1", 3, 4), Task("raises", 0, 0)]
    with AgentSource(sampler, tokenizer, agent, max_turns=4, max_tokens=512) as source:
        one = source.take(Draw(tasks, 2, torch.Generator().manual_seed(5), step=0))
        two = source.take(Draw(tasks, 2, torch.Generator().manual_seed(5), step=0))
    assert [t.group for t in one.trajs] == [0, 0, 1, 1, 2, 2]
    assert [t.outcome for t in one.trajs] == [Outcome.OK] * 4 + [Outcome.ENV_ERROR] * 2
    assert "RuntimeError: the agent's own bug" in one.trajs[-1].info["env_error"]
    assert all(t.info["n_turns"] == 2 and t.count(Owner.POLICY) for t in one.trajs[:4])
    assert one.metrics["agent/error_share"] == pytest.approx(2 / 6)
    # each episode samples from its own seed: the same draw gives the same tokens, whatever the threads' timing
    assert [t.ids for t in one.trajs] == [t.ids for t in two.trajs]


def test_an_agent_past_its_time_limit_is_an_env_error(tokenizer):
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    release = threading.Event()

    def slow(task, base_url, session):
        release.wait(5)
        return 1.0

    with AgentSource(Scripted([], stop), tokenizer, slow, timeout_s=0.3, max_fault_share=1.0) as source:
        out = source.take(Draw([Task("t", 0, 0)], 2, torch.Generator().manual_seed(0)))
        release.set()
    assert [t.outcome for t in out.trajs] == [Outcome.ENV_ERROR] * 2
    assert "TimeoutError" in out.trajs[0].info["env_error"]


def test_a_failing_sampler_stops_the_run_not_the_agents(tokenizer):
    """A sampler that fails (a weight sync that did not take) fails the agents' requests with 500, and the source
    raises that error: the run stops, it does not train on a batch of ENV_ERRORs."""
    from trajtune.sources.sync import SyncError

    class Broken:
        settings = SamplerSettings(4)

        def sample(self, prompts, stop_ids, seeds, max_new_tokens=None):
            raise SyncError("the sampler's weights did not change after a sync")

    def agent(task, base_url, session):
        client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0)
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
        return 1.0

    with AgentSource(Broken(), tokenizer, agent) as source:
        with pytest.raises(SyncError, match="did not change"):
            source.take(Draw([Task("t", 0, 0)], 2, torch.Generator().manual_seed(0)))


def test_an_async_agent_streaming_through_the_async_client(tokenizer, engine):
    sampler = engine_sampler(engine, SamplerSettings(6), pad_id=tokenizer.pad_token_id)
    texts = {}

    async def agent(task, base_url, session):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="-", max_retries=0)
        stream = await client.chat.completions.create(model="policy", stream=True,
                                                      messages=[{"role": "user", "content": task.name}])
        texts[session] = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        return 0.5

    with AgentSource(sampler, tokenizer, agent) as source:
        out = source.take(Draw([Task("a", 0, 0), Task("b", 0, 0)], 2, torch.Generator().manual_seed(1), step=3))
    assert [t.outcome for t in out.trajs] == [Outcome.OK] * 4 and [t.reward for t in out.trajs] == [0.5] * 4
    for t in out.trajs:  # what the agent read is what was sampled (without the stop token)
        assert t.info["actions"] == [texts[t.info["session"]]]
        assert {v for v, o in zip(t.versions, t.owners) if o == Owner.POLICY} == {3}


def test_a_completions_session_extends_by_text_and_by_token_ids(tokenizer):
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    first, second = char_ids(tokenizer, "abc"), char_ids(tokenizer, "de")
    sampler = Scripted([first, second, char_ids(tokenizer, "f")], stop)
    with Endpoint(sampler, tokenizer) as endpoint:
        endpoint.open("c")
        client = openai.OpenAI(base_url=endpoint.base_url("c"), api_key="-")
        r1 = client.completions.create(model="policy", prompt="Q: hi", extra_body={"return_token_ids": True})
        assert r1.choices[0].text == "abc"
        prompt_ids = tokenizer("Q: hi", add_special_tokens=False)["input_ids"]
        # by text: the recorded text (prompt + reply, stop token included) + new text; only the new text is tokenized
        client.completions.create(model="policy", prompt="Q: hi" + "abc<|im_end|>" + " more")
        assert sampler.prompts[1][: len(prompt_ids) + 4] == prompt_ids + first + [stop]
        # by ids: the recorded ids + new ids
        ids = sampler.prompts[1] + second + [stop] + [7, 8]
        client.completions.create(model="policy", prompt=ids)
        traj = endpoint.trajectory(endpoint.finish("c"))
    assert traj.tokens_of(Owner.POLICY) == first + [stop] + second + [stop] + char_ids(tokenizer, "f") + [stop]
    assert traj.ids[: len(ids)] == ids and traj.owners[: len(prompt_ids)] == [Owner.PROMPT] * len(prompt_ids)
    assert traj.owners[len(ids) - 2: len(ids)] == [Owner.TOOL] * 2


def test_trajtune_endpoint_serves_a_model_and_records_its_sessions(model_dir, tmp_path, monkeypatch):
    from trajtune.cli import build_parser
    from trajtune.cli.endpoint import cmd_endpoint

    record = tmp_path / "sessions.jsonl"
    args = build_parser().parse_args(["endpoint", "--model", str(model_dir), "--port", "0", "--max-new-tokens", "5",
                                      "--record", str(record), "--served-name", "tiny"])
    ready, stop, box = threading.Event(), threading.Event(), {}
    start = Endpoint.start
    monkeypatch.setattr(Endpoint, "start", lambda self: box.setdefault("endpoint", start(self)))  # (its port)
    thread = threading.Thread(target=lambda: box.setdefault("code", cmd_endpoint(args, ready, stop)))
    thread.start()
    try:
        assert ready.wait(60)
        client = openai.OpenAI(base_url=box["endpoint"].base_url("s1"), api_key="-")
        assert [m.id for m in client.models.list().data] == ["tiny"]
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                               temperature=0.5, max_tokens=3)  # a standalone server's own settings
        assert reply.usage.completion_tokens <= 3
    finally:
        stop.set()
        thread.join(30)
    assert box["code"] == 0
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert [r["session"] for r in rows] == ["s1"] and Owner.POLICY in rows[0]["owners"]
    with pytest.raises(ConfigError, match="exists"):  # a second run never overwrites the first one's record
        cmd_endpoint(args)


def test_each_agents_time_limit_runs_from_its_own_start(tokenizer):
    """concurrency 1: the second agent starts when the first ends, and its 0.5 s run from then (a limit shared from
    the draw's start would cut it)."""
    import time

    def steady(task, base_url, session):
        time.sleep(0.35)
        return 1.0

    with AgentSource(Scripted([], 0), tokenizer, steady, timeout_s=0.5, concurrency=1) as source:
        out = source.take(Draw([Task("t", 0, 0)], 2, torch.Generator().manual_seed(0)))
    assert [t.outcome for t in out.trajs] == [Outcome.OK] * 2
