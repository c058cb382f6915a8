"""Diagnostics of the agent experiment that need no training loop (REPRODUCE A1, A4, A6; A11's NLL).

Each takes an engine and trajectories and returns plain numbers. The losses are
the library's (`objectives`); gradients are read off the parameters after
`engine.forward_backward`, the same seam the loops use.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

import torch

from ...engine import Engine, Loss
from ...objectives.advantages import group_advantages
from ...objectives.inputs import PGInputs
from ...objectives.policy_gradient import policy_gradient_loss
from ...objectives.preference import dpo_loss
from ...objectives.sft import sft_loss
from ...text.render import owner_counts
from ...trajectory import Trajectory, collate

# the three gradients A4 compares: token-mean losses over POLICY tokens
PG_01 = Loss(lambda out, b: policy_gradient_loss(out.logprobs, b.action_mask, PGInputs(b.rewards)), "token")
PG_BASELINE = Loss(lambda out, b: policy_gradient_loss(out.logprobs, b.action_mask, b.pg), "token")
SFT = Loss(lambda out, b: sft_loss(out.logprobs, b.action_mask), "token")


def owners_and_init_loss(fresh: Engine, demos: Sequence[Trajectory], pad_id: int, vocab_size: int) -> dict:
    """A1: predicted tokens by owner, and the masked (POLICY) vs unmasked (all real tokens) NLL at init."""
    batch = collate(demos, pad_id)
    logp = fresh.forward(batch).logprobs  # [B, T-1]
    every_real = batch.attention_mask[:, 1:].float()  # [B, T-1]: every predicted, non-padding token
    counts = owner_counts(demos)
    return {"owners": counts, "total": sum(counts.values()),
            "masked_loss": float(sft_loss(logp, batch.action_mask)[0]),
            "unmasked_loss": float(sft_loss(logp, every_real)[0]), "log_vocab": math.log(vocab_size)}


def _flat_grad(engine: Engine, batch, loss: Loss) -> torch.Tensor:
    """Gradient of `loss` at the engine's parameters, flattened -> [n_params] (no optimizer step)."""
    params = list(engine.model.parameters())
    for p in params:
        p.grad = None
    engine.forward_backward(batch, loss)
    grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]).clone()
    for p in params:
        p.grad = None
    return grads


def gradient_identity(engine: Engine, sample: Sequence[Trajectory], pad_id: int) -> dict:
    """A4: grad(0/1 PG, token mean) = (kept action tokens / all action tokens) x grad(SFT on kept).

    Also the cosine between the group-mean-baseline PG gradient and the RFT gradient.
    """
    batch = collate(sample, pad_id)
    kept = [t for t in sample if t.reward >= 1.0]
    if not kept or len(kept) == len(sample):
        return {"kept": len(kept), "episodes": len(sample), "max_abs_diff": float("nan"),
                "max_abs_grad": float("nan"), "ratio": float("nan"), "cosine_baseline": float("nan")}
    kept_batch = collate(kept, pad_id)
    g_pg = _flat_grad(engine, batch, PG_01)
    g_rft = _flat_grad(engine, kept_batch, SFT)
    adv_B = group_advantages(batch.rewards, batch.groups)  # [B]: R - mean of its task's group
    g_base = _flat_grad(engine, replace(batch, pg=PGInputs(adv_B)), PG_BASELINE)
    ratio = float(kept_batch.action_mask.sum() / batch.action_mask.sum())
    return {"kept": len(kept), "episodes": len(sample), "ratio": ratio,
            "max_abs_diff": float((g_pg - ratio * g_rft).abs().max()), "max_abs_grad": float(g_pg.abs().max()),
            "cosine_baseline": float(torch.nn.functional.cosine_similarity(g_base, g_rft, dim=0))}


def dpo_values(beta: float = 0.5) -> dict:
    """A6: dpo_loss at margins 0, +4, -4 (beta 0.5) -> expected 0.6931 / 0.1269 / 2.1269."""
    zero = torch.zeros(1)
    out = {}
    for margin in (0.0, 4.0, -4.0):
        c, r = torch.tensor([margin / 2]), torch.tensor([-margin / 2])
        out[f"{margin:+.0f}"] = float(dpo_loss(c, r, zero, zero, beta)[0])
    return out


def nll(engine: Engine, trajs: Sequence[Trajectory], pad_id: int) -> float:
    """Mean NLL per POLICY token of `trajs` under the engine's policy (no gradient)."""
    batch = collate(trajs, pad_id)
    return float(sft_loss(engine.forward(batch).logprobs, batch.action_mask)[0])
