"""The one verdict helper (trajtune.runs.verdicts): constructed data at and above the noise level."""

import random

import pytest

from trajtune.runs.report import Claim, claims_summary, claims_table, claims_verdict, pooled_verdicts
from trajtune.runs.verdicts import (NOISE, Estimate, both, bootstrap, difference, judge, over_seeds, paired,
                                    two_shares)


def test_a_difference_of_a_few_problems_is_noise():
    # rlhf_book S9.2a / S9.2b: 20/256 vs 16/256 and 18/256 vs 20/256 were opposite verdicts; both are noise
    assert judge(two_shares(20, 256, 16, 256)) == NOISE
    assert judge(two_shares(18, 256, 20, 256)) == NOISE


def test_a_clear_difference_holds_and_its_reverse_fails():
    assert judge(two_shares(120, 256, 40, 256)) is True
    assert judge(two_shares(40, 256, 120, 256)) is False
    assert judge(two_shares(40, 256, 120, 256), "<") is True


def test_the_boundary_is_two_standard_errors():
    assert judge(Estimate(0.21, 0.1)) is True
    assert judge(Estimate(0.19, 0.1)) == NOISE
    assert judge(Estimate(-0.21, 0.1)) is False
    assert judge(Estimate(0.3, 0.1), margin=0.05) is True
    assert judge(Estimate(0.2, 0.1), margin=0.05) == NOISE


def test_bounds_hold_only_when_the_whole_band_is_on_their_side():
    # "stays at guess level" (held-out - guess <= 0): +0.050 ± 0.069 was "holds" by a lenient rule; it is noise
    assert judge(Estimate(0.05, 0.0345), "<=") == NOISE
    assert judge(Estimate(0.05, 0.0345), "<=", 0.15) is True  # a tolerance the claim names, cleared
    assert judge(Estimate(0.01, 0.01), "<=") == NOISE  # a rise inside the noise does not show there was none
    assert judge(Estimate(-0.03, 0.01), "<=") is True
    assert judge(Estimate(0.05, 0.01), "<=") is False
    assert judge(Estimate(-0.05, 0.01), ">=") is False
    assert judge(Estimate(0.93, 0.02), ">=", 0.95) == NOISE  # "format at least 0.95" on 0.93 ± 0.04
    assert judge(Estimate(0.99, 0.004), ">=", 0.95) is True


def test_guards_only_fail_on_a_clear_contradiction():
    assert judge(Estimate(-0.01, 0.01), "not <") is True  # a dip inside the noise is no fall
    assert judge(Estimate(-0.05, 0.01), "not <") is False
    assert judge(Estimate(0.01, 0.01), "not >") is True and judge(Estimate(0.05, 0.01), "not >") is False
    with pytest.raises(ValueError):
        judge(Estimate(0, 1), "!=")


def test_paired_uses_the_per_item_differences():
    rng = random.Random(0)
    before = [rng.random() for _ in range(200)]
    # the same problems, each +0.05: a paired SE of ~0 makes a small shift clear, an unpaired one does not
    after = [b + 0.05 for b in before]
    assert judge(paired(before, after)) is True
    assert judge(difference(after, before)) == NOISE
    noisy = [b + rng.gauss(0, 0.5) for b in before]
    assert judge(paired(before, noisy)) == NOISE
    with pytest.raises(ValueError, match="same items"):
        paired([1.0], [1.0, 2.0])


def test_bootstrap_is_reproducible_and_scales_with_n():
    rng = random.Random(1)
    xs = [rng.gauss(0, 1) for _ in range(400)]
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    a, b = bootstrap(xs, mean, seed=3), bootstrap(xs, mean, seed=3)
    assert a == b
    assert 0.03 < a.se < 0.07  # ~ 1 / sqrt(400)


def test_over_seeds_never_drops_below_the_sampling_noise():
    agree = [Estimate(0.02, 0.03), Estimate(0.02, 0.03), Estimate(0.02, 0.03)]  # seeds that happen to agree
    pooled = over_seeds(agree)
    assert pooled.se == pytest.approx(0.03 / 3 ** 0.5)
    assert judge(pooled) == NOISE
    spread = over_seeds([Estimate(0.3, 0.01), Estimate(-0.2, 0.01), Estimate(0.25, 0.01)])
    assert judge(spread) == NOISE  # one seed against the others: not a result
    clear = over_seeds([Estimate(0.3, 0.05), Estimate(0.25, 0.05), Estimate(0.35, 0.05)])
    assert judge(clear) is True


def test_both_and_the_claim_row():
    assert both(True, True) is True and both(True, NOISE) == NOISE and both(NOISE, False) is False
    assert both(True, None) is None
    c = Claim.compare("S9.2a", "RS vs SFT, held-out greedy", "-", "20/256 vs 16/256", "RS beats SFT",
                      two_shares(20, 256, 16, 256))
    assert c.holds == NOISE and "± 0.046" in c.evidence
    assert "difference ± 2 SE" in claims_table([c]) and "not distinguishable" in claims_table([c])
    skipped = Claim("S12.2a", "SDPO", "-", "0.23 -> 0.02", "x", None, why="the run collapsed")
    assert skipped.verdict == "not judged (the run collapsed)"
    assert claims_verdict([c, skipped]) == "**0 of 1 claim holds** (1 not distinguishable from noise, 1 not judged)"
    long = Claim("A1", "x" * 300, "-", "-", "-", True)
    out = claims_summary([c, skipped, long])
    assert out.splitlines()[0] == "1 of 2 claims hold (1 not distinguishable from noise, 1 not judged)"
    assert all(len(line) <= 120 for line in out.splitlines()) and "|" not in out


def test_pooled_verdicts_judge_the_estimate_over_seeds():
    def seed(v, se=0.02, other=True):
        return [Claim.compare("X", "x", "-", "-", "-", Estimate(v, se)), Claim("Y", "y", "-", "-", "-", other)]

    pooled = pooled_verdicts({0: seed(0.1), 1: seed(0.12), 2: seed(0.08, other=NOISE)})
    assert pooled["X"][0] is True and pooled["X"][1].n == 3
    assert pooled["Y"] == (NOISE, None)
    assert pooled_verdicts({0: seed(0.1), 1: seed(-0.1, other=False)})["Y"][0] is False


def test_ratio_is_the_bootstrap_where_that_is_stable_and_does_not_depend_on_order():
    from trajtune.runs.verdicts import ratio

    rng = random.Random(0)
    num, den = [rng.gauss(0.3, 1) for _ in range(128)], [rng.gauss(1, 1) for _ in range(128)]
    est = ratio(num, den)
    boot = bootstrap(list(zip(num, den)), lambda xs: sum(a for a, _ in xs) / sum(b for _, b in xs), seed=0)
    assert est.value == pytest.approx(boot.value) and est.se == pytest.approx(boot.se, rel=0.15)
    assert ratio(num[::-1], den[::-1]).se == pytest.approx(est.se, rel=1e-9)  # another order, the same noise
    assert ratio([0.0, 0.0], [0.0, 0.0]).se == 0.0  # the reference against itself: nothing to measure
    with pytest.raises(ValueError, match="same"):
        ratio([1.0], [1.0, 2.0])
