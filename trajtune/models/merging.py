"""Model merging (RLHF book ch.3 "Canonical Training Recipes" and appendix C "Practical issues": "model merging is a
key final-recipe tool", of checkpoints or of domain specialists, e.g. Branch-Train-Merge, Command A).

Merges checkpoints of one architecture, tensor by tensor (float32 arithmetic, the first model's dtype kept):

    linear           theta = sum_i w_i theta_i                      (weight interpolation, a "model soup"; weights
                                                                     default to equal and must sum to 1)
    task_arithmetic  theta = theta_base + sum_i l_i (theta_i - theta_base)   (task vectors, Ilharco et al.)
    slerp            two models, spherical interpolation at t per tensor (linear where they are parallel)

`merge_state_dicts` is the pure function; `merge_dirs` reads model directories (a trajtune checkpoint or a Hugging
Face `save_pretrained` directory: every *.safetensors file, shards included), checks that they have the same tensors
with the same shapes (naming the first that differs), and writes the merge with the first model's files (config,
tokenizer, shard layout) beside it. `trajtune merge` is its command line.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Literal, Mapping, Sequence, get_args

import torch

from safetensors.torch import save_file

from ..checkpoint import CheckpointError, atomic_dir, load_tensors

Method = Literal["linear", "task_arithmetic", "slerp"]
METHODS: tuple[str, ...] = get_args(Method)


def _check_same(states: Sequence[Mapping[str, torch.Tensor]], names: Sequence[str]) -> None:
    keys = set(states[0])
    for state, name in zip(states[1:], names[1:]):
        if set(state) != keys:
            extra, missing = sorted(set(state) - keys), sorted(keys - set(state))
            raise ValueError(f"merge: {name} does not have the tensors of {names[0]} (only in {name}: {extra[:3]}; "
                             f"missing: {missing[:3]}); merging needs one architecture")
        for k in keys:
            if state[k].shape != states[0][k].shape:
                raise ValueError(f"merge: tensor {k!r} is {tuple(state[k].shape)} in {name} but "
                                 f"{tuple(states[0][k].shape)} in {names[0]}")


def _slerp(a: torch.Tensor, b: torch.Tensor, t: float) -> torch.Tensor:
    """Spherical interpolation of two tensors viewed as vectors (linear when nearly parallel or one is zero)."""
    na, nb = a.norm(), b.norm()
    if na == 0 or nb == 0:
        return (1 - t) * a + t * b
    cos = torch.clamp((a.flatten() @ b.flatten()) / (na * nb), -1.0, 1.0)
    omega = math.acos(float(cos))
    if omega < 1e-4:
        return (1 - t) * a + t * b
    s = math.sin(omega)
    return (math.sin((1 - t) * omega) / s) * a + (math.sin(t * omega) / s) * b


def merge_state_dicts(states: Sequence[Mapping[str, torch.Tensor]], method: str = "linear",
                      weights: Sequence[float] | None = None, base: Mapping[str, torch.Tensor] | None = None,
                      t: float = 0.5, names: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
    """Merge state dicts of one architecture (module docstring). weights: linear's w_i (None: 1/n each; must sum
    to 1) or task_arithmetic's l_i (None: 1 each); base: task_arithmetic's theta_base; t: slerp's position (0: the
    first model, 1: the second). Non-float tensors must be equal in every model. -> {name: tensor}."""
    names = list(names or [f"model {i}" for i in range(len(states))])
    if method not in METHODS:
        raise ValueError(f"merge: method must be one of {METHODS}, got {method!r}")
    if not states:
        raise ValueError("merge: no models")
    if method == "task_arithmetic" and base is None:
        raise ValueError("merge: task_arithmetic needs the base model the others were fine-tuned from")
    if method == "slerp" and (len(states) != 2 or not 0 <= t <= 1):
        raise ValueError(f"merge: slerp takes exactly 2 models and t in [0, 1], got {len(states)} models, t={t}")
    if method == "linear" and len(states) < 2:
        raise ValueError("merge: linear interpolation needs at least 2 models")
    everything = list(states) + ([base] if base is not None else [])
    _check_same(everything, names + (["the base"] if base is not None else []))
    n = len(states)
    if weights is None:
        weights = [1.0 / n] * n if method == "linear" else [1.0] * n
    if len(weights) != n or not all(math.isfinite(w) for w in weights):
        raise ValueError(f"merge: {len(weights)} weights for {n} models (finite numbers, one per model)")
    if method == "linear" and not math.isclose(sum(weights), 1.0, abs_tol=1e-6):
        raise ValueError(f"merge: linear weights must sum to 1, got {list(weights)} (sum {sum(weights):g})")
    out: dict[str, torch.Tensor] = {}
    for k, first in states[0].items():
        if not first.is_floating_point():
            if any(not torch.equal(s[k], first) for s in everything[1:]):
                raise ValueError(f"merge: non-float tensor {k!r} differs between the models; cannot interpolate it")
            out[k] = first.clone()
            continue
        xs = [s[k].float() for s in states]
        if method == "linear":
            merged = sum((w * x for w, x in zip(weights, xs)), torch.zeros_like(xs[0]))
        elif method == "task_arithmetic":
            b = base[k].float()  # type: ignore[index]
            merged = b + sum((w * (x - b) for w, x in zip(weights, xs)), torch.zeros_like(b))
        else:
            merged = _slerp(xs[0], xs[1], t)
        out[k] = merged.to(first.dtype)
    return out


def _read_dir(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """All tensors of a model directory's *.safetensors files, and which file each came from."""
    if not path.is_dir():
        raise CheckpointError(f"merge: {path} is not a model directory")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"merge: {path} has no *.safetensors weights (a trajtune checkpoint or a Hugging Face "
                              "save_pretrained directory)")
    tensors: dict[str, torch.Tensor] = {}
    where: dict[str, str] = {}
    for f in files:
        for k, v in load_tensors(f).items():
            tensors[k], where[k] = v, f.name
    return tensors, where


def merge_dirs(models: Sequence[str | Path], out: str | Path, method: str = "linear",
               weights: Sequence[float] | None = None, base: str | Path | None = None, t: float = 0.5) -> Path:
    """Merge model directories into `out` (which must not exist): the first model's non-weight files are copied,
    its weight files rewritten with the merged tensors. Returns `out`."""
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"merge: {out} exists; give a new directory (nothing is overwritten)")
    paths = [Path(m) for m in models]
    read = [_read_dir(p) for p in paths]
    base_state = _read_dir(Path(base))[0] if base is not None else None
    merged = merge_state_dicts([r[0] for r in read], method, weights, base_state, t, [str(p) for p in paths])
    layout = read[0][1]
    with atomic_dir(out) as tmp:
        for f in paths[0].iterdir():
            if f.suffix != ".safetensors" and f.is_file():
                shutil.copy2(f, tmp / f.name)
            elif f.is_dir() and f.name not in ("resume", "checkpoints"):
                shutil.copytree(f, tmp / f.name)
        for name in sorted(set(layout.values())):
            part = {k: v.contiguous() for k, v in merged.items() if layout[k] == name}
            save_file(part, str(tmp / name), metadata={"format": "pt"})  # transformers reads only 'pt'-tagged files
    return out
