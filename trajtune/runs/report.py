"""Reports: markdown tables, claim checks beside the seed's numbers, report.md + report.html.

Every experiment ends with `write_report(run_dir, title, sections)`, which writes
`report.md` and an HTML rendering of it next to the PNG figures (`runs.plots`), and returns the
path of `report.md` (an experiment's run prints it as its last line). The report of any run
directory from its metrics.jsonl alone is `runs.metrics_report.write_run_report`.

A *claim* is what REPRODUCE.md says must hold; the seed's exact numbers are
context. `Claim` rows put both side by side with a verdict, so a reader sees at
once what reproduced and what did not; `write_claims_over_seeds` pools them over seeds.
"""

from __future__ import annotations

import html
import math
import statistics
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Mapping, Sequence

from .verdicts import NOISE, Z, Estimate, Holds, judge, over_seeds



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


def short(v: float) -> str:
    """A number in 3 significant digits ('0' for 0): a run report's metrics, a flat series' value."""
    return "0" if v == 0 else f"{v:.3g}"


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
    """The reference (the seed document's or the book's numbers) beside ours, with the claim, whether it holds, and
    (when any claim is decided by a
    difference) that difference with its noise: the verdict is read beside the uncertainty that decided it."""
    if any(c.estimate is not None for c in claims):
        return markdown_table(["#", "experiment", "reference", "ours", "claim", f"difference ± {Z:g} SE", "verdict"],
                              [(c.id, c.what, c.seed, c.ours, c.claim, c.evidence or "-", c.verdict) for c in claims])
    return markdown_table(
        ["#", "experiment", "reference", "ours", "claim", "verdict"],
        [(c.id, c.what, c.seed, c.ours, c.claim, c.verdict) for c in claims],
    )


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
