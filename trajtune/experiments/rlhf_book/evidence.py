"""The estimates the rlhf_book claims are decided on: each a difference and its standard error, built on
`runs.verdicts` (which judges them: holds / does not hold / not distinguishable).

The units of noise this recipe has, and the estimate each gives:

    held-out problems   the same 256 sums (128 words) scored by two policies: `verdicts.paired` over the
                        problems (per-problem 0/1 results, recorded by every evaluation)
    sampled shares      a share of n sampled replies (format, stop, preference): binomial (`share`, `verdicts.two_shares`)
    training steps      a per-step metric (each step a mean over its own fresh episodes): the last k steps against
                        the first k, Welch over the steps (`change`); a run's mean over its steps (`level`). Steps
                        with a trend count the trend as noise: conservative
    loss noise          the sd of step-to-step loss changes, with a bootstrap SE over the changes (`step_noise`)

A claim made of parts (`Part`) is decided by `decide`: it holds when every part does (`verdicts.both`), and the
estimate shown beside it is the part that decided it (the first that fails, else the first inside the noise, else
the first part with an estimate), so the uncertainty a reader sees is the one that settled the verdict.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from ...runs.verdicts import NOISE, Estimate, Holds, bootstrap, both, difference, judge, share_se

def finite(xs: Sequence[float]) -> list[float]:
    """The values that are numbers (a step without an update logs NaN)."""
    return [float(x) for x in xs if x == x]


def change(xs: Sequence[float], k: int, what: str) -> Estimate:
    """mean(last k steps) - mean(first k steps) of a per-step metric, with the Welch SE over those steps."""
    xs = finite(xs)
    k = max(1, min(k, len(xs) // 2 or 1))
    return relabel(difference(xs[-k:], xs[:k]), f"{what}, last {k} vs first {k} steps, Welch")


def level(xs: Sequence[float], minus: float, what: str) -> Estimate:
    """mean(xs) - `minus` over a run's steps, with the SE sd / sqrt(steps)."""
    xs = finite(xs)
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0
    return Estimate(statistics.fmean(xs) - minus, se, len(xs), f"{what}, over {len(xs)} steps")


def share(p: float, n: int, minus: float, what: str) -> Estimate:
    """A share `p` of `n` sampled replies minus a threshold, with its binomial SE (taken at (hits + 1) / (n + 2),
    as `verdicts.two_shares` does, so 0/40 is not judged on a zero SE)."""
    return Estimate(p - minus, share_se((p * n + 1) / (n + 2), n), n, f"{what}, binomial, {n}")


def minus(a: Estimate, b: Estimate, what: str, scale: float = 1.0) -> Estimate:
    """a - scale * b of two independent estimates: SE sqrt(se_a^2 + scale^2 se_b^2)."""
    return Estimate(a.value - scale * b.value, math.hypot(a.se, scale * b.se), min(a.n, b.n), what)


def relabel(est: Estimate, what: str) -> Estimate:
    return Estimate(est.value, est.se, est.n, what)


def step_noise(losses: Sequence[float], seed: int = 0) -> Estimate:
    """The sd of step-to-step changes of a loss curve (its noise, not its trend), with a bootstrap SE over the
    changes (1000 resamples, `random.Random(seed)`)."""
    xs = finite(losses)
    diffs = [b - a for a, b in zip(xs, xs[1:])]
    if len(diffs) < 2:
        return Estimate(float("nan"), 0.0, len(diffs), "loss noise")
    return bootstrap(diffs, statistics.stdev, seed, what=f"sd of {len(diffs)} step-to-step changes, bootstrap")


@dataclass(frozen=True)
class Part:
    """One part of a claim: its name, the estimate and how it is judged (`verdicts.judge(est, test, margin)`);
    `verdict` overrides the judgement for a part that is exact (a count, a cache hit)."""

    name: str
    estimate: Estimate | None
    test: str = ">"
    margin: float = 0.0
    exact: Holds = None

    @property
    def holds(self) -> Holds:
        return self.exact if self.estimate is None else judge(self.estimate, self.test, self.margin)  # type: ignore[arg-type]


def decide(parts: Sequence[Part]) -> tuple[Holds, Estimate | None, str]:
    """(verdict, the estimate that decided it, why): every part must hold. The deciding part is the first that
    fails, else the first inside the noise, else the first part with an estimate; `why` names it when the claim
    does not hold or is not distinguishable ('' when it holds)."""
    verdicts = [p.holds for p in parts]
    holds = both(*verdicts)
    pick = next((p for p, v in zip(parts, verdicts) if v is False), None) \
        or next((p for p, v in zip(parts, verdicts) if v == NOISE), None) \
        or next((p for p in parts if p.estimate is not None), parts[0])
    est = pick.estimate
    if est is not None and pick.name:  # the part's name and how its noise was taken ('paired over 256', 'Welch')
        est = relabel(est, f"{pick.name}; {est.what.split(', ', 1)[-1]}" if est.what else pick.name)
    why = "" if holds is True else pick.name
    return holds, est, why


def fmt_est(est: Estimate) -> str:
    """'+0.016 ± 0.046' (the value and 2 SE, for a table cell; the kind of SE is in the claims table)."""
    lo, hi = est.interval()
    return f"{est.value:+.3f} ± {(hi - lo) / 2:.3f}"


SECTIONS = {4: "4.4", 5: "5.8", 6: "6.5", 8: "8.6", 9: "9.4", 12: "12.3.4"}
"""chapter -> the number of its "Suggested Experiments" section (the book's headings counted in order: ch.12's is a
subsection of "The Path to On-Policy, Teacher-Student Distillation")"""


def cite(chapter: int) -> str:
    """'RLHF book, ch.6 §6.5': where the book states the experiment (its Suggested Experiments section)."""
    return f"RLHF book, ch.{chapter} §{SECTIONS[chapter]}"
