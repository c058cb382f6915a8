"""Graders recipe, part 'overopt', at a budget of seconds: the stage graph, the split, the claims on hand-made
curves, and one end-to-end run (RMs, both RL runs, probe rows every N steps, claims, the plot)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from trajtune.experiments.graders import Config, run_with_results, stages
from trajtune.experiments.graders.overopt import (
    GOLD, GRADED, INSTR, KL, PROXY, TEST, Demo, change, claims, halves, level_gap, peak_row, rise_and_fall,
)
from trajtune.metrics import is_documented, read_metrics
from trajtune.runs.verdicts import NOISE


def tiny(**kw) -> Config:
    """Chapter 13's upstream stages and this part at a few steps each."""
    d = Config()
    overopt = Demo(members=2, rm_epochs=0.1, rl=replace(Demo().rl, steps=4, tasks_per_step=2, group_size=2,
                                                        eval_every=2), eval_samples=1)
    return Config(**{**dict(demos=["overopt"], runner=replace(d.runner, workers=1), dim=32, n_layers=1,
                            pretrain=replace(d.pretrain, steps=4), val_windows=4, sft=replace(d.sft, steps=3),
                            adherence_samples=1, max_reply=12, overopt=overopt), **kw})


def test_stage_graph():
    names = [s.name for s in stages(Config(demos=["overopt"]))]
    assert names == ["pretrain", "sft_narrow", "overopt_single", "overopt_ensemble", "overopt_rm0", "overopt_rm1",
                     "overopt_rm2", "overopt_rm_test"]
    with pytest.raises(ValueError, match="members"):
        Demo(members=0)


def test_halves_are_disjoint_seeded_halves():
    a, b = halves(0)
    assert len(a) == len(b) == 320
    assert halves(0) == (a, b) and halves(1) != (a, b)
    ids = lambda pairs: {(t.word, c, r) for t, c, r in pairs}  # noqa: E731
    assert len(ids(a) & ids(b)) < 10  # drawn with replacement per word: a few repeats, no systematic overlap


def curve(proxy, gold, instr, test, kl, n=64, sd=0.5):
    """A probe's rows every 5 steps: n replies each, the RM scores and the KL with standard deviation `sd` over the
    replies (the shares' is binomial, from the share)."""
    return [{"step": 5 * i, PROXY: p, GOLD: g, INSTR: m, TEST: t, KL: k, GRADED: n, "overopt/sd/proxy": sd,
             "overopt/sd/gold/test_rm": sd, "overopt/sd/kl": sd if k else 0.0}
            for i, (p, g, m, t, k) in enumerate(zip(proxy, gold, instr, test, kl, strict=True))]


def var(p: float, n: int = 64) -> float:
    """A share's binomial variance over n replies, p taken at (hits + 1) / (n + 2)."""
    q = (p * n + 1) / (n + 2)
    return q * (1 - q) / n


def verdicts(single, ensemble) -> dict:
    results = {"overopt_single": {"curve": single}, "overopt_ensemble": {"curve": ensemble}}
    return {c.id: c.holds for c in claims(results, Config(demos=["overopt"]))}


def test_claims_on_hand_made_curves():
    # one RM: gold 0.3 -> peak 0.8 at step 10 -> 0.4, proxy keeps rising; test RM flat after step 10
    single = curve([0, 1, 2, 3, 4], [0.3, 0.6, 0.8, 0.6, 0.4], [0.3, 0.5, 0.5, 0.5, 0.5], [0, 1, 1.5, 1.5, 1.4],
                   [0, 1, 2, 3, 4])
    # the ensemble: gold above one RM's after its peak (0.9, 0.8 vs 0.6, 0.4); KL falls by 1 nat once (2 -> 1)
    ensemble = curve([0, 1, 2, 3, 4], [0.3, 0.6, 0.8, 0.9, 0.8], [0.3, 0.6, 0.6, 0.6, 0.6], [0, 1, 2, 2, 2],
                     [0, 1, 2, 1, 3], sd=0.2)
    top = peak_row(single, GOLD)
    assert (top["step"], top[GOLD]) == (10, 0.8)
    assert rise_and_fall(single, GOLD)[0] is True
    gap = level_gap(single, ensemble, GOLD, after=10)  # steps 15, 20: +0.3, +0.4
    assert gap.value == pytest.approx(0.35) and gap.n == 2
    # the binomial SE of the pooled replies beats the paired SE of two nearly equal differences
    assert gap.se == pytest.approx(math.sqrt((var(0.6) + var(0.9) + var(0.4) + var(0.8)) / 2 / 2))
    assert verdicts(single, ensemble) == {"O1": True, "O2": True, "O3": True, "O4": False, "O5": NOISE, "O6": None}
    assert claims({}, Config(demos=["overopt"])) == []  # the RL stages did not run: nothing to judge


