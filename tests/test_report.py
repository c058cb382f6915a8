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
