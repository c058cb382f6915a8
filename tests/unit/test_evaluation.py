"""Evaluation statistics: pass@k, pass^k, distinct answers, entropy, KL, informative groups, hacks."""

import math

import pytest
import torch

from trajtune.sources.base import Source

from trajtune.evaluation import (
    distinct_answers,
    hack_rate,
    informative_group_share,
    kl_from_reference,
    mean_action_entropy,
    mean_pass_at_k,
    pass_at_k,
    pass_hat_k,
    score_policy,
    score_trajectories,
)
from trajtune.trajectory import Outcome, Trajectory


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


def episodes(rewards_per_task, names=None, errors=()):
    """Finished episodes in a source's layout: task i's episodes have group i and info['task']; those in `errors`
    failed in their environment (outcome ENV_ERROR)."""
    out = []
    for i, rewards in enumerate(rewards_per_task):
        for j, r in enumerate(rewards):
            info = {"task": names[i] if names else f"t{i}"}
            outcome = Outcome.OK
            if (i, j) in errors:
                info["env_error"], outcome = "KeyError: x", Outcome.ENV_ERROR
            out.append(Trajectory(reward=r, group=i, info=info, outcome=outcome))
    return out


def test_score_trajectories_hand_values():
    score = score_trajectories(episodes([[1, 0, 0, 0], [1, 1, 0.5, 0], [0, 0, 0, 0]]), ks=(1, 2, 4))
    assert score.mean_reward == pytest.approx(3.5 / 12)
    # pass@1 = mean of c/n: (1/4 + 2/4 + 0) / 3; pass@2 = mean of 1 - C(n-c,2)/C(4,2): (1/2 + 5/6 + 0) / 3
    assert score.pass_at[1] == pytest.approx((0.25 + 0.5) / 3)
    assert score.pass_at[2] == pytest.approx((1 - 3 / 6 + 1 - 1 / 6) / 3)
    assert score.pass_at[4] == pytest.approx(2 / 3)
    assert [(t.name, t.n, t.n_correct) for t in score.per_task] == [("t0", 4, 1), ("t1", 4, 2), ("t2", 4, 0)]
    assert score.per_task[1].mean_reward == pytest.approx(0.625)
    # a threshold other than 1: partial credit 0.5 counts
    assert score_trajectories(episodes([[1, 1, 0.5, 0]]), threshold=0.5).pass_at[1] == pytest.approx(0.75)


def test_score_table_and_metrics():
    score = score_trajectories(episodes([[1, 1], [0, 0], [1, 0]], names=["easy", "hard", "half"], errors={(1, 0)}),
                               ks=(1, 2))
    table = score.table()
    lines = table.splitlines()
    assert lines[0] == "| task | episodes | mean reward | correct | pass@1 | pass@2 |"
    assert [line.split("|")[1].strip() for line in lines[2:5]] == ["hard", "half", "easy"]  # the worst first
    assert "0/2 (1 env errors)" in lines[2] and "| 0.50 | 1.00 |" in lines[3]
    assert lines[-1].startswith("| **all 3 tasks** | 6 | **0.500** | 3/6 |")
    assert score.n_failed == 1
    assert score.metrics() == {"eval/reward": 0.5, "eval/pass@1": 0.5, "eval/pass@2": pytest.approx(2 / 3),
                               "eval/env_errors": 1.0, "eval/tokens_per_sample": 0.0, "eval/tokens_total": 0.0}
    short = score.table(max_rows=1).splitlines()
    assert len(short) == 5 and "2 more tasks" in short[3]


def test_score_errors_are_clear():
    with pytest.raises(ValueError, match="no episodes"):
        score_trajectories([])
    with pytest.raises(ValueError, match=r"ks=\[4\] must be in 1..2"):
        score_trajectories(episodes([[1, 0], [1, 1, 1, 1]]), ks=(4,))
    with pytest.raises(ValueError, match="n=2"):
        score_policy(lambda tasks, n, g: [], ["a"], n=2, ks=(4,))


def test_score_policy_samples_n_per_task_with_its_seed():
    from test_sources import Scripted

    calls = []

    def make(draw):  # a fake policy: task "x" always right, "y" right on its first episode
        calls.append((list(draw.tasks), draw.n, int(torch.randint(0, 2**30, (1,), generator=draw.generator))))
        n = draw.n
        return episodes([[1.0] * n if t == "x" else [1.0] + [0.0] * (n - 1) for t in draw.tasks],
                        names=list(draw.tasks))

    source = Scripted(make)
    assert isinstance(source, Source)
    score = score_policy(source, ["x", "y"], n=4, ks=(1, 4), seed=3)
    assert score.pass_at == {1: pytest.approx((1 + 0.25) / 2), 4: 1.0}
    assert score.mean_reward == pytest.approx(5 / 8)
    score_policy(source, ["x", "y"], n=4, seed=3)
    assert calls[0] == calls[1] and calls[0][:2] == (["x", "y"], 4)  # same seed, same generator
