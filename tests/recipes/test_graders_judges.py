"""The graders recipe's 'judges' part at a budget of seconds: the stages run, the claims and the section are
written; and the demo's data helpers on hand-checked cases."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trajtune.experiments.graders import Config, run_with_results, stages
from trajtune.experiments.graders import judges as J
from trajtune.algorithms.sft import SFTConfig
from trajtune.metrics import is_documented, read_metrics
from trajtune.runs.verdicts import NOISE
from trajtune.trajectory import Owner


def tiny() -> Config:
    d = Config()
    return Config(demos=["judges"], runner=replace(d.runner, workers=1), dim=32, n_layers=1,
                  pretrain=replace(d.pretrain, steps=15), val_windows=16, sft=replace(d.sft, steps=8),
                  adherence_samples=1, max_reply=16, eval_per_word=1, dpo=replace(d.dpo, steps=2),
                  judges=J.Demo(judge_sft=SFTConfig(steps=150, batch_size=16),
                                judge_optim=replace(J.Demo().judge_optim, lr=3e-3),
                               eval_ties=4, rubric_samples=1))


def test_stage_graph():
    names = [s.name for s in stages(Config(demos=["judges"]))]
    assert names == ["pretrain", "sft_narrow", "judge_train", "judge_dpo_ai", "judge_dpo_verifier"]
    with pytest.raises(ValueError, match="dpo_beta"):
        J.Demo(dpo_beta=0)


def test_verifier_verdicts_and_examples():
    assert J.verifier_verdict("Love.", "Love") == "A" and J.verifier_verdict("Love", "Love!") == "tie"
    assert J.verifier_verdict("x", "y.") == "B" and J.verifier_verdict("x.", "y.") == "tie"
    pairs, _, _ = J.split_pairs(0)
    flipped = J.oriented(pairs[:50], seed=1)
    assert {J.verifier_verdict(a, b) for _, a, b in flipped} == {"A", "B"}  # both positions occur
    assert all(J.verifier_verdict(a, b) == "tie" for _, a, b in J.tie_pairs(20, seed=2))
    data = J.judge_examples(pairs[:2], J.tie_pairs(1, seed=3), J.Demo(yes_no_share=0.3), seed=4)
    # 2 pairs x 2 orders + 1 tie = 5 pairwise examples, and int(5 * 0.3 / 0.7) = 2 yes/no ones (a 0.3 share)
    assert len(data) == 7
    tok = J.corpus()[0]
    verdicts = [tok.decode(t.tokens_of(Owner.POLICY)[:-1]) for t in data]  # the POLICY tokens: verdict + <|end|>
    # each pair as (chosen, rejected) then (rejected, chosen): A then B; the tie: C
    assert verdicts[:5] == ["A", "B", "A", "B", "C"]
    assert set(verdicts[5:]) <= {"Yes", "No"}
    assert all(len(t.ids) <= 128 for t in J.judge_examples(pairs, [], J.Demo(), seed=0))  # fits the context


def test_the_judges_part_runs_end_to_end(tmp_path):
    config = tiny()
    report, results = run_with_results(config, tmp_path)
    j = results["judge_train"]
    assert 0 <= j["agreement"] <= 1 and 0 <= j["unparseable"] <= 1 and 0 <= j["inconsistent"] <= 1
    assert results["judge_dpo_verifier"]["n_pairs"] == results["judge_dpo_verifier"]["n_pool"]
    claims = J.claims(results, config)
    assert [c.id for c in claims] == ["J1", "J2", "J3", "J4", "J5", "J6"]
    assert all(c.holds in (True, False, NOISE, None) for c in claims)
    assert all(c.estimate is not None for c in claims if c.id in ("J3", "J4", "J5", "J6"))
    text = report.read_text()
    assert "| J1 |" in text and "judges_frontier.png" in text and "judges_cai.png" in text
    assert (tmp_path / "judges_frontier.png").exists() and (tmp_path / "judge_train" / "judge").is_dir()
    assert "<" not in J.section(tmp_path, results, config).replace("<=", "")  # no raw HTML in the markdown
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert {r["stage"] for r in rows} >= {"judge_train", "judge_dpo_verifier"}
    assert all(is_documented(k) for r in rows for k in r if "/" in k)


# --- the claims follow their numbers ---------------------------------------------------------------------------
def judge_results(**changes) -> dict:
    """The judges part's results, 160 held-out pairs: a judge with 4 errors of which 3 systematic, no greedy repeat
    disagreement, 6 of 160 temperature-1 disagreements, CAI labels as good as the generated ones, a rubric item
    agreeing on 62 of 64 samples; DPO on AI labels gaining as much as on verifier labels (0.3 -> 0.9, 128 replies)."""
    j = {"n_eval": 160, "errors": 4 / 160, "systematic_errors": 3 / 160, "consistent_wrong": 3 / 160,
         "position_bias": 0.0, "repeat_disagreement_t0": 0.0, "repeat_disagreement_t1": 30 / 160,
         "inconsistent": 8 / 160, "agreement": 0.95, "first_order_agreement": 0.95, "unparseable": 0.0,
         "cai": {"agreement": 0.97, "greedy_agreement": 0.97, "mean_p_right": 0.9, "p_a_when_a": [0.9] * 64,
                 "p_a_when_b": [0.1] * 64},
         "rubric": {"judge_item_agreement": 1.0, "n": 64, "ungraded": 0.0}}
    for key, value in changes.items():
        part, _, name = key.partition("__")
        (j[part] if name else j).update({name or part: value})
    dpo = {"kl": 2.0, "n_pairs": 100, "ties": 0, "unparseable": 0, "label_agreement": 1.0, "n_pool": 100,
           "format": 1.0}
    ai = {**dpo, "labels": "ai", "reward": changes.get("ai_reward", 0.9)}
    ver = {**dpo, "labels": "verifier", "reward": 0.9, "sft": {"reward": 0.3, "format": 1.0}}
    j.pop("ai_reward", None)
    return {"judge_train": j, "judge_dpo_ai": ai, "judge_dpo_verifier": ver}


def judged(results) -> dict:
    return {c.id: c.holds for c in J.claims(results, Config(demos=["judges"]))}


def test_each_judge_claim_follows_its_numbers_not_its_headline():
    base = judged(judge_results())
    assert base == {"J1": True, "J2": NOISE, "J3": True, "J4": True, "J5": True, "J6": True}
    # J1: AI labels gain 0.5 of the verifier's 0.6 (83% > 80% by the headline): 0.8 - 0.72 - 0.06 = +0.02 ± 0.1
    # -> holds ('not less than 80% beyond the noise'); 0.6 gains half: 0.6 - 0.78 = -0.18, beyond 2 SE -> fails
    assert judged(judge_results(ai_reward=0.8))["J1"] is True
    assert judged(judge_results(ai_reward=0.6))["J1"] is False
    # J2: 3 of 4 errors systematic (75% >= 50% by the headline) is 4 errors' worth of evidence: not distinguishable;
    # 30 of 40 is; a greedy repeat that disagrees fails it whatever the errors
    assert judged(judge_results(errors=40 / 160, systematic_errors=30 / 160))["J2"] is True
    assert judged(judge_results(repeat_disagreement_t0=1 / 160))["J2"] is False
    # J3: 2 of 160 swap-inconsistent (1.25% >= 1% by the headline) is not beyond the noise
    assert judged(judge_results(inconsistent=2 / 160))["J3"] == NOISE
    # J4: greedy 0 vs temperature 1 3 of 160 ('less at temperature 0') is inside the noise
    assert judged(judge_results(repeat_disagreement_t1=3 / 160))["J4"] == NOISE
    # J5: CAI 4 points below the generated verdict (the headline allows 2) on 128 pairs: inside the noise, holds;
    # 30 points below: fails
    assert judged(judge_results(cai__agreement=0.93))["J5"] is True
    assert judged(judge_results(cai__agreement=0.67))["J5"] is False
    # J6: 59 of 64 (92% >= 90% by the headline) is not above 90% beyond the noise; 40 of 64 is below it
    assert judged(judge_results(rubric__judge_item_agreement=59 / 64))["J6"] == NOISE
    assert judged(judge_results(rubric__judge_item_agreement=40 / 64))["J6"] is False
