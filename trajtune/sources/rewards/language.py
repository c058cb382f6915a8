"""Language-consistency reward (RLHF book ch.7.3 "Language-consistency rewards"; DeepSeek-R1 §2.3.3: the share of
the chain of thought's words that are in the target language), as a TRL reward function.

A word's language is read from its script (Unicode character names: LATIN, CYRILLIC, CJK, HANGUL ...), so this is
the simple form: it tells Chinese from English, not English from French. Words are runs of letters of one
script; CJK ideographs, hiragana and katakana count one word per character (they are written without spaces);
digits, punctuation and symbols count for nothing.

    trajtune grpo ... --reward trajtune.sources.rewards.language:language_consistency   (Latin script)

`make_language_consistency(("cjk", "hiragana", "katakana"))` builds another target (Japanese); a row's `script`
column, where the data has one, overrides the target per prompt.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any, Callable, Sequence

PER_CHARACTER = frozenset({"cjk", "hiragana", "katakana"})
"""scripts written without spaces: each letter is a word"""
_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)


def script_of(ch: str) -> str | None:
    """The script of a letter, lower case ('latin', 'cyrillic', 'cjk', 'hangul', 'greek' ...: the first word of its
    Unicode name), or None for anything that is not a letter (digits, punctuation, spaces, symbols)."""
    if not ch.isalpha():
        return None
    name = unicodedata.name(ch, "")
    return name.split(" ", 1)[0].lower() if name else None


def script_words(text: str) -> list[str]:
    """The script of each word of `text`, in order: a word is a run of letters of one script (one letter in the
    scripts of `PER_CHARACTER`).

        "think 思考 twice"  -> ['latin', 'cjk', 'cjk', 'latin']
    """
    out: list[str] = []
    previous = None  # the script of the letter before, None after a non-letter
    for ch in text:
        script = script_of(ch)
        if script is not None and (script != previous or script in PER_CHARACTER):
            out.append(script)
        previous = script
    return out


def language_share(text: str, scripts: str | Sequence[str] = "latin") -> float:
    """The share of `text`'s words written in `scripts` (one name or several); 0.0 when it has no words."""
    target = {scripts} if isinstance(scripts, str) else set(scripts)
    words = script_words(text)
    return sum(w in target for w in words) / len(words) if words else 0.0


def reasoning_of(text: str) -> str:
    """The reasoning a completion shows: what is inside <think>...</think> (up to the end if it is not closed),
    else the whole text."""
    found = _THINK.search(text)
    return found.group(1) if found else text


def _texts(completions: Sequence[Any]) -> list[str]:
    return [c if isinstance(c, str) else c[-1]["content"] for c in completions]


def make_language_consistency(scripts: str | Sequence[str] = "latin") -> Callable:
    """A TRL reward function: `language_share` of each completion's reasoning (`reasoning_of`) in `scripts`, or in
    the row's own `script` column where the data has one (one name, or names joined by '+': 'cjk+hiragana')."""

    def language_consistency(completions, **kwargs) -> list[float]:
        rows = kwargs.get("script") or [None] * len(completions)
        return [language_share(reasoning_of(text), scripts if s is None else s.split("+"))
                for text, s in zip(_texts(completions), rows, strict=True)]

    return language_consistency


language_consistency = make_language_consistency("latin")
"""the share of each completion's reasoning words in Latin script (a row's `script` column overrides)"""
