"""The rlhf_book recipe (the RLHF book's Suggested Experiments) at a budget of seconds: every chapter's stages run
on chapter 13's upstream stages, every claim row and plot is written, every logged key is documented; the rollout
cache by hand; bad settings are refused."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from trajtune.experiments.rlhf_book import EXPERIMENTS, Config, daa, rs, run, stages
from trajtune.experiments.rlhf_book.rs import RolloutCache, coverage
from trajtune.metrics import is_documented, read_metrics
from trajtune.trajectory import Owner, Trajectory


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="chapters"):
        Config(chapters=["nope"])
    with pytest.raises(ValueError, match="include 'dpo'"):
        daa.Demo(losses=["ipo"])
    with pytest.raises(ValueError, match="betas"):
        daa.Demo(betas={"dpo": 0.1})
    with pytest.raises(ValueError, match="top_p"):
        rs.Demo(sweep_top_p=[1.5])
    assert len(EXPERIMENTS) == 19


def traj(reward: float, group: int) -> Trajectory:
    t = Trajectory(reward=reward, group=group, info={"reply": "1"})
    t.append([1, 2], Owner.PROMPT, 0)
    t.append([3], Owner.POLICY, 0)
    return t


def test_rollout_cache_makes_once_and_keys_by_settings(tmp_path):
    cache, calls = RolloutCache(tmp_path), []

    def make():
        calls.append(1)
        return [traj(1.0, 0), traj(0.0, 0), traj(0.0, 1)]

    a, hit_a = cache.get({"n": 2, "temperature": 1.0}, make)
    b, hit_b = cache.get({"temperature": 1.0, "n": 2}, make)  # the same settings in another order: a hit
    c, hit_c = cache.get({"n": 2, "temperature": 0.5}, make)  # another setting: its own entry
    assert (hit_a, hit_b, hit_c) == (False, True, False) and len(calls) == 2
    assert [t.reward for t in b] == [1.0, 0.0, 0.0] and b[0].ids == a[0].ids and b[0].owners == a[0].owners
    assert coverage(b) == 0.5  # group 0 has a correct sample, group 1 none


def tiny(chapters) -> Config:
    d = Config()
    return Config(runner=replace(d.runner, workers=1), chapters=chapters, dim=32, n_layers=1,
                  pretrain=replace(d.pretrain, steps=10), val_windows=16, sft=replace(d.sft, steps=4), calc_dim=32,
                  calc_layers=1, coldstart=replace(d.coldstart, steps=8), pass_k=2, eval_per_word=2,
                  daa=daa.Demo(steps=3, batch_size=8, pairs=[8]),
                  rs=rs.Demo(tasks=8, n=2, sweep_n=[4], sft_steps=2, sft_batch=8, weak_fraction=0.5))


def test_recipe_end_to_end(tmp_path):
    config = tiny(["daa", "rs"])
    names = [s.name for s in stages(config)]
    assert names[:3] == ["pretrain", "coldstart", "sft_narrow"] and "daa_orpo_lr1" in names and "rs_weak_top" in names
    text = run(config, tmp_path).read_text()
    for cid in ("S8.1", "S8.2", "S8.3", "S8.4", "S9.1", "S9.2a", "S9.2b", "S9.3", "S9.4"):
        assert f"| {cid} |" in text, cid
    assert "**not run**" in text and "covered by graders R5" in text
    for png in ("book-s8-dpo", "book-s9-rs"):
        assert (tmp_path / f"{png}.png").stat().st_size > 1000
    cache = json.loads((tmp_path / "rs_cache" / "results.json").read_text())
    assert cache["reread"]["hit"] and not cache["built"]["main"]["hit"] and len(list((tmp_path / "rs_cache" / "rollouts").glob("*.json"))) == 5  # 4 settings + the weak policy
    top = json.loads((tmp_path / "rs_top_per_prompt" / "results.json").read_text())
    assert top["cache_hit"] and top["kept"] == 8
    rows = read_metrics(tmp_path)
    assert all(is_documented(k) for r in rows for k in r if "/" in k)
