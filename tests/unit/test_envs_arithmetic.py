"""Arithmetic gym: the prompt format, the exact-match verifier, seeded problems, a disjoint held-out set."""

import random

from trajtune.envs.arithmetic import (
    ArithmeticTask, arithmetic_env, arithmetic_tokenizer, exact_match, heldout_tasks, make_tasks, problem, train_tasks,
)
from trajtune.envs.scripted import ArithmeticOracle, ArithmeticRandom
from trajtune.sources.rollout import scripted_rollout
from trajtune.text.render import Renderer


def test_format_and_verifier():
    task = ArithmeticTask(23, 45)
    assert (task.prompt, task.answer, task.name) == ("Q: 23+45\nA: ", "68", "23+45")
    assert len(task.prompt) == 12
    assert exact_match(task, "68")[0] == 1.0
    for wrong in ["67", " 68", "68 ", "068", "68\n", "", "6"]:
        assert exact_match(task, wrong)[0] == 0.0, wrong
    env = arithmetic_env()
    assert env.reset(task) == "Q: 23+45\nA: "
    obs, reward, done, info = env.step("68")
    assert (obs, reward, done) == ("", 1.0, True)
    assert info["task"] == "23+45" and info["correct"] and info["actions"] == ["68"] and info["n_invalid"] == 0


def test_generator_is_seeded_and_heldout_is_disjoint():
    assert problem(random.Random(3)) == problem(random.Random(3))
    assert heldout_tasks()[0] == problem(random.Random(10_000))  # the seed's test set
    assert len(heldout_tasks()) == 256 and make_tasks("heldout") == list(heldout_tasks())
    a, b = train_tasks(500, seed=0), train_tasks(500, seed=0)
    assert a == b and train_tasks(500, seed=1) != a
    assert not set(a) & set(heldout_tasks())
    assert all(10 <= t.a <= 99 and 10 <= t.b <= 99 for t in a)


def test_scripted_policies_and_tokenizer():
    tok = arithmetic_tokenizer()
    r = Renderer(tok)
    tasks = make_tasks("train", n=50, seed=2)
    oracle = [scripted_rollout(ArithmeticOracle(), arithmetic_env(), t, r) for t in tasks]
    assert all(t.reward == 1.0 for t in oracle)
    guesses = [scripted_rollout(ArithmeticRandom(seed=1), arithmetic_env(), t, r) for t in tasks]
    assert sum(t.reward for t in guesses) <= 3
    assert tok.vocab_size == 8 + 16
