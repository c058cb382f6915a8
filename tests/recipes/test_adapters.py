"""Adapters on real tasks of the libraries (trajtune/envs/adapters/): reasoning-gym and TextArena.

Each block is skipped, saying what to install, when its optional library is missing.
"""

import importlib.util
import json
import random

import pytest

from trajtune.sources.rollout import scripted_rollout
from trajtune.text.render import Renderer
from trajtune.text.tokenizers import CharTokenizer, WordTokenizer
from trajtune.trajectory import Owner

HAS_RG = importlib.util.find_spec("reasoning_gym") is not None
HAS_TA = importlib.util.find_spec("textarena") is not None
needs_rg = pytest.mark.skipif(not HAS_RG, reason="reasoning-gym is not installed (pip install reasoning-gym)")
needs_ta = pytest.mark.skipif(not HAS_TA, reason="textarena is not installed (pip install 'trajtune[textarena]')")


class Say:
    """A scripted policy that plays a fixed list of actions."""

    def __init__(self, actions):
        self.actions = list(actions)

    def act(self, messages):
        return self.actions.pop(0)


# --- reasoning-gym ------------------------------------------------------------------------------
@needs_rg
def test_reasoning_gym_tasks_are_the_datasets_entries_scored_by_their_own_scorer():
    from trajtune.envs.adapters.reasoning_gym import dataset_names, reasoning_gym_env, reasoning_gym_tasks

    assert {"spell_backward", "basic_arithmetic", "leg_counting"} <= set(dataset_names())
    tasks = reasoning_gym_tasks("spell_backward", size=8, seed=3, min_word_len=3, max_word_len=4)
    assert tasks == reasoning_gym_tasks("spell_backward", size=8, seed=3, min_word_len=3, max_word_len=4)
    assert len({hash(t) for t in tasks}) == len(set(tasks))  # hashable: equal entries group together
    t = tasks[0]
    assert t.name == "spell_backward/0" and t.answer == t.question.split(": ")[-1][::-1]
    env = reasoning_gym_env()
    assert env.reset(t) == t.question
    right = env.step(t.answer)
    assert right.reward == 1.0 and right.done and right.info["correct"] and right.info["task"] == t.name
    env.reset(t)
    partial = env.step(t.answer[:-1])  # spell_backward gives partial credit: the leading letters right
    assert 0 < partial.reward < 1 and not partial.info["correct"]
    env.reset(t)
    assert env.step("").reward == 0.0


@needs_rg
def test_reasoning_gym_exact_match_dataset_and_answer_tags():
    from trajtune.envs.adapters.reasoning_gym import reasoning_gym_env, reasoning_gym_tasks

    t = reasoning_gym_tasks("basic_arithmetic", size=4, seed=0, min_terms=2, max_terms=2, min_digits=1,
                            max_digits=1, operators=("+",))[1]
    plain, tags = reasoning_gym_env(), reasoning_gym_env(extract="tags")
    plain.reset(t)
    assert plain.step(f" {t.answer} ").reward == 1.0  # surrounding space is not part of the answer
    tags.reset(t)
    assert tags.step(f"I add them. <answer>{t.answer}</answer>").reward == 1.0
    tags.reset(t)
    assert tags.step(t.answer).reward == 0.0  # no <answer> tags: nothing to score
    with pytest.raises(ValueError, match="extract must be"):
        reasoning_gym_env(extract="json")


@needs_rg
def test_reasoning_gym_bad_names_are_clear_errors():
    from trajtune.envs.adapters.reasoning_gym import reasoning_gym_tasks

    with pytest.raises(ValueError, match="no dataset 'spell_backwards'.*spell_backward"):
        reasoning_gym_tasks("spell_backwards")
    with pytest.raises(ValueError, match="spell_backward.*min_len"):
        reasoning_gym_tasks("spell_backward", size=2, min_len=3)


@needs_rg
def test_reasoning_gym_episode_through_the_rollout_loop():
    from trajtune.envs.adapters.reasoning_gym import reasoning_gym_env, reasoning_gym_tasks

    task = reasoning_gym_tasks("spell_backward", size=1, seed=0, min_word_len=3, max_word_len=4)[0]
    renderer = Renderer(CharTokenizer.from_corpus(task.question + task.answer))
    traj = scripted_rollout(Say([task.answer]), reasoning_gym_env(), task, renderer, max_turns=1, max_tokens=128,
                            max_action_tokens=8)
    assert traj.reward == 1.0 and traj.info["task"] == task.name and traj.info["stop_reason"] == "done"
    assert renderer.tokenizer.decode(traj.tokens_of(Owner.POLICY), skip_special=True) == task.answer


@needs_rg
def test_reasoning_gym_recipe_reduced(tmp_path, capsys):
    from trajtune.cli import main

    run_dir = tmp_path / "run"
    overrides = ["config.n_train=16", "config.n_eval=4", "config.eval_samples=2", "config.dim=16", "config.n_layers=1",
                 "config.rl.steps=3", "config.rl.tasks_per_step=2", "config.rl.group_size=2", "config.rl.eval_every=3"]
    assert main(["run", "reasoning_gym", "--run-dir", str(run_dir)] + [a for o in overrides for a in ("--set", o)]) == 0
    assert "Held-out mean reward" in (run_dir / "report.md").read_text()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("stage") == "rl" and "eval/reward" in r] == [3]
    assert (run_dir / "rl" / "episodes.jsonl").exists()  # what `trajtune view` shows


