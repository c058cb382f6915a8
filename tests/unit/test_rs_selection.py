"""Rejection-sampling selection (RLHF book ch.9.3) on the book's 5 x 4 worked example, and its controls (ch.9.6)."""

import pytest

from trajtune.algorithms.common import select_episodes
from trajtune.algorithms.rft import RFTConfig
from trajtune.trajectory import Trajectory

R = [[.7, .3, .5, .2], [.4, .8, .6, .5], [.9, .3, .4, .7], [.2, .5, .8, .6], [.5, .4, .3, .6]]


def episodes():
    out = []
    for i, row in enumerate(R):
        for j, r in enumerate(row):
            t = Trajectory(reward=r, group=i)
            t.info["flat"] = i * 4 + j
            out.append(t)
    return out


def flat(kept):
    return [t.info["flat"] for t in kept]


def test_top_per_prompt_is_the_books_answer():
    kept = select_episodes(episodes(), "top_per_prompt")
    assert [k % 4 + 1 for k in flat(kept)] == [1, 2, 1, 3, 4]  # the book's 1-indexed S(R)


def test_top_k_overall_is_the_books_answer():
    kept = select_episodes(episodes(), "top_overall", top_k=5)
    assert set(flat(kept)) == {8, 5, 14, 0, 11}  # as a set (erratum E6: argsort's order differs from the list)
    assert sorted((t.reward for t in kept), reverse=True) == [.9, .8, .8, .7, .7]
    assert sorted({t.group for t in kept}) == [0, 1, 2, 3]  # prompt 3 twice, prompt 5 not at all
    assert set(flat(select_episodes(episodes(), "top_overall", top_fraction=0.25))) == {8, 5, 14, 0, 11}  # 5 of 20
    with pytest.raises(ValueError, match="top_k must be >= 0"):
        select_episodes(episodes(), "top_overall", top_k=-1)


def test_random_controls_are_matched():
    per_prompt = select_episodes(episodes(), "top_per_prompt", random_control=True, seed=3)
    assert sorted(t.group for t in per_prompt) == [0, 1, 2, 3, 4]  # one per prompt, as the selection
    draws = {tuple(flat(select_episodes(episodes(), "top_per_prompt", random_control=True, seed=s))) for s in range(8)}
    assert len(draws) > 1  # the seed decides
    overall = select_episodes(episodes(), "top_overall", top_k=5, random_control=True, seed=1)
    assert len(overall) == 5 and flat(overall) == sorted(flat(overall))
    assert flat(overall) == flat(select_episodes(episodes(), "top_overall", top_k=5, random_control=True, seed=1))
    accepted = select_episodes(episodes(), "accepted", threshold=0.7)
    assert set(flat(accepted)) == {0, 5, 8, 11, 14}
    assert len(select_episodes(episodes(), "accepted", threshold=0.7, random_control=True)) == 5


def test_rft_config_takes_k_or_a_fraction():
    assert RFTConfig(select="top_overall", select_k=1000).select_k == 1000
    with pytest.raises(ValueError, match="select_k must be >= 0"):
        RFTConfig(select_k=-2)
