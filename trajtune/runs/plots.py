"""Figures for reports: every axis labelled, legends outside the data, integer ticks for steps and rounds.

Each plot is built by a `*_figure` function (returns the Figure, so a test can inspect it) and saved by its
`*_plot` twin (`save_figure`) as a PNG next to report.md (`runs.report.image` links it);
`figure_problems(fig)` says what a reader could not read off a figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # files only: never open a window
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .report import short  # noqa: E402

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
        return f"{short(ys[0])} (constant)"
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

