"""The builders the chapter13 / iw-SFT / smollm2 / hf_pipeline claims added to the shared verdict helper:
`verdicts.share` (one share against a threshold), `verdicts.decide` (a claim made of several tests: its verdict and
the estimate that decided it) and `runs.report.pooled_claims` (the claims over seeds, for `claims_summary`)."""

from trajtune.runs.report import Claim, claims_summary, pooled_claims
from trajtune.runs.verdicts import NOISE, Estimate, decide, share, two_shares


def test_share_is_never_judged_on_a_zero_standard_error():
    zero = share(0, 128)
    assert zero.value == 0 and zero.se > 0.005 and zero.n == 128
    assert abs(share(64, 128).se - (0.5 * 0.5 / 128) ** 0.5) < 1e-3


def test_decide_takes_every_part_and_shows_the_one_that_decided():
    up, flat = Estimate(0.20, 0.02), Estimate(0.01, 0.01)
    holds, est = decide((up, ">", 0.1), (flat, "not >", 0.02))
    assert holds is True and est is flat  # both clear; the closest call (flat: 1 SE from its margin) is shown
    noisy = Estimate(0.12, 0.02)
    assert decide((noisy, ">", 0.1), (flat, "not >", 0.02)) == (NOISE, noisy)  # 0.12 - 0.1 is inside 2 SE
    bad = Estimate(0.10, 0.02)
    assert decide((noisy, ">", 0.1), (bad, "not >", 0.02)) == (False, bad)  # a failing part beats a noisy one
    assert decide((up, ">", 0.0)) == (True, up)


def test_pooled_claims_judge_the_pooled_estimate_and_count_the_seeds():
    def seed(a_hits, b_hits):
        return [Claim.compare("X1", "b beats a", "-", f"{b_hits} vs {a_hits}", "b > a",
                              two_shares(b_hits, 100, a_hits, 100), ">"),
                Claim("X2", "a level", "-", "", "at most 5%", True)]

    pooled = pooled_claims({0: seed(40, 52), 1: seed(40, 50), 2: seed(40, 51)})  # each alone inside its noise
    x1, x2 = pooled
    assert [c.holds for c in seed(40, 52)][0] == NOISE
    assert x1.holds is True and "over 3 seeds" in x1.evidence and x1.ours == "holds on 0 of 3 seeds"
    assert x2.holds is True and x2.estimate is None and x2.ours == "holds on 3 of 3 seeds"
    text = claims_summary(pooled)
    assert text.splitlines()[0] == "2 of 2 claims hold" and all(len(line) <= 120 for line in text.splitlines())
