"""Evaluation statistics: pass@k, pass^k, distinct answers, entropy, KL, informative groups, hacks."""

import math

import pytest
import torch

from trajtune.evaluation import (
    distinct_answers,
    hack_rate,
    informative_group_share,
    kl_from_reference,
    mean_action_entropy,
    mean_pass_at_k,
    pass_at_k,
    pass_hat_k,
)


def test_pass_at_k_hand_values_and_combinatorial_form():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - 21 / 45)
    assert pass_at_k(10, 3, 8) == 1.0  # fewer than k wrong samples
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(1000, 1, 100) == pytest.approx(0.1)
    for n, c, k in [(16, 5, 4), (200, 100, 50), (300, 7, 299)]:  # C(n,k) overflows floats here
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-9, abs=1e-12)
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 1)
    with pytest.raises(ValueError):
        pass_at_k(5, 1, 6)


def test_pass_hat_k_and_mean_over_tasks():
    assert pass_hat_k(10, 3, 2) == pytest.approx(3 / 45)
    tasks = [[True, False, False, True], [False] * 4, [1, 1, 1, 1]]
    assert mean_pass_at_k(tasks, 1) == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert mean_pass_at_k(tasks, 2) == pytest.approx((1 - 1 / 6 + 0.0 + 1.0) / 3)


def test_distinct_answers_per_k_samples():
    answers = [[1, 1, 2, 3], [5, 5, 5, None]]
    assert distinct_answers(answers) == 2.5
    assert distinct_answers(answers, k=2) == 1.0
    with pytest.raises(ValueError):
        distinct_answers(answers, k=5)


def test_mean_action_entropy_reads_only_positions_predicting_actions():
    logits = torch.zeros(1, 4, 8)
    logits[0, 0] = torch.tensor([20.0] + [0.0] * 7)  # nearly deterministic, but not an action position
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    assert mean_action_entropy(logits, mask) == pytest.approx(math.log(8), abs=1e-6)
    with pytest.raises(ValueError):
        mean_action_entropy(logits, torch.ones(1, 4))


def test_kl_from_reference_hand_values():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    out = kl_from_reference(logp, ref, mask, kind="k1")  # sequences: -0.5 and +1.0
    assert out["kl/sequence"] == pytest.approx(0.25)
    assert out["kl/token"] == pytest.approx(0.5 / 3)


def test_informative_group_share_and_hack_rate():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.2, 0.2])
    groups = torch.tensor([4, 4, 1, 1, 9, 2, 2])
    assert informative_group_share(rewards, groups) == pytest.approx(1 / 4)
    public = [True, True, True, False, False]
    hidden = [True, False, False, False, True]
    assert hack_rate(public, hidden) == pytest.approx(2 / 5)
    assert hack_rate(public, hidden, among_public_pass=True) == pytest.approx(2 / 3)
    assert hack_rate([False], [False], among_public_pass=True) == 0.0
