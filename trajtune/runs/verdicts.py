"""Verdicts with their uncertainty: one place where every recipe decides whether a comparison holds.

A comparative claim ("RFT beats SFT on held-out", "the ensemble's share stays above the single RM's") is decided
on an `Estimate`: the measured difference and its standard error. The claim holds only when the difference
clears `Z` standard errors in the claimed direction, does not hold when it clears them the other way, and is
`NOISE` ("not distinguishable") in between -- never "holds" or "does not hold" on a difference that sampling
noise could have made.

    est = two_shares(20, 256, 16, 256)            # held-out greedy 20/256 vs 16/256
    str(est)                                      # '+0.016 ± 0.046 (2 SE; binomial)'
    judge(est)                                    # 'not distinguishable'
    judge(paired(before, after))                  # per-problem paired change
    judge(over_seeds([e0, e1, e2]))               # the same difference on three seeds, pooled
    decide((up, ">", 0.1), (flat, "<=", 0.02))    # a claim of two tests: both verdicts, the deciding estimate

The standard errors (z = 2 throughout, a ~95% two-sided band):

    binomial   p on n trials:                 sqrt(p (1 - p) / n)       (`share`, `two_shares`)
    paired     per-item differences d_i:       sd(d) / sqrt(n)          (`paired`: the same problems before/after)
    unpaired   two independent samples:        sqrt(var_a/n_a + var_b/n_b)  (`difference`)
    bootstrap  any statistic of one sample:    sd of the statistic over resamples (`bootstrap`, seeded)
    ratio      sum(num) / sum(den) over items: the delta method (`ratio`; smooth, order-free)
    seeds      one estimate per seed:          between-seed sd / sqrt(k), never below the mean sampling SE / sqrt(k)

A bound ("random reward does not raise pass@1 by more than 0.02", "format stays at least 0.9") is
`judge(est, "<=", margin)` / `">="`: it holds only when the whole noise band lies on its side of the margin -- a
rise inside the noise does not show that there was none. A claim on a run that cannot support it (a collapsed run, a
stage that did not run) is not judged at all: `Claim(holds=None, why=...)`.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

Z = 2.0
"""a difference counts when it exceeds this many standard errors (two-sided ~95%)"""

NOISE = "not distinguishable"
"""the third verdict: the difference lies inside Z standard errors of zero (or of the claimed margin)"""

Holds = bool | None | str
"""True (holds), False (does not hold), NOISE (not distinguishable from noise), None (not judged)"""

@dataclass(frozen=True)
class Estimate:
    """A measured difference (or a quantity against a threshold) and its standard error.

    value:  the difference, in the claim's units (b - a for "b beats a")
    se:     its standard error (0 for an exact, noiseless quantity)
    n:      how many independent units it rests on (problems, episodes, seeds), for the reader
    what:   'paired over 256', 'binomial', 'over 3 seeds', ...
    """

    value: float
    se: float
    n: int = 0
    what: str = ""

    def interval(self, z: float = Z) -> tuple[float, float]:
        return self.value - z * self.se, self.value + z * self.se

    def __str__(self) -> str:
        digits = 3 if max(abs(self.value), self.se) < 10 else 1
        core = f"{self.value:+.{digits}f} ± {Z * self.se:.{digits}f} ({Z:g} SE"
        return core + (f"; {self.what})" if self.what else ")")


def judge(est: Estimate, claim: Literal[">", "<", "<=", ">=", "not <", "not >"] = ">", margin: float = 0.0,
          z: float = Z) -> Holds:
    """The verdict of the claim `est.value <claim> margin`, given its noise.

    '>' / '<':   holds when the value clears `margin` by z SE in that direction, does not hold when it clears it
                 the other way, NOISE in between.
    '<=' / '>=': at most / at least `margin` ("stays at guess level": at most guess + a tolerance the claim names;
                 "keeps its format": at least the start - 0.1): holds when the whole band [value - z SE,
                 value + z SE] lies on the claimed side (touching the margin counts), does not hold when it lies
                 beyond it, NOISE when it straddles it. The absence of a clear effect is not evidence of its
                 absence: "does not rise" with margin 0 holds only on a value clearly below 0, so such a claim
                 names the tolerance it means.
    'not <' / 'not >': a guard, never a claim's deciding test: holds unless the value is clearly below (above)
                 `margin` -- "and it never clearly falls between two evaluations" beside a main part that clears
                 its own noise. Alone it would let noise decide, which is what this module exists to prevent.
    """
    lo, hi = est.value - z * est.se, est.value + z * est.se
    if claim == ">":
        return True if lo > margin else False if hi < margin else NOISE
    if claim == "<":
        return True if hi < margin else False if lo > margin else NOISE
    if claim == "<=":
        return True if hi <= margin else False if lo > margin else NOISE
    if claim == ">=":
        return True if lo >= margin else False if hi < margin else NOISE
    if claim == "not <":
        return not hi < margin
    if claim == "not >":
        return not lo > margin
    raise ValueError(f"claim must be one of > < <= >= 'not <' 'not >', got {claim!r}")


def both(*verdicts: Holds) -> Holds:
    """A claim made of parts: False if any part fails, else None if any was not judged, else NOISE if any part is
    inside the noise, else True."""
    if any(v is False for v in verdicts):
        return False
    if any(v is None for v in verdicts):
        return None
    if any(v == NOISE for v in verdicts):
        return NOISE
    return True


@dataclass(frozen=True)
class Part:
    """One test of a claim made of several (pass@1 up AND pass@16 flat): its name, the estimate and how it is judged
    (`judge(estimate, test, margin)`); a part with no estimate is exact (a count, a cache hit) and `exact` is its
    verdict. `decide` also takes a bare (estimate, test, margin) tuple for an unnamed part."""

    name: str
    estimate: Estimate | None = None
    test: str = ">"
    margin: float = 0.0
    exact: Holds = None

    @property
    def holds(self) -> Holds:
        # type: ignore[arg-type]
        return self.exact if self.estimate is None else judge(self.estimate, self.test, self.margin)

    def clearance(self) -> float:
        """By how many standard errors the estimate clears its margin in the claimed direction (inf when exact)."""
        if self.estimate is None:
            return math.inf
        est = self.estimate
        gap = est.value - self.margin if self.test in (">", ">=", "not <") else self.margin - est.value
        return gap / est.se if est.se > 0 else math.copysign(math.inf, gap)

    def text(self) -> str:
        """'held-out - guess level +0.04 ± 0.06 (2 SE; binomial, 160 episodes), claim not > 0: holds'."""
        word = {True: "holds", False: "fails", NOISE: "not distinguishable", None: "not judged"}[self.holds]
        if self.estimate is None:
            return f"{self.name}: {word}"
        return f"{self.name} {self.estimate}, claim {self.test} {self.margin:g}: {word}"

    def to_json(self) -> dict:
        e = self.estimate
        return {"what": self.name, "test": self.test, "margin": self.margin, "exact": self.exact,
                "est": None if e is None else {"value": e.value, "se": e.se, "n": e.n, "what": e.what}}

    @classmethod
    def from_json(cls, d: dict) -> "Part":
        e = d["est"]
        return cls(d["what"], None if e is None else Estimate(e["value"], e["se"], e["n"], e["what"]), d["test"],
                   d["margin"], d["exact"])


def deciding_part(*parts: Part | tuple[Estimate, str, float]) -> tuple[Holds, Part]:
    """A claim made of several parts -> (`both` of their verdicts, the part that decided it, to show beside the
    verdict): a failed exact part first, else of the parts with an estimate the failed one that fails by most, else
    the one inside the noise closest to failing, else the closest call (the part that clears its margin by the
    fewest standard errors); the first part when all are exact and hold."""
    if not parts:
        raise ValueError("decide: no parts")
    tests = [p if isinstance(p, Part) else Part("", *p) for p in parts]
    holds = both(*(t.holds for t in tests))
    failed_exact = [t for t in tests if t.estimate is None and t.holds is False]
    if failed_exact:
        return holds, failed_exact[0]
    for want in (False, NOISE, True):
        pick = [t for t in tests if t.estimate is not None and t.holds == want]
        if pick:
            return holds, min(pick, key=Part.clearance)
    return holds, tests[0]


def decide(*parts: Part | tuple[Estimate, str, float]) -> tuple[Holds, Estimate | None]:
    """`deciding_part`'s verdict and the deciding part's estimate: decide((up, ">", 0.1), (flat, "<=", 0.02))."""
    holds, pick = deciding_part(*parts)
    return holds, pick.estimate


def share_se(p: float, n: int) -> float:
    """The binomial standard error of a share `p` measured on `n` independent trials (0 for n = 0)."""
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n > 0 else 0.0


def two_shares(a_hits: float, a_n: int, b_hits: float, b_n: int, what: str = "binomial") -> Estimate:
    """a_hits/a_n - b_hits/b_n from two independent samples (e.g. 20/256 vs 16/256 held-out problems). Each
    share's SE is taken at (hits + 1) / (n + 2), so 0/64 against 3/64 is not judged on a zero SE."""
    def se(hits: float, n: int) -> float:
        return share_se((hits + 1) / (n + 2), n)

    return Estimate(a_hits / a_n - b_hits / b_n, math.sqrt(se(a_hits, a_n) ** 2 + se(b_hits, b_n) ** 2),
                    min(a_n, b_n), what)


