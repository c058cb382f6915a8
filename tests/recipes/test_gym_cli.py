"""`trajtune gym ...` through add_gym_parser/run_gym, and `python -m trajtune.cli.gym`."""

import argparse
import re
import subprocess
import sys

import pytest

from trajtune.cli.gym import add_gym_parser, run_gym


def run(capsys, *argv):
    parser = argparse.ArgumentParser()
    add_gym_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["gym", *argv])
    assert args.func is run_gym
    code = run_gym(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def number(out, label):
    return float(re.search(rf"^{label}\s+([\d.]+)", out, re.M).group(1))


def test_bugfix_oracle_prints_rates_and_a_rendered_episode(capsys):
    code, out, _ = run(capsys, "bugfix", "--policy", "oracle")
    assert code == 0
    assert number(out, "pass rate") == 1.0 and number(out, "invalid / ep") == 0.0 and number(out, "hack rate") == 0.0
    assert "episode 0: task minmax/clamp" in out
    assert "t0 policy   | read <|end|>" in out and "t1 policy   | edit swap_minmax <|end|>" in out
    assert re.search(r"t0 tool\s+\| def clamp", out) and "episodes/s" in out


def test_bugfix_blind_and_random(capsys):
    _, out, _ = run(capsys, "bugfix", "--policy", "blind", "--split", "heldout", "--episodes-per-task", "10")
    assert 0.1 <= number(out, "pass rate") <= 0.3 and "10 tasks x 10 episodes" in out
    _, out, _ = run(capsys, "bugfix", "--policy", "random", "--reward", "public", "--episodes-per-task", "4",
                    "--seed", "1")
    assert number(out, "hack rate") > 0.1 and number(out, "pass rate") > number(out, "hack rate")


def test_single_turn_gyms(capsys):
    code, out, _ = run(capsys, "arithmetic", "--policy", "oracle", "--split", "heldout")
    assert code == 0 and number(out, "pass rate") == 1.0 and "256 tasks" in out
    assert re.search(r"t0 prompt\s+\| Q: \d\d\+\d\d\\nA: ", out)
    code, out, _ = run(capsys, "arithmetic", "--tasks", "5")
    assert code == 0 and "5 tasks" in out
    code, out, _ = run(capsys, "instruct", "--policy", "oracle", "--reward", "format")
    assert code == 0 and number(out, "pass rate") == 1.0 and "16 tasks" in out


@pytest.mark.parametrize("argv, message", [
    (["bugfix", "--policy", "genius"], "unknown policy"),
    (["arithmetic", "--policy", "blind"], "unknown policy"),
    (["bugfix", "--reward", "format"], "unknown reward"),
    (["bugfix", "--episodes-per-task", "0"], "at least 1"),
    (["bugfix", "--show", "99"], "--show"),
    (["arithmetic", "--max-turns", "0"], "--max-turns 0: an episode needs at least 1"),  # was a KeyError
    (["arithmetic", "--tasks", "0"], "--tasks 0: needs at least 1"),
    (["bugfix", "--tasks", "3"], "gym bugfix --split train has a fixed task set"),  # was silently ignored
    (["arithmetic", "--split", "heldout", "--tasks", "3"], "has a fixed task set"),
])
def test_bad_arguments_are_reported(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err


def test_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "trajtune.cli.gym", "bugfix", "--policy", "oracle",
                          "--split", "heldout"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pass rate        1.000" in out.stdout


def test_bugfix_novel_split_and_a_split_another_gym_lacks(capsys):
    code, out, _ = run(capsys, "bugfix", "--policy", "oracle", "--split", "novel")
    assert code == 0 and number(out, "pass rate") == 1.0 and "split novel" in out and "minmax/floor_at" in out
    code, _, err = run(capsys, "arithmetic", "--split", "novel")
    assert code == 2 and "bugfix split" in err
