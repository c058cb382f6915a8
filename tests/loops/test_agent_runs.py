"""`trajtune grpo --agent FILE.py:FUNCTION`: an agent program's sessions with the run's endpoint as the RL loop's
episodes -- the same numbers twice, overlapped one update behind (sync checked, every token's version), scored by
--reward functions when the agent returns None, and the refusals."""

import json
import textwrap

import pytest

pytest.importorskip("transformers")
pytest.importorskip("openai")

from trajtune.cli import main  # noqa: E402
from trajtune.models.hf_random import make_random_model  # noqa: E402

AGENT = textwrap.dedent('''
    import openai

    def run(task, base_url, session):
        """Two turns; the reward is the parity of the replies' length (varied: every group has a signal)."""
        client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0)
        messages = [{"role": "user", "content": task.prompt}]
        text = ""
        for _ in range(2):
            reply = client.chat.completions.create(model="policy", messages=messages).choices[0].message
            text += reply.content or ""
            messages += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": "and?"}]
        return float(len(text) % 2)

    def unscored(task, base_url, session):
        client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0)
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task.prompt}])
        return None
    ''')

REWARD = "def short(prompts, completions, **kw):\n    return [float(len(c) < 12) for c in completions]\n"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("agent_runs")
    make_random_model(d / "model", "qwen2", "tiny")
    (d / "agent.py").write_text(AGENT)
    (d / "rewards.py").write_text(REWARD)
    (d / "tasks.jsonl").write_text("".join(json.dumps({"prompt": f"What is {a} + 1?", "answer": str(a + 1)}) + "\n"
                                           for a in range(8)))
    return d


def grpo(work, out, *extra):
    return main(["grpo", "--model", str(work / "model"), "--data", str(work / "tasks.jsonl"), "--steps", "3",
                 "--tasks-per-step", "2", "--group-size", "2", "--max-new-tokens", "6", "--lr", "1e-3",
                 "--out", str(out), *extra])


def rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def numbers(out):
    """Every metric but the clocks."""
    clock = ("time/", "perf/")
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith(clock) and "tok_per_s" not in k}
            for r in rows(out)]


def test_an_agent_run_gives_the_same_numbers_twice_and_trains(work, tmp_path):
    agent = ["--agent", f"{work / 'agent.py'}:run", "--max-turns", "3"]
    assert grpo(work, tmp_path / "a", *agent) == 0
    assert grpo(work, tmp_path / "b", *agent) == 0
    assert numbers(tmp_path / "a") == numbers(tmp_path / "b")
    last = rows(tmp_path / "a")[-1]
    assert last["agent/turns"] == 2 and last["agent/error_share"] == 0
    assert any(r["train/grad_norm"] > 0 for r in rows(tmp_path / "a"))


def test_an_overlapped_agent_run_samples_one_update_behind_with_checked_syncs(work, tmp_path):
    out = tmp_path / "o"
    assert grpo(work, out, "--agent", f"{work / 'agent.py'}:run", "--max-staleness", "1", "--tis-cap", "2") == 0
    r = rows(out)
    assert [x["staleness/mean"] for x in r] == [0.0, 1.0, 1.0]
    assert "sync/logprob_diff" in r[-1] and r[-1]["sync/logprob_diff"] < 1e-3


def test_the_reward_functions_score_an_agent_that_returns_none(work, tmp_path):
    out = tmp_path / "r"
    assert grpo(work, out, "--agent", f"{work / 'agent.py'}:unscored", "--reward", f"{work / 'rewards.py'}:short") == 0
    assert all("reward/short/mean" in x for x in rows(out))


def test_agent_refusals_are_one_line(work, tmp_path, capsys):
    assert grpo(work, tmp_path / "x", "--agent", f"{work / 'agent.py'}:nothing") == 2
    assert "has no function 'nothing'" in capsys.readouterr().err
    assert grpo(work, tmp_path / "y", "--agent", f"{work / 'agent.py'}:run", "--max-staleness", "1", "--tis-cap", "2",
                "--stale", "discard", "--tokens-per-update", "4") == 0
    capsys.readouterr()
    code = grpo(work, tmp_path / "z", "--agent", f"{work / 'agent.py'}:run", "--max-staleness", "1", "--tis-cap", "2",
                "--stale", "partial", "--tokens-per-update", "4")
    err = capsys.readouterr().err
    assert code == 2 and "partial" in err and "agent" in err and err.count("\n") == 1


def test_hf_generate_serves_an_agent_too(work, tmp_path):
    """--backend generate draws one stream per call (no per-row generators): the endpoint gives it one."""
    out = tmp_path / "g"
    assert grpo(work, out, "--agent", f"{work / 'agent.py'}:run", "--backend", "generate") == 0
    assert all(r["agent/turns"] == 2 and r["agent/error_share"] == 0 for r in rows(out))