@pytest.mark.skipif(HAS_RG, reason="checks the message when reasoning-gym is missing, and it is installed")
def test_a_recipe_whose_library_is_missing_says_what_to_install_in_one_line(tmp_path, capsys):
    from trajtune.cli import main

    assert main(["run", "reasoning_gym", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "pip install reasoning-gym" in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("trajtune: error:")]) == 1


# --- TextArena ----------------------------------------------------------------------------------
def binary_search(messages):
    """GuessTheNumber's best player: halve the range on every hint."""
    lo, hi = 1, 20
    guesses = [m["content"] for m in messages if m["role"] == "assistant"]
    hints = [m["content"] for m in messages if m["role"] == "tool"]
    for g, h in zip(guesses, hints):
        if "higher" in h:
            lo = int(g) + 1
        elif "lower" in h:
            hi = int(g) - 1
    return str((lo + hi) // 2)


class BinarySearch:
    def act(self, messages):
        return binary_search(messages)


@needs_ta
def test_textarena_game_is_a_multi_turn_episode_with_the_hints_as_tool_turns():
    from trajtune.envs.adapters.textarena import TextArenaEnv, textarena_tasks

    tasks = textarena_tasks("GuessTheNumber-v0-raw", 3, seed=7)
    assert [t.name for t in tasks] == [f"GuessTheNumber-v0-raw/{s}" for s in (7, 8, 9)]
    env = TextArenaEnv("[{}]")
    opening = env.reset(tasks[0])
    assert "Guess The Number" in opening and "between 1 and 20" in opening
    words = [opening, "The target number is higher.", "The target number is lower."] + [str(n) for n in range(21)]
    renderer = Renderer(WordTokenizer.from_corpus(words))
    traj = scripted_rollout(BinarySearch(), TextArenaEnv("[{}]"), tasks[0], renderer, max_turns=10, max_tokens=2048,
                            max_action_tokens=2)
    assert traj.reward == 1.0 and traj.info["stop_reason"] == "done"  # binary search finds it within 5 guesses
    assert "Congratulations" in traj.info["reason"] and traj.info["n_invalid"] == 0
    n = len(traj.info["actions"])
    assert 1 <= n <= 5 and traj.info["turns"] == n
    tool_turns = {turn for turn, owner in zip(traj.turns, traj.owners) if owner == Owner.TOOL}
    assert len(tool_turns) == n - 1  # every guess but the winning one got a hint
    tool_text = renderer.tokenizer.decode(traj.tokens_of(Owner.TOOL), skip_special=True)
    assert "target number is" in tool_text and "[" not in tool_text  # the player's own moves are not echoed


@needs_ta
def test_textarena_invalid_moves_are_counted_and_end_the_game_past_its_allowance():
    from trajtune.envs.adapters.textarena import TextArenaEnv, textarena_tasks

    env = TextArenaEnv("[{}]")
    env.reset(textarena_tasks("GuessTheNumber-v0-raw", 1)[0])
    first = env.step("higher")  # not a number: the game warns once
    assert not first.done and "invalid move" in first.observation and first.info["n_invalid"] == 1
    second = env.step("lower")
    assert second.done and second.reward == 0.0 and second.info["n_invalid"] == 2
    assert "Invalid Move" in second.info["reason"]
    with pytest.raises(RuntimeError, match="after the game ended"):
        env.step("3")


@needs_ta
def test_textarena_two_player_game_with_a_scripted_opponent():
    from trajtune.envs.adapters.textarena import TextArenaEnv, textarena_tasks

    rng = random.Random(0)
    free = lambda obs: rng.choice([c for c in "012345678" if f"'[{c}]'" in obs.rsplit("Available Moves:", 1)[-1]])
    env = TextArenaEnv("[{}]", num_players=2, opponent=free)
    opening = env.reset(textarena_tasks("TicTacToe-v0-raw", 1)[0])
    assert "Tic Tac Toe" in opening or "TicTacToe" in opening or "Tic-Tac-Toe" in opening
    result, moves = None, iter("402681357")
    while result is None or not result.done:
        board = (result.observation if result else opening).rsplit("Available Moves:", 1)[-1]
        move = next(c for c in moves if f"'[{c}]'" in board)
        result = env.step(move)
    assert result.reward in (-1.0, 0.0, 1.0) and result.info["n_invalid"] == 0
    with pytest.raises(ValueError, match="needs an opponent"):
        TextArenaEnv(num_players=2)
    with pytest.raises(ValueError, match="action_template"):
        TextArenaEnv("[x]")


@needs_ta
def test_textarena_unknown_game_names_close_ones():
    from trajtune.envs.adapters.textarena import textarena_tasks

    with pytest.raises(ValueError, match="GuessTheNumber-v0-raw"):
        textarena_tasks("GuessTheNumbr-v0-raw", 2)


@needs_ta
def test_textarena_recipe_reduced(tmp_path):
    from trajtune.cli import main

    run_dir = tmp_path / "run"
    overrides = ["config.n_train=4", "config.n_eval=2", "config.eval_samples=2", "config.dim=16", "config.n_layers=1",
                 "config.max_turns=3", "config.rl.steps=2", "config.rl.tasks_per_step=2", "config.rl.group_size=2",
                 "config.rl.eval_every=2"]
    assert main(["run", "textarena", "--run-dir", str(run_dir)] + [a for o in overrides for a in ("--set", o)]) == 0
    assert "Held-out mean reward" in (run_dir / "report.md").read_text()
    rows = [json.loads(line) for line in (run_dir / "rl" / "episodes.jsonl").read_text().splitlines()]
    assert rows and all(Owner.TOOL in r["owners"] or r["info"]["n_turns"] == 1 for r in rows)
