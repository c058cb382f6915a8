"""GRPO process supervision (checklist 6.7b): step rewards -> per-token advantages, by hand."""

import pytest
import torch

from trajtune.objectives.advantages import process_advantages

# Three completions, two groups, action axis T-1 = 5.
#   group 0: A steps [2, 0] ending at tokens 1 and 3 (token 4 is padding); B one step [1] ending at token 2
#            step rewards {2, 0, 1}: mean 1, unbiased std 1 -> A [1, -1], B [0]
#   group 1: C steps [4, 2] ending at 1 and 4; D one step [0] ending at 4
#            step rewards {4, 2, 0}: mean 2, unbiased std 2 -> C [1, 0], D [-1]
STEP_REWARDS = torch.tensor([[2.0, 0.0], [1.0, 0.0], [4.0, 2.0], [0.0, 0.0]])
STEP_MASK = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 0]])
STEP_ENDS = torch.tensor([[1, 3], [2, 0], [1, 4], [4, 0]])
ACTION_MASK = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
GROUPS = torch.tensor([0, 0, 1, 1])


def test_process_advantages_by_hand():
    adv = process_advantages(STEP_REWARDS, STEP_MASK, STEP_ENDS, ACTION_MASK, GROUPS, eps=0.0)
    want = torch.tensor([
        [0.0, 0.0, -1.0, -1.0, 0.0],  # A: 1 + (-1) up to token 1, then -1; token 4 is off the mask
        [0.0, 0.0, 0.0, 0.0, 0.0],  # B: its one step is the group mean
        [1.0, 1.0, 0.0, 0.0, 0.0],  # C: 1 + 0 up to token 1, then 0
        [-1.0, -1.0, -1.0, -1.0, -1.0],  # D: -1 on every token
    ])
    assert torch.allclose(adv, want, atol=1e-6)
    assert adv.shape == ACTION_MASK.shape and not adv.requires_grad


def test_process_advantages_without_std_eps_and_equal_groups():
    adv = process_advantages(STEP_REWARDS, STEP_MASK, STEP_ENDS, ACTION_MASK, GROUPS, std_normalize=False)
    assert adv[2].tolist() == [2.0, 2.0, 0.0, 0.0, 0.0] and adv[3].tolist() == [-2.0] * 5  # C [2, 0], D [-2]
    with_eps = process_advantages(STEP_REWARDS, STEP_MASK, STEP_ENDS, ACTION_MASK, GROUPS)
    assert with_eps[3, 0].item() == pytest.approx(-2.0 / (2.0 + 1e-4))
    same = process_advantages(torch.ones(2, 2), torch.ones(2, 2), torch.tensor([[0, 1], [0, 1]]), torch.ones(2, 3))
    assert same.abs().sum().item() == 0.0  # all step rewards equal: no signal
    # a single step per completion is outcome supervision: GRPO's advantage on every token up to the end
    outcome = process_advantages(torch.tensor([[1.0], [0.0]]), torch.ones(2, 1), torch.tensor([[2], [2]]),
                                 torch.ones(2, 3), eps=0.0)
    s = 2 ** -0.5  # rewards {1, 0}: mean 0.5, unbiased std 1/sqrt 2 -> +-0.5 sqrt 2
    assert torch.allclose(outcome, torch.tensor([[s] * 3, [-s] * 3]), atol=1e-6)


def test_process_advantages_checks_shapes():
    with pytest.raises(ValueError, match="step_ends"):
        process_advantages(STEP_REWARDS, STEP_MASK, STEP_ENDS[:, :1], ACTION_MASK)
    with pytest.raises(ValueError, match="action_mask"):
        process_advantages(STEP_REWARDS, STEP_MASK, STEP_ENDS, ACTION_MASK[:2])
