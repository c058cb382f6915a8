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

import html
import math
import statistics
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Callable, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # files only: never open a window
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .verdicts import NOISE, Z, Estimate, Holds, judge, over_seeds  # noqa: E402


@dataclass
class Claim:
    """One row of a claims table.

    id:       experiment id (e.g. "A3")
    what:     the experiment in a few words
    seed:     the reference: the seed document's (or the book's) numbers or words, as text (column "reference")
    ours:     our numbers, as text
    claim:    what must hold (REPRODUCE.md)
    holds:    True / False; verdicts.NOISE when the difference that decides it is inside the noise; None when this
              run cannot judge it (then `why` says why: a stage that did not run, a collapsed run)
    estimate: the difference that decides a comparative claim, with its standard error (shown beside the verdict)
    test:     how `estimate` decides it ('>', '<', '<=', '>=' against `margin`, `verdicts.judge`): set by
              `Claim.compare`, so a multi-seed report can pool the estimate over seeds and judge it again
    why:      a few words on a verdict the numbers alone do not explain (why not judged, which part failed)
    """

    id: str
    what: str
    seed: str
    ours: str
    claim: str
    holds: Holds
    estimate: Estimate | None = None
    test: str = ""
    margin: float = 0.0
    why: str = ""

    @classmethod
    def compare(cls, id: str, what: str, seed: str, ours: str, claim: str, estimate: Estimate, test: str = ">",
                margin: float = 0.0, why: str = "") -> "Claim":
        """A claim decided by one estimate alone: `verdicts.judge(estimate, test, margin)`."""
        return cls(id, what, seed, ours, claim, judge(estimate, test, margin), estimate, test, margin, why)

    @property
    def verdict(self) -> str:
        word = VERDICT_WORDS[self.holds]
        return f"{word} ({self.why})" if self.why and self.holds in (None, NOISE) else word

    @property
    def evidence(self) -> str:
        """The deciding difference and its noise ('+0.016 ± 0.046 (2 SE; binomial)'), '' for none."""
        return str(self.estimate) if self.estimate is not None else ""

    def line(self, width: int = 120, id_width: int = 6) -> str:
        """One terminal line (<= width characters): id, verdict, and what decided it (the deciding difference, else
        `why`: a failed exact part, the reason it was not judged)."""
        text = f"  {self.id:<{id_width}} {VERDICT_WORDS[self.holds].replace('*', ''):<19} {self.what}"
        if self.evidence:
            text += f": {self.evidence}"
        elif self.why and self.holds is not True:
            text += f" ({self.why})"
        return text if len(text) <= width else text[:width - 1] + "…"


VERDICT_WORDS: dict[Holds, str] = {True: "holds", False: "**does not hold**", NOISE: "not distinguishable",
                                   None: "not judged"}


def claims_count(claims: Sequence[Claim]) -> tuple[int, int, int, int]:
    """(held, judged, inside the noise, not judged): judged counts every claim with a verdict, NOISE included."""
    judged = [c for c in claims if c.holds is not None]
    return (sum(c.holds is True for c in judged), len(judged), sum(c.holds == NOISE for c in judged),
            len(claims) - len(judged))


def claims_verdict(claims: Sequence[Claim], bold: bool = True) -> str:
    """'**3 of 4 claims hold** (1 not distinguishable from noise, 1 not judged)': a report's first-screen count of
    the claims this run could judge (`Claim.holds` not None)."""
    held, n, noise, skipped = claims_count(claims)
    head = f"{held} of {n} claim{'s' if n != 1 else ''} hold{'s' if n == 1 else ''}"
    extra = [f"{noise} not distinguishable from noise"] * bool(noise) + [f"{skipped} not judged"] * bool(skipped)
    return (f"**{head}**" if bold else head) + (f" ({', '.join(extra)})" if extra else "")


def claims_summary(claims: Sequence[Claim]) -> str:
    """What a recipe prints at its end: 'N of M claims hold (...)' and one short line per claim (<= 120 characters;
    the details stay in the report) -- never the markdown table."""
    id_width = max([6, *(len(c.id) for c in claims)])
    return "\n".join([claims_verdict(claims, bold=False), *(c.line(id_width=id_width) for c in claims)])


