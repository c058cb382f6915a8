import pytest
import torch

from trajtune.trajectory import Owner, Trajectory, collate


def two_turn_episode():
    t = Trajectory(reward=1.0, group=3, info={"task": "t0"})
    t.append([1], Owner.TEMPLATE, 0)
    t.append([10, 11], Owner.PROMPT, 0)
    t.append([20, 21, 2], Owner.POLICY, 0, logprobs=[-0.1, -0.2, -0.3])
    t.append([30, 31], Owner.TOOL, 0)
    t.append([22, 2], Owner.POLICY, 1, logprobs=[-0.4, -0.5])
    return t


def test_append_tracks_owner_turn_and_logprobs():
    t = two_turn_episode()
    assert len(t) == 10 and t.n_turns == 2
    assert t.count(Owner.POLICY) == 5 and t.count(Owner.TOOL) == 2
    assert t.tokens_of(Owner.POLICY) == [20, 21, 2, 22, 2]
    assert t.logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5]
    assert t.turns == [0] * 8 + [1, 1]


def test_collate_pads_right_and_shifts_action_mask():
    long, short = two_turn_episode(), Trajectory()
    short.append([1, 10], Owner.PROMPT, 0)
    short.append([20], Owner.POLICY, 0)
    b = collate([long, short], pad_id=0)
    assert b.ids.shape == (2, 10) and b.action_mask.shape == (2, 9) and b.old_logprobs.shape == (2, 9)
    assert b.ids[1].tolist() == [1, 10, 20] + [0] * 7
    assert b.attention_mask[1].tolist() == [True] * 3 + [False] * 7
    # action_mask[t] is 1 where the predicted token ids[t+1] is a POLICY token
    assert b.action_mask[0].tolist() == [0, 0, 1, 1, 1, 0, 0, 1, 1]
    assert b.action_mask[1].tolist() == [0, 1] + [0] * 7  # padding is never trained on
    assert b.turns[1, 3:].tolist() == [-1] * 7
    assert b.old_logprobs[0, 2:5].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert b.rewards.tolist() == [1.0, 0.0] and b.groups.tolist() == [3, -1]
    assert b.infos[0]["task"] == "t0"


def test_multi_turn_owners_survive_collate_and_select():
    b = collate([two_turn_episode(), two_turn_episode()], pad_id=0)
    policy = b.owners == Owner.POLICY
    assert policy.sum().item() == 10
    assert (b.turns[policy] == torch.tensor([0, 0, 0, 1, 1] * 2)).all()
    sub = b.select([1])
    assert sub.ids.shape == (1, 10) and sub.infos == [b.infos[1]]


def test_collate_rejects_bad_input():
    with pytest.raises(ValueError, match="no trajectories"):
        collate([], 0)
    with pytest.raises(ValueError, match="max_len"):
        collate([two_turn_episode()], 0, max_len=5)
    with pytest.raises(ValueError, match="same length"):
        Trajectory(ids=[1, 2], owners=[0], turns=[0, 0])
