"""Reward-model ensembles (book ch.14.4): mean, min and mean - k*std on hand-worked scores."""

import pytest
import torch

from trajtune.sources.ensemble import RewardEnsemble, combine_ensemble


def test_combine_hand_values():
    s = torch.tensor([[1.0, 0.0], [3.0, 0.0], [2.0, 3.0]])  # 3 members x 2 completions
    assert combine_ensemble(s, "mean").tolist() == [2.0, 1.0]
    assert combine_ensemble(s, "min").tolist() == [1.0, 0.0]
    # population std: [sqrt(2/3), sqrt(2)]
    got = combine_ensemble(s, "mean_minus_std", k=0.5)
    assert got.tolist() == pytest.approx([2.0 - 0.5 * (2 / 3) ** 0.5, 1.0 - 0.5 * 2 ** 0.5])
    one = torch.tensor([[4.0, -1.0]])
    assert combine_ensemble(one, "mean_minus_std", k=2.0).tolist() == [4.0, -1.0]


def test_combine_refuses_bad_input():
    with pytest.raises(ValueError, match="how must be one of"):
        combine_ensemble(torch.zeros(2, 3), "median")
    with pytest.raises(ValueError, match=r"\[M, B\]"):
        combine_ensemble(torch.zeros(3), "mean")
    with pytest.raises(ValueError, match="k must be >= 0"):
        combine_ensemble(torch.zeros(2, 3), "mean_minus_std", k=-1)


def test_reward_ensemble_members_and_none():
    a = lambda batch: [1.0, None, 2.0]  # noqa: E731
    b = lambda batch: [3.0, 5.0, 2.0]  # noqa: E731
    e = RewardEnsemble([a, b], "min", name="rms")
    assert e(None) == [1.0, None, 2.0]
    assert e.metrics == {"reward/rms/member_std": pytest.approx((1.0 + 0.0) / 2)}
    assert RewardEnsemble([a, b], "mean")(None) == [2.0, None, 2.0]
    with pytest.raises(ValueError, match="no members"):
        RewardEnsemble([])
