"""The graders recipe's 'judges' part at a budget of seconds: the stages run, the claims and the section are
written; and the demo's data helpers on hand-checked cases."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trajtune.experiments.graders import Config, run_with_results, stages
from trajtune.experiments.graders import judges as J
from trajtune.algorithms.sft import SFTConfig
from trajtune.metrics import is_documented, read_metrics
from trajtune.trajectory import Owner


def tiny() -> Config:
    d = Config()
    return Config(demos=["judges"], runner=replace(d.runner, workers=1), dim=32, n_layers=1,
                  pretrain=replace(d.pretrain, steps=15), val_windows=16, sft=replace(d.sft, steps=8),
                  adherence_samples=1, max_reply=16, eval_per_word=1, dpo=replace(d.dpo, steps=2),
                  judges=J.Demo(judge_sft=SFTConfig(steps=150, batch_size=16), judge_optim=replace(J.Demo().judge_optim, lr=3e-3),
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
    assert all(c.holds in (True, False) for c in claims)
    text = report.read_text()
    assert "| J1 |" in text and "judges_frontier.png" in text and "judges_cai.png" in text
    assert (tmp_path / "judges_frontier.png").exists() and (tmp_path / "judge_train" / "judge").is_dir()
    assert "<" not in J.section(tmp_path, results, config).replace("<=", "")  # no raw HTML in the markdown
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert {r["stage"] for r in rows} >= {"judge_train", "judge_dpo_verifier"}
    assert all(is_documented(k) for r in rows for k in r if "/" in k)
