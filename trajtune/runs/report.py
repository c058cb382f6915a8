"""Reports: markdown tables, claim checks beside the seed's numbers, PNG plots, report.md + report.html.

Every experiment ends with `write_report(run_dir, title, sections)`, which writes
`report.md` and an HTML rendering of it next to the PNG figures, and returns the
path of `report.md` (an experiment's run prints it as its last line).
`write_run_report(run_dir, title)` is the report of any run directory from its
metrics.jsonl alone (loss, reward, KL, lr, eval curves): the Hugging Face commands' report.

A *claim* is what REPRODUCE.md says must hold; the seed's exact numbers are
context. `Claim` rows put both side by side with a verdict, so a reader sees at
once what reproduced and what did not.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # files only: never open a window
import matplotlib.pyplot as plt  # noqa: E402


@dataclass
class Claim:
    """One row of a claims table.

    id:     experiment id (e.g. "A3")
    what:   the experiment in a few words
    seed:   the seed document's numbers, as text
    ours:   our numbers, as text
    claim:  what must hold (REPRODUCE.md)
    holds:  True / False, or None when it cannot be judged from this run
    """

    id: str
    what: str
    seed: str
    ours: str
    claim: str
    holds: bool | None

    @property
    def verdict(self) -> str:
        return {True: "holds", False: "**does not hold**", None: "n/a"}[self.holds]


def fmt(x: float | None, digits: int = 2) -> str:
    """A number for a table: fixed digits, '-' for None, 'nan' kept visible."""
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return f"{x:.{digits}f}"


def mean_sd(values: Sequence[float], digits: int = 2) -> str:
    """'mean ± sd' over seeds (sd of a single value is shown as ± 0)."""
    values = [float(v) for v in values]
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.{digits}f} ± {sd:.{digits}f}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured markdown table; cells are str()-ed, '|' escaped."""

    def cell(x: object) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def claims_table(claims: Sequence[Claim]) -> str:
    """The seed's numbers beside ours, with the claim and whether it holds."""
    return markdown_table(
        ["#", "experiment", "seed", "ours", "claim", "verdict"],
        [(c.id, c.what, c.seed, c.ours, c.claim, c.verdict) for c in claims],
    )


def line_plot(
    path: str | Path,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    title: str,
    xlabel: str,
    ylabel: str,
    ylim: tuple[float, float] | None = None,
    styles: Mapping[str, str] | None = None,
) -> Path:
    """Save one line plot (PNG): series maps a label to (xs, ys)."""
    path = Path(path)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    for label, (xs, ys) in series.items():
        ax.plot(list(xs), list(ys), (styles or {}).get(label, "-o"), label=label, markersize=3)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def bar_plot(path: str | Path, bars: Mapping[str, float], title: str, ylabel: str,
             errors: Mapping[str, float] | None = None) -> Path:
    """Save a bar chart (PNG) of label -> value (optional error bars)."""
    path = Path(path)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    labels = list(bars)
    ax.bar(labels, [bars[k] for k in labels], yerr=[(errors or {}).get(k, 0.0) for k in labels], capsize=3)
    ax.set(title=title, ylabel=ylabel)
    ax.grid(alpha=0.3, axis="y")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def image(path: str | Path, alt: str) -> str:
    """Markdown for a figure saved in the run directory (linked by file name)."""
    return f"![{alt}]({Path(path).name})"


def write_report(run_dir: str | Path, title: str, sections: Sequence[str]) -> Path:
    """Write report.md and report.html into run_dir; returns the path of report.md."""
    import markdown

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    text = f"# {title}\n\n" + "\n\n".join(s.strip() for s in sections if s and s.strip()) + "\n"
    md = run_dir / "report.md"
    md.write_text(text, encoding="utf-8")
    body = markdown.markdown(text, extensions=["tables"])
    html = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{title}</title><style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em}"
        "img{max-width:100%}</style></head><body>" + body + "</body></html>"
    )
    (run_dir / "report.html").write_text(html, encoding="utf-8")
    return md


# --- the report of any run directory, from its metrics.jsonl --------------------------------
RUN_PLOTS = (
    ("loss", "training loss", ("train/loss",)),
    ("reward", "reward of sampled completions", ("rollout/reward", "rollout/pass_rate")),
    ("kl", "KL(policy || reference) per token", ("kl/k3", "kl/k1", "kl/k2")),
    ("accuracy", "preference accuracy", ("dpo/accuracy", "rm/accuracy", "simpo/accuracy", "orpo/accuracy")),
    ("lr", "learning rate", ("train/lr",)),
    ("eval", "evaluation", ("eval/",)),
)
"""(file stem, title, keys) of `write_run_report`'s figures; a key ending in '/' is a prefix"""


