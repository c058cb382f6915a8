"""Two fits of the RLHF book's evaluation chapters: Gao et al.'s over-optimization forms (ch.14, checklist 14.8)
and a length-controlled win rate (ch.16 / appendix B), on data with known answers."""

import math

import pytest

from trajtune.ratings import length_controlled_win_rate
from trajtune.overoptimization import fit_scaling_law


def test_scaling_law_forms_recover_known_curves():
    kl = [0.0, 0.25, 1.0, 2.25, 4.0, 6.25, 9.0]  # d = sqrt(KL) = 0, 0.5, 1, ..., 3
    bon = [0.3 + math.sqrt(k) * (2.0 - 0.5 * math.sqrt(k)) for k in kl]  # alpha 2, beta 0.5 above a base of 0.3
    f = fit_scaling_law(kl, bon, "bon")
    assert (f["alpha"], f["beta"], f["d_peak"]) == (pytest.approx(2.0), pytest.approx(0.5), pytest.approx(2.0))
    assert f["r2"] == pytest.approx(1.0)
    rl = [math.sqrt(k) * (1.0 - 0.5 * math.log(math.sqrt(k))) if k else 0.0 for k in kl]
    g = fit_scaling_law(kl, rl, "rl")
    assert (g["alpha"], g["beta"]) == (pytest.approx(1.0), pytest.approx(0.5))
    assert g["d_peak"] == pytest.approx(math.e)  # exp(alpha / beta - 1)
    rising = fit_scaling_law([0.0, 1.0, 4.0, 9.0], [0.0, 1.0, 2.0, 3.0], "bon")
    assert abs(rising["beta"]) < 1e-9 and rising["d_peak"] > 1e6  # still rising: no peak in sight
    with pytest.raises(ValueError, match="form must be"):
        fit_scaling_law(kl, bon, "ppo")
    with pytest.raises(ValueError, match="at least 3 points"):
        fit_scaling_law([0.0, 1.0], [0.0, 1.0])


def test_length_controlled_win_rate_takes_the_length_out():
    # a judge that only likes length: longer answers win 90%, shorter 10%; the model is longer 8 times in 10
    wins = [0.9] * 8 + [0.1] * 2
    diffs = [100.0] * 8 + [-100.0] * 2
    got = length_controlled_win_rate(wins, diffs)
    assert got["win_rate"] == pytest.approx(0.74)
    assert got["lc_win_rate"] == pytest.approx(0.5, abs=0.01) and got["phi"] > 0
    # no length difference at all: the raw rate
    flat = length_controlled_win_rate([1.0, 0.0, 1.0, 1.0], [0.0] * 4)
    assert flat["lc_win_rate"] == pytest.approx(0.75, abs=1e-6)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        length_controlled_win_rate([2.0, 0.0], [1.0, -1.0])
