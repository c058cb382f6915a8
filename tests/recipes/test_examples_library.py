"""The examples that put library modules to use (issue 40: no library module only tests use) run and show what
their docstrings say: audit_run.py (trajtune.audits), calculator_tool.py (trajtune.envs.tools),
classic_control.py (trajtune.envs.toy), preventative_steering.py (trajtune.models.steering)."""

import json

from trajtune.trajectory import Owner

from test_examples import load  # the examples loaded as modules, as their own test does


def test_calculator_tool_oracle_calls_the_tool_and_the_guesser_cannot():
    out = load("calculator_tool").main(n_tasks=10, verbose=False)
    assert out["oracle"] == 1.0 and out["guesser"] <= 0.2
    assert out["call_match"] == {"name": 1.0, "arguments": 1.0}
    assert Owner.TOOL in set(out["oracle_episode"].owners)  # the tool's reply, TOOL-owned: never trained on


def test_classic_control_the_books_policies_beat_random():
    out = load("classic_control").main(episodes=4, verbose=False)
    assert out["thermostat, the book's policy"] > 15 > 8 > out["thermostat, random"]
    assert out["cartpole, push toward the fall"] == 200.0 > 50 > out["cartpole, random"]


def test_audit_run_reads_a_runs_episodes(tmp_path, capsys):
    def row(step, i, text, reward):
        return {"stage": "rl", "step": step, "index": i, "ids": [1, 2, 2, 2], "owners": [1, 2, 2, 2], "reward": reward,
                "info": {"actions": [text]}}

    (tmp_path / "rl").mkdir()
    rows = [row(1, 0, "4", 1.0), row(1, 1, "five", 0.0),
            row(9, 0, "Certainly! 4 4 4 4 4 4", 1.0), row(9, 1, "Certainly! I apologize: five", 0.0)]
    (tmp_path / "rl" / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = load("audit_run").main(tmp_path)
    assert set(out) == {("rl", 1), ("rl", 9)}
    assert out[("rl", 1)]["certainly_opening"] == 0.0 and out[("rl", 9)]["certainly_opening"] == 1.0
    assert out[("rl", 9)]["apology"] == 0.5 and out[("rl", 9)]["repetition"] == 0.3  # (0.6 + 0) / 2
    assert out[("rl", 1)]["max_token_share"] == 1.0  # the POLICY ids [2, 2, 2]: one token all the way
    assert "certainly_opening" in capsys.readouterr().out


def test_preventative_steering_keeps_the_trait_out_and_the_screen_finds_it():
    out = load("preventative_steering").main(steps=30, verbose=False)
    shifts, losses = out["shifts"], out["losses"]
    assert shifts[0.0] > 1.0 and shifts[3.0] < 0.5 * shifts[0.0]  # +3.57 and +0.73 on seed 0
    assert all(last < first for first, last in losses.values())  # it still fits the data
    assert out["kept"] == [False, True, False, True]
