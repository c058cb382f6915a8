"""The estimates the rlhf_book claims are decided on: each a difference and its standard error, built on
`runs.verdicts` (which judges them: holds / does not hold / not distinguishable).

The units of noise this recipe has, and the estimate each gives:

    held-out problems   the same 256 sums (128 words) scored by two policies: `verdicts.paired` over the
                        problems (per-problem 0/1 results, recorded by every evaluation)
    sampled shares      a share of n sampled replies (format, stop, preference): binomial (`share`,
                        `verdicts.two_shares`)
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
from typing import Sequence

from ...runs import verdicts
from ...runs.verdicts import Estimate, Holds, Part, bootstrap, deciding_part, difference


def finite(xs: Sequence[float]) -> list[float]:
    """The values that are numbers (a step without an update logs NaN)."""
    return [float(x) for x in xs if x == x]


def change(xs: Sequence[float], k: int, what: str) -> Estimate:
    """mean(last k steps) - mean(first k steps) of a per-step metric, with the Welch SE over those steps."""
    xs = finite(xs)
    k = max(1, min(k, len(xs) // 2 or 1))
    return relabel(difference(xs[-k:], xs[:k]), f"{what}, last {k} vs first {k} steps, Welch")


def level(xs: Sequence[float], bar: float, what: str) -> Estimate:
    """mean(xs) - `bar` over a run's steps, with the SE sd / sqrt(steps)."""
    xs = finite(xs)
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0
    return Estimate(statistics.fmean(xs) - bar, se, len(xs), f"{what}, over {len(xs)} steps")


def share(p: float, n: int, bar: float, what: str) -> Estimate:
    """A share `p` of `n` sampled replies minus a threshold: `verdicts.share` from the share instead of the hits."""
    return verdicts.share(p * n, n, bar, f"{what}, binomial, {n}")


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


def decide(parts: Sequence[Part]) -> tuple[Holds, Estimate | None, str]:
    """(verdict, the estimate that decided it, why): every part must hold. The deciding part is the first that
    fails, else the first inside the noise, else the closest call (`verdicts.deciding_part`); `why` names it when the
    claim does not hold or is not distinguishable ('' when it holds)."""
    holds, pick = deciding_part(*parts)
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
