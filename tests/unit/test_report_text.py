"""What reports say, computed from their own numbers: the HF pipeline's stage summary, the claims count,
the per-seed links, the view.html line. No training: hand-made results."""

from trajtune.experiments.hf_pipeline.config import Config as PipelineConfig
from trajtune.experiments.hf_pipeline.report import stage_claims, stage_summary
from trajtune.runs.report import Claim, claims_verdict, html_problems, write_claims_over_seeds, write_report


def _evals(completion, chat, sampled, at_k):
    return {s: {"eval": {"completion_greedy": c, "chat_greedy": g, "chat_sampled": t, "chat_pass_at_k": k}}
            for s, c, g, t, k in zip(("base", "pretrain", "sft", "dpo", "grpo"), completion, chat, sampled, at_k,
                                     strict=True)}


def summary(results):
    return stage_summary(results, PipelineConfig(), stage_claims(results, PipelineConfig()))


def test_the_pipeline_summary_names_what_fell_and_the_forgetting():
    # the run: completion pass@1 93.4% -> 22.3% -> 7.4% -> 8.2% while the chat metrics rise
    results = _evals([0.0, 0.934, 0.223, 0.074, 0.082], [0.0, 0.1, 0.434, 0.6, 0.785],
                     [0.0, 0.05, 0.4, 0.55, 0.7], [0.0, 0.2, 0.7, 0.8, 0.9])
    text = summary(results)
    assert ("**Every training stage raised the held-out metrics it targets beyond the noise, but not every metric "
            "rose: completion pass@1 (greedy) fell after sft, dpo.**") in text
    assert "- sft: rose: chat pass@1 (greedy) 10.0% -> 43.4%" in text
    assert "fell: completion pass@1 (greedy) 93.4% -> 22.3%" in text
    assert "93.4% -> 22.3% -> 7.4% -> 8.2%" in text and "ch. 15" in text and "lowest after dpo" in text
    assert f"the form of {1 - PipelineConfig().chat_share:.0%} of the pretraining corpus" in text
    # every stage raises everything: the headline says so, and no forgetting sentence
    up = _evals([0.0, 0.5, 0.55, 0.6, 0.65], [0.0, 0.1, 0.4, 0.6, 0.7], [0.0, 0.1, 0.3, 0.5, 0.6],
                [0.0, 0.2, 0.5, 0.7, 0.8])
    text = summary(up)
    assert "**Every training stage raised the held-out metrics it targets beyond the noise, and no pass metric " \
           "fell beyond it.**" in text
    assert "fell:" not in text and "forgotten" not in text
    # a targeted metric that falls is named in the headline, with its counts
    down = _evals([0.0, 0.5, 0.55, 0.6, 0.65], [0.0, 0.1, 0.4, 0.3, 0.7], [0.0, 0.1, 0.3, 0.5, 0.6],
                  [0.0, 0.2, 0.5, 0.7, 0.8])
    assert "**Not every stage raised the metrics it targets beyond the noise:** " \
           "dpo: chat greedy pass@1 40.0% -> 30.0%, -0.100 ± 0.084" in summary(down)


def test_claims_count_and_seed_links(tmp_path):
    cl = [Claim("C1", "x", "-", "-", "y", True), Claim("C2", "x", "-", "-", "y", False),
          Claim("C3", "x", "-", "-", "y", None)]
    assert claims_verdict(cl) == "**1 of 2 claims hold** (1 not judged)"
    assert claims_verdict(cl[:1]) == "**1 of 1 claim holds**"
    text = write_claims_over_seeds(tmp_path, "t", {0: cl, 1: cl}).read_text()
    assert "[seed 0](seed-0/report.html), [seed 1](seed-1/report.html)" in text


