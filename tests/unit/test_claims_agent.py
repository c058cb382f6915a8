"""Every verdict of the agent report (A1-A13) is as strict as its claim: a constructed result with
the seed's numbers passes every check, and each constructed failure makes its own check fail.

No training here: the results dicts are written by hand in the stages' format."""

import copy
import json

import pytest

from trajtune.experiments import agent
from trajtune.experiments.agent.claims import claims, share_shift
from trajtune.runs.verdicts import NOISE


def curve(points):
    """[(train, held-out), ...] -> an evaluation curve every 10 steps."""
    return [{"step": 10 * i, "eval/pass_rate": a, "eval/heldout_pass_rate": b, "eval/invalid_per_episode": 0.05}
            for i, (a, b) in enumerate(points)]


def describe(train, held, invalid=0.02, reads=1.0, entropy=0.02):
    return {"train": train, "heldout": held, "invalid": invalid, "reads": reads, "entropy": entropy}


def rnd(solved, edit_share=0.8, raw=None, dedup=None, kept=84, distinct=21):
    raw = raw or {"minmax": 0.21, "range": 0.37, "compare": 0.35, "zero": 0.07, "init": 0.0}
    dedup = dedup or {"minmax": 0.43, "range": 0.24, "compare": 0.19, "zero": 0.14, "init": 0.0}
    return {"solved": [f"{f}/t{i}" for i, f in enumerate(solved)], "first_action_edit_share": edit_share,
            "kept": kept, "distinct": distinct, "shares_raw": raw, "shares_dedup": dedup, "hack_share": 0.0}


def dpo_curve(d_rej, invalid, train, held):
    return [{"step": 25 * i, "d_rejected": r, "d_chosen": 0.5, "eval/invalid_per_episode": v,
             "eval/pass_rate": a, "eval/heldout_pass_rate": b}
            for i, (r, v, a, b) in enumerate(zip(d_rej, invalid, train, held, strict=True))]


def seed_like() -> dict:
    """The seed's own numbers (REPRODUCE.md part A), in the stages' result format."""
    solved16 = ["minmax"] * 4 + ["range"] * 4 + ["compare"] * 4 + ["zero"] * 4
    return {
        "diagnostics": {
            "a1": {"owners": {"policy": 260, "tool": 838}, "total": 1338, "log_vocab": 5.76,
                   "masked_loss": 5.91, "unmasked_loss": 5.88},
            "a4": {"max_abs_diff": 1.4e-9, "max_abs_grad": 0.1, "kept": 12, "episodes": 80, "ratio": 0.2,
                   "cosine_baseline": 0.985},
            "a6": {"0": 0.6931, "+4": 0.1269, "-4": 2.1269},
        },
        "weak_base": {"describe": describe(0.144, 0.138, 0.06, 0.29, 0.25)},
        "oracle_sft": {"describe": describe(0.99, 0.93, entropy=0.02),
                       "curve": curve([(0.16, 0.05), (0.47, 0.47), (0.80, 0.85), (0.91, 0.95), (0.99, 0.90),
                                       (0.97, 0.90), (0.99, 0.93)]),
                       "probes": {"0": {"heldout": 0.14, "informative": 0.60, "entropy": 0.25},
                                  "20": {"heldout": 0.82, "informative": 0.70, "entropy": 0.13},
                                  "60": {"heldout": 0.93, "informative": 0.10, "entropy": 0.03}}},
        "rft": {"rounds": [rnd(solved16) for _ in range(4)],
                "curve": curve([(0.15, 0.10), (0.33, 0.12), (0.68, 0.23), (0.75, 0.10), (0.75, 0.15)])},
        "dpo": {"curve": dpo_curve([0, -15, -29, -39, -45], [0.06, 0.5, 2.26, 2.44, 2.02],
                                   [0.14, 0.20, 0.20, 0.31, 0.41], [0.14, 0.10, 0.07, 0.07, 0.00])},
        "dpo_nll": {"curve": dpo_curve([0, -15, -29, -39, -45.6], [0.06, 0.4, 0.5, 0.6, 0.61],
                                       [0.14, 0.3, 0.5, 0.6, 0.69], [0.14, 0.15, 0.16, 0.17, 0.17])},
        "sft_rl": {"curve": curve([(0.80, 0.85), (0.81, 0.85), (0.90, 0.90), (0.94, 0.90), (0.96, 0.95)])},
        "rl_only": {"curve": curve([(0.16, 0.05), (0.21, 0.20), (0.20, 0.17), (0.23, 0.17), (0.19, 0.20), (0.34, 0.25),
                                    (0.36, 0.30)])},
        "template_mismatch": {"describe": describe(0.075, 0.087, invalid=0.62, entropy=0.19), "nll_right_format": 3.0},
        "hacking": {"rounds": [{**rnd(solved16), "hack_share": h} for h in (0.42, 0.55, 0.64)],
                    "curve": [{"step": 0, "eval/public_pass_rate": 0.3, "eval/hidden_pass_rate": 0.14},
                              {"step": 1, "eval/public_pass_rate": 0.6, "eval/hidden_pass_rate": 0.30},
                              {"step": 2, "eval/public_pass_rate": 0.85, "eval/hidden_pass_rate": 0.34},
                              {"step": 3, "eval/public_pass_rate": 0.97, "eval/hidden_pass_rate": 0.36}]},
    }


