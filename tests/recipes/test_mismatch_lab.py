"""The mismatch lab, reduced to seconds (one seed, 3 steps, three corrections): the report's structure, and each
injected mismatch really there -- K in the recorded versions, the bf16 / fp8 sampler's log-probs off the trainer's
(fp8 more), top-p's raw log-probs off the processed ones on the same tokens."""

import json
import math

import pytest

from trajtune.algorithms.rl import RLConfig
from trajtune.config import from_dict
from trajtune.experiments import mismatch_lab
from trajtune.experiments.mismatch_lab import MISMATCHES, Config, stage_name
from trajtune.experiments.mismatch_lab.report import verdict
from trajtune.runs.stages import StageOptions
from trajtune.trajectory import Owner

CORRECTIONS = ["none", "tis", "mis_token"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("lab")
    config = Config(seeds=[0], corrections=CORRECTIONS, n_eval=4, eval_samples=2,
                    rl=RLConfig(steps=3, tasks_per_step=2, group_size=4, advantage="grpo", surrogate="ppo"),
                    runner=StageOptions(workers=1))
    report = mismatch_lab.run(config, run_dir)
    return run_dir, report


def results(run_dir, stage):
    return json.loads((run_dir / stage / "results.json").read_text())


def recording(run_dir, stage, step):
    return json.loads((run_dir / stage / "recording" / f"step-{step:06d}.json").read_text())


def policy(traj, key):
    return [v for v, o in zip(traj[key], traj["owners"]) if o == Owner.POLICY]


def test_report_structure(lab):
    run_dir, report = lab
    text = report.read_text()
    for heading in ("## The injected mismatch, measured", "## Held-out reward minus on-policy's",
                    "## The same over the whole run", "## Share of sampled tokens each correction cut", "## Verdicts"):
        assert heading in text
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["mismatch"]) == set(MISMATCHES) and set(summary["verdicts"]) == set(MISMATCHES)
    for m in MISMATCHES:
        assert f"- {m}: not separable at 1 seeds" in text  # one seed: no spread, no winner
        assert set(summary["mismatch"][m]["corrections"]) == set(CORRECTIONS)
        assert summary["mismatch"][m]["corrections"]["none"]["cut"] == [0.0]
    # the recording run is the tis row; the others replayed it: 3 steps each
    assert results(run_dir, stage_name(0, "k1", "none"))["steps"] == 3
    assert not (run_dir / stage_name(0, "k1", "none") / "recording").exists()


@pytest.mark.parametrize("k", [1, 2, 4])
def test_staleness_is_in_the_versions(lab, k):
    run_dir, _ = lab
    for step in range(3):  # step s sampled with the weights after update max(0, s - K)
        versions = {v for t in recording(run_dir, stage_name(0, f"k{k}", "tis"), step)["trajs"]
                    for v in policy(t, "versions")}
        assert versions == {max(0, step - k)}
    assert results(run_dir, stage_name(0, "k1", "tis"))["k3"] > 0


def test_low_precision_sampler_is_off_the_trainer_and_fp8_more(lab):
    run_dir, _ = lab
    on, bf16, fp8 = (results(run_dir, stage_name(0, m, None if m == "onpolicy" else "tis"))
                     for m in ("onpolicy", "bf16", "fp8"))
    assert on["abs_log_ratio"] < 1e-5  # the same weights: the KV cache's rounding alone
    assert 10 * on["abs_log_ratio"] < bf16["abs_log_ratio"] < fp8["abs_log_ratio"]
    assert 0 < bf16["sync_logprob_diff"] < fp8["sync_logprob_diff"]  # the sync check measured it (and let it pass)


def test_top_p_raw_logprobs_are_the_full_softmax(lab):
    run_dir, _ = lab
    processed = recording(run_dir, stage_name(0, "top_p", "tis"), 0)["trajs"]
    raw = recording(run_dir, stage_name(0, "top_p_raw", "tis"), 0)["trajs"]
    assert [t["ids"] for t in processed] == [t["ids"] for t in raw]  # the same draws from the same weights
    p = [x for t in processed for x in policy(t, "logprobs")]
    r = [x for t in raw for x in policy(t, "logprobs")]
    assert all(a >= b for a, b in zip(p, r)) and any(a > b + 1e-3 for a, b in zip(p, r))  # renormalised nucleus
    assert results(run_dir, stage_name(0, "top_p_raw", "tis"))["abs_log_ratio"] < 1e-5  # raw: the trainer's own
    assert results(run_dir, stage_name(0, "top_p", "tis"))["abs_log_ratio"] > 1e-3


def test_verdict_by_hand():
    # gaps over 3 seeds: a (0.0, 0.1, -0.1) mean 0, sd 0.1; b (-0.3, -0.4, -0.5) mean -0.4, sd 0.1: lead 0.4 > pooled
    # spread sqrt((0.01 + 0.01) / 2) = 0.1 -> a wins
    v = verdict({"a": {"gap": [0.0, 0.1, -0.1]}, "b": {"gap": [-0.3, -0.4, -0.5]}}, 3)
    assert v["best"] == "a" and v["separable"] and v["spread"] == pytest.approx(0.1)
    assert v["text"].startswith("**a** keeps learning closest")
    # b (-0.05, 0.15, -0.25) mean -0.05, sd 0.2: lead 0.05 < spread sqrt((0.01 + 0.04) / 2) = 0.158
    v = verdict({"a": {"gap": [0.0, 0.1, -0.1]}, "b": {"gap": [-0.05, 0.15, -0.25]}}, 3)
    assert not v["separable"] and v["spread"] == pytest.approx(math.sqrt(0.025))
    assert v["text"].startswith("not separable at 3 seeds (a gap +0.000, runner-up b -0.050: lead 0.050")


def test_config_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="mismatches must be distinct names"):
        Config(mismatches=["k3"])
    with pytest.raises(ValueError, match="recorded_with 'mis_geo' must be one of corrections"):
        Config(corrections=["none", "tis"], recorded_with="mis_geo")
    with pytest.raises(ValueError, match="rl.correction / rl.tis_cap are the lab's"):
        from_dict(Config, {"rl": {"tis_cap": 2.0}})
    with pytest.raises(ValueError, match=r"sampling.top_p: set per mismatch by the lab \(its top-p: top_p"):
        from_dict(Config, {"sampling": {"top_p": 0.5}})