def seed_links(seeds: Sequence[int]) -> str:
    """'[seed 0](seed-0/report.html), [seed 1](seed-1/report.html)': a multi-seed report's per-seed pages."""
    return ", ".join(f"[seed {s}](seed-{s}/report.html)" for s in seeds)


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
    """The reference (the seed document's or the book's numbers) beside ours, with the claim, whether it holds, and (when any claim is decided by a
    difference) that difference with its noise: the verdict is read beside the uncertainty that decided it."""
    if any(c.estimate is not None for c in claims):
        return markdown_table(["#", "experiment", "reference", "ours", "claim", f"difference ± {Z:g} SE", "verdict"],
                              [(c.id, c.what, c.seed, c.ours, c.claim, c.evidence or "-", c.verdict) for c in claims])
    return markdown_table(
        ["#", "experiment", "reference", "ours", "claim", "verdict"],
        [(c.id, c.what, c.seed, c.ours, c.claim, c.verdict) for c in claims],
    )


# --- figures: every axis labelled, legends outside the data, integer ticks for steps and rounds ---------
# Each plot is built by a `*_figure` function (returns the Figure, so a test can inspect it) and saved by its
# `*_plot` twin (`save_figure`). `figure_problems(fig)` says what a reader could not read off a figure.
Series = Mapping[str, tuple[Sequence[float], Sequence[float]]]
"""label -> (xs, ys) of one line each"""


@dataclass
class Panel:
    """One panel of `panel_plot`: its own y axis (label, limits), for series in one unit."""

    ylabel: str
    series: Series
    ylim: tuple[float, float] | None = None
    styles: Mapping[str, str] | None = None


def _whole(xs: Sequence[float]) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) and float(x).is_integer() for x in xs)


def _legend_outside(ax) -> None:
    """The legend right of the axes, clear of every data point (the layout makes room for it)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


FLOAT_NOISE = 1e-9
"""a series whose every |value| is at most this is float noise, not a measurement (the KL of a policy to itself in fp32
is ~1e-12, not 0): it is drawn and written as '0 (float noise)'"""
MARKER = 5
"""marker size (points) of a line's points: big enough to see where the measurements are"""
MARKED_UP_TO = 60
"""a line with more points than this is drawn without markers (they would fuse into a thick line)"""


def flat_value(ys: Sequence[float]) -> str:
    """How a plot or table shows a series that carries one number: '0 (float noise, |value| <= 9e-12)' when every
    value is within `FLOAT_NOISE` of 0 (but not all exactly 0), '1e-05 (constant)' when two or more values are all
    equal; '' for a series that varies (it is drawn)."""
    ys = [float(y) for y in ys if math.isfinite(float(y))]  # a gap (nan) is no value
    if not ys:
        return ""
    top = max(abs(y) for y in ys)
    if 0 < top <= FLOAT_NOISE:
        return f"0 (float noise, |value| <= {top:.2g})"
    if len(ys) > 1 and max(ys) == min(ys):
        return f"{_short(ys[0])} (constant)"
    return ""


def merge_identical(series: Series) -> dict[str, tuple[list[float], list[float], str]]:
    """label -> (xs, ys, the first label: its style) with identical series (the same xs and ys) once, named
    'a = b' (a reward that is 1 exactly when the answer passes is its pass rate: one line, both names)."""
    out: dict[str, tuple[list[float], list[float], str]] = {}
    for label, (xs, ys) in series.items():
        xs, ys = list(xs), list(ys)
        twin = next((k for k, (a, b, _) in out.items() if a == xs and b == ys), None)
        if twin is None:
            out[label] = (xs, ys, label)
        else:
            out[f"{twin} = {label}"] = out.pop(twin)
    return out


def _draw_lines(ax, series: Series, styles: Mapping[str, str] | None, integer_x: bool | None) -> None:
    """The lines of one axes, as a reader needs them: identical series once with both names (`merge_identical`), a
    constant or float-noise series named with its value (`flat_value`; float noise drawn at 0, and an axes of only
    such series spans 0 and the value instead of zooming into nothing), markers of `MARKER` points, ticks on the
    points when x counts steps or rounds and the points are few (else whole numbers)."""
    lines = merge_identical(series)
    notes = {label: flat_value(ys) for label, (_, ys, _) in lines.items()}
    for label, (xs, ys, first) in lines.items():
        style = (styles or {}).get(first, "-o")
        if "noise" in notes[label]:
            ys = [0.0 if math.isfinite(y) else y for y in ys]
        if len(xs) > MARKED_UP_TO and styles is None:
            style = "-"
        ax.plot(xs, ys, style, label=f"{label} = {notes[label]}" if notes[label] else label, markersize=MARKER)
    if lines and all(notes.values()):  # nothing varies: an axis around 0 and the values, not a zoom on float noise
        values = [0.0] + [0.0 if "noise" in notes[k] else ys[0] for k, (_, ys, _) in lines.items()]
        lo, hi = min(values), max(values)
        pad = 0.1 * (hi - lo) or 1.0
        ax.set_ylim(lo - pad, hi + pad)
    if integer_x is None:  # steps, rounds, k: whole numbers on the axis, never 2.5 steps
        integer_x = bool(series) and all(_whole(list(xs)) for xs, _ in series.values())
    if integer_x:
        points = sorted({float(x) for xs, _ in series.values() for x in xs})
        if 1 < len(points) <= 12 and min(b - a for a, b in zip(points, points[1:])) >= (points[-1] - points[0]) / 30:
            ax.set_xticks(points, [f"{x:g}" for x in points])  # a tick on every point, none between them
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # even a lone step 1
    ax.grid(alpha=0.3)
    _legend_outside(ax)


