"""Graders recipe, part 'overopt', at a budget of seconds: the stage graph, the split, the claims on hand-made
curves, and one end-to-end run (RMs, both RL runs, probe rows every N steps, claims, the plot)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from trajtune.experiments.graders import Config, run_with_results, stages
from trajtune.experiments.graders.overopt import (
    GOLD, INSTR, KL, PROXY, TEST, Demo, claims, fall_step, halves, peak_and_fall,
)
from trajtune.metrics import is_documented, read_metrics


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


def curve(proxy, gold, instr, test, kl):
    return [{"step": 5 * i, PROXY: p, GOLD: g, INSTR: n, TEST: t, KL: k}
            for i, (p, g, n, t, k) in enumerate(zip(proxy, gold, instr, test, kl, strict=True))]


def test_claims_on_hand_made_curves():
    # one RM: gold 0.3 -> peak 0.8 at step 10 -> 0.5 (a fall of 0.3), proxy keeps rising; test RM flat after step 10
    single = curve([0, 1, 2, 3, 4], [0.3, 0.6, 0.8, 0.6, 0.5], [0.3, 0.5, 0.5, 0.5, 0.5], [0, 1, 1.5, 1.5, 1.4],
                   [0, 1, 2, 3, 4])
    # the ensemble: gold falls later (step 20 vs step 15); KL flat once (0 -> 1 -> 1): O4 fails
    ensemble = curve([0, 1, 2, 3, 4], [0.3, 0.6, 0.8, 0.9, 0.7], [0.3, 0.6, 0.6, 0.6, 0.6], [0, 1, 2, 2, 2],
                     [0, 1, 1, 2, 3])
    assert fall_step(single, GOLD, 0.1) == 15 and fall_step(ensemble, GOLD, 0.1) == 20
    p = peak_and_fall(single, GOLD, 0.1)
    assert (p["peak_step"], p["peak"], p["final"], p["fell"], p["proxy_at_peak"]) == (10, 0.8, 0.5, True, 2)
    results = {"overopt_single": {"curve": single}, "overopt_ensemble": {"curve": ensemble}}
    verdicts = {c.id: c.holds for c in claims(results, Config(demos=["overopt"]))}
    assert verdicts == {"O1": True, "O2": True, "O3": True, "O4": False, "O5": False, "O6": None}
    assert claims({}, Config(demos=["overopt"])) == []  # the RL stages did not run: nothing to judge


def test_overopt_end_to_end(tmp_path):
    config = tiny()
    report, results = run_with_results(config, tmp_path)
    text = report.read_text()
    for cid in ("O1", "O2", "O3", "O4", "O5", "O6"):
        assert f"| {cid} |" in text, cid
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
    assert {PROXY, GOLD, TEST, INSTR, KL, "overopt/gold/ends_with_period", "overopt/graded"} <= keys
    assert all(is_documented(k) for k in keys), [k for k in keys if not is_documented(k)]


def test_a_gold_that_only_falls_is_not_over_optimization():
    """The book's definition: the true objective gets better, then worse. A gold that never rose above its start
    (peak at step 0, or by less than the threshold) does not show it, and an ensemble has nothing to delay."""
    falling = curve([0, 1, 2, 3, 4], [0.3, 0.6, 0.8, 0.9, 0.9], [0.2, 0.1, 0.05, 0.0, 0.0], [0, 1, 1, 1, 1],
                    [0, 1, 2, 3, 4])
    barely = curve([0, 1, 2, 3, 4], [0.3, 0.6, 0.8, 0.9, 0.9], [0.20, 0.27, 0.1, 0.0, 0.0], [0, 1, 1, 1, 1],
                   [0, 1, 2, 3, 4])
    for single in (falling, barely):
        p = peak_and_fall(single, INSTR, 0.1)
        assert p["fell"] and not p["rose"]  # it fell, but it never got better first
        results = {"overopt_single": {"curve": single}, "overopt_ensemble": {"curve": single}}
        verdicts = {c.id: c.holds for c in claims(results, Config(demos=["overopt"]))}
        assert verdicts["O5"] is False and verdicts["O6"] is None
