"""Audits of graders and of what they reward: the book's bias list and over-optimization signatures.

RLHF book ch.11 "Preference Data" (checklist 11.7, the bias audit list: prefix bias, verbosity / length,
formatting such as lists) and ch.14 "Qualitative Over-Optimization" (checklist 14.5: "Common phrases, such as
'As an AI language model...' or 'Certainly!...'; uninformative answers via repetitiveness, hedging; pandering:
self-doubt, sycophancy, over-apologizing; misaligned behavior such as over-refusals"; "repeating rare tokens that
happen to increase scores due to artifacts in RM training"). Pure functions of texts, token ids and scores:

    signature_shares(texts)          share of texts showing each `SIGNATURES` pattern (case-insensitive regexes)
    repetition(text, n)              share of a text's word n-grams that repeat an earlier one (0: none, -> 1: a loop)
    max_token_share(ids)             the largest share one token id takes of a sequence (rare-token spam)
    length_bias(scores, lengths)     Pearson and Spearman correlation of a grader's scores with length (verbosity)
    longer_preferred(...)            share of pairs whose preferred side is the longer one (0.5: no length bias)
    list_share(texts)                share of texts formatted as a list (formatting habits)
    prefix_agreement(full, prefix)   how often the preference on the first k characters alone equals the full one
                                     (prefix bias: near 1 means the beginning decides)

A number alone judges nothing: compare a policy before and after RL, or a grader against a verifier.
"""

from __future__ import annotations

import math
import re
from typing import Mapping, Sequence

SIGNATURES: Mapping[str, str] = {
    "ai_disclaimer": r"\bas an ai\b|\bas a language model\b|\bas an ai language model\b",
    "certainly_opening": r"^\s*(certainly|absolutely|of course|sure|great question)\b[!,.]?",
    "apology": r"\b(i apologi[sz]e|i'm sorry|i am sorry|my apologies|sorry for)\b",
    "hedging": r"\b(i'm not sure|i am not sure|it is hard to say|it's hard to say|it depends|i cannot be certain)\b",
    "self_doubt": r"\b(i might be wrong|i may be wrong|i could be mistaken|please double[- ]check)\b",
    "refusal": r"\b(i can(?:not|'t) (?:help|assist|provide|do that)|i'm unable to|i am unable to|i won't be able)\b",
    "sycophancy": r"\b(you're absolutely right|you are absolutely right|what a great|excellent question)\b",
}
"""name -> case-insensitive regex of the book's qualitative over-optimization signs (ch.14); extend per task"""

_WORD = re.compile(r"\w+", re.UNICODE)
_LIST_LINE = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+\S", re.MULTILINE)


def signature_shares(texts: Sequence[str], patterns: Mapping[str, str] = SIGNATURES) -> dict[str, float]:
    """{name: share of `texts` in which `patterns[name]` matches anywhere} (case-insensitive; 0.0 each for none)."""
    compiled = {name: re.compile(p, re.IGNORECASE | re.MULTILINE) for name, p in patterns.items()}
    n = len(texts)
    return {name: (sum(bool(rx.search(t)) for t in texts) / n if n else 0.0) for name, rx in compiled.items()}


def repetition(text: str, n: int = 3) -> float:
    """Share of the word n-grams of `text` that repeat an n-gram seen earlier in it (lower-cased words).

    0.0 when every n-gram is new or there are none; (k-1)/k for a phrase said k times over."""
    if n < 1:
        raise ValueError(f"repetition: n must be >= 1, got {n}")
    words = [w.lower() for w in _WORD.findall(text)]
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def max_token_share(ids: Sequence[int]) -> float:
    """The largest share one token id takes of `ids` (1.0: a single token repeated; 0.0 for an empty sequence)."""
    if not ids:
        return 0.0
    counts: dict[int, int] = {}
    for i in ids:
        counts[i] = counts.get(i, 0) + 1
    return max(counts.values()) / len(ids)


def _pearson(x: Sequence[float], y: Sequence[float]) -> float:
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float("nan")


def _ranks(x: Sequence[float]) -> list[float]:
    """Average ranks (1-based; ties share the mean of their ranks)."""
    order = sorted(range(len(x)), key=lambda i: x[i])
    ranks = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def length_bias(scores: Sequence[float], lengths: Sequence[float]) -> dict[str, float]:
    """How a grader's scores follow completion length (ch.11.7 verbosity): {"pearson", "spearman"} over the
    completions (nan when either side is constant). lengths in characters or tokens, one per score."""
    if len(scores) != len(lengths):
        raise ValueError(f"length_bias: {len(scores)} scores for {len(lengths)} lengths")
    if len(scores) < 2:
        raise ValueError("length_bias: needs at least 2 completions")
    s, l_ = [float(v) for v in scores], [float(v) for v in lengths]
    return {"pearson": _pearson(s, l_), "spearman": _pearson(_ranks(s), _ranks(l_))}


def longer_preferred(preferred_lengths: Sequence[float], other_lengths: Sequence[float]) -> float:
    """Share of pairs (of different lengths) whose preferred completion is the longer one: 0.5 when length does not
    decide, near 1 for a verbosity-biased grader. nan when every pair has equal lengths."""
    if len(preferred_lengths) != len(other_lengths):
        raise ValueError(f"longer_preferred: {len(preferred_lengths)} preferred lengths for {len(other_lengths)} "
                         "others")
    unequal = [(a, b) for a, b in zip(preferred_lengths, other_lengths) if a != b]
    return sum(a > b for a, b in unequal) / len(unequal) if unequal else float("nan")


def list_share(texts: Sequence[str], min_items: int = 2) -> float:
    """Share of texts with at least `min_items` list lines ('- x', '* x', '1. x', '2) x'): formatting habits."""
    return sum(len(_LIST_LINE.findall(t)) >= min_items for t in texts) / len(texts) if texts else 0.0


def prefix_agreement(full: Sequence[int], prefix: Sequence[int]) -> float:
    """Share of pairs where the preference given only each completion's first characters (`prefix`, e.g. the
    first 32) equals the preference on the whole completions (`full`): +1 first preferred, -1 second, 0 tie.
    Near 1 on pairs whose difference lies late in the text means the beginning decides (prefix bias, ch.11.7)."""
    if len(full) != len(prefix):
        raise ValueError(f"prefix_agreement: {len(full)} full verdicts for {len(prefix)} prefix verdicts")
    if not full:
        raise ValueError("prefix_agreement: no pairs")
    return sum(a == b for a, b in zip(full, prefix)) / len(full)