def line_figure(series: Series, title: str, xlabel: str, ylabel: str, ylim: tuple[float, float] | None = None,
                styles: Mapping[str, str] | None = None, integer_x: bool | None = None) -> Figure:
    """One line plot: series maps a label to (xs, ys). integer_x: integer ticks on x (default: when every x is a
    whole number: steps, rounds, k); the legend sits right of the axes."""
    if not xlabel or not ylabel:
        raise ValueError(f"line_figure {title!r}: both axes need a label (got x {xlabel!r}, y {ylabel!r})")
    fig, ax = plt.subplots(figsize=(8.4, 4.0), dpi=110, layout="constrained")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    _draw_lines(ax, series, styles, integer_x)
    if ylim is not None:
        ax.set_ylim(*ylim)
    return fig


def line_plot(path: str | Path, series: Series, title: str, xlabel: str, ylabel: str,
              ylim: tuple[float, float] | None = None, styles: Mapping[str, str] | None = None,
              integer_x: bool | None = None) -> Path:
    """Save one line plot (PNG): `line_figure`'s."""
    return save_figure(line_figure(series, title, xlabel, ylabel, ylim, styles, integer_x), path)


def panel_figure(panels: Sequence[Panel], title: str, xlabel: str, integer_x: bool | None = None) -> Figure:
    """Panels stacked over one shared x axis, one unit each (a rate and a count never share a y axis)."""
    if not panels or not xlabel or any(not p.ylabel for p in panels):
        raise ValueError(f"panel_figure {title!r}: needs panels, an x label and a y label per panel")
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.4, 2.4 + 1.9 * len(panels)), dpi=110, sharex=True,
                             layout="constrained", squeeze=False)
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        ax.set(ylabel=panel.ylabel, xlabel=xlabel)
        _draw_lines(ax, panel.series, panel.styles, integer_x)
        if panel.ylim is not None:
            ax.set_ylim(*panel.ylim)
    axes[0, 0].set_title(title)
    for ax in axes[:-1, 0]:
        ax.tick_params(labelbottom=True)  # every panel keeps its x tick labels: it reads on its own
    return fig


def panel_plot(path: str | Path, panels: Sequence[Panel], title: str, xlabel: str,
               integer_x: bool | None = None) -> Path:
    """Save `panel_figure`'s (PNG)."""
    return save_figure(panel_figure(panels, title, xlabel, integer_x), path)


def bar_figure(bars: Mapping[str, float], title: str, ylabel: str, errors: Mapping[str, float] | None = None, *,
               xlabel: str) -> Figure:
    """A bar chart of label -> value (optional error bars), each bar's value written on it."""
    return grouped_bar_figure({k: {"": v} for k, v in bars.items()}, title, xlabel, ylabel,
                              errors={k: {"": e} for k, e in (errors or {}).items()})


def bar_plot(path: str | Path, bars: Mapping[str, float], title: str, ylabel: str,
             errors: Mapping[str, float] | None = None, *, xlabel: str) -> Path:
    """Save a bar chart (PNG) of label -> value (optional error bars): `bar_figure`'s."""
    return save_figure(bar_figure(bars, title, ylabel, errors, xlabel=xlabel), path)


def grouped_bar_figure(groups: Mapping[str, Mapping[str, float]], title: str, xlabel: str, ylabel: str,
                       ylim: tuple[float, float] | None = None, errors: Mapping[str, Mapping[str, float]] | None = None,
                       value_format: str = "{:.2f}") -> Figure:
    """Categories on x (`groups`' keys), one bar per series in each (`groups[category][series]`; series "" alone:
    a plain bar chart, no legend). Every bar has its value written above it, so a bar of height 0 still reads
    as 0; the legend sits right of the axes."""
    if not xlabel or not ylabel:
        raise ValueError(f"grouped_bar_figure {title!r}: both axes need a label (got x {xlabel!r}, y {ylabel!r})")
    cats = list(groups)
    names = list(dict.fromkeys(s for g in groups.values() for s in g))
    fig, ax = plt.subplots(figsize=(8.4 if names != [""] else 6.4, 4.0), dpi=110, layout="constrained")
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(cats))]
        ys = [groups[c].get(name, math.nan) for c in cats]
        err = [(errors or {}).get(c, {}).get(name, 0.0) for c in cats]
        bars = ax.bar(xs, ys, width, yerr=err if any(err) else None, capsize=3, label=name or None)
        ax.bar_label(bars, labels=["" if math.isnan(y) else value_format.format(y) for y in ys], fontsize=7, padding=2)
    ax.set_xticks(range(len(cats)), cats)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    else:
        ax.margins(y=0.12)  # headroom for the value labels
    ax.grid(alpha=0.3, axis="y")
    if max((len(c) for c in cats), default=0) > 10:
        plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    _legend_outside(ax)
    return fig