def test_change_is_the_unpaired_se_of_two_evaluations():
    """An RM score's SE from the probe's sd over its replies, a share's binomial."""
    a, b = curve([0, 1], [0.5, 0.75], [0, 0], [0, 0], [0, 2], n=64, sd=0.8)
    est = change(a, b, PROXY)
    assert est.value == 1 and est.se == pytest.approx(math.sqrt(2 * 0.64 / 64))
    est = change(a, b, GOLD)  # a share: binomial
    assert est.value == 0.25 and est.se == pytest.approx(math.sqrt(var(0.5) + var(0.75)))
    assert var(1.0) == pytest.approx((65 / 66) * (1 / 66) / 64)  # 64 of 64: not a zero variance
    old = {k: v for k, v in a.items() if k != "overopt/sd/gold/test_rm"}  # a row from before the probe logged sds
    with pytest.raises(ValueError, match="overopt/sd/gold/test_rm"):
        change(old, b, TEST)  # an RM score has no binomial sd to fall back on


def test_the_ensemble_that_falls_later_from_a_lower_peak_does_not_delay_the_fall():
    """The issue's O6: each run measured against its own peak, the ensemble 'falls later' (step 25 vs 15), while
    its level is below one RM's at every evaluation. Compared at the same steps, the verdict follows the levels."""
    single = curve([0, 1, 2, 3, 4, 5, 6], [0.3] * 7, [0.3, 0.6, 0.8, 0.6, 0.5, 0.4, 0.3], [0] * 7,
                   [0, 1, 2, 3, 4, 5, 6])
    ensemble = curve([0, 1, 2, 3, 4, 5, 6], [0.3] * 7, [0.3, 0.4, 0.45, 0.45, 0.4, 0.25, 0.15], [0] * 7,
                     [0, 1, 2, 3, 4, 5, 6])
    v = verdicts(single, ensemble)
    assert v["O5"] is True and v["O6"] is False  # 0.15 below at each of steps 15-30: beyond 2 SE
    # the same shape with the gaps a third as large: inside the noise of 64 replies
    close = curve([0, 1, 2, 3, 4, 5, 6], [0.3] * 7, [0.3, 0.55, 0.75, 0.55, 0.45, 0.35, 0.25], [0] * 7,
                  [0, 1, 2, 3, 4, 5, 6])
    assert verdicts(single, close)["O6"] == NOISE


def test_a_headline_that_the_noise_does_not_support_is_not_a_verdict():
    """Each claim fed curves whose headline (a rise, a fall, a gap) points one way by less than its noise: the
    verdict is 'not distinguishable', never 'holds' or 'does not hold'."""
    # a rise and fall of 0.06 on 64 replies (2 SE of a difference of two shares near 0.5: ~0.18)
    small = curve([0, 1, 2, 3, 4], [0.5, 0.53, 0.56, 0.53, 0.5], [0.5, 0.53, 0.56, 0.53, 0.5],
                  [0, 1, 1.05, 1.05, 1.1], [0, 1, 2, 3, 4])
    v = verdicts(small, small)
    assert v["O1"] == v["O5"] == NOISE and v["O3"] is None and v["O6"] is None  # no clear fall: nothing to delay
    assert v["O2"] is True  # the proxy rose by 2 (SE 0.09), the test RM by 0.05, inside its noise: "does not rise"
    # the test RM rises clearly over the second half: O2 fails
    assert verdicts(curve([0, 1, 2, 3, 4], [0.5] * 5, [0.5] * 5, [0, 1, 1, 2, 3], [0, 1, 2, 3, 4]),
                    small)["O2"] is False
    # a KL dip of 0.2 nats with an sd of 0.5 over 64 replies (2 SE: 0.18) ... and one of 0.1: not a fall
    dip = curve([0, 1, 2, 3, 4], [0.5] * 5, [0.5] * 5, [0] * 5, [0, 1, 2, 1.8, 3])
    flat = curve([0, 1, 2, 3, 4], [0.5] * 5, [0.5] * 5, [0] * 5, [0, 1, 2, 1.9, 3])
    assert verdicts(dip, dip)["O4"] is False and verdicts(flat, flat)["O4"] is True