def test_a_report_links_view_html_when_episodes_were_recorded(tmp_path):
    from trajtune.runs.recorder import FILE
    from trajtune.runs.report import EPISODES_FILE

    assert EPISODES_FILE == FILE
    write_report(tmp_path, "t", ["intro", "## more"])
    assert "view" not in (tmp_path / "report.md").read_text()  # nothing recorded: no line
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "episodes.jsonl").write_text("{}\n")
    lines = write_report(tmp_path, "t", ["intro", "## more"]).read_text().split("\n\n")
    assert lines[2] == (f"This run recorded episodes (`<stage>/episodes.jsonl`); `trajtune view {tmp_path}` writes "
                        "(or refreshes) view.html to read them token by token.")  # right after the first paragraph
    (tmp_path / "view.html").write_text("<html></html>")
    write_report(tmp_path, "t", ["intro"])
    page = (tmp_path / "report.html").read_text()
    assert '<a href="view.html">view.html</a>' in page and html_problems(page) == []


def test_run_warnings_name_each_way_a_run_learned_nothing(tmp_path):
    from trajtune.metrics import MetricsLogger
    from trajtune.runs.metrics_report import run_warnings, write_run_report

    learning = [{"step": s, "train/loss": 1.0 / s, "train/grad_norm": 0.5, "rollout/reward": 0.1 * s,
                 "rollout/no_signal_share": 0.5, "rollout/truncated_share": 0.2} for s in (1, 2, 3)]
    assert run_warnings(learning) == []
    flat = [{"step": s, "train/loss": 0.0, "train/grad_norm": 0.0, "rollout/reward": 0.0,
             "rollout/no_signal_share": 1.0, "rollout/truncated_share": 0.9} for s in (1, 2, 3)]
    got = run_warnings(flat)
    assert [w.split(":**")[0] for w in got] == ["**No learning signal",
                                                "**Most completions were cut at the token budget",
                                                "**The loss never moved", "**Gradient norm 0 at every step"]
    assert ("90% of sampled completions over 3 steps" in got[1]
            and "(mean reward 0; `rollout/no_signal_share` 1)" in got[0])
    # one step with signal, or a minority cut: no such line
    mixed = flat[:2] + [{**flat[2], "rollout/no_signal_share": 0.75, "rollout/truncated_share": 0.0},
                        {"step": 4, "rollout/truncated_share": 0.0}]  # cut: (0.9 + 0.9 + 0 + 0) / 4 <= 0.5
    assert not any("No learning signal" in w or "cut at" in w for w in run_warnings(mixed))
    with MetricsLogger(tmp_path) as log:
        for row in flat:
            log.log(row["step"], {k: v for k, v in row.items() if k != "step"})
    text = write_run_report(tmp_path, "grpo", "settings: lr 1e-05").read_text()
    first = text.split("## Every plotted metric")[0]
    assert first.index("settings") < first.index("**No learning signal") < first.index("## Key metrics")
    assert "| training loss | `train/loss` | 3 | 0 | 0 | 0 | 0 | 0 |" in first


def test_hf_settings_name_what_each_command_trains_with():
    from trajtune.experiments.hf import dpo, grpo, rft, rm, sft
    from trajtune.experiments.hf.recipe import settings_text
    from trajtune.experiments.hf.model import ModelConfig

    base = {"data": "x.jsonl", "model": ModelConfig(path="m")}
    assert settings_text(sft.SFTRun(**base)) == "settings: lr 1e-05; steps 100; batch 8; loss NLL on all tokens"
    offline = settings_text(dpo.DPORun(**base))
    assert offline.endswith("loss dpo, beta 0.1") and "max new tokens" not in offline  # offline DPO samples nothing
    assert settings_text(rm.RewardModelRun(**base)).endswith("loss reward model, objective bt")
    text = settings_text(grpo.GRPORun(**base, reward=["r.py:f", "r.py:g"], reward_weights=[1.0, 0.5]))
    assert text.startswith("reward: `r.py:f` + `r.py:g` (weights 1, 0.5)\n\nsettings: lr 1e-05; steps 100; ")
    assert "group size 8; loss advantage grpo, surrogate reinforce, KL coef 0; max new tokens 64" in text
    assert "rounds 4 x 100 SFT steps" in settings_text(rft.RFTRun(**base, reward=["r.py:f"]))