def grouped_bar_plot(path: str | Path, groups: Mapping[str, Mapping[str, float]], title: str, xlabel: str,
                     ylabel: str, ylim: tuple[float, float] | None = None, value_format: str = "{:.2f}") -> Path:
    """Save `grouped_bar_figure`'s (PNG)."""
    return save_figure(grouped_bar_figure(groups, title, xlabel, ylabel, ylim, value_format=value_format), path)


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write a figure as PNG (nothing cut off: the legends outside the axes included) and close it."""
    path = Path(path)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def figure_problems(fig: Figure) -> list[str]:
    """What a reader could not read off `fig`: an axes without an x or y label, a legend that overlaps an
    axes' data area or leaves the figure. [] when none (the figure is drawn to measure)."""
    fig.canvas.draw()
    out = []
    box = fig.bbox
    for i, ax in enumerate(fig.axes):
        name = ax.get_title() or f"axes {i}"
        for axis in ("x", "y"):
            if not getattr(ax, f"get_{axis}label")():
                out.append(f"{name}: no {axis} label")
        legends = [ax.get_legend(), *fig.legends]
        for legend in (lg for lg in legends if lg is not None):
            where = legend.get_window_extent()
            if any(where.overlaps(other.bbox) for other in fig.axes):
                out.append(f"{name}: the legend overlaps the data")
            if where.x0 < box.x0 - 1 or where.x1 > box.x1 + 1 or where.y0 < box.y0 - 1 or where.y1 > box.y1 + 1:
                out.append(f"{name}: the legend leaves the figure")
    return sorted(set(out))


def image(path: str | Path, alt: str) -> str:
    """Markdown for a figure saved in the run directory (linked by file name)."""
    return f"![{alt}]({Path(path).name})"


