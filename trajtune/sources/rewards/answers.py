"""Answer extraction and exact-match rewards (RLHF book ch.7 "Reasoning", ch.16 "Evaluation", checklist 16.2(a)).

"Exact match has different problems, such as requiring rigid format suffixes (e.g., `The answer is:`) or using
regular expressions to detect answers anywhere in generated text (e.g., looking for `(C)` or the answer string
itself)" (ch.16). The book names the conventions: `\\boxed{77}`, "The answer is: 77", `#### 77` (GSM8K), and the
Tülu 3 multiple-choice suffix "Therefore, the answer is (C)". Each extractor returns the *last* answer the text
gives in its form (a model that corrects itself is judged on its final answer), or None:

    boxed(text)        the content of the last \\boxed{...}, braces balanced ("\\boxed{\\frac{1}{2}}" -> "\\frac{1}{2}")
    after_hashes(text) what follows the last '####' on its line
    answer_is(text)    what follows the last "the answer is" (optional ':'), up to the line's end, a trailing '.' cut
    letter(text)       the last "(X)" choice letter, X in A-Z
    extract(text, how) one of EXTRACTORS by name, or "any": the first of boxed, after_hashes, answer_is that finds one

`normalize` makes a fair comparison: strip, drop '$', thousands commas and a trailing period, and compare numbers
as numbers ("3.0" == "3"). The reward functions have TRL's signature (`--reward trajtune.sources.rewards.answers:
exact_answer` with an `answer` column): 1.0 when the extracted answer equals the row's, 0.0 when it differs or
nothing could be extracted (a format failure is a wrong answer, as in the book's evaluations).
"""

from __future__ import annotations

import re
from typing import Callable

_HASHES = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS = re.compile(r"the answer is\s*:?\s*([^\n]*)", re.IGNORECASE)
_LETTER = re.compile(r"\(([A-Z])\)")


def boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` in `text` (nested braces balanced), or None (none, or unclosed)."""
    start = text.rfind("\\boxed{")
    while start != -1:
        i, depth = start + len("\\boxed{"), 1
        for j in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                return text[i:j].strip()
        start = text.rfind("\\boxed{", 0, start)  # unclosed: an earlier one may be whole
    return None


def after_hashes(text: str) -> str | None:
    """What follows the last '####' on its line (GSM8K's answer line), stripped; None if absent or empty."""
    found = _HASHES.findall(text)
    return found[-1].strip() or None if found else None


def answer_is(text: str) -> str | None:
    """What follows the last 'the answer is' (case-insensitive, an optional ':'), to the end of its line, with a
    trailing period cut ("The answer is 11." -> "11"); None if absent or empty."""
    found = _ANSWER_IS.findall(text)
    if not found:
        return None
    out = found[-1].strip()
    out = out[:-1].rstrip() if out.endswith(".") else out
    return out or None


def letter(text: str) -> str | None:
    """The last '(X)' choice letter in `text` (Tülu 3's "Therefore, the answer is (C)"), or None."""
    found = _LETTER.findall(text)
    return found[-1] if found else None


EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "boxed": boxed, "hashes": after_hashes, "answer_is": answer_is, "letter": letter}
"""name -> extractor; extract(text, "any") tries boxed, hashes, answer_is in that order"""


def extract(text: str, how: str = "any") -> str | None:
    """The answer of `text` by extractor `how` (an `EXTRACTORS` name, or "any"), or None."""
    if how == "any":
        for name in ("boxed", "hashes", "answer_is"):
            got = EXTRACTORS[name](text)
            if got is not None:
                return got
        return None
    if how not in EXTRACTORS:
        raise ValueError(f"extract: how must be 'any' or one of {sorted(EXTRACTORS)}, got {how!r}")
    return EXTRACTORS[how](text)


def normalize(answer: str) -> str:
    """An answer for comparison: stripped, '$' and thousands commas dropped, a trailing period cut, numbers as
    numbers ('3.0' -> '3', '1,000' -> '1000', '-0.50' -> '-0.5')."""
    a = answer.strip().replace("$", "").strip()
    a = a[:-1].rstrip() if a.endswith(".") else a
    plain = a.replace(",", "") if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", a) else a
    try:
        number = float(plain)
    except ValueError:
        return a
    return str(int(number)) if number.is_integer() else repr(number)


def same_answer(text: str, answer: object, how: str = "any") -> bool:
    """Whether the answer extracted from `text` by `how` equals `answer` after `normalize` (False when none)."""
    got = extract(text, how)
    return got is not None and normalize(got) == normalize(str(answer))


def _texts(completions) -> list[str]:
    return [c if isinstance(c, str) else c[-1]["content"] for c in completions]


def exact_answer(completions, answer, **kwargs) -> list[float]:
    """TRL reward: 1.0 when the completion's answer (\\boxed{}, '####' or 'The answer is', the first found) equals
    the row's `answer` column, else 0.0."""
    return [float(same_answer(t, a)) for t, a in zip(_texts(completions), answer, strict=True)]


def exact_letter(completions, answer, **kwargs) -> list[float]:
    """TRL reward for multiple choice: 1.0 when the completion's last '(X)' is the row's `answer` letter."""
    return [float(same_answer(t, str(a).strip("() "), "letter")) for t, a in zip(_texts(completions), answer,
                                                                                 strict=True)]
