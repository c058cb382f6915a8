"""Checkpoint primitives: safetensors for tensors, JSON for everything else; nothing is unpickled.

Directories are written atomically (`atomic_dir`): everything goes to a temporary
sibling, is flushed to disk, and is renamed into place, so a crash mid-save leaves
the previous checkpoint intact; `recover_dir` undoes a save cut between its two
renames. Readers get a `CheckpointError` naming the file for anything missing,
truncated or corrupted; writers one naming the file and the OS reason for a full disk
or a read-only directory (the previous checkpoint stays). Saved directories are
readable by others as the umask allows (0755 / 0644).

The formats built on these live with what they save: the TinyTransformer model
directory in trajtune/models/tiny.py (`save_model` / `load_model`), Hugging Face
policies in trajtune/models/hf.py, an engine's training state in engine.py.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from safetensors.torch import load_model as _st_load_model
from safetensors.torch import save_model as _st_save_model


class CheckpointError(RuntimeError):
    """A checkpoint directory that is missing, incomplete or corrupted."""


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory; on success it replaces `path` in one rename.

    If the body raises, the temporary directory is removed and `path` is untouched.
    A directory cannot be renamed over a non-empty one, so the previous `path` is
    first moved aside to `.<name>.old-<pid>`; a crash between the two renames leaves
    it there, and `recover_dir(path)` (called by readers such as the Checkpointer)
    puts it back. The result is readable by others as the umask allows (0755 / 0644
    under the usual 022; `mkdtemp` alone would leave it 0700). A write that fails for
    a reason of the disk or the directory (full, read-only, no permission) is a
    `CheckpointError` naming the file and the OS reason.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    except OSError as e:
        raise write_error(path, e) from e
    try:
        yield tmp
        share(tmp)
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
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) or _io_error(e):
            raise write_error(path, e) from e
        raise


def write_error(path: Path, e: BaseException) -> CheckpointError:
    """'cannot write DIR: FILE: No space left on device' for an OSError (or a safetensors I/O error)
    met while saving `path`; the previous checkpoint there is intact."""
    if isinstance(e, OSError):
        where = f"{e.filename}: " if e.filename else ""
        reason = e.strerror or str(e)
    else:
        where, reason = "", str(e)
    return CheckpointError(f"cannot write {path}: {where}{reason} (the previous checkpoint there, if any, is "
                           "intact); free some space or choose a writable directory, then run the same command again")


def _io_error(e: BaseException) -> bool:
    """A safetensors write error that is the OS's (it wraps the OSError in its own type)."""
    return isinstance(e, SafetensorError) and "IoError" in str(e)


def share(directory: Path) -> None:
    """Give `directory`, its subdirectories and files the permissions the umask allows for new
    ones (0755 / 0644 under umask 022): readable by the others a saved model is for."""
    umask = _umask()
    os.chmod(directory, 0o777 & ~umask)
    for root, dirs, files in os.walk(directory):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o777 & ~umask)
        for f in files:
            full = os.path.join(root, f)
            executable = os.stat(full).st_mode & 0o111
            os.chmod(full, (0o777 if executable else 0o666) & ~umask)


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


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc/self/status);
    elsewhere set and restored at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


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


def write_json(path: Path, data: Any) -> None:
    """Write `data` as JSON atomically: a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


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
    bad = [name for name,
           t in model.state_dict().items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
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
