"""The model cache: where converted models live, a GGUF file converted into it, and where each came from.

A GGUF file is read by transformers (`from_pretrained(dir, gguf_file=...)`: weights dequantized to fp32, the
tokenizer, chat template and special tokens the file carries), rebuilt as a plain model (transformers refuses
to save a GGUF-loaded one) and saved as an ordinary fp32 folder, keyed by the file's sha256, so a second run
reuses it. The folder appears whole or not at all: it is written to a temporary folder beside it and renamed,
under a file lock, so torchrun's processes converting at once do it once, and a killed conversion leaves
nothing half-written. `trajtune_source.json` in the folder says where it came from (the GGUF's sha256, quant
type, the package that shipped it, the license); `provenance(folder)` reads it and runs name it. The weights
are a dequantized quantized checkpoint, not the original: a note says so (stderr, once per process).

The cache: `$TRAJTUNE_CACHE`, else `$XDG_CACHE_HOME/trajtune`, else `~/.cache/trajtune`; models in its
`models/`. `models.hub` resolves `--model` into it; `trajtune models list` shows the catalog and what is cached;
`trajtune models fetch NAME` fetches one (`--wheel FILE`: from a wheel already downloaded, for a machine without the
registry).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .hub import CatalogEntry

SOURCE_FILE = "trajtune_source.json"
"""the provenance file a converted folder holds"""


class ModelPathError(FileNotFoundError):
    """A model spec that names no usable model (no such folder / file / hub id / catalog name, or not a model)."""


# --- the cache ------------------------------------------------------------------------------
def cache_root() -> Path:
    """`$TRAJTUNE_CACHE`, else `$XDG_CACHE_HOME/trajtune`, else `~/.cache/trajtune`."""
    if os.environ.get("TRAJTUNE_CACHE"):
        return Path(os.environ["TRAJTUNE_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "trajtune"
    return Path.home() / ".cache" / "trajtune"


def models_dir() -> Path:
    return cache_root() / "models"


def gguf_folder_name(sha256: str) -> str:
    """The cache folder of a GGUF file: gguf-<the first 16 hex digits of its sha256>."""
    return f"gguf-{sha256[:16]}"


def is_model_dir(p: Path) -> bool:
    return p.is_dir() and (p / "config.json").is_file()


# --- GGUF files -------------------------------------------------------------------------------
_HASHES: dict[tuple, str] = {}


def file_sha256(path: Path) -> str:
    """The file's sha256 (once per process for an unchanged file: a run resolves its model more than once)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]


def gguf_info(path: Path) -> dict:
    """What a GGUF file says of itself: architecture, name, license, quant type (`ModelPathError` if it is not
    a readable GGUF file)."""
    try:
        import gguf
    except ImportError:
        raise ModelPathError(f"{path}: reading a .gguf file needs the gguf package: pip install 'trajtune[hf]' "
                             "(or pip install gguf)") from None
    try:
        reader = gguf.GGUFReader(str(path))
        fields = {k: reader.fields[k].contents() for k in
                  ("general.architecture", "general.name", "general.license", "general.file_type")
                  if k in reader.fields}
        kinds = [t.tensor_type.name for t in reader.tensors]
    except Exception as e:  # noqa: BLE001 (a wrong magic, a truncated file: the reader raises several kinds)
        raise ModelPathError(f"{path}: not a readable GGUF file ({type(e).__name__}: {str(e)[:200]}); "
                             "download it again, or give a Hugging Face model folder") from None
    if "general.architecture" not in fields:
        raise ModelPathError(f"{path}: the GGUF file names no architecture (general.architecture)")
    quant = None
    if "general.file_type" in fields:
        try:
            quant = (gguf.LlamaFileType(int(fields["general.file_type"])).name.removeprefix("MOSTLY_")
                     .removeprefix("ALL_"))
        except ValueError:
            quant = None
    if quant is None and kinds:  # the commonest tensor type of the file
        quant = max(set(kinds), key=kinds.count)
    return {"architecture": fields["general.architecture"], "name": fields.get("general.name", ""),
            "license": fields.get("general.license", ""), "quant_type": quant or "unknown"}


UNQUANTIZED = ("F32", "F16", "BF16")
"""GGUF types that hold the weights as they were (converting them to fp32 changes no value)"""


def note_of(source: dict) -> str:
    """The line that says what a converted folder is."""
    what = source.get("original") or source.get("name") or source.get("gguf_file", "a GGUF file")
    quant, sha = source.get("quant_type", "?"), source.get("gguf_sha256", "?")[:16]
    if quant in UNQUANTIZED:
        return f"{what}, converted from an unquantized {quant} GGUF file (sha256 {sha}) to fp32"
    return (f"{what} dequantized from a {quant} GGUF file (sha256 {sha}) to fp32: a dequantized quantized "
            "checkpoint, not the original weights")


