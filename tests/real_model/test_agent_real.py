"""The example agent of issue 42 (examples/openai_agent.py: the `openai` client, an `add` tool) on the real model,
whose template has no tool calls: trajtune describes the tools in the system message and reads <tool_call> JSON
from the content. Its episodes through the endpoint are well formed, and one `trajtune grpo --agent` step runs."""

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("openai")

from test_hf_cli import _run  # noqa: E402 - main(args) == 0

from trajtune.engine import make_engine  # noqa: E402
from trajtune.metrics import read_metrics  # noqa: E402
from trajtune.models.hf import load_policy, load_tokenizer  # noqa: E402
from trajtune.sources.base import Draw  # noqa: E402
from trajtune.sources.data import PromptTask  # noqa: E402
from trajtune.sources.endpoint.agents import AgentSource  # noqa: E402
from trajtune.sources.sampler import SamplerSettings, engine_sampler  # noqa: E402
from trajtune.trajectory import Outcome, Owner, collate  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import openai_agent  # noqa: E402


def task(a, b):
    row = openai_agent.task_row(a, b)
    return PromptTask(f"{a}+{b}", row["prompt"], {"answer": row["answer"]})


def test_the_openai_agent_on_the_real_model(real_model, tmp_path):
    tok = load_tokenizer(real_model)
    engine = make_engine(load_policy(real_model))
    sampler = engine_sampler(engine, SamplerSettings(24), pad_id=tok.pad_token_id)
    with AgentSource(sampler, tok, openai_agent.run, max_turns=2, max_tokens=1024) as source:
        trajs = source.take(Draw([task(23, 45), task(71, 18)], 2, torch.Generator().manual_seed(0))).trajs
    assert len(trajs) == 4 and all(t.outcome == Outcome.OK and t.reward in (0.0, 1.0) for t in trajs)
    for t in trajs:
        prompt = tok.decode(t.ids[: t.owners.index(Owner.POLICY)])
        assert '"name": "add"' in prompt and "<tool_call>" in prompt  # the tools and the call format described
        assert t.tokens_of(Owner.POLICY)
    batch = collate(trajs, tok.pad_token_id)
    with torch.no_grad():
        trainer = engine.forward(batch).logprobs
    mask = batch.action_mask > 0
    assert torch.allclose(trainer[mask], batch.old_logprobs[mask], atol=1e-3)  # the trained ids are the sampled ids

    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps(openai_agent.task_row(a, b)) + "\n" for a, b in [(12, 34), (56, 21)]))
    out = tmp_path / "grpo"
    _run("grpo", "--model", str(real_model), "--data", str(data), "--agent", f"{ROOT}/examples/openai_agent.py:run",
         "--steps", "1", "--tasks-per-step", "2", "--group-size", "2", "--max-new-tokens", "24", "--max-turns", "2",
         "--out", str(out))
    [row] = [r for r in read_metrics(out) if "agent/turns" in r]
    assert row["agent/error_share"] == 0.0 and row["agent/turns"] >= 1 and (out / "report.md").is_file()
