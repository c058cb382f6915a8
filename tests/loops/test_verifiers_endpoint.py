"""A verifiers tool environment through the real endpoint (trajtune.sources.endpoint): `AgentSource` runs
`verifiers_agent(vf.ToolEnv)`, the sampler scripted with token ids the tokenizer would never choose (one id per
character), so the episode shows that what verifiers sends back (its own message dicts: `reasoning_content: null`,
its tool-call ids, `strict` tool schemas, `max_completion_tokens`) continues the recorded tokens exactly: the POLICY
ids are the scripted ids, the tool's result is the TOOL turn, and the reward is the rubric's.

Marker `verifiers`; skipped, naming the install command, where the verifiers package is absent."""

import pytest
import torch

from trajtune.sources.endpoint.verifiers import INSTALL

pytest.importorskip("transformers")
pytest.importorskip("openai")
vf = pytest.importorskip("verifiers", reason=f"needs the verifiers package: {INSTALL}")

from test_endpoint import Scripted, char_ids, tokenizer, model_dir  # noqa: E402,F401 - fixtures by name
from test_verifiers_adapter import adding_env  # noqa: E402

from trajtune.sources.base import Draw  # noqa: E402
from trajtune.sources.endpoint.agents import AgentSource  # noqa: E402
from trajtune.sources.endpoint.verifiers import verifiers_agent, verifiers_tasks  # noqa: E402
from trajtune.trajectory import Outcome, Owner  # noqa: E402

pytestmark = pytest.mark.verifiers


def test_a_verifiers_tool_environment_keeps_the_sampled_ids_and_the_rubric_reward(tokenizer):  # noqa: F811
    env = adding_env(vf)
    tasks = verifiers_tasks(env)
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    first, second = char_ids(tokenizer, call), char_ids(tokenizer, "The answer is 5")
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for task, reward in ((tasks[0], 1.0), (tasks[1], 0.0)):  # the same replies: 2+3 is right, 4+4 is not
        sampler = Scripted([first, second], stop)
        with AgentSource(sampler, tokenizer, verifiers_agent(env), max_turns=4, max_tokens=512) as source:
            out = source.take(Draw([task], 1, torch.Generator().manual_seed(0), step=0))
        (traj,) = out.trajs
        assert traj.outcome is Outcome.OK and traj.reward == reward, traj.info
        assert traj.info["task"] == task.name and traj.info["n_turns"] == 2
        assert "history_edited" not in traj.info and out.metrics["agent/error_share"] == 0.0
        assert [i for i, o in zip(traj.ids, traj.owners) if o == Owner.POLICY] == first + [stop] + second + [stop]
        assert tokenizer.decode([i for i, o in zip(traj.ids, traj.owners) if o == Owner.TOOL]) == "5"
        p1, p2 = sampler.prompts
        assert p2[:len(p1) + len(first) + 1] == p1 + first + [stop]  # the second request continues the first
        assert "add" in tokenizer.decode(p1)  # the environment's tool was rendered into the prompt


def test_the_endpoints_turn_limit_cuts_a_verifiers_rollout_with_reward_zero(tokenizer):  # noqa: F811
    env = adding_env(vf)
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    first, stop = char_ids(tokenizer, call), tokenizer.convert_tokens_to_ids("<|im_end|>")
    # one reply allowed: the rollout's second request (after the tool's result) is refused (400 turn_limit), the
    # adapter raises it, and AgentSource keeps the cut episode (the policy's tokens so far) with reward 0
    with AgentSource(Scripted([first], stop), tokenizer, verifiers_agent(env), max_turns=1, max_tokens=512) as source:
        out = source.take(Draw(verifiers_tasks(env)[:1], 1, torch.Generator().manual_seed(0), step=0))
    (traj,) = out.trajs
    assert traj.outcome is Outcome.OK and traj.reward == 0.0 and traj.info["stop_reason"] == "max_turns"
    assert [i for i, o in zip(traj.ids, traj.owners) if o == Owner.POLICY] == first + [stop]
    assert out.metrics["agent/cut_share"] == 1.0