def from_gguf(path: Path, entry: CatalogEntry | None = None, sha256: str | None = None) -> Path:
    """The cache folder of a GGUF file: converted the first time (atomically, under a lock), reused after."""
    sha = sha256 or file_sha256(path)
    dst = models_dir() / gguf_folder_name(sha)
    if not is_model_dir(dst):
        info = gguf_info(path)  # a file that is not a GGUF fails here, before anything is written
        dst.parent.mkdir(parents=True, exist_ok=True)
        with lock(dst.name):
            if not is_model_dir(dst):  # another process may have converted it while this one waited
                for stale in dst.parent.glob(f".{dst.name}.tmp-*"):  # a killed conversion's (the lock is ours)
                    shutil.rmtree(stale, ignore_errors=True)
                source = {"gguf_sha256": sha, "gguf_file": path.name, **info}
                source.update(_catalog_fields(entry))
                source["note"] = note_of(source)
                say(f"converting {path} ({info['quant_type']} GGUF) to an fp32 Hugging Face folder in {dst} "
                     "(once; later runs reuse it)")
                _convert(path, dst, source)
    ensure_source(dst, entry)
    note_once(dst)
    return dst


def _convert(path: Path, dst: Path, source: dict) -> None:
    """Dequantize `path` into `dst` through a temporary folder beside it (renamed when whole)."""
    import time

    t0 = time.time()
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 -> an ordinary folder (others may read a shared cache)
    try:
        _dequantize(path, tmp)
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=1) + "\n")
        if dst.exists():  # something not a model folder (no config.json) in the way, under the lock: ours to replace
            shutil.rmtree(dst)
        os.replace(tmp, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"converted in {time.time() - t0:.0f} s: {dst}")


def _dequantize(path: Path, out: Path) -> None:
    """transformers reads the GGUF (dequantized weights, its tokenizer and chat template); `save_pretrained` of
    that model refuses ("quantized with gguf"), so the same weights go into a plain model built from its config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    except (OSError, ValueError, KeyError, RuntimeError, NotImplementedError) as e:
        raise ModelPathError(f"{path}: transformers cannot load this GGUF file ({type(e).__name__}: "
                             f"{str(e)[:300]})") from None
    d = loaded.config.to_dict()
    d.pop("quantization_config", None)
    plain = AutoModelForCausalLM.from_config(type(loaded.config).from_dict(d), dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(str(out))
    tok.save_pretrained(str(out))


@contextmanager
def lock(name: str):
    """An exclusive lock named `name`, a file in <cache>/locks (released when the holder exits, killed or not)."""
    import fcntl

    path = cache_root() / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _catalog_fields(entry: CatalogEntry | None) -> dict:
    if entry is None:
        return {}
    return {"catalog_name": entry.name, "package": entry.package, "member": entry.member, "license": entry.license,
            "original": entry.original, "description": entry.description}


def ensure_source(dst: Path, entry: CatalogEntry | None) -> None:
    """A catalog model's folder converted without its provenance (from a bare .gguf, or by hand) gets it."""
    if entry is None:
        return
    source = provenance(dst) or {"gguf_sha256": entry.sha256, "gguf_file": Path(entry.member).name,
                                 "quant_type": _quant_from_member(entry.member)}
    if source.get("catalog_name") == entry.name:
        return
    source.update(_catalog_fields(entry))
    source["note"] = note_of(source)
    tmp = dst / f".{SOURCE_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(source, indent=1) + "\n")
    os.replace(tmp, dst / SOURCE_FILE)


def _quant_from_member(member: str) -> str:
    m = re.search(r"\.(I?Q\d\w*|F16|F32|BF16)\.gguf$", member, re.IGNORECASE)
    return m.group(1).upper() if m else "unknown"


def provenance(folder: str | os.PathLike) -> dict | None:
    """The `trajtune_source.json` of a model folder (what it was converted from), or None (an ordinary folder)."""
    try:
        data = json.loads((Path(folder) / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


_NOTED: set[str] = set()


def note_once(folder: Path) -> None:
    src = provenance(folder)
    if src and str(folder) not in _NOTED:
        _NOTED.add(str(folder))
        say(f"note: {folder.name} is {src.get('note') or note_of(src)}")


def say(text: str) -> None:
    """A line on stderr, from one process (rank 0 under torchrun)."""
    if os.environ.get("RANK", "0") == "0":
        print(f"trajtune: {text}", file=sys.stderr, flush=True)


def cached_models() -> list[tuple[Path, int, dict | None]]:
    """(folder, bytes, provenance) of every model folder in the cache."""
    root = models_dir()
    out = []
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        if is_model_dir(p):
            out.append((p, sum(f.stat().st_size for f in p.rglob("*") if f.is_file()), provenance(p)))
    return out
