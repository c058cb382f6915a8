"""Which tokenizer decodes each stage's recorded episodes, and each token's text (for `trajtune view`,
`runs.view`).

Token text comes from the tokenizer of the policy that sampled the episode, stage by stage
(`stage_decoders`): `--tokenizer PATH` (a trajtune tokenizer.json, or a Hugging Face model or
tokenizer directory) for every stage; else the tokenizer saved in the stage's own directory (the
model it trained); else, through the stage graph (each finished stage's results.json records the
stages it waited for, `runs.rundir.stages_on_disk`), the nearest upstream stage that saved one --
the model the stage started from, e.g. `overopt_single` <- `overopt_rm0` (whose network and
tokenizer are `sft_narrow`'s), `pg_instruct` <- `sft_narrow`; else the model named in RUN_DIR/config.json
(the Hugging Face commands' input model). A stage with no record (an older run directory, a stage
still running or cut short) falls back to the first of the run's saved tokenizers whose vocabulary
holds all its ids; where the run holds several, the page says it is a guess, above the episodes and
on stderr. So does a stage whose token ids fall outside its tokenizer's vocabulary (the wrong
tokenizer), and one whose upstream stages saved different tokenizers. Without any tokenizer, tokens
show as their ids.

Characters split across tokens. A byte-level BPE (GPT-2, SmolLM2, Qwen) encodes text as UTF-8
bytes, so one Japanese character (3 bytes) may be two or three tokens, and a token decoded alone
is a broken byte sequence (U+FFFD). Tokens are therefore decoded incrementally, as a streaming
detokenizer does (`Decoder.texts`): a token's text is what decoding the sequence up to it adds to
decoding the sequence before it, with a few tokens of context. A token that ends inside a
character adds nothing yet: it is shown as a grey "…" box (its tooltip names the token that
completes the character), and the token that completes it shows the whole character (a token can
complete one character and start the next, e.g. the bytes "93 e3" of こ|ん: a chain of such tokens
waits for the first that ends on a character boundary, `HOLD`, which shows them all). So the
tokens' texts, joined, are the decoded text, character for character. The trajtune tokenizers
(characters, words) have whole characters in every token.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Callable, Sequence

from ..config import ConfigError
from .rundir import INPUTS, stages_on_disk

HOLD = 32
"""at most this many tokens wait for a character boundary (a token may end inside one character after completing
another, e.g. the bytes "93 e3" of こ|ん, so a chain of such tokens waits as a whole); past it, bytes that never
complete a character show as U+FFFD"""


class Decoder:
    """The text of each token of a sequence, from one tokenizer (see the module docstring).

    `texts(ids)` -> (text per token, completed_by per token): joined, the texts are the decoded sequence; a token
    that ends inside a character has text "" and completed_by = the index of the next token that ends on a character
    boundary, which shows the characters they make together (None elsewhere). Ids outside [0, size) show as "#<id>"
    (`outside` counts them)."""

    def __init__(self, source: str, size: int, decode: Callable[[list[int]], str], whole_tokens: bool,
                 word_level: bool = False):
        self.source, self.size, self._decode = source, size, decode
        self.whole_tokens = whole_tokens
        """True: every token is whole characters (trajtune's tokenizers): decoded one by one"""
        self.word_level = word_level
        """True: a word-level tokenizer (no whitespace but line breaks in its tokens)"""

    def outside(self, ids: Sequence[int]) -> int:
        """How many of `ids` fall outside the vocabulary."""
        return sum(not 0 <= i < self.size for i in ids)

    def texts(self, ids: Sequence[int]) -> tuple[list[str], list[int | None]]:
        n = len(ids)
        out, completed_by = [""] * n, [None] * n
        if self.whole_tokens:
            return [self._decode([i]) if 0 <= i < self.size else f"#{i}" for i in ids], completed_by
        prefix = read = 0  # ids[read:i] wait for a character's last bytes; ids[prefix:read] are context
        for i in range(n):
            if not 0 <= ids[i] < self.size:  # not decodable: shown as its id, and the stream starts afresh after it
                self._flush(ids, prefix, read, i, out, completed_by)
                out[i], prefix, read = f"#{ids[i]}", i + 1, i + 1
                continue
            before = self._decode(list(ids[prefix:read]))
            now = self._decode(list(ids[prefix:i + 1]))
            if now.endswith("\ufffd") and i - read < HOLD and i + 1 < n:
                continue  # ends inside a character: wait for the token that ends on a character boundary
            out[i] = now[len(before):]
            for j in range(read, i):
                completed_by[j] = i
            prefix, read = read, i + 1
        return out, completed_by

    def _flush(self, ids, prefix, read, end, out, completed_by) -> None:
        """Tokens ids[read:end] still waiting when an undecodable id comes: the last of them shows what they make."""
        if read < end:
            out[end - 1] = self._decode(list(ids[prefix:end]))[len(self._decode(list(ids[prefix:read]))):]
            for j in range(read, end - 1):
                completed_by[j] = end - 1


def load_decoder(path: Path) -> Decoder:
    """A decoder from a trajtune tokenizer.json, or a Hugging Face tokenizer directory."""
    from ..text.tokenizers import Tokenizer

    file = path / "tokenizer.json" if path.is_dir() else path
    if file.exists():
        try:
            tok = Tokenizer.load(file)
            return Decoder(str(file), len(tok.itos), lambda ids: "".join(tok.itos[i] for i in ids), True,
                           word_level=tok.kind == "word")
        except ValueError:
            pass  # not the trajtune format: a Hugging Face tokenizer
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise ConfigError(f"trajtune view: {path} is not a trajtune tokenizer, and reading a Hugging Face one "
                          f"needs transformers (pip install 'trajtune[hf]'): {e}") from None
    folder = path.parent if path.is_file() else path
    try:
        hf = AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:  # noqa: BLE001 - any failure to read it is the user's path
        raise ConfigError(f"trajtune view: cannot read a tokenizer from {path}: "
                          f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from None
    return Decoder(str(folder), len(hf), lambda ids: hf.decode(ids, skip_special_tokens=False,
                                                                clean_up_tokenization_spaces=False), False)


def saved_tokenizer(folder: Path) -> Decoder | None:
    """The tokenizer saved under `folder` (a stage directory: its checkpoint or model first), or None."""
    for file in _tokenizer_files(folder):
        try:
            return load_decoder(file.parent)
        except ConfigError:
            continue
    return None


def _tokenizer_files(folder: Path) -> list[Path]:
    """The tokenizer.json files under `folder`, those of a checkpoint/ or model/ folder first."""
    files = folder.rglob("tokenizer.json") if folder.is_dir() else []
    return sorted(files, key=lambda f: (f.parent.name not in ("checkpoint", "model"), f))


def _tokenizer_bytes(folder: Path) -> bytes | None:
    """The first tokenizer.json under `folder`, as bytes (to tell tokenizers apart), or None."""
    files = _tokenizer_files(folder)
    return files[0].read_bytes() if files else None


def find_decoder(run_dir: Path, explicit: str | None = None) -> tuple[Decoder | None, str]:
    """(decoder or None, where it came from): `explicit`, else the first tokenizer saved under the run, else the
    model directory of its config.json (`--tokenizer`, and a page of one episodes.jsonl)."""
    if explicit:
        return load_decoder(Path(explicit)), explicit
    root = run_dir.parent if run_dir.is_file() else run_dir
    found = saved_tokenizer(root)
    if found is not None:
        return found, found.source
    found = input_model(root)
    return (found, found.source) if found is not None else (None, "none found: tokens show as ids")


def input_model(root: Path) -> Decoder | None:
    """The tokenizer of the model RUN_DIR/config.json names ("model": a folder, a name of the model catalog already
    fetched, or the Hugging Face commands' {"path": ...}), or None. Never downloads."""
    from ..models.hub import cached_model

    try:
        model = json.loads((root / "config.json").read_text()).get("model")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    model = model.get("path") if isinstance(model, dict) else model
    if not isinstance(model, str) or not model:
        return None
    try:
        folder = Path(model) if Path(model).is_dir() else cached_model(model)
    except Exception:  # noqa: BLE001 - a name it cannot resolve offline: no input model to read
        folder = None
    if folder is not None:
        try:
            return load_decoder(Path(folder))
        except ConfigError:
            return None
    return None


def upstream(run_dir: Path, stage: str, on_disk: dict | None = None) -> list[str] | None:
    """The stages `stage` waited for, and theirs, nearest first (breadth-first over each finished stage's record of
    its `after`, results.json "inputs"); None when `stage` has no such record (not finished, or an older run).
    `on_disk`: `stages_on_disk(run_dir)`, if read already."""
    on_disk = stages_on_disk(run_dir) if on_disk is None else on_disk
    if stage not in on_disk or not on_disk[stage].finished or INPUTS not in on_disk[stage].results:
        return None
    order, frontier = [], list(on_disk[stage].after)
    while frontier:
        name = frontier.pop(0)
        if name not in order and name != stage:
            order.append(name)
            frontier += list(on_disk[name].after) if name in on_disk else []
    return order


def stage_decoders(run_dir: Path, stages: Sequence[str], explicit: str | None = None,
                   ids: dict[str, list[list[int]]] | None = None) -> dict[str, tuple[Decoder | None, str, bool]]:
    """{stage: (decoder or None, where it came from, in words; True when it is a guess)} (the module docstring).
    `ids`: each stage's episodes' token ids: a guess takes the first tokenizer whose vocabulary holds them all."""
    if explicit or run_dir.is_file():
        decoder, where = find_decoder(run_dir, explicit)
        return {s: (decoder, f"{where}{' (--tokenizer)' if explicit else ''}", False) for s in stages}
    out, fallback, on_disk = {}, None, stages_on_disk(run_dir)
    for stage in stages:
        own = saved_tokenizer(run_dir / stage)
        if own is not None:
            out[stage] = (own, f"{_rel(own.source, run_dir)}, the stage's own saved model", False)
            continue
        chain = upstream(run_dir, stage, on_disk)
        found = next(((name, d) for name in chain or () if (d := saved_tokenizer(run_dir / name)) is not None), None)
        if found is not None:
            kinds_up = len({_tokenizer_bytes(run_dir / name) for name in chain} - {None})
            out[stage] = (found[1], f"{_rel(found[1].source, run_dir)}, saved by {found[0]}, upstream of {stage} in "
                                    "the stage graph" + (f", the nearest of {kinds_up} different tokenizers upstream: "
                                                         "it may not be the policy's" if kinds_up > 1 else ""),
                          kinds_up > 1)
            continue
        model = input_model(run_dir)
        if model is not None:
            out[stage] = (model, f"{model.source}, the run's input model (config.json)", False)
            continue
        if fallback is None:  # every distinct tokenizer of the run, in path order
            fallback = {}
            for file in sorted(run_dir.rglob("tokenizer.json")):
                if file.read_bytes() not in fallback:
                    with contextlib.suppress(ConfigError):
                        fallback[file.read_bytes()] = load_decoder(file.parent)
        if not fallback:
            out[stage] = (None, "none found: tokens show as ids", False)
            continue
        candidates = list(fallback.values())
        fits = [d for d in candidates if not any(d.outside(x) for x in (ids or {}).get(stage, []))]
        pick = (fits or candidates)[0]
        if len(candidates) == 1:  # nothing else it could be
            out[stage] = (pick, f"{_rel(pick.source, run_dir)}, the one tokenizer saved in the run", False)
            continue
        why = ("its stage graph has no saved tokenizer" if chain is not None else
               "no record of the model it sampled (a stage not finished, or a run directory older than the record)")
        out[stage] = (pick, f"{_rel(pick.source, run_dir)}, the first of the run's {len(candidates)} saved tokenizers "
                            f"whose vocabulary holds its ids ({len(fits)} do): {why}, so it may be another model's",
                      True)
    return out


def _rel(path: str, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path

