"""The graders recipe's part 'reward_models' at a budget of seconds: its stages run on chapter 13's upstream
stages, every claim row and plot is written, every logged key is documented; and its pure helpers by hand."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from trajtune.experiments.graders import Config, run, stages
from trajtune.experiments.graders.reward_models import Demo, action_label, auc, finish_rank
from trajtune.metrics import is_documented, read_metrics


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
