"""The rlhf_book recipe (the RLHF book's Suggested Experiments) at a budget of seconds: every chapter's stages run
on chapter 13's upstream stages, every claim row and plot is written, every logged key is documented; the rollout
cache by hand; bad settings are refused."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from trajtune.experiments.rlhf_book import (EXPERIMENTS, Config, daa, distill, index_table, pg, rs, run, seeds_report,
                                            sft, stages)
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
    with pytest.raises(ValueError, match="lrs"):
        sft.Demo(lrs=[1e-3])
    with pytest.raises(ValueError, match="group sizes"):
        pg.Demo(sweep_group=[1])
    with pytest.raises(ValueError, match="top_p"):
        rs.Demo(sweep_top_p=[1.5])
    assert len(EXPERIMENTS) == 19


def test_index_names_every_experiment():
    table = index_table([], Config(chapters=["daa"]))
    assert table.count("\n") == 2 + 18  # header, rule, 19 rows
    assert "not run here (chapter `rs` not selected)" in table and "covered by graders R1, R3" in table
    assert "run; not judged" in table  # daa selected, no results


def test_reversal_task_and_words():
    t = distill.ReverseTask("abcd")
    assert t.prompt == "reverse abcd" and t.answer == "dcba" and distill.exact(t, "dcba")[0] == 1.0
    assert distill.ReverseTask("abcd", "dcba").prompt == "reverse abcd hint dcba"
    train, held = distill.word_sets(0, 50, 10)
    assert len(set(train)) == 50 and not set(train) & set(held) and all(3 <= len(w) <= 6 for w in train + held)
    assert distill.word_sets(0, 50, 10) == (train, held)


def test_calculator_reward_pieces():
    assert pg.correctness("123", "124") == pytest.approx(2 / 3) and pg.correctness("45", "450") == pytest.approx(2 / 3)
    assert pg.well_formed("45") and not pg.well_formed("045") and not pg.well_formed("4+5") and not pg.well_formed("")
    reward, checks = pg.calculator_verifier(0.5)(pg.ArithmeticTask(20, 25), "45")
    assert reward == 1.5 and checks["binary"] and checks["format_ok"]


def test_diagnostics_count_groups_without_contrast():
    trajs = [traj(1.0, 0), traj(1.0, 0), traj(1.0, 1), traj(0.0, 1)]
    for t in trajs:
        t.info.update(format_ok=True, binary=t.reward >= 1)
    trajs[0].info["reply"] = "2"
    m = pg.diagnostics(trajs)
    assert m["book/binary_no_contrast"] == 0.5 and m["book/binary"] == 0.75
    assert m["book/distinct_share"] == pytest.approx((2 / 2 + 1 / 2) / 2)


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
                  rs=rs.Demo(tasks=8, n=2, sweep_n=[4], sft_steps=2, sft_batch=8, weak_fraction=0.5),
                  sft_book=sft.Demo(lrs=[1e-3, 1e-2], steps=2, every=1, samples=1),
                  distill=distill.Demo(train_words=40, heldout_words=4, dim=16, coldstart_steps=3, coldstart_batch=8,
                                       steps=2, prompts_per_step=2, rollouts=2, sweep_rollouts=[1], sweep_top_k=[1],
                                       sweep_prompts=[], eval_samples=1),
                  pg=pg.Demo(steps=2, tasks_per_step=2, group_size=2, sweep_group=[], sweep_data=[4], instruct_steps=2))


def test_one_chapter_and_the_seeds_report(tmp_path):
    """Plumbing at a budget of seconds: one chapter's stages, its claims in the report, the over-seeds table."""
    config = tiny(["daa"])
    assert [s.name for s in stages(config)][:2] == ["pretrain", "sft_narrow"]  # only what daa needs upstream
    text = run(config, tmp_path).read_text()
    assert "| S8.1 |" in text and "not run here (chapter `rs` not selected)" in text
    over = seeds_report(config, tmp_path / "over", {0: tmp_path}).read_text()
    assert "| S8.4 |" in over and "of 1" in over


@pytest.mark.slow
def test_recipe_end_to_end(tmp_path, capsys):
    config = tiny(["sft", "pg", "daa", "rs", "distill"])
    names = [s.name for s in stages(config)]
    assert names[:3] == ["pretrain", "coldstart", "sft_narrow"] and "daa_orpo_lr1" in names and "rs_weak_top" in names
    text = run(config, tmp_path).read_text()
    printed = capsys.readouterr().out.splitlines()
    summary = next(i for i, line in enumerate(printed) if " claims hold" in line)  # the terminal: the summary, no table
    assert all(len(line) <= 120 and not line.startswith("|") for line in printed[summary:])
    table = (tmp_path / "claims.md").read_text()
    assert [line.split()[0] for line in printed[summary + 1:]] == re.findall(r"^\| (S[\d.]+[a-z]?) \|", table, re.M)
    assert (tmp_path / "view.html").exists() and "[view.html](view.html)" in text  # written first, then linked
    assert "seeds/rlhf-book.md" not in text and "RLHF book, ch.9 §9.4" in text
    for cid in ("S4.1", "S4.2", "S6.1", "S6.2", "S6.3b", "S6.3c", "S6.4", "S8.1", "S8.2", "S8.3", "S8.4", "S9.1",
                "S9.2a", "S9.2b", "S9.3a", "S9.3b", "S9.4", "S12.1", "S12.2a", "S12.2b"):
        assert f"| {cid} |" in text, cid
    assert "not run" not in text.split("## Claims")[0] and "covered by graders R5" in text
    for png in ("book-s4-stop", "book-s4-heldout_nll", "book-s6-binary", "book-s6-binary_no_contrast",
                "book-s6-instruct", "book-s8-dpo", "book-s9-rs", "book-s12-reward", "book-s12-skipped_share"):
        assert (tmp_path / f"{png}.png").stat().st_size > 1000
    cache = json.loads((tmp_path / "rs_cache" / "results.json").read_text())
    # 4 settings + the weak policy
    assert (cache["reread"]["hit"] and not cache["built"]["main"]["hit"]
            and len(list((tmp_path / "rs_cache" / "rollouts").glob("*.json"))) == 5)
    top = json.loads((tmp_path / "rs_top_per_prompt" / "results.json").read_text())
    assert top["cache_hit"] and top["kept"] == 8
    sft_run = json.loads((tmp_path / "sft_lr1" / "results.json").read_text())
    assert [c["step"] for c in sft_run["curve"]] == [0, 1, 2] and sft_run["held_out_demos"] > 0
    rows = read_metrics(tmp_path)
    assert all(is_documented(k) for r in rows for k in r if "/" in k)