def write_report(run_dir: str | Path, title: str, sections: Sequence[str]) -> Path:
    """Write report.md and report.html into run_dir; returns the path of report.md.

    Raw HTML in the text is not HTML: `seed-<s>/report.md` shows as written, never as a tag
    (`markdown_html`), so a report says in the browser what its report.md says."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    sections = [s.strip() for s in sections if s and s.strip()]
    note = episodes_note(run_dir)
    sections[1:1] = [note] if note else []  # after the first paragraph
    text = f"# {title}\n\n" + "\n\n".join(sections) + "\n"
    md = run_dir / "report.md"
    md.write_text(text, encoding="utf-8")
    html_page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{PAGE_CSS}</style></head><body>" + markdown_html(text)
        + "</body></html>"
    )
    (run_dir / "report.html").write_text(html_page, encoding="utf-8")
    return md


PAGE_CSS = ("body{font-family:sans-serif;line-height:1.4;max-width:60em;margin:2em auto;padding:0 max(1em,4vw);"
            "overflow-wrap:break-word}"
            "table{border-collapse:collapse;display:block;overflow-x:auto;max-width:100%}"
            "td,th{border:1px solid #ccc;padding:.2em .5em}pre{overflow-x:auto}img{max-width:100%;height:auto}")
"""a report page's style: side margins at every width (a padding of its own, not only the centring of a wide
screen), a wide table scrolls inside the page instead of pushing past its edge, figures shrink to the page"""


def markdown_html(text: str) -> str:
    """Markdown (with tables) -> HTML, where `<`, `>` and `&` that are not markdown syntax are text:
    Python-Markdown's raw-HTML block and inline passes are removed, so `a < b`, `seed-<s>` or
    `<div>` come out escaped (`&lt;s&gt;`); links, autolinks `<http://...>`, code and entities work as before."""
    import markdown
    from markdown.extensions import Extension

    class NoRawHtml(Extension):
        def extendMarkdown(self, md):  # noqa: N802 (Python-Markdown's name)
            md.preprocessors.deregister("html_block")
            md.inlinePatterns.deregister("html")

    return markdown.markdown(text, extensions=["tables", NoRawHtml()])


EPISODES_FILE = "episodes.jsonl"
"""runs.recorder.FILE (the recorder sits above this module: the name is repeated, and a test keeps the two equal)"""


def episodes_note(run_dir: Path) -> str:
    """A line for a run that recorded episodes (RUN_DIR/<stage>/episodes.jsonl, `runs.recorder`): the link to
    view.html when `trajtune view` has written it, and the command that writes (or refreshes) it. '' for none."""
    if not any(run_dir.glob(f"*/{EPISODES_FILE}")):
        return ""
    how = f"`trajtune view {run_dir}` writes (or refreshes) view.html"
    if (run_dir / "view.html").exists():
        return f"Recorded episodes, token by token: [view.html](view.html) ({how})."
    return f"This run recorded episodes (`<stage>/{EPISODES_FILE}`); {how} to read them token by token."


REPORT_TAGS = frozenset({
    "html", "head", "meta", "title", "style", "body",  # write_report's page
    "p", "h1", "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th", "td", "img", "a", "code",
    "pre", "em", "strong", "ul", "ol", "li", "hr", "br", "blockquote", "sup", "del",
})
"""the tags markdown_html and write_report produce; any other tag in a report came from unescaped text"""
VOID_TAGS = frozenset({"img", "br", "hr", "meta"})


def html_problems(page: str) -> list[str]:
    """What is wrong with a report page's tags, one line each: a tag no report makes (text that went
    through as HTML, e.g. `<s>`), a tag never closed, an end tag that closes nothing. [] when clean."""
    checker = _TagCheck()
    checker.feed(page)
    checker.close()
    return checker.problems + [f"line {line}: <{tag}> is never closed" for tag, line in checker.open]


class _TagCheck(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.open: list[tuple[str, int]] = []  # (tag, line) of the open elements, innermost last
        self.problems: list[str] = []

    def _known(self, tag: str) -> None:
        if tag not in REPORT_TAGS:
            self.problems.append(f"line {self.getpos()[0]}: <{tag}> is not a tag a report makes (unescaped text?)")

    def handle_starttag(self, tag, attrs):
        self._known(tag)
        if tag not in VOID_TAGS:
            self.open.append((tag, self.getpos()[0]))

    def handle_startendtag(self, tag, attrs):
        self._known(tag)

    def handle_endtag(self, tag):
        if tag in VOID_TAGS:
            return
        names = [t for t, _ in self.open]
        if tag not in names:
            self.problems.append(f"line {self.getpos()[0]}: </{tag}> closes no open tag")
            return
        while self.open:
            name, line = self.open.pop()
            if name == tag:
                break
            self.problems.append(f"line {line}: <{name}> is never closed (closed by </{tag}>)")


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


KEY_METRICS = (
    ("train/loss", "training loss"), ("train/grad_norm", "gradient norm"), ("rollout/reward", "mean reward"),
    ("rollout/pass_rate", "pass rate (reward >= 1)"), ("rollout/no_signal_share", "groups with no reward variance"),
    ("rollout/truncated_share", "completions cut at the token budget"), ("rollout/policy_tokens", "completion tokens"),
    ("kl/k3", "KL to the reference"), ("dpo/accuracy", "preference accuracy"), ("dpo/margin", "reward margin"),
    ("rm/accuracy", "pair accuracy"), ("rft/kept", "kept samples"),
)
"""(key, what it is) of the key-metrics table on a run report's first screen, in this order, where the rows have them"""


def key_metrics(rows: Sequence[dict]) -> str:
    """A small markdown table of the run's key metrics (first, last, mean, min, max over its steps, 3 significant
    digits); '' when the rows have none of them."""
    table = []
    for key, what in KEY_METRICS:
        if ys := _values(rows, key):
            table.append((what, f"`{key}`", len(ys), *(_short(v) for v in (ys[0], ys[-1], statistics.fmean(ys),
                                                                              min(ys), max(ys)))))
    return markdown_table(["metric", "key", "rows", "first", "last", "mean", "min", "max"], table) if table else ""


def _short(v: float) -> str:
    return "0" if v == 0 else f"{v:.3g}"


def _values(rows: Sequence[dict], key: str) -> list[float]:
    """The finite values of `key` over the rows that have it, in row order."""
    return [v for r in rows if (v := _number(r.get(key))) is not None and math.isfinite(v)]


