"""Metrics: one flat JSON line per logged step, namespaced keys, each documented once.

Every run writes `metrics.jsonl` into its run directory. A line looks like

    {"step": 10, "time": 3.2, "stage": "sft", "train/loss": 1.93, "eval/pass_rate": 0.4}

Keys are `namespace/name`. `METRICS` below is the glossary: every key any loop
logs is documented here (a test checks it), so a reader of a metrics file
never has to guess what a number means. TensorBoard is optional
(`pip install trajtune[tensorboard]`) behind the same `log` call.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Iterable

from tqdm.auto import tqdm

METRICS: dict[str, str] = {
    # --- train: one optimizer step
    "train/loss": "loss minimised at this step (after aggregation)",
    "train/grad_norm": "global gradient norm before clipping",
    "train/lr": "learning rate used for this step",
    "train/tokens": "number of trained-on (POLICY) tokens in the step's batch",
    "train/entropy": "mean entropy (nats) of the policy at trained-on tokens",
    # --- eval: measured on held-out or train tasks without gradient
    "eval/accuracy": "exact-match accuracy of greedy answers",
    "eval/loss": "mean NLL per trained-on token on evaluation data",
    "eval/pass_rate": "share of evaluation episodes with reward 1",
    # --- rollout: statistics of sampled episodes
    "rollout/pass_rate": "share of sampled episodes with reward 1",
    "rollout/reward": "mean reward of sampled episodes",
    "rollout/tokens": "mean number of tokens per sampled episode",
    # --- time
    "time/step_s": "wall seconds of this step",
}


def is_documented(key: str) -> bool:
    """True for keys in `METRICS` (an entry ending in '/*' documents a whole family)."""
    if key in METRICS:
        return True
    ns = key.split("/", 1)[0]
    return f"{ns}/*" in METRICS


def register(key: str, doc: str) -> None:
    """Document a metric key from an extension (algorithms register theirs at import)."""
    if "/" not in key:
        raise ValueError(f"metric key {key!r} must be namespaced, like 'train/{key}'")
    METRICS.setdefault(key, doc)


class MetricsLogger:
    """Append-only `metrics.jsonl` writer; optionally mirrors scalars to TensorBoard."""

    def __init__(self, run_dir: str | os.PathLike, tensorboard: bool = False, strict: bool = False):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._fh = open(self.path, "a", encoding="utf-8")
        self._t0 = time.time()
        self.strict = strict
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:  # pragma: no cover - depends on the optional extra
                raise ImportError("TensorBoard logging needs `pip install trajtune[tensorboard]`") from e
            self._tb = SummaryWriter(str(self.run_dir / "tb"))

    def log(self, step: int, metrics: dict[str, float], stage: str | None = None) -> None:
        row: dict = {"step": int(step), "time": round(time.time() - self._t0, 3)}
        if stage is not None:
            row["stage"] = stage
        for k, v in metrics.items():
            if "/" not in k:
                raise ValueError(f"metric key {k!r} is not namespaced (e.g. 'train/{k}')")
            if self.strict and not is_documented(k):
                raise KeyError(f"metric key {k!r} is not documented in trajtune.metrics.METRICS")
            v = float(v)
            row[k] = v if math.isfinite(v) else str(v)
            if self._tb is not None:
                self._tb.add_scalar(k if stage is None else f"{stage}/{k}", v, step)
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """Rows of a `metrics.jsonl` file (a run directory or the file itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def progress(iterable: Iterable | None = None, total: int | None = None, desc: str = "", disable: bool | None = None):
    """A tqdm progress bar with ETA (hidden when stderr is not a terminal unless forced)."""
    return tqdm(iterable, total=total, desc=desc, disable=disable, dynamic_ncols=True, leave=False)
