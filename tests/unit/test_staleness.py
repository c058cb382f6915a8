"""The per-step staleness metrics (trajtune/sources/staleness.py), on hand-built episodes: every expected number is
worked out by hand in the comments."""

import pytest

from trajtune.metrics import is_documented
from trajtune.sources.staleness import resumed, staleness_metrics, token_staleness
from trajtune.trajectory import Owner, Trajectory

P, A, T = int(Owner.PROMPT), int(Owner.POLICY), int(Owner.TEMPLATE)


def episode(owners, versions):
    return Trajectory(ids=list(range(len(owners))), owners=owners, turns=[0] * len(owners), versions=versions)


# trained at step 5 (five updates so far) with max_staleness 2
RESUMED = episode([P, A, A, A, T], [-1, 3, 3, 4, -1])  # a partial rollout: versions 3, 3 then 4 -> lags 2, 2, 1
FRESH = episode([P, A, A], [-1, 5, 5])  # sampled by the step's own weights -> lags 0, 0
ON_POLICY = episode([P, A], None)  # no versions: the trained policy sampled it -> lag 0
STALE = episode([P] + [A] * 6, [-1] + [2] * 6)  # 3 behind: past K = 2, discarded (never trained)


def test_a_hand_worked_step():
    m = staleness_metrics([RESUMED, FRESH, ON_POLICY, STALE], [RESUMED, FRESH, ON_POLICY], step=5, max_staleness=2)
    # trained POLICY-token lags: 2, 2, 1 | 0, 0 | 0 -> six tokens, sum 5
    assert m["staleness/mean"] == pytest.approx(5 / 6)
    assert m["staleness/max"] == 2.0
    assert m["staleness/share_0"] == pytest.approx(3 / 6)  # FRESH's two and ON_POLICY's one
    assert m["staleness/share_1"] == pytest.approx(1 / 6)  # RESUMED's last token
    assert m["staleness/share_2"] == pytest.approx(2 / 6)  # RESUMED's first two
    assert m["staleness/discarded_share"] == pytest.approx(1 / 4)  # STALE, of four sampled
    assert m["staleness/resumed_share"] == pytest.approx(1 / 3)  # RESUMED, of three trained
    # POLICY tokens per episode: trained (3 + 2 + 1) / 3 = 2; sampled (3 + 2 + 1 + 6) / 4 = 3 -> 2 - 3 = -1
    assert m["staleness/length_bias"] == pytest.approx(-1.0)
    assert set(m) == {"staleness/mean", "staleness/max", "staleness/share_0", "staleness/share_1",
                      "staleness/share_2", "staleness/discarded_share", "staleness/resumed_share",
                      "staleness/length_bias"}
    assert all(is_documented(k) for k in m)  # every name in the metrics glossary (trajtune.metrics.METRICS)


def test_token_staleness_and_resumed():
    assert token_staleness(RESUMED, 5) == [2, 2, 1]  # TEMPLATE and PROMPT tokens (-1) are not counted
    assert token_staleness(ON_POLICY, 7) == [0]  # no versions: on-policy whatever the step
    assert [resumed(t) for t in (RESUMED, FRESH, ON_POLICY, STALE)] == [True, False, False, False]


def test_on_policy_and_nothing_discarded():
    # K = 0, no versions: every token 0 behind, nothing dropped, trained = sampled -> no length bias
    m = staleness_metrics([FRESH, ON_POLICY], [FRESH, ON_POLICY], step=5, max_staleness=0)
    assert m == {"staleness/discarded_share": 0.0, "staleness/mean": 0.0, "staleness/max": 0.0,
                 "staleness/share_0": 1.0, "staleness/resumed_share": 0.0, "staleness/length_bias": 0.0}


def test_nothing_sampled_or_nothing_trained():
    assert staleness_metrics([], [], step=3, max_staleness=1) == {}
    # everything discarded: the discarded share only (no token to make a histogram of)
    assert staleness_metrics([STALE], [], step=5, max_staleness=2) == {"staleness/discarded_share": 1.0}


@pytest.mark.parametrize("trained, step, K, match", [
    ([episode([P, A, A], [-1, 4, -1])], 5, 2, "episode 0's POLICY token 2 has no policy version"),
    ([FRESH, episode([P, A], [-1, 6])], 5, 2, "episode 1's POLICY token 1 has version 6, newer than the step 5"),
    ([FRESH, STALE], 5, 2, "episode 1 trained at step 5 has a POLICY token 3 updates behind, past the bound "
                           "max_staleness 2"),
])
def test_impossible_versions_are_named(trained, step, K, match):
    with pytest.raises(ValueError, match=match):
        staleness_metrics(trained, trained, step=step, max_staleness=K)


def test_bad_arguments():
    with pytest.raises(ValueError, match="more than the 1 sampled"):
        staleness_metrics([FRESH], [FRESH, FRESH], step=5, max_staleness=1)
    with pytest.raises(ValueError, match="must be >= 0"):
        staleness_metrics([FRESH], [FRESH], step=5, max_staleness=-1)