def run_warnings(rows: Sequence[dict], weight_change: Mapping | None = None) -> list[str]:
    """One line for each way a run can have learned nothing, judged from its metric rows:
    no group with reward variance at any step (`rollout/no_signal_share` 1 everywhere: a group baseline makes
    every advantage 0), most completions cut at the token budget (`rollout/truncated_share` > 0.5 over the run),
    a loss that never moved, a gradient norm of 0 at every step; and, given the saved model's `weight_change`
    against its input (`changed` of `tensors` weight tensors differ), a model saved unchanged. [] when none applies.
    Markdown (bold heads, code keys): a command prints them on its terminal through `plain`."""
    out = []
    signal, reward = _values(rows, "rollout/no_signal_share"), _values(rows, "rollout/reward")
    if signal and all(v == 1.0 for v in signal):
        same = f"mean reward {_short(min(reward))}; " if reward and min(reward) == max(reward) else ""
        out.append(f"**No learning signal:** at every one of the {len(signal)} steps, every group's completions got "
                   f"the same reward ({same}`rollout/no_signal_share` 1): with a group baseline (GRPO, RLOO) every "
                   "advantage was 0 and the reward taught the policy nothing; check the reward function on a few real completions.")
    cut = _values(rows, "rollout/truncated_share")
    if cut and statistics.fmean(cut) > 0.5:
        out.append(f"**Most completions were cut at the token budget:** {statistics.fmean(cut):.0%} of sampled "
                   f"completions over {len(cut)} steps stopped at the maximum number of new tokens before they ended "
                   "(`rollout/truncated_share`); raise --max-new-tokens, or check that the model can end a turn.")
    loss = _values(rows, "train/loss")
    if len(loss) > 1 and max(loss) - min(loss) <= 1e-9 * max(1.0, abs(loss[0])):
        out.append(f"**The loss never moved:** `train/loss` was {_short(loss[0])} at all {len(loss)} steps.")
    grad = _values(rows, "train/grad_norm")
    if grad and all(v == 0 for v in grad):
        out.append(f"**Gradient norm 0 at every step:** `train/grad_norm` was 0 at all {len(grad)} steps, so the "
                   "weights never changed.")
    if weight_change and weight_change.get("tensors") and not weight_change.get("changed"):
        out.append(f"**The saved model is its input, unchanged:** all {weight_change['tensors']} weight tensors of "
                   f"`{weight_change.get('model', 'model/')}` equal those of `{weight_change.get('input', 'the input')}` "
                   "bit for bit: the run trained nothing.")
    return out


def plain(text: str) -> str:
    """A markdown line as terminal text: no bold marks, no code backticks."""
    return text.replace("**", "").replace("`", "")


def changed_weights(change: Mapping | None) -> str:
    """'weights changed: 211 of 272 tensors, |Δw| = 0.285 = 0.00013 |w|' (L2 norms over the tensors both models
    have) for a saved model's `weight_change` against its input; '' without one."""
    if not change or not change.get("tensors"):
        return ""
    if not change.get("changed"):
        return f"weights unchanged: all {change['tensors']} tensors equal the input's"
    rel = f" = {change['relative']:.2g} |w|" if change.get("relative") is not None else ""
    return f"weights changed: {change['changed']} of {change['tensors']} tensors, |Δw| = {_short(change['l2'])}{rel}"


def _md_text(text: str, limit: int = 160) -> str:
    """Text from a model as markdown that shows it as written: markdown's marks escaped, newlines as ⏎, cut at
    `limit` characters."""
    text = text.replace("\r", "").replace("\n", "⏎")
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return "".join("\\" + ch if ch in "\\`*_[]#!" else ch for ch in text)


