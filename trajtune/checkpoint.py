"""Checkpoints: safetensors for tensors, JSON for everything else; nothing is unpickled.

A model checkpoint is a directory:

    config.json        {"format": "trajtune", "model": "TinyTransformer", "config": {...}}
    model.safetensors  the weights
    tokenizer.json     (optional) the toy tokenizer

Directories are written atomically: everything goes to a temporary sibling,
is flushed to disk, and is renamed into place, so a crash mid-save leaves the
previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from safetensors.torch import load_model as _st_load_model
from safetensors.torch import save_model as _st_save_model

from .models.tiny import TinyConfig, TinyTransformer
from .text.tokenizers import Tokenizer

MODEL_CLASSES = {"TinyTransformer": (TinyTransformer, TinyConfig)}


class CheckpointError(RuntimeError):
    """A checkpoint directory that is missing, incomplete or corrupted."""


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory; on success it replaces `path` in one rename.

    If the body raises, the temporary directory is removed and `path` is untouched.
    A directory cannot be renamed over a non-empty one, so the previous `path` is
    first moved aside to `.<name>.old-<pid>`; a crash between the two renames leaves
    it there, and `recover_dir(path)` (called by readers such as the Checkpointer)
    puts it back.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        for f in tmp.iterdir():  # flush file contents before the rename makes them visible
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def recover_dir(path: str | os.PathLike) -> bool:
    """If `path` is missing but a save was cut between its two renames (see `atomic_dir`),
    move the previous complete directory back. Returns True if it did."""
    path = Path(path)
    if path.exists():
        return False
    aside = sorted(path.parent.glob(f".{path.name}.old-*"), key=lambda p: p.stat().st_mtime)
    if not aside:
        return False
    os.replace(aside[-1], path)
    return True


def _fsync_dir(directory: Path) -> None:
    """Make a rename inside `directory` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_json(file: Path) -> dict:
    """A checkpoint's JSON file; a truncated or corrupted one is a CheckpointError naming it."""
    try:
        data = json.loads(Path(file).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file}: unreadable checkpoint metadata ({e})") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: checkpoint metadata is not a JSON object")
    return data


def save_tensors(tensors: dict[str, torch.Tensor], file: Path) -> None:
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(file))


def load_tensors(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{file}: cannot read safetensors file ({e})") from e


def save_model_weights(model: torch.nn.Module, file: Path) -> None:
    """Save weights (tied weights handled); refuses NaN/Inf weights so a checkpoint is never poisoned."""
    bad = [name for name, t in model.state_dict().items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise CheckpointError(f"refusing to save non-finite weights to {file}: {', '.join(bad[:3])}"
                              + (f" and {len(bad) - 3} more" if len(bad) > 3 else ""))
    _st_save_model(model, str(file))


def load_model_weights(model: torch.nn.Module, file: Path) -> None:
    if not Path(file).exists():
        raise CheckpointError(f"{file}: weights file is missing")
    try:
        missing, unexpected = _st_load_model(model, str(file), strict=False)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{file}: cannot load weights ({e})") from e
    if missing or unexpected:
        raise CheckpointError(f"{file}: weights do not match the model (missing {missing}, unexpected {unexpected})")


def save_model(path: str | os.PathLike, model: TinyTransformer, tokenizer: Tokenizer | None = None, meta: dict | None = None) -> Path:
    """Save a model (and optionally its tokenizer and a JSON-able `meta` dict) to directory `path`."""
    name = type(model).__name__
    if name not in MODEL_CLASSES:
        raise TypeError(f"save_model: no checkpoint format for {name}; known: {sorted(MODEL_CLASSES)}")
    with atomic_dir(path) as tmp:
        cfg = {"format": "trajtune", "model": name, "config": model.config.to_dict(), "meta": meta or {}}
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
        save_model_weights(model, tmp / "model.safetensors")
        if tokenizer is not None:
            tokenizer.save(tmp / "tokenizer.json")
    return Path(path)


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[TinyTransformer, Tokenizer | None]:
    """Load what `save_model` wrote: (model, tokenizer or None)."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise CheckpointError(f"{path}: not a trajtune checkpoint (no config.json)")
    try:
        cfg = json.loads(cfg_file.read_text())
        cls, config_cls = MODEL_CLASSES[cfg["model"]]
        config = config_cls(**cfg["config"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{cfg_file}: malformed checkpoint config ({e!r})") from e
    model = cls(config)
    load_model_weights(model, path / "model.safetensors")
    tok_file = path / "tokenizer.json"
    tokenizer = Tokenizer.load(tok_file) if tok_file.exists() else None
    return model.to(device), tokenizer
