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


def multi_turn(actions, group):
    """An episode of actions of the given lengths (POLICY tokens), each after a one-token prompt/tool turn."""
    owners, turns = [], []
    for k, n in enumerate(actions):
        owners += [P] + [A] * n
        turns += [2 * k] + [2 * k + 1] * n
    return Trajectory(ids=list(range(len(owners))), owners=owners, turns=turns, group=group)


def test_the_decode_clock_of_a_lockstep_batch():
    from trajtune.sources.staleness import decode_clock

    # three episodes: actions (3, 5), (4,) and (1, 2, 6); action 0 of all three decodes in max(3, 4, 1) = 4 steps,
    # action 1 of the first and third in max(5, 2) = 5, action 2 of the third alone in 6
    trajs = [multi_turn([3, 5], 0), multi_turn([4], 0), multi_turn([1, 2, 6], 1)]
    # first: 4 (action 0) + its own 5 = 9; second: its own 4; third: 4 + 5 + its own 6 = 15
    assert decode_clock(trajs) == [9, 4, 15]
    assert decode_clock([multi_turn([], 0)]) == [0]


def test_discard_drops_the_groups_that_arrive_after_their_step_trained():
    from trajtune.sources.staleness import discard_stale
    from trajtune.trajectory import Outcome

    trajs = [multi_turn([3, 5], 0), multi_turn([4], 0), multi_turn([1, 2, 6], 1), multi_turn([2], 2)]
    # clocks 9, 4, 15, 2 (the fourth joins action 0: max(3, 4, 1, 2) = 4 -> 4 + 5 = 9, 4, 4 + 5 + 6 = 15, 2)
    # at 4 decode steps per update: durations 2, 1, 3, 0 -> groups 0: max 2, 1: 3, 2: 0; one update behind: groups
    # 0 and 1 arrive late (2 > 1, 3 > 1) and are dropped, group 2 is kept
    assert discard_stale(trajs, behind=1, tokens_per_update=4) == 3
    assert [t.outcome for t in trajs] == [Outcome.STALE] * 3 + [Outcome.OK]
    trajs = [multi_turn([3, 5], 0), multi_turn([4], 0), multi_turn([1, 2, 6], 1), multi_turn([2], 2)]
    assert discard_stale(trajs, behind=3, tokens_per_update=4) == 0  # three behind: every group in time
    trajs[0].outcome = Outcome.ENV_ERROR  # a failed episode keeps its outcome
    assert discard_stale(trajs, behind=1, tokens_per_update=4) == 2 and trajs[0].outcome is Outcome.ENV_ERROR
    with pytest.raises(ValueError, match="tokens_per_update must be >= 1"):
        discard_stale(trajs, behind=1, tokens_per_update=0)
