"""The graders recipe's part 'reward_models' at a budget of seconds: its stages run on chapter 13's upstream
stages, every claim row and plot is written, every logged key is documented; and its pure helpers by hand."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from trajtune.experiments.graders import Config, run, stages
from trajtune.experiments.graders.reward_models import Demo, action_label, auc, auc_se, claims, finish_rank
from trajtune.metrics import is_documented, read_metrics
from trajtune.runs.verdicts import NOISE


def test_auc_by_hand():
    # positives 0.9, 0.4; negatives 0.5, 0.4: pairs (0.9>0.5) 1, (0.9>0.4) 1, (0.4<0.5) 0, (0.4=0.4) 0.5 -> 2.5/4
    assert auc([0.9, 0.4, 0.5, 0.4], [True, True, False, False]) == pytest.approx(0.625)
    assert auc([1.0, 2.0], [True, True]) != auc([1.0, 2.0], [True, True])  # NaN: no negatives


def test_labels_and_ranks():
    assert action_label("read", "fix_init", {}) == ("read", 1)
    assert action_label("edit fix_init", "fix_init", {}) == ("right edit", 1)
    assert action_label("edit swap_minmax", "fix_init", {}) == ("wrong edit", 0)
    assert action_label("submit", "fix_init", {"hidden_pass": True}) == ("submit", 1)
    assert action_label("hardcode_tests", "fix_init", {}) == ("hardcode", 0)
    assert [finish_rank(x) for x in ("Good.", "Good!", "Good,", "Good")] == [3, 2, 1, 0]
    with pytest.raises(ValueError, match="orm_aggregate"):
        Demo(orm_aggregate="max")


def tiny() -> Config:
    d = Config()
    return Config(runner=replace(d.runner, workers=1), demos=["reward_models"], dim=32, n_layers=1,
                  pretrain=replace(d.pretrain, steps=10), val_windows=16, sft=replace(d.sft, steps=4), calc_dim=32,
                  calc_layers=1, coldstart=replace(d.coldstart, steps=6), pass_k=2,
                  reward_models=Demo(orm_tasks=8, orm_samples=2, orm_steps=2, orm_batch=8, bon_n=2, prm_steps=2,
                                     prm_batch=8, prm_dim=16, bt_steps=3, kwise_lists=8, kwise_steps=2))


def test_reward_models_part_end_to_end(tmp_path):
    config = tiny()
    assert [s.name for s in stages(config)][-4:] == ["rm_orm", "rm_prm", "rm_bt", "rm_kwise"]
    text = run(config, tmp_path).read_text()
    for cid in ("R1", "R2", "R3", "R4", "R5", "R6", "R7"):
        assert f"| {cid} |" in text, cid
    for png in ("rm-orm-bon", "rm-prm-steps", "rm-bt-margin", "rm-kwise-loss"):
        assert (tmp_path / f"{png}.png").stat().st_size > 1000
    assert "<" not in text.replace("<br>", "").split("## Reward models")[1].split("## Time")[0]  # no raw tags
    bt = json.loads((tmp_path / "rm_bt" / "results.json").read_text())
    assert len(bt["margin"]) == 3 and bt["eval"]["n"] == 128 and len(bt["eval"]["categories"]) == 16
    rows = read_metrics(tmp_path)
    assert {"rm_orm", "rm_prm", "rm_bt", "rm_kwise"} <= {r["stage"] for r in rows}
    assert all(is_documented(k) for r in rows for k in r if "/" in k)


# --- the claims follow their numbers ---------------------------------------------------------------------------
def test_auc_se_hanley_mcneil_by_hand():
    # a = 0.75, 10 positives, 20 negatives: q1 = 0.75 / 1.25 = 0.6, q2 = 2 * 0.5625 / 1.75 = 0.642857
    # var = (0.1875 + 9 * (0.6 - 0.5625) + 19 * (0.642857 - 0.5625)) / 200 = (0.1875 + 0.3375 + 1.526786) / 200
    assert auc_se(0.75, 10, 20) == pytest.approx(math.sqrt(2.051786 / 200), abs=1e-6)
    assert math.isnan(auc_se(0.75, 0, 20))


def rm_results(**changes) -> dict:
    """The reward_models part's results: an ORM at AUC 0.9 on 2048 samples (7% right), best-of-8 0.20 vs 0.07 on
    256 problems, a PRM right on 95% of 200 right and 200 wrong edits, AUC 0.95 on 100 fixed / 100 unfixed
    episodes, a BT margin rising 0.1 -> 1.0, 128 held-out pairs at 0.95, PL and BT both 0.99 on 64 lists."""
    r = {"rm_orm": {"auc": {"mean": 0.9, "min": 0.9, "product": 0.9, "last": 0.9}, "heldout_samples": 2048,
                    "heldout_correct": 0.07, "accuracy": 0.93, "n": 8,
                    "bon": {"orm": 0.2, "random": 0.07, "oracle": 0.4}},
         "rm_prm": {"step_accuracy": {"read": 1.0, "right edit": 0.95, "wrong edit": 0.95, "submit": 1.0},
                    "step_counts": {"read": 200, "right edit": 200, "wrong edit": 200, "submit": 200},
                    "test_episodes": 200, "good_share": 0.5, "auc": {"min": 0.95, "mean": 0.9, "last": 0.9}},
         "rm_bt": {"margin": [0.1, 0.12, 0.08, 0.11, 0.1, 0.1, 0.12, 0.08, 0.5, 0.6] + [1.0, 1.1, 0.9, 1.0, 1.0, 1.0,
                                                                                        1.1, 0.9],
                   "accuracy": [1.0] * 18, "eval": {"n": 128, "categories": {"a": {}}, "accuracy": 0.95, "margin": 1.0},
                   "eval_s": 0.5},
         "rm_kwise": {"plackett-luce": {"pair_accuracy": 0.99, "top1": 1.0}, "bt": {"pair_accuracy": 0.99, "top1": 1.0},
                      "test_lists": 64, "train_lists": 96}}
    for key, value in changes.items():
        stage, *path = key.split("__")
        d = r[stage]
        for p in path[:-1]:
            d = d[p]
        d[path[-1]] = value
    return r


def rm_verdicts(results) -> dict:
    return {c.id: c.holds for c in claims(results, Config(demos=["reward_models"]))}


def test_each_reward_model_claim_follows_its_numbers_not_its_headline():
    assert rm_verdicts(rm_results()) == {f"R{i}": True for i in range(1, 8)}
    # R1: AUC 0.78 (>= 0.75 by the headline) with 143 right answers of 2048: SE ~0.02, not beyond the bar
    assert rm_verdicts(rm_results(rm_orm__auc__mean=0.78))["R1"] == NOISE
    # R2: ORM pick 0.09 vs random 0.07 ('beats' by the headline) on 256 problems: inside the noise
    assert rm_verdicts(rm_results(rm_orm__bon__orm=0.09))["R2"] == NOISE
    # R3: wrong edits at 0.82 (>= 0.8) on 200 steps: not beyond the bar; at 0.6: below it
    assert rm_verdicts(rm_results(**{"rm_prm__step_accuracy__wrong edit": 0.82}))["R3"] == NOISE
    assert rm_verdicts(rm_results(**{"rm_prm__step_accuracy__wrong edit": 0.6}))["R3"] is False
    # R4: AUC 0.83 on 100 + 100 episodes: not beyond 0.8
    assert rm_verdicts(rm_results(rm_prm__auc__min=0.83))["R4"] == NOISE
    # R5: the last steps' margin above the first by the headline (1.02 vs 1.0) with a step-to-step spread of 0.1
    flat = [1.0, 1.1, 0.9, 1.0] * 2 + [1.0, 1.0] + [1.0, 1.1, 0.9, 1.1] * 2
    assert rm_verdicts(rm_results(rm_bt__margin=flat))["R5"] == NOISE
    # R6: accuracy 0.55 on 128 pairs ('above chance'): inside the noise
    assert rm_verdicts(rm_results(rm_bt__eval__accuracy=0.55))["R6"] == NOISE
    # R7: PL 0.93 vs BT 0.99 ('within 0.05' fails by the headline, 0.06) on 384 pairs: not beyond the noise; 0.8 is
    assert rm_verdicts(rm_results(**{"rm_kwise__plackett-luce__pair_accuracy": 0.93}))["R7"] is True
    assert rm_verdicts(rm_results(**{"rm_kwise__plackett-luce__pair_accuracy": 0.8}))["R7"] is False
