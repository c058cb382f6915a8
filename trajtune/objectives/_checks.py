"""Shape checks shared by the objective functions (private: not part of the API)."""

from __future__ import annotations

import torch


def expect_dim(name: str, t: torch.Tensor, dim: int) -> None:
    """Fail with a readable message unless `t` has exactly `dim` axes."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"{name}: expected {dim} axes, got shape {tuple(t.shape)}")


def expect_like(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """Fail unless `t` has the same shape as `ref`."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
    if t.shape != ref.shape:
        raise ValueError(f"{name} {tuple(t.shape)} must match {ref_name} {tuple(ref.shape)}")


def expect_rows(name: str, t: torch.Tensor, batch: int) -> None:
    """Fail unless `t` is [B] with B == batch."""
    expect_dim(name, t, 1)
    if t.shape[0] != batch:
        raise ValueError(f"{name}: expected [{batch}], got {tuple(t.shape)}")


def per_token(name: str, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-sequence [B] tensor to [B, T-1], or check a [B, T-1] one."""
    if values.dim() == 1:
        expect_rows(name, values, mask.shape[0])
        return values[:, None].expand_as(mask)
    expect_like(name, values, "mask", mask)
    return values