def sampled_completions(episodes: Sequence[dict], rows: Sequence[dict],
                        decode: Callable[[Sequence[int]], str] | None = None, per_step: int = 4) -> str:
    """A few of the completions the run recorded (`episodes`: RUN_DIR/<stage>/episodes.jsonl's rows, the
    recorder's), `per_step` from its first and from its last recorded step, each with its prompt (the prompt's
    tokens through `decode`, else the task's name), the completion as the reward saw it (info["actions"]), the
    answer the data expects, its reward and how it ended; above them, which steps were recorded, of how many
    (a run recorded at step 1 only says so). '' when nothing was recorded."""
    from ..trajectory import Owner

    by_stage: dict[str, dict[int, list[dict]]] = {}
    for e in episodes:
        by_stage.setdefault(str(e.get("stage", "")), {}).setdefault(int(e.get("step", 0)), []).append(e)
    if not by_stage:
        return ""
    parts = []
    for stage, steps in by_stage.items():
        recorded = sorted(steps)
        mine = [r for r in rows if r.get("stage", stage) == stage]
        unit = "round" if any("train/round" in r for r in mine) else "step"  # RFT records per round (its rows: per step)
        ran = int(max((_number(r.get("train/round" if unit == "round" else "step")) or 0 for r in mine),
                      default=recorded[-1]))
        said = (f"{unit} {recorded[0]} only" if len(recorded) == 1 else
                f"{unit}s " + ", ".join(map(str, recorded[:-1])) + f" and {recorded[-1]}")
        note = f"Episodes of stage {stage} were recorded at {said}, of the {ran} {unit}{'s' * (ran != 1)} it ran"
        if len(recorded) == 1 and ran > recorded[0]:
            note += f": what the policy sampled after {unit} {recorded[0]} was not recorded"
        shown = dict.fromkeys([recorded[0], recorded[-1]])
        parts.append(note + f". The first {per_step} of {unit}" + (f"s {recorded[0]} and {recorded[-1]}" if
                                                                   len(shown) > 1 else f" {recorded[0]}") + ":")
        table = []
        for step in shown:
            for e in steps[step][:per_step]:
                info = e.get("info") or {}
                ids, owners = e.get("ids") or [], e.get("owners") or []
                prompt = [i for i, o in zip(ids, owners) if o == int(Owner.PROMPT)]
                policy = [i for i, o in zip(ids, owners) if o == int(Owner.POLICY)]
                asked = decode(prompt) if decode is not None and prompt else str(e.get("task", ""))
                actions = info.get("actions")
                said_text = (" ⏎ ".join(map(str, actions)) if actions else decode(policy) if decode is not None
                             else " ".join(map(str, policy)))
                reward = e.get("reward")
                table.append((step, _md_text(asked.strip(), 80), _md_text(said_text), _md_text(str(info.get("expected", "-")), 40),
                              _short(float(reward)) if isinstance(reward, (int, float)) else str(reward),
                              "cut at the token budget" if info.get("stop_reason") == "length" else "ended"))
        parts.append(markdown_table([unit, "prompt", "completion", "expected", "reward", "stopped"], table))
    return "## Sampled completions\n\n" + "\n\n".join(parts)


def write_run_report(run_dir: str | Path, title: str, intro: str = "", warnings: Sequence[str] | None = None,
                     episodes: Sequence[dict] = (), decode: Callable[[Sequence[int]], str] | None = None) -> Path:
    """report.md / report.html for any run directory from its metrics.jsonl. First screen: `intro` (markdown:
    what ran, with which settings), a warning line for each way the run learned nothing (`warnings`, default
    `run_warnings(rows)`), a few of the completions it sampled (`sampled_completions` of `episodes`, the
    recorder's rows; `decode` shows their prompts) and a small table of its key metrics (`key_metrics`). Then a
    summary table per stage (first, last, min, max of the plotted keys) and one figure per group the rows have
    (loss, reward, KL, preference accuracy, lr, eval curves: `report-<group>.png`, one line per stage and key,
    x = the row's step); a group where nothing varies (a constant lr, a KL of float noise: `flat_value`) is
    written as its values instead of a figure. Returns report.md's path."""
    from ..metrics import read_metrics

    run_dir = Path(run_dir)
    try:
        rows = read_metrics(run_dir)
    except (OSError, ValueError):
        rows = []
    curves = _curves(rows)  # {(stage, key): (steps, values)}
    warnings = run_warnings(rows) if warnings is None else warnings
    sections = ["\n\n".join([intro, *warnings]), sampled_completions(episodes, rows, decode), key_metrics(rows)]
    if sections[-1]:  # the episodes line goes after the first section
        sections[-1] = "## Key metrics\n\n" + sections[-1]
    if not curves:
        sections.append("No metric rows were logged (metrics.jsonl is missing or empty).")
        return write_report(run_dir, title, sections)
    table = [(stage, key, len(ys), *(f"{v:.4g}" for v in (ys[0], ys[-1], min(ys), max(ys))))
             for (stage, key), (_, ys) in curves.items()]
    sections.append("## Every plotted metric, per stage\n\n" + markdown_table(["stage", "metric", "rows", "first", "last", "min", "max"], table))
    stages = {stage for stage, _ in curves}
    figures, flat = [], []
    for stem, plot_title, keys in RUN_PLOTS:
        series = {(f"{stage} {key}" if len(stages) > 1 else key): xy for (stage, key), xy in curves.items()
                  if any(key == k or (k.endswith("/") and key.startswith(k)) for k in keys)}
        if not series:
            continue
        lines = merge_identical(series)
        notes = {label: flat_value(ys) or (_short(ys[0]) if len(ys) == 1 else "") for label, (_, ys, _) in lines.items()}
        if all(notes.values()):  # one number per line: written, not drawn
            flat.append(f"- {plot_title}: " + "; ".join(
                " = ".join(f"`{name}`" for name in label.split(" = ")) + f" {notes[label]} " +
                (f"at step {xs[0]}" if len(xs) == 1 else f"at all {len(xs)} logged steps ({xs[0]} to {xs[-1]})")
                for label, (xs, _, _) in lines.items()))
            continue
        path = line_plot(run_dir / f"report-{stem}.png", series, plot_title, "step", stem, styles=None)
        figures.append(image(path, plot_title))
    if flat:
        sections.append("## Values that did not change (written, not plotted)\n\n" + "\n".join(flat))
    if figures:
        sections.append("## Curves\n\n" + "\n\n".join(figures))
    skipped = sum(1 for r in rows if _number(r.get("train/skipped")) == 1.0)
    if skipped:
        sections.append(f"**{skipped} optimizer step{'s' * (skipped != 1)} skipped** (a non-finite loss or "
                        "gradient; weights unchanged).")
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


