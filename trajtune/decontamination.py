"""Decontamination: which evaluation rows share an n-gram of words, or a long substring, with the training data.

RLHF book ch.16 "Contamination" (checklist 16.6): "one performs searches over the training and test
datasets, looking for matches in n-gram overlap over words/subword tokens, or fixed-length character
substring matching (e.g., 50 characters)"; Tülu 3 found its contaminated sets "via 8-gram overlap from the
training prompt to the exact prompts in the evaluation set". Two rules, either one flags an evaluation row:

    words   the row shares a run of `ngram` consecutive words (default 8) with a training row. Words are the
            maximal runs of letters and digits of the text after Unicode NFKC and lower-casing (`words`):
            punctuation and spacing do not count, so "Q: 23+45" is the words q, 23, 45.
    chars   the row shares a substring of `chars` characters (default 50) with a training row, after NFKC,
            lower-casing and every run of whitespace made one space (`normalize_chars`); punctuation counts.

A row shorter than the rule's length (fewer than `ngram` words, fewer than `chars` characters) cannot hold
such a run; it is flagged when its whole normalized text occurs in a training row (for words: as a run of
consecutive words; for characters: as a substring), so a short exact duplicate -- a two-line arithmetic
problem -- is still caught. Its match is labelled `ngram_whole_row` / `chars_whole_row`: a row of a word or
two occurs in much ordinary text, so read those matches before you drop the rows. `ngram=0` / `chars=0`
turns a rule off.

How it scales: the evaluation rows are indexed (every word n-gram, every character window) and the training
rows streamed past the index once, so memory grows with the evaluation set, time with the training set. For
characters a training row is read only at every `stride`-th offset, with windows of `chars - stride + 1`
characters: any shared substring of `chars` characters covers one of them whole, and each hit is checked
by extending it both ways, so nothing is missed and nothing is flagged that does not share `chars`
characters. ~100k training rows of a few hundred words take seconds.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Iterable, Sequence

WORD = re.compile(r"[^\W_]+")
"""a word: a maximal run of letters and digits (Unicode)"""
SPACE = re.compile(r"\s+")


def words(text: str) -> list[str]:
    """The words of a text for the n-gram rule: NFKC, lower-cased, maximal runs of letters and digits."""
    return WORD.findall(unicodedata.normalize("NFKC", text).lower())


def normalize_chars(text: str) -> str:
    """The text for the substring rule: NFKC, lower-cased, every run of whitespace one space, stripped."""
    return SPACE.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()


@dataclass(frozen=True)
class Match:
    """One contaminated evaluation row: which rule, the shared text, and the first training row that has it."""

    eval_row: int
    """index of the evaluation row (0-based, in the order given)"""
    train_row: int
    """index of the first training row (0-based) that shares the text"""
    rule: str
    """"ngram" (a run of `ngram` words), "chars" (a substring of `chars` characters), or "ngram_whole_row" /
    "chars_whole_row" (a row shorter than the rule, found whole in a training row)"""
    text: str
    """the shared text: the n words joined by spaces, or the normalized substring"""


@dataclass(frozen=True)
class Decontamination:
    """The result of `find_contamination`: one `Match` per contaminated evaluation row (its first match;
    the word rule before the character rule), in evaluation order."""

    matches: tuple[Match, ...]
    n_eval: int
    n_train: int
    ngram: int
    chars: int

    @property
    def contaminated(self) -> list[int]:
        return [m.eval_row for m in self.matches]

    @property
    def share(self) -> float:
        """Share of evaluation rows flagged."""
        return len(self.matches) / self.n_eval if self.n_eval else 0.0


def find_contamination(train: Iterable[str], evaluation: Sequence[str], ngram: int = 8, chars: int = 50,
                       stride: int | None = None) -> Decontamination:
    """Flag every evaluation text that shares `ngram` consecutive words or `chars` characters with a training
    text (see the module docstring for the rules and the normalization).

    train: training texts (any iterable: streamed once); evaluation: evaluation texts.
    stride: read training rows at every `stride`-th word / character offset (default: half the rule's
    length; 1 reads every offset). Any stride finds the same rows (module docstring); it only sets the speed.
    """
    if ngram < 0 or chars < 0 or (ngram == 0 and chars == 0):
        raise ValueError(f"find_contamination: ngram ({ngram}) and chars ({chars}) must be >= 0, one of them > 0")
    if stride is not None and stride < 1:
        raise ValueError(f"find_contamination: stride must be >= 1, got {stride}")
    rules = []
    if ngram:
        rules.append(("ngram", _Needles([tuple(words(t)) for t in evaluation], ngram, stride), words, " ".join))
    if chars:
        rules.append(("chars", _Needles([normalize_chars(t) for t in evaluation], chars, stride), normalize_chars,
                      "".join))
    found: dict[int, Match] = {}
    n_train = 0
    for j, text in enumerate(train):
        n_train += 1
        for rule, needles, normalize, join in rules:
            if len(found) < len(evaluation):
                seq = normalize(text)
                needles.scan(tuple(seq) if rule == "ngram" else seq, j, rule, join, found)
    return Decontamination(tuple(sorted(found.values(), key=lambda m: m.eval_row)), len(evaluation), n_train,
                           ngram, chars)


class _Needles:
    """The evaluation rows of one rule, indexed for a stride scan. Row i needs a shared run of L_i =
    min(len(row i), length) items (words, or characters). Rows are grouped by L; for each L the index maps
    every window of w = L - s + 1 items of those rows (every offset q) to (i, q), and a training sequence is
    read at offsets 0, s, 2s, ...: a shared run of L items starting at a covers the window at the first
    offset k >= a (k <= a + s - 1, so k + w <= a + L). Each hit is extended both ways and kept if the
    shared run reaches L."""

    def __init__(self, rows: list, length: int, stride: int | None):
        self.rows = rows
        self.length = length
        self.groups: dict[int, tuple[int, int, dict]] = {}  # L -> (stride, width, {window: [(row, offset)]})
        for i, row in enumerate(rows):
            if not row:
                continue
            need = min(len(row), length)
            if need not in self.groups:
                s = min(need, stride if stride is not None else max(1, need // 2))
                self.groups[need] = (s, need - s + 1, {})
            _, width, index = self.groups[need]
            for q in range(len(row) - width + 1):
                index.setdefault(row[q:q + width], []).append((i, q))

    def scan(self, seq, j: int, rule: str, join, found: dict[int, Match]) -> None:
        """Record a `Match` for every row not yet found that shares its run with `seq` (training row j)."""
        for need, (s, width, index) in self.groups.items():
            for k in range(0, len(seq) - width + 1, s):
                for i, q in index.get(seq[k:k + width], ()):
                    if i in found:
                        continue
                    row = self.rows[i]
                    left = 0
                    while k - left > 0 and q - left > 0 and seq[k - left - 1] == row[q - left - 1]:
                        left += 1
                    right = width
                    while k + right < len(seq) and q + right < len(row) and seq[k + right] == row[q + right]:
                        right += 1
                    if left + right >= need:
                        label = rule if need == self.length else f"{rule}_whole_row"
                        found[i] = Match(i, j, label, join(row[q - left:q - left + need]))
