"""Direct alignment variants of issue 31 (book ch.8.2): length-normalised DPO, ODPO's offset, REBEL, by hand."""

import math

import pytest
import torch

from trajtune.algorithms.dpo import DPOConfig, preference_loss_fn, with_ref_sums
from trajtune.engine import ForwardOutput
from trajtune.objectives.preference import dpo_loss, odpo_offset, rebel_loss
from trajtune.trajectory import Owner, Trajectory, pair_batch


def t(x):
    return torch.tensor(x, dtype=torch.float64)


def test_odpo_offset_and_loss():
    # Delta = alpha log(s_c - s_r): scores 5 vs 2 -> log 3; a pair scored the other way gets 0
    off = odpo_offset(t([5.0, 1.0]), t([2.0, 3.0]), alpha=0.5)
    assert off.tolist() == pytest.approx([0.5 * math.log(3), 0.0])
    assert odpo_offset(t([5.0]), t([2.0]), 2.0, "identity").tolist() == [6.0]
    # h = 4 at beta 0.5: -log sigma(2 - 1) = log(1 + e^-1)
    loss, _ = dpo_loss(t([4.0]), t([0.0]), t([0.0]), t([0.0]), 0.5, offset=t([1.0]))
    assert loss.item() == pytest.approx(math.log1p(math.exp(-1.0)))
    loss = dpo_loss(t([4.0]), t([0.0]), t([0.0]), t([0.0]), 0.5, offset=t([0.0]))[0]
    assert loss.item() == pytest.approx(0.1269, abs=1e-4)
    with pytest.raises(ValueError, match="needs loss_type 'sigmoid'"):
        dpo_loss(t([1.0]), t([0.0]), t([0.0]), t([0.0]), 0.5, loss_type="ipo", offset=t([1.0]))


def test_rebel_by_hand():
    # h = (-1 - -2) - (-3 - -2) = 1 - (-1) = 2; eta 0.5 -> margin 4; target 3 -> (4 - 3)^2 = 1
    loss, m = rebel_loss(t([-1.0]), t([-3.0]), t([-2.0]), t([-2.0]), t([3.0]), eta=0.5)
    assert loss.item() == pytest.approx(1.0) and m["rebel/margin"].item() == pytest.approx(4.0)
    assert m["rebel/accuracy"].item() == 1.0
    with pytest.raises(ValueError, match="eta must be > 0"):
        rebel_loss(t([0.0]), t([0.0]), t([0.0]), t([0.0]), t([0.0]), eta=0)


def pair(chosen_len, rejected_len):
    def ep(n):
        e = Trajectory()
        e.append([1, 2], Owner.PROMPT, 0)
        e.append([3] * n, Owner.POLICY, 0)
        return e
    return ep(chosen_len), ep(rejected_len)


def test_dpo_norm_uses_average_log_probs():
    batch = pair_batch([pair(2, 4)], 0)  # chosen 2 POLICY tokens, rejected 4
    mask = batch.action_mask
    logprobs = torch.full(mask.shape, -1.0)  # policy: -1 per token -> sums -2 / -4, averages -1 / -1
    batch = with_ref_sums(batch, torch.tensor([-4.0, -4.0]))  # reference averages -2 / -1
    out = ForwardOutput(logprobs=logprobs)
    norm, m = preference_loss_fn(DPOConfig(loss="dpo_norm", beta=2.0)).fn(out, batch)
    # averages: h = (-1 - -2) - (-1 - -1) = 1 -> -log sigma(2)
    assert norm.item() == pytest.approx(math.log1p(math.exp(-2.0)), rel=1e-5)
    summed, _ = preference_loss_fn(DPOConfig(loss="dpo", beta=2.0)).fn(out, batch)
    # sums: h = (-2 - -4) - (-4 - -4) = 2 -> -log sigma(4)
    assert summed.item() == pytest.approx(math.log1p(math.exp(-4.0)), rel=1e-5)
