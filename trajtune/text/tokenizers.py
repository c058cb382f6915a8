"""Tokenizers for the toy gyms: character-level and word-level, built from a corpus.

Both share one vocabulary layout: the special tokens first (pad, bos, eos and
the turn wrappers the renderer uses), then the corpus symbols in sorted order,
so a tokenizer built twice from the same corpus has the same ids. Special
tokens are never parsed out of text; the renderer inserts them by name
(`tok.special_id("<|assistant|>")`), so no user text can forge a turn boundary.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterable, Sequence

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SYSTEM, USER, ASSISTANT, TOOL, END = "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, SYSTEM, USER, ASSISTANT, TOOL, END)

WORD_PATTERN = re.compile(r"\n|\w+|[^\w\s]+")


class UnknownSymbolError(ValueError):
    """A symbol outside the tokenizer's vocabulary."""


class Tokenizer:
    """Common base: a fixed list of symbols; subclasses define how text splits into them."""

    kind = "base"

    def __init__(self, symbols: Sequence[str], specials: Sequence[str] = SPECIAL_TOKENS):
        dup = set(specials) & set(symbols)
        if dup:
            raise ValueError(f"corpus symbols collide with special tokens: {sorted(dup)}")
        self.specials = list(specials)
        self.itos: list[str] = list(specials) + list(symbols)
        self.stoi: dict[str, int] = {s: i for i, s in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("duplicate symbols in the vocabulary")
        self._text_ids = {s: i for s, i in self.stoi.items() if i >= len(self.specials)}  # what text may encode to

    # --- ids of special tokens -------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    @property
    def pad_id(self) -> int:
        return self.stoi[PAD]

    @property
    def bos_id(self) -> int:
        return self.stoi[BOS]

    @property
    def eos_id(self) -> int:
        return self.stoi[EOS]

    def special_id(self, name: str) -> int:
        if name not in self.specials:
            raise KeyError(f"{name!r} is not a special token of this tokenizer; specials: {self.specials}")
        return self.stoi[name]

    # --- text <-> ids ----------------------------------------------------------
    def split(self, text: str) -> list[str]:
        raise NotImplementedError

    def join(self, symbols: list[str]) -> str:
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        symbols = self.split(text)
        try:  # the common case in one pass; an unknown (or special) symbol is named below
            return [self._text_ids[sym] for sym in symbols]
        except KeyError:
            pass
        ids = []
        for sym in symbols:
            i = self.stoi.get(sym)
            if i is None or i < len(self.specials):
                raise UnknownSymbolError(
                    f"{type(self).__name__}: symbol {sym!r} ({_describe(sym)}) in {text[:60]!r} "
                    f"is not in the vocabulary ({self.vocab_size} symbols)"
                )
            ids.append(i)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        ids = [int(i) for i in ids]
        if not skip_special and (not ids or (min(ids) >= 0 and max(ids) < self.vocab_size)):
            return self.join([self.itos[i] for i in ids])  # the common case, in one pass
        syms = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise UnknownSymbolError(f"{type(self).__name__}: id {i} is outside the vocabulary (size "
                                         f"{self.vocab_size})")
            if skip_special and i < len(self.specials):
                continue
            syms.append(self.itos[i])
        return self.join(syms)

    # --- persistence -----------------------------------------------------------
    def to_dict(self) -> dict:
        return {"kind": self.kind, "specials": self.specials, "symbols": self.itos[len(self.specials):]}

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), ensure_ascii=False, indent=0))

    @staticmethod
    def from_dict(d: dict) -> "Tokenizer":
        cls = {"char": CharTokenizer, "word": WordTokenizer}.get(d.get("kind"))
        if cls is None:
            raise ValueError(f"unknown tokenizer kind {d.get('kind')!r} (expected 'char' or 'word')")
        return cls(d["symbols"], d["specials"])

    @staticmethod
    def load(path: str | os.PathLike) -> "Tokenizer":
        try:
            return Tokenizer.from_dict(json.loads(Path(path).read_text()))
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"{path}: not a trajtune tokenizer file ({e})") from e


class CharTokenizer(Tokenizer):
    """One token per character."""

    kind = "char"

    @classmethod
    def from_corpus(cls, texts: Iterable[str] | str) -> "CharTokenizer":
        chars: set[str] = set()
        for t in [texts] if isinstance(texts, str) else texts:
            chars.update(t)
        return cls(sorted(chars))

    def split(self, text: str) -> list[str]:
        return list(text)

    def join(self, symbols: list[str]) -> str:
        return "".join(symbols)


class WordTokenizer(Tokenizer):
    """One token per word, per run of punctuation, and per newline (regex `\\n|\\w+|[^\\w\\s]+`).

    Other whitespace is not a token: `decode` joins symbols with single spaces, so
    `encode(decode(ids)) == ids` always holds and `decode(encode(s))` equals `s`
    up to spacing.
    """

    kind = "word"

    @classmethod
    def from_corpus(cls, texts: Iterable[str] | str) -> "WordTokenizer":
        words: set[str] = set()
        for t in [texts] if isinstance(texts, str) else texts:
            words.update(WORD_PATTERN.findall(t))
        return cls(sorted(words))

    def split(self, text: str) -> list[str]:
        pieces = WORD_PATTERN.findall(text)
        if not pieces and text.strip():
            raise UnknownSymbolError(f"WordTokenizer: cannot split {text!r}")
        return pieces

    def join(self, symbols: list[str]) -> str:
        out = []
        for s in symbols:
            if out and s != "\n" and out[-1] != "\n":
                out.append(" ")
            out.append(s)
        return "".join(out)


def _describe(sym: str) -> str:
    if len(sym) == 1:
        return f"U+{ord(sym):04X}"
    return f"{len(sym)} characters"