def verdicts(r):
    return {c.id: c.holds for c in claims(agent.Config(), r)}


def test_the_seeds_own_numbers_pass_every_check():
    assert verdicts(seed_like()) == {f"A{i}": True for i in range(1, 14)}


def _set(path, value):
    def mutate(r):
        *keys, last = path
        for k in keys:
            r = r[k]
        r[last] = value
    return mutate


FAILURES = {
    "A1": _set(("diagnostics", "a1", "owners", "policy"), 900),  # actions a majority
    "A2": _set(("weak_base", "describe", "invalid"), 0.3),  # no format
    "A3 held-out": _set(("oracle_sft", "describe", "heldout"), 0.80),  # does not transfer
    "A3 entropy": _set(("oracle_sft", "describe", "entropy"), 0.1),  # entropy drops 2.5x, not ~10x
    "A4": _set(("diagnostics", "a4", "max_abs_diff"), 1e-3),
    "A5 plateau above solvable": _set(("rft", "curve"),
                                      curve([(0.15, 0.1), (0.4, 0.1), (0.7, 0.1), (0.95, 0.1), (0.96, 0.1)])),
    "A5 no flattening": _set(("rft", "curve"), curve([(0.15, 0.1), (0.2, 0.1), (0.30, 0.1), (0.45, 0.1), (0.75, 0.1)])),
    "A5 held-out above guess": _set(("rft", "curve"),
                                    curve([(0.15, 0.1), (0.33, 0.3), (0.68, 0.3), (0.75, 0.3), (0.75, 0.3)])),
    "A5 kept not blind": lambda r: r["rft"]["rounds"][0].update(first_action_edit_share=0.3),
    "A6": _set(("diagnostics", "a6", "+4"), 0.13),
    "A7": _set(("dpo", "curve"), dpo_curve([0, -1, -2, -3, -4], [0.06, 0.06, 0.07, 0.06, 0.06],
                                           [0.14, 0.2, 0.2, 0.3, 0.4], [0.14, 0.1, 0.1, 0.1, 0.1])),
    "A8": lambda r: r["dpo_nll"]["curve"][-1].update({"eval/invalid_per_episode": 2.5}),
    "A9 SFT->RL vs RL only": _set(("rl_only", "curve"), curve([(0.14, 0.14), (0.5, 0.5), (0.90, 0.80)])),
    "A9 RFT held-out": _set(("rft", "curve"),
                            curve([(0.15, 0.1), (0.33, 0.12), (0.68, 0.23), (0.75, 0.9), (0.75, 0.9)])),
    "A10": lambda r: r["oracle_sft"]["probes"]["60"].update(informative=0.6),
    "A11": _set(("template_mismatch", "describe", "train"), 0.6),
    "A12 shares barely change": lambda r: r["rft"]["rounds"][1].update(
        shares_dedup={"minmax": 0.25, "range": 0.35, "compare": 0.33, "zero": 0.07, "init": 0.0}),
    "A12 no duplicates": lambda r: r["rft"]["rounds"][1].update(distinct=84),
    "A13": lambda r: r["hacking"]["curve"][-1].update({"eval/hidden_pass_rate": 0.95}),
}


