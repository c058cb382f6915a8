from trajtune.runs.plots import line_plot
from trajtune.runs.report import Claim, claims_table, fmt, markdown_table, mean_sd, write_report


def test_tables_and_numbers():
    assert mean_sd([0.1, 0.3]) == "0.20 ± 0.14" and mean_sd([0.5]) == "0.50 ± 0.00" and mean_sd([]) == "-"
    assert fmt(None) == "-" and fmt(float("nan")) == "nan" and fmt(0.123, 1) == "0.1"
    assert markdown_table(["a", "b"], [[1, "x|y"]]) == "| a | b |\n|---|---|\n| 1 | x\\|y |"
    t = claims_table([Claim("A6", "dpo", "0.69", "0.69", "exact", True), Claim("A7", "x", "-", "-", "y", False)])
    assert "holds" in t and "**does not hold**" in t


def test_write_report_with_plot(tmp_path):
    png = line_plot(tmp_path / "curve.png", {"train": ([0, 10], [0.1, 0.9])}, "t", "step", "pass")
    assert png.stat().st_size > 1000
    md = write_report(tmp_path, "Title", ["## Section\n\n| a |\n|---|\n| 1 |", f"![curve]({png.name})"])
    assert md.read_text().startswith("# Title")
    html = (tmp_path / "report.html").read_text()
    assert "<table>" in html and "curve.png" in html


def test_report_text_is_escaped_and_the_page_checked(tmp_path):
    from trajtune.runs.report import html_problems

    write_report(tmp_path, "a <b> title", ["each seed's report is in seed-<s>/report.md; a < b > c & d",
                                           "| x<i> | `seed-<s>` |\n|---|---|\n"
                                           "| <div> | [seed 0](seed-0/report.html) |"])
    page = (tmp_path / "report.html").read_text()
    assert html_problems(page) == [], html_problems(page)
    assert "seed-&lt;s&gt;/report.md" in page and "a &lt; b &gt; c &amp; d" in page and "<s>" not in page
    assert "<code>seed-&lt;s&gt;</code>" in page and '<a href="seed-0/report.html">seed 0</a>' in page
    assert "<title>a &lt;b&gt; title</title>" in page
    # what the check finds: a tag that came from text (unclosed), a stray end tag, a tag never closed
    bad = html_problems("<html><body><p>seed-<s>/report.md</p></body></html>")
    assert any("<s> is not a tag a report makes" in p for p in bad) and any("<s> is never closed" in p for p in bad)
    assert html_problems("<p>x</em></p>") == ["line 1: </em> closes no open tag"]
    assert html_problems("<table><tr><td>1</td></tr>") == ["line 1: <table> is never closed"]


def test_a_page_keeps_side_margins_at_every_width(tmp_path):
    """Below ~1000 px the centring margin of a 60em body is 0: the page needs a padding of its own, and a wide
    table scrolls inside the page rather than pushing past its edge."""
    import re

    write_report(tmp_path, "t", ["x"])
    style = re.search(r"<style>(.*)</style>", (tmp_path / "report.html").read_text()).group(1)
    body = re.search(r"body\{([^}]*)\}", style).group(1)
    assert "max-width:60em" in body and re.search(r"padding:0 max\(1em,\s*\d+vw\)", body)
    assert re.search(r"table\{[^}]*overflow-x:auto", style) and re.search(r"img\{[^}]*max-width:100%", style)


def episode(step, task, text, reward=0.0, stop="stop", **more):
    # owners: 0 template, 1 prompt, 2 policy (trajtune.trajectory.Owner)
    return {"stage": "grpo", "step": step, "task": task, "reward": reward, "ids": [9, 1, 2, 9, 3, 4],
            "owners": [0, 1, 1, 0, 2, 2], "info": {"actions": [text], "expected": "6", "stop_reason": stop, **more}}


def test_sampled_completions_say_which_steps_were_recorded_and_show_text_as_written():
    from trajtune.runs.metrics_report import sampled_completions

    rows = [{"stage": "grpo", "step": s} for s in range(1, 5)]
    once = [episode(1, f"row{i}", "4 + 2 = *6*", reward=0.0, stop="length") for i in range(6)]
    text = sampled_completions(once, rows, decode=lambda ids: f"What is {ids}?")
    assert ("Episodes of stage grpo were recorded at step 1 only, of the 4 steps it ran: what the policy sampled after "
            "step 1 was not recorded. The first 4 of step 1:") in text
    body = [line for line in text.splitlines() if line.startswith("| 1 |")]
    assert len(body) == 4  # per_step, not all six
    assert body[0] == "| 1 | What is [1, 2]? | 4 + 2 = \\*6\\* | 6 | 0 | cut at the token budget |".replace(
        "[1, 2]", "\\[1, 2\\]")  # the prompt's own tokens decoded; markdown's marks escaped: shown as the model wrote
    both = once[:2] + [episode(10, "row0", "6", reward=1.0), episode(20, "row0", "line one\nline two", reward=1.0)]
    text = sampled_completions(both, rows + [{"stage": "grpo", "step": 20}])
    assert "recorded at steps 1, 10 and 20, of the 20 steps it ran. The first 4 of steps 1 and 20:" in text
    assert "| 20 | row0 | line one⏎line two | 6 | 1 | ended |" in text  # no decoder: the task's name
    assert "| 10 |" not in text  # first and last recorded steps only
    assert sampled_completions([], rows) == ""


def test_run_warnings_name_a_model_saved_unchanged_and_a_run_report_writes_flat_groups_as_values(tmp_path):
    from trajtune.metrics import MetricsLogger
    from trajtune.runs.metrics_report import changed_weights, run_warnings, write_run_report

    same = {"tensors": 26, "changed": 0, "l2": 0.0, "relative": 0.0, "input": "in", "model": "out/model"}
    assert run_warnings([], same) == ["**The saved model is its input, unchanged:** all 26 weight tensors of "
                                      "`out/model` equal those of `in` bit for bit: the run trained nothing."]
    moved = {**same, "changed": 3, "l2": 0.25, "relative": 1.5e-4}
    assert run_warnings([], moved) == [] and run_warnings([], None) == []
    assert changed_weights(moved) == "weights changed: 3 of 26 tensors, |Δw| = 0.25 = 0.00015 |w|"
    with MetricsLogger(tmp_path) as log:
        for s in (1, 2, 3, 4):
            log.log(s, {"train/loss": 1.0 / s, "train/lr": 1e-5, "rollout/reward": 0.25 * (s > 2),
                        "rollout/pass_rate": 0.25 * (s > 2), **({"kl/k3": 7e-12} if s == 4 else {})})
    text = write_run_report(tmp_path, "grpo", "settings: lr 1e-05").read_text()
    assert "- learning rate: `train/lr` 1e-05 (constant) at all 4 logged steps (1 to 4)" in text
    assert "- KL(policy || reference) per token: `kl/k3` 0 (float noise, |value| <= 7e-12) at step 4" in text
    assert (tmp_path / "report-loss.png").exists() and (tmp_path / "report-reward.png").exists()
    assert not (tmp_path / "report-lr.png").exists() and not (tmp_path / "report-kl.png").exists()
