"""KL folded into the reward (issue 31's first defect): the book's RLOO subtracts the sequence KL from each
episode's reward before the baseline (ch.6.3, 6.15), for every group advantage -- not only GAE."""

import pytest
import torch

from trajtune.algorithms.rl import RLConfig, advantages_for
from trajtune.trajectory import Owner, Trajectory, collate


def batch_of(rewards, groups):
    trajs = []
    for r, g in zip(rewards, groups):
        t = Trajectory(reward=r, group=g)
        t.append([1, 2], Owner.PROMPT, 0)
        t.append([3, 4, 5], Owner.POLICY, 0)
        trajs.append(t)
    return collate(trajs, 0)


def test_sequence_kl_enters_every_group_advantage():
    batch = batch_of([1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1])
    mask = batch.action_mask  # [4, 4]: the three POLICY tokens of each row (shifted)
    per_token_kl = torch.tensor([5.0, 0.0, 2.0, 1.0])[:, None] / 3  # sequence KL 5, 0, 2, 1 nats
    ref = torch.zeros_like(mask, dtype=torch.float)
    old = per_token_kl.expand_as(ref) * mask
    # RLOO, G = 2: adv_i = r'_i - r'_other with r' = r - 0.1 * KL: group 0 [0.5, 0], group 1 [0.8, -0.1]
    rloo = RLConfig(advantage="rloo", kl_coef=0.1, kl_in_reward=True)
    adv, _ = advantages_for(batch, rloo, None, ref, old)
    assert adv.tolist() == pytest.approx([0.5, -0.5, 0.9, -0.9])
    plain, _ = advantages_for(batch, RLConfig(advantage="rloo"), None, ref, old)
    assert plain.tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0])
    # REINFORCE with the group mean: r' - mean(r') per group
    mean, _ = advantages_for(batch, RLConfig(advantage="reinforce", kl_coef=0.1, kl_in_reward=True), None, ref, old)
    assert mean.tolist() == pytest.approx([0.25, -0.25, 0.45, -0.45])
    # GRPO divides by the group's std (unbiased, + 1e-4): the KL changes the spread too
    grpo, _ = advantages_for(batch, RLConfig(advantage="grpo", kl_coef=0.1, kl_in_reward=True), None, ref, old)
    assert grpo[2].item() == pytest.approx(0.45 / (0.9 / 2 ** 0.5 + 1e-4), rel=1e-4)
    # kl_in_reward off: the KL stays in the loss, the advantages are the rewards'
    loss_side, _ = advantages_for(batch, RLConfig(advantage="rloo", kl_coef=0.1), None, ref, old)
    assert loss_side.tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0])
