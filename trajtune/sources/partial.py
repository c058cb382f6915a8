"""Partial rollouts (`sampling.stale` partial): an episode in flight at a weight update continues under the new
weights, exactly -- `PartialSampler` and `partial_versions`.

The overlapped source draws step s while earlier steps train (`trajtune.sources.overlap`), from the weights after
update v = s - K. Its sampler decodes the draw's episodes in lockstep (one token of every running episode per decode
step, turn by turn: `trajtune.sources.staleness.decode_clock`), and `sampling.tokens_per_update` decode steps take
as long as one update: so decode step d of the draw (1-based, counted across its turns) samples with the weights
after update

    version(d) = min(v + (d - 1) // tokens_per_update, cap),   cap = min(v + 1, s)

One update at most -- the one that lands while the draw is in flight -- and never past s (step s trains on them).
The cap is what an exact resume allows: a checkpoint after step c waits for the draws in flight (steps c .. c+K-1,
started at c-K .. c-1) and saves them, and only the weights after update c exist then; a draw that went on to
later versions could not be finished, nor redrawn after a resume (the older weights are gone). With the cap every
draw in flight finishes with the weights there are, and a `kill -9` resumes exactly.

`PartialSampler` is the `Sampler` the episode loop calls, here in the trainer's background thread: it cuts each
call's budget at the decode steps where the version changes, has the sampler process load that version first
(`SamplerProcess.send_version`: the held weights of that update, waiting for the trainer to make them) and continues
the unfinished rows with the tokens so far as their prompt -- what vLLM does with an aborted request resubmitted
under new weights, prefix-cached. Every token's log-prob is the one of the weights that drew it, and
`partial_versions` stamps each token with that version, from the trajectories alone: the same clock. A run gives the
same numbers twice whatever the threads' timing.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..engine.decoding import Samples
from ..trajectory import Owner, Trajectory
from .sampler import SamplerSettings, Seeds
from .staleness import lockstep


def version_at(decode_step: int, start: int, cap: int, tokens_per_update: int) -> int:
    """The version that samples decode step `decode_step` (1-based) of a draw started at version `start`, capped at
    version `cap` (module docstring)."""
    return min(start + (decode_step - 1) // tokens_per_update, cap)


class PartialSampler:
    """A `Sampler` over the sampler process `process` whose calls switch to newer weights at the update boundaries of
    the draw in progress (module docstring). `begin(start, cap)` before each draw (the overlapped source: cap =
    min(start + 1, step))."""

    def __init__(self, process: Any, tokens_per_update: int):
        if tokens_per_update < 1:
            raise ValueError(f"PartialSampler: tokens_per_update must be >= 1, got {tokens_per_update}")
        self.process, self.tokens_per_update = process, tokens_per_update
        self.start = self.cap = 0
        self.clock = 0  # decode steps of the draw so far

    @property
    def settings(self) -> SamplerSettings:
        return self.process.settings

    def begin(self, start: int, cap: int) -> None:
        """A draw sampled from the weights after update `start`, up to those after `cap`: its clock starts at 0."""
        self.start, self.cap, self.clock = start, cap, 0

    def sample(self, prompts: Sequence[Sequence[int]], stop_ids: Sequence[int], seeds: Seeds) -> Samples:
        """One turn of every running episode: `settings.max_new_tokens` decode steps at most, cut where the version
        changes; each cut's unfinished rows continue with their tokens so far appended to the prompt."""
        budget, n = self.settings.max_new_tokens, len(prompts)
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        stopped = [False] * n
        many = seeds is not None and not isinstance(seeds, torch.Generator)
        done = 0
        while done < budget:
            live = [i for i in range(n) if not stopped[i]]
            if not live:
                break
            version = version_at(self.clock + done + 1, self.start, self.cap, self.tokens_per_update)
            steps = budget - done
            if version < self.cap:  # up to the next update's boundary
                steps = min(steps, (version - self.start + 1) * self.tokens_per_update - (self.clock + done))
            self.process.send_version(version)
            rows_seeds = [seeds[i] for i in live] if many else seeds  # type: ignore[index]
            part = self.process.sample([list(prompts[i]) + tokens[i] for i in live], stop_ids, rows_seeds,
                                       max_new_tokens=steps)
            for i, new, lps, stop in zip(live, part.tokens, part.logprobs, part.stopped, strict=True):
                tokens[i] += new
                logprobs[i] += lps
                stopped[i] = stop
            done += max(len(new) for new in part.tokens)
        self.clock += done
        return Samples(tokens, logprobs, stopped)


def partial_versions(trajs: Sequence[Trajectory], start: int, cap: int, tokens_per_update: int) -> None:
    """Stamp every POLICY token of one draw's episodes with the version that sampled it (`Trajectory.versions`;
    `version_at` of its decode step in the lockstep batch: the clock `PartialSampler` cut by)."""
    _, offsets = lockstep(trajs)
    for t in trajs:
        versions = [-1] * len(t.ids)
        turn_of: dict[int, int] = {}  # a POLICY turn -> its action index
        within: dict[int, int] = {}
        for i, (owner, turn) in enumerate(zip(t.owners, t.turns, strict=True)):
            if owner != Owner.POLICY:
                continue
            k = turn_of.setdefault(turn, len(turn_of))
            within[k] = within.get(k, 0) + 1
            versions[i] = version_at(offsets[k] + within[k], start, cap, tokens_per_update)
        t.versions = versions