def write_run_report(run_dir: str | Path, title: str, intro: str = "") -> Path:
    """report.md / report.html for any run directory from its metrics.jsonl: a summary table per
    stage (first, last, min, max of the plotted keys) and one figure per group the rows have
    (loss, reward, KL, preference accuracy, lr, eval curves: `report-<group>.png`, one line per
    stage and key, x = the row's step). `intro`: markdown put first. Returns report.md's path."""
    from ..metrics import read_metrics

    run_dir = Path(run_dir)
    try:
        rows = read_metrics(run_dir)
    except (OSError, ValueError):
        rows = []
    curves = _curves(rows)  # {(stage, key): (steps, values)}
    sections = [intro]
    if not curves:
        sections.append("No metric rows were logged (metrics.jsonl is missing or empty).")
        return write_report(run_dir, title, sections)
    table = [(stage, key, len(ys), *(f"{v:.4g}" for v in (ys[0], ys[-1], min(ys), max(ys))))
             for (stage, key), (_, ys) in curves.items()]
    sections.append("## Summary\n\n" + markdown_table(["stage", "metric", "rows", "first", "last", "min", "max"], table))
    stages = {stage for stage, _ in curves}
    figures = []
    for stem, plot_title, keys in RUN_PLOTS:
        series = {(f"{stage} {key}" if len(stages) > 1 else key): xy for (stage, key), xy in curves.items()
                  if any(key == k or (k.endswith("/") and key.startswith(k)) for k in keys)}
        if series:
            path = line_plot(run_dir / f"report-{stem}.png", series, plot_title, "step", stem, styles=None)
            figures.append(image(path, plot_title))
    sections.append("## Curves\n\n" + "\n\n".join(figures))
    skipped = sum(1 for r in rows if _number(r.get("train/skipped")) == 1.0)
    if skipped:
        sections.append(f"**{skipped} optimizer step(s) skipped** (a non-finite loss or gradient; weights unchanged).")
    return write_report(run_dir, title, sections)


def _curves(rows: Sequence[dict]) -> dict[tuple[str, str], tuple[list[int], list[float]]]:
    """(stage, key) -> (steps, finite values) for every plotted key the rows have, in row order."""
    wanted = [k for _, _, keys in RUN_PLOTS for k in keys]
    out: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
    for r in rows:
        for key, value in r.items():
            if not any(key == k or (k.endswith("/") and key.startswith(k)) for k in wanted):
                continue
            v = _number(value)
            if v is not None and math.isfinite(v):
                xs, ys = out.setdefault((r.get("stage", ""), key), ([], []))
                xs.append(int(r.get("step", len(xs))))
                ys.append(v)
    return out


def _number(value: object) -> float | None:
    try:
        return float(value)  # non-finite values are stored as "nan" / "inf"
    except (TypeError, ValueError):
        return None


def write_claims_over_seeds(run_dir: str | Path, title: str, per_seed: Mapping[int, Sequence[Claim]]) -> Path:
    """report.md / .html of a recipe run per seed (`trajtune run R --seeds 0,1,2`): every claim's verdict and numbers
    on every seed, how many seeds it holds on, and the per-seed reports linked (run_dir/seed-S/report.html)."""
    rows: dict[str, list] = {}
    for claims in per_seed.values():
        for claim in claims:
            rows.setdefault(claim.id, [claim.id, claim.claim]).append(f"{claim.verdict}: {claim.ours}")
    seeds = list(per_seed)
    holds = {cid: sum(cell.startswith("holds") for cell in r[2:]) for cid, r in rows.items()}
    table = markdown_table(["#", "claim", *[f"seed {s}" for s in seeds], "holds on"],
                           [[*r, f"{holds[cid]} of {len(seeds)}"] for cid, r in rows.items()])
    links = ", ".join(f"[seed {s}](seed-{s}/report.html)" for s in seeds)
    always = sum(h == len(seeds) for h in holds.values())
    return write_report(run_dir, title, [f"**{always} of {len(rows)} claims hold on every seed** "
                                         f"({', '.join(map(str, seeds))}). Per-seed reports: {links}.",
                                         "## Verdicts per seed\n\n" + table])