def pooled_verdicts(per_seed: Mapping[int, Sequence[Claim]]) -> dict[str, tuple[Holds, Estimate | None]]:
    """Claim id -> its verdict over the seeds: a claim decided by one estimate on every seed (`Claim.compare`) is
    judged again on the estimates pooled over seeds (`verdicts.over_seeds`); any other claim holds over the seeds
    only where it holds on every seed it was judged on (NOISE where it held on some and was inside the noise on the
    rest, False where it failed on any)."""
    by_id: dict[str, list[Claim]] = {}
    for claims in per_seed.values():
        for c in claims:
            by_id.setdefault(c.id, []).append(c)
    out: dict[str, tuple[Holds, Estimate | None]] = {}
    for cid, cs in by_id.items():
        if all(c.test and c.estimate is not None for c in cs):
            est = over_seeds([c.estimate for c in cs])  # type: ignore[misc]
            out[cid] = (judge(est, cs[0].test, cs[0].margin), est)
            continue
        judged = [c.holds for c in cs if c.holds is not None]
        out[cid] = (None if not judged else False if any(h is False for h in judged)
                    else NOISE if any(h == NOISE for h in judged) else True, None)
    return out


def pooled_claims(per_seed: Mapping[int, Sequence[Claim]]) -> list[Claim]:
    """The claims over the seeds, one per id (`pooled_verdicts`): each the first seed's claim with its verdict and
    estimate replaced by the pooled ones and `ours` saying how many seeds it held on -- what a multi-seed recipe
    prints with `claims_summary`."""
    pooled = pooled_verdicts(per_seed)
    first: dict[str, Claim] = {}
    held: dict[str, int] = {}
    for claims in per_seed.values():
        for c in claims:
            first.setdefault(c.id, c)
            held[c.id] = held.get(c.id, 0) + (c.holds is True)
    return [replace(c, holds=pooled[cid][0], estimate=pooled[cid][1], ours=f"holds on {held[cid]} of {len(per_seed)} "
                    "seeds", why="" if pooled[cid][0] is not None else c.why or "judged on no seed")
            for cid, c in first.items()]


def write_claims_over_seeds(run_dir: str | Path, title: str, per_seed: Mapping[int, Sequence[Claim]]) -> Path:
    """report.md / .html of a recipe run per seed (`trajtune run R --seeds 0,1,2`): every claim's verdict and numbers
    on every seed, how many seeds it holds on, its verdict over the seeds (`pooled_claims`: the estimate pooled
    over seeds, with its uncertainty), and the per-seed reports linked (run_dir/seed-S/report.html). Prints the
    pooled claims' summary (`claims_summary`), as a one-seed run prints its own."""
    rows: dict[str, list] = {}
    for claims in per_seed.values():
        for claim in claims:
            rows.setdefault(claim.id, [claim.id, claim.claim]).append(f"{claim.verdict}: {claim.ours}")
    seeds = list(per_seed)
    holds = {cid: sum(cell.startswith("holds") for cell in r[2:]) for cid, r in rows.items()}
    pooled = {c.id: c for c in pooled_claims(per_seed)}
    table = markdown_table(["#", "claim", *[f"seed {s}" for s in seeds], "holds on", "over the seeds"],
                           [[*r, f"{holds[cid]} of {len(seeds)}",
                             VERDICT_WORDS[pooled[cid].holds] + (f": {pooled[cid].evidence}" if pooled[cid].evidence
                                                                 else "")]
                            for cid, r in rows.items()])
    print(f"over seeds {', '.join(map(str, seeds))}: " + claims_summary(list(pooled.values())), flush=True)
    return write_report(run_dir, title, [f"{claims_verdict(list(pooled.values()))} over seeds "
                                         f"{', '.join(map(str, seeds))}; a difference is pooled over the seeds with "
                                         f"its uncertainty. Per-seed reports: {seed_links(seeds)}.",
                                         "## Verdicts per seed\n\n" + table])
