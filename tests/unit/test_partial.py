"""Partial rollouts' clock (trajtune/sources/partial.py), by hand: which version samples each decode step, where a
turn's budget is cut, what the continuation's prompt is, and the versions stamped on the episodes."""

import pytest

from trajtune.engine.decoding import Samples
from trajtune.sources.partial import PartialSampler, partial_versions, version_at
from trajtune.sources.sampler import SamplerSettings
from trajtune.trajectory import Owner, Trajectory

P, A = int(Owner.PROMPT), int(Owner.POLICY)


def test_the_version_of_each_decode_step():
    # started at version 3, capped at 4, 2 decode steps per update: steps 1-2 -> 3, steps 3.. -> 4 (the cap)
    assert [version_at(d, 3, 4, 2) for d in range(1, 8)] == [3, 3, 4, 4, 4, 4, 4]
    assert [version_at(d, 0, 0, 1) for d in range(1, 4)] == [0, 0, 0]  # on-policy: never past the cap


class FakeProcess:
    """Answers each row with the next tokens of a script (stopping where the script ends), logging every call."""

    settings = SamplerSettings(max_new_tokens=5)

    def __init__(self, scripts):
        self.scripts, self.calls = scripts, []

    def send_version(self, version):
        self.calls.append(("version", version))

    def sample(self, prompts, stop_ids, seeds, *, max_new_tokens):
        self.calls.append(("sample", [list(p) for p in prompts], max_new_tokens))
        out = Samples([], [], [])
        for p in prompts:
            script = self.scripts[p[0]]
            done = len(p) - 1  # the prompt is one token (the row's name), then its tokens so far
            new = script[done: done + max_new_tokens]
            out.tokens.append(new)
            out.logprobs.append([-0.5] * len(new))
            out.stopped.append(done + len(new) == len(script))
        return out


def test_a_turn_is_cut_where_the_version_changes_and_continued_with_its_tokens_so_far():
    # row 0 answers 4 tokens, row 1 answers 2; budget 5; started at version 2, capped at 3, 3 decode steps per update,
    # the draw's clock already at 1 (an earlier turn): decode steps 2-3 -> version 2, steps 4.. -> version 3
    process = FakeProcess({0: [10, 11, 12, 13], 1: [20, 21]})
    sampler = PartialSampler(process, tokens_per_update=3)
    sampler.begin(2, 3)
    sampler.clock = 1
    got = sampler.sample([[0], [1]], [99], None)
    assert process.calls == [
        ("version", 2), ("sample", [[0], [1]], 2),  # 2 steps to the boundary: row 0 gets 10 11, row 1 stops (20 21)
        ("version", 3), ("sample", [[0, 10, 11]], 3),  # row 0 alone, its tokens so far appended; 3 = 5 - 2 left
    ]
    assert got.tokens == [[10, 11, 12, 13], [20, 21]] and got.stopped == [True, True]
    assert sampler.clock == 1 + 2 + 2  # 2 decode steps, then row 0's 2 more


def test_the_stamped_versions_follow_the_lockstep_clock_across_turns():
    def episode(actions):
        owners, turns = [], []
        for k, n in enumerate(actions):
            owners += [P] + [A] * n
            turns += [2 * k] + [2 * k + 1] * n
        return Trajectory(ids=list(range(len(owners))), owners=owners, turns=turns)

    trajs = [episode([2, 3]), episode([4])]
    # action 0 decodes in max(2, 4) = 4 steps (clock 1-4), action 1 (the first episode's) at clock 5-7;
    # start 5, cap 6, 3 steps per update: clock 1-3 -> 5, 4.. -> 6
    partial_versions(trajs, 5, 6, 3)
    assert [v for v, o in zip(trajs[0].versions, trajs[0].owners) if o == A] == [5, 5, 6, 6, 6]
    assert [v for v, o in zip(trajs[1].versions, trajs[1].owners) if o == A] == [5, 5, 5, 6]
    assert all(v == -1 for v, o in zip(trajs[0].versions, trajs[0].owners) if o != A)
    with pytest.raises(ValueError, match="tokens_per_update must be >= 1"):
        PartialSampler(FakeProcess({}), 0)
