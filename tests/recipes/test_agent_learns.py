"""The example agent of issue 42 (examples/openai_agent.py, the `openai` client in a tool-using loop) and its learning
script (examples/agent_learns.py): the agent's loop against the endpoint with a scripted model (its reward, its
episode's owners), and (slow) the script end to end, reduced: make -> SFT -> measure -> GRPO -> measure."""

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("openai")

from trajtune.engine import make_engine  # noqa: E402
from trajtune.engine.decoding import Samples  # noqa: E402
from trajtune.models.hf import load_policy, load_tokenizer  # noqa: E402
from trajtune.models.hf_random import make_random_model  # noqa: E402
from trajtune.sources.base import Draw  # noqa: E402
from trajtune.sources.data import PromptTask  # noqa: E402
from trajtune.sources.endpoint.agents import AgentSource  # noqa: E402
from trajtune.sources.sampler import SamplerSettings, engine_sampler  # noqa: E402
from trajtune.text.tool_calls import parse_tool_calls  # noqa: E402
from trajtune.trajectory import Outcome, Owner, collate  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

import agent_learns  # noqa: E402
import openai_agent  # noqa: E402


class Scripted:
    """A sampler that answers each request with the next scripted text (its tokens, the stop token appended)."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.settings = tokenizer, list(replies), SamplerSettings(64)
        self.stop = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def sample(self, prompts, stop_ids, seeds, max_new_tokens=None):
        out = [self.tokenizer(self.replies.pop(0), add_special_tokens=False)["input_ids"] + [self.stop]
               for _ in prompts]
        return Samples(out, [[-0.5] * len(t) for t in out], [True] * len(out))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(make_random_model(tmp_path_factory.mktemp("agent") / "m", "qwen2", "tiny"))


def task(a, b):
    row = openai_agent.task_row(a, b)
    return PromptTask(f"{a}+{b}", row["prompt"], {"answer": row["answer"]})


@pytest.mark.parametrize("replies, reward", [
    (['<tool_call>{"name": "add", "arguments": {"a": 23, "b": 45}}</tool_call>', "68"], 1.0),
    (['<tool_call>{"name": "add", "arguments": {"a": 23, "b": 44}}</tool_call>', "67"], 0.0),  # a wrong call
    (["68"], 1.0),  # no tool: the answer is what counts (the reward is not shaped)
    (["23 + 45 = 68."], 1.0), (["68 is 23 + 45"], 0.0),  # the reply's last integer is its answer
    (['<tool_call>{"name": "add", "arguments": {"a": "x"}}</tool_call>', "68"], 1.0),  # the tool's error text back
])
def test_the_agent_loop_through_the_endpoint(tokenizer, replies, reward):
    source = AgentSource(Scripted(tokenizer, replies), tokenizer, openai_agent.run, max_turns=4, max_tokens=1024)
    with source:
        [traj] = source.take(Draw([task(23, 45)], 1, torch.Generator().manual_seed(0))).trajs
    assert traj.outcome == Outcome.OK and traj.reward == reward
    policy = tokenizer.decode(traj.tokens_of(Owner.POLICY))
    assert policy == "<|im_end|>".join(replies) + "<|im_end|>"  # the sampled turns, nothing else trained
    tool = tokenizer.decode(traj.tokens_of(Owner.TOOL))
    if len(replies) == 1:
        assert tool == ""
    else:
        args = parse_tool_calls(replies[0])[0][0].arguments
        expected = str(args["a"] + args["b"]) if "b" in args else "error: add takes two integers a and b"
        assert tool == expected  # the agent's tool result, owned by the tool


def test_the_agent_gives_up_at_the_turn_limit(tokenizer):
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    source = AgentSource(Scripted(tokenizer, [call] * 2), tokenizer, openai_agent.run, max_turns=2, max_tokens=1024)
    with source:
        [traj] = source.take(Draw([task(1, 2)], 1, torch.Generator().manual_seed(0))).trajs
    assert traj.reward == 0.0 and traj.outcome == Outcome.OK and traj.info["stop_reason"] == "max_turns"


@pytest.mark.slow  # ~30 s: a short SFT, two measurements and two GRPO steps through the CLI
def test_the_learning_script_end_to_end_reduced(tmp_path):
    out = agent_learns.main(["--out", str(tmp_path), "--sft-steps", "300", "--demos", "512", "--tool-share", "1",
                             "--heldout", "8", "--samples", "2", "--grpo-steps", "2", "--tasks-per-step", "2",
                             "--group-size", "4"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["before"]["episodes"] == summary["after"]["episodes"] == 16
    assert summary["before"]["tool_called"] > 0.5  # SFT taught the call format
    assert [c.split()[1] for c in summary["commands"]] == ["sft", "grpo"] and out["change"] == summary["change"]
    rows = [json.loads(x) for x in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "agent/turns" in r]
    assert len(steps) == 2 and all(r["agent/error_share"] == 0.0 and r["agent/turns"] > 1 for r in steps)
    assert (tmp_path / "grpo" / "report.md").is_file() and (tmp_path / "grpo" / "model").is_dir()
    # the SFT'd model's episodes: tool calls sampled, TOOL-owned results, POLICY tokens as sampled
    model = tmp_path / "sft" / "model"
    tok = load_tokenizer(model)
    engine = make_engine(load_policy(model))
    sampler = engine_sampler(engine, SamplerSettings(40), pad_id=tok.pad_token_id)
    with AgentSource(sampler, tok, openai_agent.run, max_turns=4, max_tokens=1024) as source:
        trajs = source.take(Draw([task(23, 45), task(71, 18)], 2, torch.Generator().manual_seed(1))).trajs
    called = [t for t in trajs if Owner.TOOL in t.owners]
    assert called and all(t.outcome == Outcome.OK for t in trajs)
    for t in called:
        first_turn = tok.decode([i for i, o, k in zip(t.ids, t.owners, t.turns) if o == Owner.POLICY and k == 0])
        assert parse_tool_calls(first_turn.removesuffix("<|im_end|>"))[0]  # the model wrote a call ...
        assert tok.decode(t.tokens_of(Owner.TOOL)).strip().lstrip("-").isdigit() or "error" in \
            tok.decode(t.tokens_of(Owner.TOOL))  # ... and the tool's answer is the tool's
    batch = collate(trajs, tok.pad_token_id)
    with torch.no_grad():
        trainer = engine.forward(batch).logprobs
    mask = batch.action_mask > 0
    assert torch.allclose(trainer[mask], batch.old_logprobs[mask], atol=1e-4)  # the trained ids are the sampled ids


@pytest.mark.slow  # ~3-4 min: the default run (docs/agents.md, "An agent that learns")
def test_the_default_run_raises_held_out_success(tmp_path):
    out = agent_learns.main(["--out", str(tmp_path)])
    # seeds 0, 1, 2 rose by +0.389, +0.154, +0.486 (paired s.e. ~0.02): a margin, not the number
    assert out["change"] > 0.1 and out["change"] > 4 * out["change_se"]
    assert out["after"]["tool_called"] > out["before"]["tool_called"] + 0.2
