"""The two builders the graders recipe added to `runs.verdicts`, by hand: one share against a fixed bar, and a
claim made of several comparisons (its verdict and the estimate that decided it)."""

from __future__ import annotations

import math

import pytest

from trajtune.runs.verdicts import NOISE, Estimate, decide, judge, share


def test_share_against_a_bar_by_hand():
    est = share(61, 64, 0.9)
    assert est.value == pytest.approx(61 / 64 - 0.9) and est.n == 64
    assert est.se == pytest.approx(math.sqrt((62 / 66) * (4 / 66) / 64))  # taken at (hits + 1) / (n + 2)
    assert judge(est, ">") == NOISE  # 0.953 against 0.9: 2 SE is 0.06
    full = share(64, 64, 0.9)
    assert full.se > 0 and judge(full, ">") is True  # 64/64 is not judged on a zero SE, and clears 0.9
    assert judge(share(40, 64, 0.9), ">") is False


def test_decide_picks_the_part_that_decided():
    clear, far = Estimate(0.5, 0.1), Estimate(3.0, 0.1)
    noisy, wrong = Estimate(0.1, 0.1), Estimate(-0.5, 0.1)
    assert decide((far, ">", 0.0), (clear, ">", 0.0)) == (True, clear)  # the one nearest its margin in SE
    assert decide((clear, ">", 0.0), (noisy, ">", 0.0)) == (NOISE, noisy)
    assert decide((noisy, ">", 0.0), (wrong, ">", 0.0), (clear, ">", 0.0)) == (False, wrong)  # a failure first
    assert decide((wrong, "not >", 0.0)) == (True, wrong)  # an absence claim: it holds
    assert decide((Estimate(0.2, 0.0), ">", 0.0), (Estimate(0.2, 0.05), ">", 0.0))[0] is True  # exact part
    with pytest.raises(ValueError, match="no parts"):
        decide()
