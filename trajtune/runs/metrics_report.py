"""The report of any run directory from its metrics.jsonl: the Hugging Face commands' report.

`write_run_report(run_dir, title)`: the settings, a warning for each way the run learned nothing
(`run_warnings`), a few sampled completions, the key metrics, then the curves (loss, reward, KL, lr,
eval) as figures (`runs.plots`), a metric that never changed written as its value.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .plots import flat_value, line_plot, merge_identical
from .report import image, markdown_table, short, write_report


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
            table.append((what, f"`{key}`", len(ys), *(short(v) for v in (ys[0], ys[-1], statistics.fmean(ys),
                                                                             min(ys), max(ys)))))
    return markdown_table(["metric", "key", "rows", "first", "last", "mean", "min", "max"], table) if table else ""


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
        same = f"mean reward {short(min(reward))}; " if reward and min(reward) == max(reward) else ""
        out.append(f"**No learning signal:** at every one of the {len(signal)} steps, every group's completions got "
                   f"the same reward ({same}`rollout/no_signal_share` 1): with a group baseline (GRPO, RLOO) every "
                   "advantage was 0 and the reward taught the policy nothing; check the reward function on a few real "
                   "completions.")
    cut = _values(rows, "rollout/truncated_share")
    if cut and statistics.fmean(cut) > 0.5:
        out.append(f"**Most completions were cut at the token budget:** {statistics.fmean(cut):.0%} of sampled "
                   f"completions over {len(cut)} steps stopped at the maximum number of new tokens before they ended "
                   "(`rollout/truncated_share`); raise --max-new-tokens, or check that the model can end a turn.")
    loss = _values(rows, "train/loss")
    if len(loss) > 1 and max(loss) - min(loss) <= 1e-9 * max(1.0, abs(loss[0])):
        out.append(f"**The loss never moved:** `train/loss` was {short(loss[0])} at all {len(loss)} steps.")
    grad = _values(rows, "train/grad_norm")
    if grad and all(v == 0 for v in grad):
        out.append(f"**Gradient norm 0 at every step:** `train/grad_norm` was 0 at all {len(grad)} steps, so the "
                   "weights never changed.")
    if weight_change and weight_change.get("tensors") and not weight_change.get("changed"):
        out.append(f"**The saved model is its input, unchanged:** all {weight_change['tensors']} weight tensors of "
                   f"`{weight_change.get('model', 'model/')}` equal those of "
                   f"`{weight_change.get('input', 'the input')}` "
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
    return f"weights changed: {change['changed']} of {change['tensors']} tensors, |Δw| = {short(change['l2'])}{rel}"


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
        # RFT records per round (its rows: per step)
        unit = "round" if any("train/round" in r for r in mine) else "step"
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
                table.append((step, _md_text(asked.strip(), 80), _md_text(said_text), _md_text(str(info.get("expected",
                                                                                                            "-")), 40),
                              short(float(reward)) if isinstance(reward, (int, float)) else str(reward),
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
    sections.append("## Every plotted metric, per stage\n\n" + markdown_table(["stage", "metric", "rows", "first",
                                                                               "last", "min", "max"], table))
    stages = {stage for stage, _ in curves}
    figures, flat = [], []
    for stem, plot_title, keys in RUN_PLOTS:
        series = {(f"{stage} {key}" if len(stages) > 1 else key): xy for (stage, key), xy in curves.items()
                  if any(key == k or (k.endswith("/") and key.startswith(k)) for k in keys)}
        if not series:
            continue
        lines = merge_identical(series)
        notes = {label: flat_value(ys) or (short(ys[0]) if len(ys) == 1 else "") for label, (_, ys, _) in lines.items()}
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