def test_overopt_end_to_end(tmp_path, capsys):
    config = tiny()
    report, results = run_with_results(config, tmp_path)
    text = report.read_text()
    for cid in ("O1", "O2", "O3", "O4", "O5", "O6"):
        assert f"| {cid} |" in text, cid
    # the terminal: 'N of M claims hold' and one short line per claim, never the markdown table
    out = capsys.readouterr().out.splitlines()
    summary = out[out.index(next(line for line in out if " claims hold" in line or " claim holds" in line)):]
    assert [line.split()[0] for line in summary[1:]] == ["O1", "O2", "O3", "O4", "O5", "O6"]
    assert all(len(line) <= 120 and not line.startswith("|") for line in out)
    # the recorded episodes: view.html written before the report, which links it
    assert (tmp_path / "view.html").exists() and "[view.html](view.html)" in text
    assert "seeds/rlhf-book.md" not in text and "RLHF book ch.14 §14.1" in text
    assert (tmp_path / "overopt.png").stat().st_size > 10_000
    for which in ("single", "ensemble"):
        res = json.loads((tmp_path / f"overopt_{which}" / "results.json").read_text())
        assert [c["step"] for c in res["curve"]] == [0, 2, 4]  # before the first step, then every eval_every
        assert res["curve"][0][KL] == 0.0 and res["curve"][-1][KL] > 0  # the policy moved away from sft_narrow
        assert all(0 <= c[GOLD] <= 1 and c["overopt/graded"] == 16 for c in res["curve"])
    assert 0 <= results["overopt_rm_test"]["accuracy"] <= 1 and results["overopt_rm0"]["n_train_pairs"] == 320
    rows = read_metrics(tmp_path)
    probe_rows = [r for r in rows if r["stage"] == "overopt_ensemble" and "overopt/proxy" in r]
    assert [r["step"] for r in probe_rows] == [0, 2, 4]
    keys = {k for r in rows for k in r if "/" in k}
    assert {PROXY, GOLD, TEST, INSTR, KL, "overopt/gold/ends_with_period", "overopt/graded", "overopt/sd/proxy",
            "overopt/sd/gold/test_rm", "overopt/sd/kl"} <= keys
    assert all(is_documented(k) for k in keys), [k for k in keys if not is_documented(k)]


def test_a_gold_that_only_falls_is_not_over_optimization():
    """The book's definition: the true objective gets better, then worse. A gold that never rose above its start
    (peak at step 0), or rose by less than its noise, does not show it, and an ensemble has nothing to delay."""
    falling = curve([0, 1, 2, 3, 4], [0.3, 0.6, 0.8, 0.9, 0.9], [0.2, 0.1, 0.05, 0.0, 0.0], [0, 1, 1, 1, 1],
                    [0, 1, 2, 3, 4])
    barely = curve([0, 1, 2, 3, 4], [0.3, 0.6, 0.8, 0.9, 0.9], [0.20, 0.27, 0.1, 0.0, 0.0], [0, 1, 1, 1, 1],
                   [0, 1, 2, 3, 4])
    for single in (falling, barely):
        holds, est = rise_and_fall(single, INSTR)
        assert holds == NOISE and est.value == pytest.approx(single[1][INSTR] - 0.2 if single is barely else 0.0)
        v = verdicts(single, single)
        assert v["O5"] == NOISE and v["O6"] is None


def test_a_proxy_that_stops_climbing_leaves_the_fall_to_delay():
    """The whole instruction rises 0.3 -> 0.8 and falls to 0.3 while the proxy only creeps up (+0.05, inside its
    noise): the book's curve (O5) is not distinguishable, but there is a fall, so O6 is judged on the levels."""
    single = curve([0, 1, 1.02, 1.04, 1.05], [0.5] * 5, [0.3, 0.6, 0.8, 0.5, 0.3], [0] * 5, [0, 1, 2, 3, 4])
    ensemble = curve([0, 1, 1.02, 1.04, 1.05], [0.5] * 5, [0.3, 0.6, 0.8, 0.5, 0.3], [0] * 5, [0, 1, 2, 3, 4])
    v = verdicts(single, ensemble)
    assert v["O5"] == NOISE and v["O6"] == NOISE  # the same levels after the peak: a gap of 0
