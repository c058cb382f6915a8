"""`trajtune decontaminate`: which evaluation rows share an 8-gram of words or 50 characters with training data.

    trajtune decontaminate --train train.jsonl --eval test.jsonl
    trajtune decontaminate --train sft.parquet --train rl.jsonl --eval gsm8k_test.jsonl --field question
    trajtune decontaminate --train corpus.txt --eval test.json --ngram 13 --chars 0 --out contaminated.jsonl

The rules, the normalization and the speed are `trajtune.decontamination`'s (RLHF book ch.16 "Contamination":
8-gram overlap over words, as Tülu 3, or 50-character substrings). Files: JSON lines, a JSON array, parquet,
a `save_to_disk` directory (`trajtune.sources.data.read_rows`), or plain text (.txt / .md: one row per
non-empty line). The text of a row is its --field(s) (repeat for several; --eval-field if the evaluation
file names it differently): a string, a list of strings, or messages (their contents); by default the first
of prompt, messages, question, problem, text the first row has.

Prints each contaminated evaluation row with the shared text and the training row that has it; --out writes
them as JSON lines. Exit code: 0 clean, 1 contaminated (so a CI job can gate on it), 2 a bad option or file.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Sequence

from ..config import ConfigError
from ..decontamination import find_contamination
from ..sources.data import DataError, Row, read_rows

TEXT_SUFFIXES = (".txt", ".md")
DEFAULT_FIELDS = ("prompt", "messages", "question", "problem", "text")
"""the field used when --field is not given: the first of these the file's first row has"""


def add_decontaminate_parser(sub) -> None:
    p = sub.add_parser("decontaminate", help="find evaluation rows that overlap training data (8-gram words, "
                       "50-character substrings); exit 1 when any does",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", action="append", required=True, metavar="FILE",
                   help="training data (repeat for several files)")
    p.add_argument("--eval", required=True, metavar="FILE", help="evaluation data")
    p.add_argument("--ngram", type=int, default=8, help="words in a shared run (default 8, Tülu 3's; 0: off)")
    p.add_argument("--chars", type=int, default=50, help="characters in a shared substring (default 50; 0: off)")
    p.add_argument("--field", action="append", metavar="NAME",
                   help="the row field(s) to compare (repeat for several; default: the first of "
                   f"{', '.join(DEFAULT_FIELDS)} the first row has)")
    p.add_argument("--eval-field", action="append", metavar="NAME",
                   help="the evaluation file's field(s) when they differ from --field")
    p.add_argument("--out", metavar="FILE", help="write the contaminated rows as JSON lines "
                   "(eval, train: where each row is; rule; text: what they share)")
    p.add_argument("--show", type=int, default=20, help="contaminated rows printed (default 20; --out has all)")
    p.set_defaults(func=cmd_decontaminate)


def read_texts(path: str, fields: Sequence[str] | None, option: str) -> tuple[list[str], list[str]]:
    """(texts, where each row is) of a data file: the chosen fields of each row joined by newlines."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{option} {path}: no such file or directory")
    if p.is_file() and p.suffix in TEXT_SUFFIXES:
        if fields and list(fields) != ["text"]:
            raise ConfigError(f"{option} {path}: a text file has one field per line, 'text'; got --field {fields}")
        try:
            lines = p.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise ConfigError(f"{option} {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        kept = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
        if not kept:
            raise ConfigError(f"{option} {path}: no rows (the file has no non-empty line)")
        return [line for _, line in kept], [f"{path}:{n}" for n, _ in kept]
    try:
        rows = read_rows(p)
    except DataError as e:
        raise ConfigError(f"{option} {e}") from None
    if not fields:
        fields = [next((f for f in DEFAULT_FIELDS if f in rows[0].data), None)]
        if fields[0] is None:
            raise ConfigError(f"{option} {rows[0].where}: none of the fields {', '.join(DEFAULT_FIELDS)}; the row "
                              f"has {', '.join(sorted(rows[0].data)) or 'no fields'}: pick one with --field")
    return [row_text(r, fields, option) for r in rows], [r.where for r in rows]


def row_text(row: Row, fields: Sequence[str], option: str) -> str:
    parts = []
    for f in fields:
        if f not in row.data:
            raise ConfigError(f"{option} {row.where}: no field {f!r}; the row has "
                              f"{', '.join(sorted(row.data)) or 'no fields'}")
        parts.append(_text(row.data[f], row, f, option))
    return "\n".join(parts)


def _text(value: Any, row: Row, field: str, option: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    if isinstance(value, list) and all(isinstance(v, dict) and isinstance(v.get("content", ""), str) for v in value):
        return "\n".join(v.get("content") or "" for v in value)
    raise ConfigError(f"{option} {row.where}: field {field!r} is {type(value).__name__} {str(value)[:60]!r}; "
                      "expected text, a list of strings or a list of messages ({role, content})")


def cmd_decontaminate(args) -> int:
    if args.ngram < 0 or args.chars < 0 or (args.ngram == 0 and args.chars == 0):
        raise ConfigError(f"--ngram {args.ngram} --chars {args.chars}: each must be >= 0 and one of them > 0")
    for option, path in [("--eval", args.eval)] + [("--train", t) for t in args.train]:
        if not Path(path).exists():  # every file before the first is read
            raise ConfigError(f"{option} {path}: no such file or directory")
    t0 = time.time()
    ev_texts, ev_where = read_texts(args.eval, args.eval_field or args.field, "--eval")
    train_where: list[str] = []

    def train_texts():
        for path in args.train:
            texts, where = read_texts(path, args.field, "--train")
            train_where.extend(where)
            yield from texts

    result = find_contamination(train_texts(), ev_texts, args.ngram, args.chars)
    rules = " or ".join(r for r, on in ((f"{args.ngram}-grams of words", args.ngram),
                                        (f"{args.chars}-character substrings", args.chars)) if on)
    n = len(result.matches)
    print(f"{args.eval}: {n} of {result.n_eval} rows ({100 * result.share:.1f}%) share {rules} with "
          f"{', '.join(args.train)} ({result.n_train} rows) [{time.time() - t0:.1f}s]")
    for m in result.matches[:max(args.show, 0)]:
        print(f"  {ev_where[m.eval_row]}  <-  {train_where[m.train_row]}  {m.rule}: {m.text!r}")
    if n > args.show:
        print(f"  ... {n - args.show} more" + (f" (all in {args.out})" if args.out else " (--out FILE lists all)"))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            for m in result.matches:
                fh.write(json.dumps({"eval": ev_where[m.eval_row], "train": train_where[m.train_row],
                                     "rule": m.rule, "text": m.text}, ensure_ascii=False) + "\n")
    return 1 if n else 0