def share(hits: float, n: int, bar: float = 0.0, what: str = "") -> Estimate:
    """One share hits/n on n independent trials, less a fixed `bar` (61/64 replies against 0.9: +0.053), its SE
    taken at (hits + 1) / (n + 2) as in `two_shares`, so 0/128 or 64/64 is not judged on a zero SE."""
    return Estimate(hits / n - bar, share_se((hits + 1) / (n + 2), n), n, what or f"binomial over {n}")


def minus(a: Estimate, b: Estimate, what: str, scale: float = 1.0) -> Estimate:
    """a - scale * b of two independent estimates: SE sqrt(se_a^2 + scale^2 se_b^2)."""
    return Estimate(a.value - scale * b.value, math.hypot(a.se, scale * b.se), min(a.n, b.n), what)


def shares(a: float, b: float, n: int, what: str = "binomial") -> Estimate:
    """Share a minus share b, each measured on n independent trials (unpaired)."""
    return two_shares(a * n, n, b * n, n, what)


def paired(before: Sequence[float], after: Sequence[float], what: str = "") -> Estimate:
    """mean(after - before) over the same items (problems, tasks, prompts) and its paired standard error:
    the sd of the per-item differences / sqrt(n). [n] and [n] -> Estimate."""
    if len(before) != len(after):
        raise ValueError(f"paired: {len(before)} items before, {len(after)} after; they must be the same items")
    d = [b - a for a, b in zip(before, after)]
    n = len(d)
    se = statistics.stdev(d) / math.sqrt(n) if n > 1 else 0.0
    return Estimate(statistics.fmean(d) if d else 0.0, se, n, what or f"paired over {n}")


