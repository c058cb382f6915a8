"""What a Tinker server keeps across restarts: its sessions, the models they created (how to make each again, how
many optimizer steps it has taken, its last saved state), and its named sampler weights. One JSON file in the
server's home, written atomically after every change (`trajtune.checkpoint.write_json`); the weights themselves are
checkpoint folders and files beside it (`service`).

    home/tinker.json                                  this registry
    home/base/<tiny-llama|tiny-qwen2>/                the built-in tiny base models
    home/checkpoints/<model>/weights/<name>/          save_state: weights, AdamW state, step (`TorchEngine.save_state`)
    home/checkpoints/<model>/sampler_weights/<name>.safetensors   save_weights_for_sampler(name)
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from ..checkpoint import write_json

FORMAT = 1


class Registry:
    """The server's durable record (module docstring); thread-safe. `boot` counts the server's starts."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self._lock = threading.RLock()
        data: dict[str, Any] = {"format": FORMAT, "boot": 0, "sessions": {}, "models": {}, "samplers": {}}
        if file.exists():
            try:
                data = json.loads(file.read_text())
            except (OSError, ValueError) as e:
                raise ValueError(f"{file}: the Tinker server's registry does not read ({e}); move it away to start "
                                 "afresh (the checkpoints beside it stay)") from None
            if data.get("format") != FORMAT:
                raise ValueError(f"{file}: registry format {data.get('format')!r}, this server reads {FORMAT}")
        data["boot"] = int(data.get("boot", 0)) + 1
        self.data = data
        self._write()

    @property
    def boot(self) -> int:
        return int(self.data["boot"])

    def _write(self) -> None:
        self.file.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.file, self.data)

    # --- sessions -------------------------------------------------------------------------------------------
    def add_session(self, session_id: str, meta: dict) -> None:
        with self._lock:
            self.data["sessions"][session_id] = {"finished": False, **meta}
            self._write()

    def session(self, session_id: str) -> dict | None:
        with self._lock:
            return self.data["sessions"].get(session_id)

    def finish_session(self, session_id: str, reason: str) -> list[str]:
        """Mark it finished -> the ids of its models."""
        with self._lock:
            s = self.data["sessions"].get(session_id)
            if s is not None:
                s.update(finished=True, reason=reason)
                self._write()
            return [m for m, e in self.data["models"].items() if e["spec"]["model_id"].startswith(session_id + ":")]

    # --- models ---------------------------------------------------------------------------------------------
    def add_model(self, spec: dict, step: int = 0, state: dict | None = None) -> None:
        with self._lock:
            self.data["models"][spec["model_id"]] = {"spec": spec, "step": step, "state": state}
            self._write()

    def model(self, model_id: str) -> dict | None:
        with self._lock:
            entry = self.data["models"].get(model_id)
            return json.loads(json.dumps(entry)) if entry is not None else None

    def set_step(self, model_id: str, step: int) -> None:
        with self._lock:
            self.data["models"][model_id]["step"] = step
            self._write()

    def set_state(self, model_id: str, state: dict) -> None:
        """The model's last saved state: {"path": tinker path, "dir": folder, "step": optimizer steps}."""
        with self._lock:
            self.data["models"][model_id]["state"] = state
            self._write()

    # --- named sampler weights and sampling sessions ------------------------------------------------------------
    def add_sampler(self, sampler_id: str, entry: dict) -> None:
        """entry: {"model_id" or "base_model", "key", "model_path" (a tinker path or None), "file" (or None)}."""
        with self._lock:
            self.data["samplers"][sampler_id] = entry
            self._write()

    def sampler(self, sampler_id: str) -> dict | None:
        with self._lock:
            return self.data["samplers"].get(sampler_id)
