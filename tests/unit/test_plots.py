"""Plots readable as drawn (trajtune/runs/plots.py's figure helpers and the recipes' calls of them): both axes
labelled, legends outside the data, integer ticks where x counts steps or rounds, categories as bars with their
values written on them, one unit per panel. The figures are inspected before they are saved (`*_figure`, or
`save_figure` patched to look at what a recipe draws)."""

import matplotlib.pyplot as plt
import pytest

from trajtune.runs import plots as figures
from trajtune.runs.plots import (Panel, bar_figure, figure_problems, grouped_bar_figure, line_figure, line_plot,
                                 panel_figure)


def integer_ticks(ax) -> bool:
    lo, hi = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
    return len(ticks) >= 1 and all(float(t).is_integer() for t in ticks)


def test_a_line_plot_has_both_labels_its_legend_outside_and_integer_steps():
    fig = line_figure({"train": ([1, 2, 3], [0.2, 0.93, 0.5]), "held-out": ([1, 2, 3], [0.1, 0.4, 0.3])},
                      "pass rate", "step", "pass rate", (0, 1.02))
    ax = fig.axes[0]
    assert ax.get_xlabel() == "step" and ax.get_ylabel() == "pass rate"
    assert figure_problems(fig) == []  # the legend overlaps no axes and stays in the figure
    assert ax.get_legend().get_window_extent().x0 >= ax.bbox.x1  # right of the data, not on the 93% peak
    assert integer_ticks(ax)  # three steps: 1, 2, 3, never 1.25 or 2.5
    plt.close(fig)
    fig = line_figure({"DPO": ([0.0, 0.13, 0.41], [0.2, 0.5, 0.7])}, "frontier", "KL (nats)", "reward")
    assert not integer_ticks(fig.axes[0])  # a continuous x keeps its fractional ticks
    plt.close(fig)
    fig = line_figure({"RFT": ([1], [0.3])}, "one round", "round", "pass rate")
    assert integer_ticks(fig.axes[0])  # a lone round 1: the tick says 1, not 0.96 1.00 1.04
    plt.close(fig)


def test_an_unlabelled_axis_is_refused_and_the_checker_sees_what_a_reader_would_miss(tmp_path):
    with pytest.raises(ValueError, match="both axes need a label"):
        line_plot(tmp_path / "x.png", {"a": ([1, 2], [1, 2])}, "C3", "alpha", "")
    with pytest.raises(ValueError, match="both axes need a label"):
        bar_figure({"a": 1.0}, "t", "y", xlabel="")
    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [0.1, 0.9, 0.2], label="peak")
    ax.legend(loc="upper center")  # inside the axes, over the data
    assert figure_problems(fig) == ["axes 0: no x label", "axes 0: no y label", "axes 0: the legend overlaps the data"]
    plt.close(fig)