ALSO_READS = {"A7": ("A8",), "A9 RFT held-out": ("A5",)}  # A8 compares with A7's run; A9 with A5's curve


@pytest.mark.parametrize("case", list(FAILURES))
def test_each_check_fails_on_a_constructed_failure(case):
    r = copy.deepcopy(seed_like())
    FAILURES[case](r)
    got = verdicts(r)
    claim = case.split()[0]
    assert got[claim] is False, (case, got)
    # only the mutated claim's verdict moves, or a claim that reads the same numbers
    others = {k: v for k, v in got.items() if k != claim and k not in ALSO_READS.get(case, ())}
    assert all(others.values()), (case, others)


def test_share_shift_is_total_variation():
    assert share_shift({"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 1.0}) == 1.0
    assert share_shift({"a": 0.5, "b": 0.5}, {"a": 0.5, "b": 0.5}) == 0.0
    assert abs(share_shift({"a": 0.21, "b": 0.37, "c": 0.35, "d": 0.07},
                           {"a": 0.43, "b": 0.24, "c": 0.19, "d": 0.14}) - 0.29) < 1e-9


def test_a11_says_when_the_seeds_mechanism_does_not_reproduce():
    r = seed_like()
    r["template_mismatch"]["describe"]["invalid"] = 0.05
    a11 = next(c for c in claims(agent.Config(), r) if c.id == "A11")
    assert a11.holds is True and "NOT by the seed's mechanism" in a11.ours
    a11 = next(c for c in claims(agent.Config(), seed_like()) if c.id == "A11")
    assert "reproduces" in a11.ours


def test_the_four_conclusions_are_judged_and_summarised():
    from trajtune.experiments.agent.claims import CONCLUSIONS, conclusions, conclusions_text

    assert all(v is True for v in conclusions(agent.Config(), seed_like()).values())
    breaks = {
        CONCLUSIONS[0]: _set(("oracle_sft", "describe", "heldout"), 0.5),
        CONCLUSIONS[0] + " (beaten)": lambda r: (r["oracle_sft"]["curve"][-1].update({"eval/heldout_pass_rate": 0.86}),
                                                 r["rl_only"].update(
                                                     curve=curve([(0.16, 0.05), (0.5, 0.5), (0.99, 0.99)]))),
        CONCLUSIONS[1]: _set(("rft", "curve"), curve([(0.15, 0.1), (0.5, 0.4), (0.9, 0.5), (0.95, 0.5), (0.95, 0.5)])),
        CONCLUSIONS[2]: _set(("sft_rl", "curve"), curve([(0.80, 0.85), (0.5, 0.4), (0.30, 0.25)])),
        CONCLUSIONS[3]: _set(("rl_only", "curve"), curve([(0.16, 0.05), (0.30, 0.2), (0.56, 0.30), (0.56, 0.3),
                                                          (0.37, 0.3), (0.36, 0.3)])),  # falls over its last third
    }
    for name, mutate in breaks.items():
        r = copy.deepcopy(seed_like())
        mutate(r)
        got = conclusions(agent.Config(), r)
        assert got[name.replace(" (beaten)", "")] is False, (name, got)
    text = conclusions_text({CONCLUSIONS[0]: [True] * 3, CONCLUSIONS[1]: [True, True, NOISE],
                             CONCLUSIONS[2]: [True, False, False], CONCLUSIONS[3]: [False] * 3})
    assert text.startswith("The chapter's four conclusions (§15.5) on our gym, over 3 seeds: (1) SFT on a perfect")
    assert ("(2) RFT from a weak base is bounded by the base: this holds on 2 of 3 seeds and is not distinguishable "
            "from noise on 1.") in text
    assert "(3) A cold start makes RL work: this holds on 1 of 3 seeds." in text
    assert "(4) The RL-only curve is still rising: this holds on 0 of 3 seeds." in text
    one = conclusions_text({k: [v] for k, v in zip(CONCLUSIONS, (True, False, NOISE, True), strict=True)})
    assert "(3) A cold start makes RL work: this is not distinguishable from noise." in one and "on this seed" in one
    assert "hold on most seeds" not in text + one and "(0/1)" not in one  # sentences, not a list with counts


# --- headline against numbers: the verdict follows the numbers, not one point or a bare threshold -------------
def _claim(r, cid):
    return next(c for c in claims(agent.Config(), r) if c.id == cid)


def test_still_rising_is_a_trend_not_one_point():
    """(4) used to hold when the last point beat the middle one by 0.05: one jump (or a dip in the middle) made
    it. Now the last third of the points is compared with the third before, with its noise."""
    from trajtune.experiments.agent.claims import CONCLUSIONS, conclusions

    r = seed_like()
    r["rl_only"]["curve"] = curve([(0.16, 0.05), (0.30, 0.2), (0.36, 0.3), (0.25, 0.3), (0.36, 0.3), (0.36, 0.3),
                                   (0.42, 0.3)])  # a dip at step 30 and one higher last point: the headline 'rising'
    assert r["rl_only"]["curve"][-1]["eval/pass_rate"] >= r["rl_only"]["curve"][3]["eval/pass_rate"] + 0.05
    assert conclusions(agent.Config(), r)[CONCLUSIONS[3]] == NOISE
    r["rl_only"]["curve"] = curve([(0.16, 0.05), (0.20, 0.2), (0.22, 0.3), (0.25, 0.3), (0.45, 0.3), (0.55, 0.3),
                                   (0.62, 0.3)])  # a real climb over the last third
    assert conclusions(agent.Config(), r)[CONCLUSIONS[3]] is True


def test_a5_held_out_follows_the_pooled_rounds_not_one_point():
    """Expert iteration's held-out at guess level: one 40-episode point at 0.33 (13 of 40, what failed A5 on seed 0)
    is not a rise above guess level when the rounds pooled sit at it; a held-out clearly above it everywhere fails."""
    r = seed_like()
    r["rft"]["curve"] = curve([(0.15, 0.15), (0.61, 0.225), (0.70, 0.225), (0.74, 0.325), (0.72, 0.225)])
    assert _claim(r, "A5").holds is True
    r["rft"]["curve"] = curve([(0.15, 0.15), (0.61, 0.45), (0.70, 0.5), (0.74, 0.45), (0.72, 0.5)])
    a5 = _claim(r, "A5")
    assert a5.holds is False and [p.name for p in a5.parts if p.holds is False] == ["held-out (rounds pooled) - guess"]


def test_a2_and_a3_levels_and_guess_level():
    """A1-A4: the weak base's 'no skill' is a comparison with guess level (what a blind guess passes, 0.2): 0.23 on
    160 episodes is inside its noise (the bare 0.2 threshold would fail it), 0.35 is not. A3's levels stay levels."""
    from trajtune.experiments.agent.claims import GUESS_LEVEL

    assert GUESS_LEVEL == 0.2
    r = seed_like()
    r["weak_base"]["describe"]["train"] = 0.23
    assert _claim(r, "A2").holds is True
    r["weak_base"]["describe"]["train"] = 0.35
    assert _claim(r, "A2").holds is False
    r = seed_like()
    r["oracle_sft"]["describe"]["train"] = 0.94
    assert _claim(r, "A3").holds is False


def test_a7_a8_comparisons_inside_the_noise_are_not_distinguishable():
    """A5-A8: DPO + NLL's train 0.60 against DPO's 0.57 (seed 0's numbers) cleared the old 'higher' check; on 80
    episodes each it is noise. A held-out 'rise' of 6 of 40 after DPO does not show it improved."""
    r = seed_like()
    r["dpo"]["curve"][-1].update({"eval/pass_rate": 0.57, "eval/invalid_per_episode": 2.0})
    r["dpo_nll"]["curve"][-1].update({"eval/pass_rate": 0.60, "eval/invalid_per_episode": 0.6})
    a8 = _claim(r, "A8")
    assert a8.holds == NOISE and "train" in next(p.name for p in a8.parts if p.holds == NOISE)
    r["dpo"]["curve"][-1].update({"eval/heldout_pass_rate": 0.14 + 0.15})  # 6 of 40 more than at the start
    assert _claim(r, "A7").holds is True
    r["dpo"]["curve"][-1].update({"eval/heldout_pass_rate": 0.6})
    assert _claim(r, "A7").holds is False


def test_a9_to_a13_margins_are_cleared_by_their_noise():
    """A9-A13: SFT -> RL ending 0.28 above RL only on 80 train episodes (the headline '>= +0.2') is inside the
    noise of the 0.2 margin; 0.5 above clears it. A13's kept hack share growing 42% -> 45% is noise."""
    r = seed_like()
    r["rl_only"]["curve"] = curve([(0.16, 0.05), (0.5, 0.5), (0.68, 0.60)])
    r["sft_rl"]["curve"][-1].update({"eval/pass_rate": 0.96, "eval/heldout_pass_rate": 0.95})
    assert _claim(r, "A9").holds == NOISE
    r["rl_only"]["curve"] = curve([(0.16, 0.05), (0.3, 0.2), (0.4, 0.3)])
    assert _claim(r, "A9").holds is True
    r = seed_like()
    r["hacking"]["rounds"][-1].update(hack_share=0.45)
    assert _claim(r, "A13").holds == NOISE


def test_every_claim_shows_the_uncertainty_that_decided_it():
    """A claim decided by a comparison carries its estimate (the claims table's 'difference ± 2 SE' column); the
    exact ones (A1, A3's levels, A4, A6, A12) carry none."""
    cl = claims(agent.Config(), seed_like())
    assert {c.id for c in cl if c.estimate is None} == {"A1", "A3", "A4", "A6", "A12"}
    assert all("± " in c.evidence and "SE" in c.evidence for c in cl if c.estimate is not None)


# --- over seeds: every part pooled with its uncertainty; NOISE everywhere a verdict becomes a word -------------
def _summaries():
    from trajtune.experiments.agent.report import summary

    c, out = agent.Config(), {}
    for s, rl_train in enumerate((0.40, 0.68, 0.45)):  # seed 1's RL only ends close to SFT -> RL: A9 inside the noise
        r = copy.deepcopy(seed_like())
        r["rl_only"]["curve"][-1]["eval/pass_rate"] = rl_train
        out[s] = json.loads(json.dumps(summary(c, r, claims(c, r))))  # through JSON, as summary.json
    return out


def test_the_seeds_report_pools_every_part_and_prints_short_lines(tmp_path, capsys):
    from trajtune.experiments.agent.report import pooled_claims, robustness, write_seeds_report

    sums = _summaries()
    assert [sums[s]["holds"]["A9"] for s in range(3)] == [True, NOISE, True]
    pooled = {c.id: c for c in pooled_claims(sums)}
    assert pooled["A9"].holds is True and "over 3 seeds" in pooled["A9"].evidence  # 0.56, 0.28, 0.51 above RL only
    assert pooled["A6"].holds is True and pooled["A6"].estimate is None  # exact parts: held on every seed
    capsys.readouterr()
    paths = {"avx512": sums, "avx2": {**sums, 0: sums[1]}}
    text = write_seeds_report(tmp_path, sums, paths).read_text()
    out = capsys.readouterr().out
    assert "| A9 | 2/3 | holds | noise | holds | holds |" in text
    assert "flip with the float path alone: A9 (seed 0)" in robustness(paths)[0]
    assert "over seeds 0, 1, 2: 13 of 13 claims hold" in out
    assert "|---" not in out and all(len(line) <= 120 for line in out.splitlines()), out
    first = text.split("## ")[0]
    assert "(4) The RL-only curve is still rising: this holds on" in first and "over the seeds it" in first
