"""A verifiers environment trains through the endpoint (issue 42, item 6): `trajtune grpo --data ROWS --agent
FILE:run` on a tiny random Qwen2 model, the agent `verifiers_agent` over a `vf.SingleTurnEnv` whose rubric logs what
it scored. Two GRPO steps: every episode's reward is the rubric's score of exactly the text the policy's recorded
(trained) token ids decode to, each step's mean reward is the rubric's, and the weights move.

Marker `verifiers`; skipped, naming the install command, where the verifiers package is absent."""

import json

import pytest
import torch

from trajtune.sources.endpoint.verifiers import INSTALL

pytest.importorskip("transformers")
pytest.importorskip("verifiers", reason=f"needs the verifiers package: {INSTALL}")

from safetensors.torch import load_file  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from trajtune.cli import main  # noqa: E402
from trajtune.metrics import read_metrics  # noqa: E402
from trajtune.models.hf_random import make_random_model  # noqa: E402
from trajtune.trajectory import Owner  # noqa: E402

pytestmark = pytest.mark.verifiers

AGENT = '''
import json
import os

import verifiers as vf
from datasets import Dataset

from trajtune.sources.endpoint.verifiers import verifiers_agent


def load_environment(n=4):
    rows = [{"question": f"what is {i}+5?", "answer": str(i + 5)} for i in range(n)]

    async def length(completion, answer) -> float:  # a reward that varies with the sampled text
        text = str(completion[-1].content) if completion else ""
        reward = min(1.0, len(text) / 40)
        with open(os.environ["RUBRIC_LOG"], "a") as f:
            f.write(json.dumps({"text": text, "reward": reward}) + "\\n")
        return reward

    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[length]))


env = load_environment()
run = verifiers_agent(env)
'''


def test_a_verifiers_environment_trains_for_two_grpo_steps_through_the_endpoint(tmp_path, monkeypatch):
    model = make_random_model(tmp_path / "model", "qwen2", "tiny")
    (tmp_path / "vf_adding.py").write_text(AGENT)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RUBRIC_LOG", str(tmp_path / "rubric.jsonl"))
    import vf_adding

    vf_adding.env.get_dataset().to_json(str(tmp_path / "rows.jsonl"))  # the command's prompt rows: the env's rows
    out = tmp_path / "out"
    assert main(["grpo", "--model", str(model), "--data", str(tmp_path / "rows.jsonl"),
                 "--agent", f"{tmp_path / 'vf_adding.py'}:run", "--steps", "2", "--prompts-per-step", "2",
                 "--group-size", "4", "--max-new-tokens", "8", "--lr", "1e-3", "--out", str(out)]) == 0

    rows = read_metrics(out)
    scored = [json.loads(line) for line in (tmp_path / "rubric.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and len(scored) == 2 * 2 * 4  # every episode of both steps went through the rubric
    for step, row in enumerate(rows):
        assert row["agent/error_share"] == 0.0 and row["agent/turns"] == 1.0
        assert row["rollout/reward"] == pytest.approx(sum(s["reward"] for s in scored[8 * step:8 * step + 8]) / 8)
        assert torch.isfinite(torch.tensor(row["train/loss"]))
    assert len({s["reward"] for s in scored}) > 1  # the groups carried signal: the loss saw non-zero advantages

    # the recorded episodes: the POLICY ids the trainer trained on decode to the text the rubric scored
    tokenizer = AutoTokenizer.from_pretrained(model)
    stops = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    episodes = [json.loads(line) for line in (out / "grpo" / "episodes.jsonl").read_text().splitlines()]
    assert episodes and {e["step"] for e in episodes} == {1, 2}
    pairs = {(s["text"], s["reward"]) for s in scored}
    for e in episodes:
        sampled = [i for i, owner in zip(e["ids"], e["owners"], strict=True) if owner == Owner.POLICY]
        sampled = sampled[:-1] if sampled[-1] in stops else sampled  # the turn's end: not in the reply's text
        assert (tokenizer.decode(sampled), e["reward"]) in pairs
        assert e["outcome"] == "ok" and e["task"].startswith("row")

    before, after = load_file(model / "model.safetensors"), load_file(out / "model" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