def test_categories_are_grouped_bars_with_their_values_written():
    groups = {"seen words": {"base": 0.0, "SFT narrow": 0.9, "SFT broad": 0.8},
              "unseen words": {"base": 0.0, "SFT narrow": 0.2, "SFT broad": 0.7}}
    fig = grouped_bar_figure(groups, "B2", "prompt words", "share of replies", (0, 1.1), value_format="{:.0%}")
    ax = fig.axes[0]
    assert figure_problems(fig) == []
    assert [t.get_text() for t in ax.get_xticklabels()] == ["seen words", "unseen words"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["base", "SFT narrow", "SFT broad"]
    assert len(ax.containers) == 3  # one bar series per model
    written = [t.get_text() for t in ax.texts]
    assert written.count("0%") == 2 and "90%" in written  # the base's zero bars still read as 0%, not as nothing
    plt.close(fig)
    fig = bar_figure({"random pick": 0.25, "ORM pick": 0.0}, "best-of-N", "pass rate", xlabel="kept sample")
    assert figure_problems(fig) == [] and fig.axes[0].get_legend() is None  # one series: no legend to read
    assert [t.get_text() for t in fig.axes[0].texts] == ["0.25", "0.00"]
    plt.close(fig)


def test_different_units_get_different_panels_each_labelled():
    fig = panel_figure([Panel("pass rate", {"DPO train": ([0, 5, 10], [0.2, 0.4, 0.5])}, (0, 1.02)),
                        Panel("invalid calls per episode", {"DPO invalid": ([0, 5, 10], [0.1, 2.0, 4.4])})],
                       "what the policy does", "DPO step")
    rate, count = fig.axes
    assert (rate.get_ylabel(), count.get_ylabel()) == ("pass rate", "invalid calls per episode")
    assert rate.get_ylim() == (0, 1.02) and count.get_ylim()[1] >= 4.4
    assert figure_problems(fig) == [] and integer_ticks(rate) and integer_ticks(count)
    plt.close(fig)


@pytest.fixture
def drawn(monkeypatch):
    """Every figure a recipe saves through the helpers: its problems and whether x has integer ticks, by file name."""
    seen = {}
    save = figures.save_figure

    def looking(fig, path):
        seen[path.name] = (figure_problems(fig), [integer_ticks(ax) for ax in fig.axes],
                           [type(c).__name__ for ax in fig.axes for c in ax.containers])
        return save(fig, path)

    monkeypatch.setattr(figures, "save_figure", looking)
    return seen


def test_the_agent_plots_read_as_drawn(tmp_path, drawn):
    from trajtune.experiments.agent.report import plots

    def curve(n, **extra):
        return [{"step": 10 * i, "eval/pass_rate": 0.1 * i, "eval/heldout_pass_rate": 0.05 * i,
                 "eval/invalid_per_episode": 4.4 - i, "d_chosen": -0.1 * i, "d_rejected": -0.3 * i, **extra}
                for i in range(n)]

    r = {k: {"curve": curve(4)} for k in ("oracle_sft", "rft", "sft_rl", "rl_only", "dpo", "dpo_nll")}
    r["hacking"] = {"rounds": [{"hack_share": 0.1 * i} for i in range(3)],
                    "curve": [{"eval/public_pass_rate": 0.2 * i, "eval/hidden_pass_rate": 0.1 * i} for i in range(4)]}
    plots(tmp_path, None, r)
    assert set(drawn) == {"curves_train.png", "curves_heldout.png", "dpo_drift.png", "dpo_behaviour.png", "hacking.png"}
    for name, (problems, integer, _) in drawn.items():
        assert problems == [] and all(integer), name
    assert len(drawn["dpo_behaviour.png"][1]) == 2  # rates and the invalid-call count: two panels


def test_chapter13_adherence_and_the_pipeline_stages_are_bars(tmp_path, drawn):
    from trajtune.experiments.chapter13.report import instruct_section
    from trajtune.experiments.hf_pipeline.config import MODEL_STAGES, Config
    from trajtune.experiments.hf_pipeline.report import stage_plot

    model = {"seen": 0.0, "unseen": 0.0, "unseen_letter": 0.0, "val_loss": 2.1, "examples": ["a", "b"]}
    results = {"pretrain": {**model, "curve": [(0, 4.0), (100, 2.5), (200, 2.1)]},
               "sft_narrow": {**model, "seen": 0.9, "unseen": 0.3}, "sft_broad": {**model, "seen": 0.8, "unseen": 0.7}}
    instruct_section(tmp_path, results)
    stage_plot(tmp_path / "stages.png", {s: {"eval": {"completion_greedy": 0.934, "chat_greedy": 0.5,
                                                      "chat_sampled": 0.4, "chat_pass_at_k": 0.8}}
                                         for s in MODEL_STAGES}, Config())
    assert all(problems == [] for problems, _, _ in drawn.values())
    assert drawn["pretrain_loss.png"][1] == [True]  # steps
    assert set(drawn["adherence.png"][2]) == {"BarContainer"} and len(drawn["adherence.png"][2]) == 3
    assert len(drawn["stages.png"][2]) == 4  # one bar per metric in each stage's group


def test_what_a_reader_would_misread_is_drawn_as_what_it_is():
    """Issue 39: a reward that equals the pass rate is one line with both names, not one line hiding another; a
    constant is named with its value on an axis around 0 and it, not a zoom into nothing; a KL of float noise
    (6e-12 .. 9e-12) is 0, not a V; ticks sit on the steps that were measured; markers are big enough to see."""
    steps = [1, 2, 3, 4]
    fig = line_figure({"rollout/reward": (steps, [0.0, 0.25, 0.25, 0.5]),
                       "rollout/pass_rate": (steps, [0.0, 0.25, 0.25, 0.5]),
                       "train/lr": (steps, [1e-5] * 4)}, "reward", "step", "reward")
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["rollout/reward = rollout/pass_rate", "train/lr = 1e-05 (constant)"]
    assert list(ax.get_xticks()) == steps and [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "3", "4"]
    assert all(line.get_markersize() >= 5 for line in ax.get_lines())
    assert figure_problems(fig) == []
    plt.close(fig)

    fig = line_figure({"train/lr": (steps, [1e-5] * 4)}, "learning rate", "step", "lr")
    lo, hi = fig.axes[0].get_ylim()
    assert lo <= 0 and hi >= 1e-5 and hi - lo >= 1e-5  # the axis shows 0 and the value: not 0.96e-5 .. 1.04e-5
    plt.close(fig)

    fig = line_figure({"kl/k3": ([10, 20, 30], [9e-12, 6e-12, 8e-12])}, "KL", "step", "KL")
    (line,) = fig.axes[0].get_lines()
    assert list(line.get_ydata()) == [0.0, 0.0, 0.0] and line.get_label() == "kl/k3 = 0 (float noise, |value| <= 9e-12)"
    assert list(fig.axes[0].get_xticks()) == [10, 20, 30]  # on the evaluations, not at 15 and 25
    plt.close(fig)

    # a real curve stays a curve; many points keep whole-number ticks chosen by the locator, no markers to smear
    fig = line_figure({"loss": (list(range(1, 101)), [1.0 / s for s in range(1, 101)])}, "loss", "step", "loss")
    (line,) = fig.axes[0].get_lines()
    assert line.get_label() == "loss" and line.get_marker() in ("None", "", None) and integer_ticks(fig.axes[0])
    plt.close(fig)
    from trajtune.runs.plots import flat_value
    assert flat_value([0.0, 0.0]) == "0 (constant)" and flat_value([0.3]) == "" and flat_value([0.1, 0.2]) == ""
    assert flat_value([1e-3, 1e-3 + 1e-12]) == ""  # a tiny change of a large value is a change, not noise
