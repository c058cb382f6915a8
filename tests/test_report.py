from trajtune.runs.report import Claim, claims_table, fmt, line_plot, markdown_table, mean_sd, write_report


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
                                           "| x<i> | `seed-<s>` |\n|---|---|\n| <div> | [seed 0](seed-0/report.html) |"])
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