def difference(a: Sequence[float], b: Sequence[float], what: str = "") -> Estimate:
    """mean(a) - mean(b) of two independent samples, with the unpaired (Welch) standard error."""
    def var_n(xs: Sequence[float]) -> float:
        return statistics.variance(xs) / len(xs) if len(xs) > 1 else 0.0

    return Estimate(statistics.fmean(a) - statistics.fmean(b), math.sqrt(var_n(a) + var_n(b)), min(len(a), len(b)),
                    what or f"unpaired, {len(a)} and {len(b)}")


def bootstrap(items: Sequence, statistic: Callable[[Sequence], float], seed: int, resamples: int = 1000,
              what: str = "") -> Estimate:
    """statistic(items) and its bootstrap standard error: the sd of the statistic over `resamples` resamples of the
    items with replacement, drawn by a `random.Random(seed)` (reproducible)."""
    rng = random.Random(seed)
    n = len(items)
    stats = [statistic([items[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples)]
    return Estimate(statistic(items), statistics.stdev(stats) if resamples > 1 else 0.0, n,
                    what or f"bootstrap, {resamples} resamples of {n}")


def ratio(num: Sequence[float], den: Sequence[float], what: str = "") -> Estimate:
    """sum(num) / sum(den) over n items (e.g. the share of each reply's log-ratio that sits on its last tokens) and
    its delta-method standard error, sd(num - R den) / (sqrt(n) |mean(den)|): smooth in the data and independent of
    the items' order, where a bootstrap of a ratio whose denominator nears 0 in some resamples is not (two
    processes that sum in another order would report different noise). [n] and [n] -> Estimate."""
    n = len(num)
    if n != len(den) or n == 0:
        raise ValueError(f"ratio: {n} numerators and {len(den)} denominators; they must be the same, non-empty items")
    total = sum(den)
    r = sum(num) / total if total else float("nan")
    if n < 2 or not total:
        return Estimate(r, 0.0, n, what or f"ratio over {n}")
    resid = [a - r * b for a, b in zip(num, den)]
    return Estimate(r, statistics.stdev(resid) / (math.sqrt(n) * abs(total / n)), n, what or f"delta method, {n}")


def over_seeds(estimates: Sequence[Estimate]) -> Estimate:
    """One difference measured on k seeds -> their mean and its standard error: the between-seed sd / sqrt(k), but
    never below the seeds' mean sampling SE / sqrt(k) (three seeds that happen to agree do not make noise vanish)."""
    k = len(estimates)
    values = [e.value for e in estimates]
    between = statistics.stdev(values) / math.sqrt(k) if k > 1 else 0.0
    within = math.sqrt(statistics.fmean([e.se ** 2 for e in estimates]) / k) if k else 0.0
    return Estimate(statistics.fmean(values), max(between, within), k, f"over {k} seed{'s' if k != 1 else ''}")


def exact(value: float, what: str = "exact") -> Estimate:
    """A noiseless quantity (a loss at init, a gradient identity): standard error 0."""
    return Estimate(value, 0.0, 0, what)
