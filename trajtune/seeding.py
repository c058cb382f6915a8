"""Derived seeds: every random stream of a run comes from its one `seed` through `derive`.

    derive(seed, k)              the k-th seed derived from `seed`: seed * 1_000_003 + k
                                 (step k of a loop, stage offset k of an experiment)
    generator(seed, k)           a torch.Generator seeded with derive(seed, k): step k's stream
    episode_seed(base, e)        the seed of episode e of a batch whose generator drew `base`

A loop seeds step s with `generator(config.seed, s)`, so a step's data is a pure function of
(seed, s) and a resumed run is the uninterrupted one. The stride is a prime larger than any
step count, so the streams of two seeds never share a step's seed in practice. Chapter 13 and
the HF pipeline derive their evaluation seeds with stride 7919 (`derive(seed, k, stride=7919)`),
as they always have: their reported numbers depend on it.
"""

from __future__ import annotations

import torch

STRIDE = 1_000_003


def derive(seed: int, k: int, stride: int = STRIDE) -> int:
    """The k-th seed derived from `seed`: seed * stride + k (a pure function)."""
    return seed * stride + k


def generator(seed: int, k: int) -> torch.Generator:
    """A fresh torch.Generator seeded with derive(seed, k): e.g. step k's sampling and batch order."""
    return torch.Generator().manual_seed(derive(seed, k))


def episode_seed(base: int, episode: int) -> int:
    """The seed of episode `episode` of a batch whose generator drew `base` (a pure function), so an episode's
    actions do not depend on the batch or the process it runs in."""
    return (derive(base, episode * 7_919 + 1)) % 2**63
