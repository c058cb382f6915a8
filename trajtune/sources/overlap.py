"""Overlapped sampling: steps s+1 .. s+K drawn while step s trains, each exactly K updates behind.

`Overlapped(inner, process, K)` is a source whose `take(draw, ahead)` returns `draw`'s episodes --
drawn ahead during earlier steps, or now for the first -- and at once starts the draws of the steps
up to draw.step + K (`ahead`: the loop's schedule) in a background thread, in order. The episodes
run in `process`, a `SamplerProcess` holding its own copy of the weights (the inner `EpisodeSource`
must sample through it: checked on every draw), so the trainer's interpreter only trains while they
are sampled (the PipelineRL / prime-rl / verl-async / AReaL scheme, bounded staleness K):

    training thread:  take s | score + update s (-> theta_s+1) | after_update: hold theta_s+1 | take s+1 ...
    background:              | inner.take(s+K): sampled with theta_s, then the wrappers inside (rewards ...)
    sampler process:         | ... | episodes of s+K (theta_s) | load theta_s+1 | episodes of s+K+1 ...

Exact, whatever the threads' timing ("pace": no rollout starts more than K updates behind, nothing is
thrown away): step s's episodes are sampled with the weights after update max(0, s - K). The draw of
step s+K is started at step s's `take`, with the weights the trainer holds then; each update's sync is
held (`SamplerProcess.hold_syncs`) and sent by the background thread just before the rollouts of the
step K updates later (`send_held`). Every episode is stamped with the version that sampled it
(`Trajectory.versions`: the count of updates its weights had had) and `Episodes.behind` = step -
version; the loop corrects the lag with an importance correction against the sampler's log-probs
(`RLConfig.tis_cap` or another `RLConfig.correction`, which `sampling.check_sampling` requires). K = 1 is
the one-step overlap. vLLM's runner holds its syncs the same way (`trajtune.sources.vllm.runner`).
Everything inside `inner` (reward functions, reward models, an
experiment's measurements) runs in the background thread too, overlapped with the update.

At a checkpoint, the episodes drawn ahead (up to K steps') are waited for and saved (`pending`), and a
resumed run trains on them (`restore`), its sampler starting from the restored weights: it ends with
the weights and rows of an uninterrupted one, every episode still exactly K behind. An error while
drawing ahead is raised by the `take` of its step (or `pending`); the update it overlapped has
finished by then. `close()` stops the process and the thread however the run ends.

The sampling section (`trajtune.sources.sampling.SamplingConfig`: max_staleness, sampler_process) asks for
this, and `overlapped` builds the source it describes: `sampler_process` alone (K = 0) runs the episodes in the
process on-policy, the one-process run bit for bit (with the trainer's thread count), a check of the machinery.
"""

from __future__ import annotations

import collections
import dataclasses
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from ..trajectory import Outcome, Owner
from .base import Draw, Episodes, Schedule, Source, Wrapper
from .process import SamplerProcess
from .sampler import Sampler
from .sampling import SamplingConfig
from .partial import PartialSampler, partial_versions
from .staleness import discard_stale, staleness_metrics


def overlapped(engine, overlap: SamplingConfig, build: Callable[[Any], Source], sampler: Sampler,
               runner: Any = None) -> Source:
    """The source the sampling section `overlap` describes: `build(policy)` with `policy` = `sampler` (on-policy, in
    the trainer: e.g.
    `Decoder(engine.sample, settings)`), or a `SamplerProcess` on `engine` drawing with `sampler`'s settings
    (`sampler_process`), wrapped in `Overlapped` for max_staleness K >= 1.

        source = overlapped(engine, config.sampling,
                            lambda policy: Scored(EpisodeSource(policy, make_env, renderer), rewards), sampler)

    `runner`: a sampler that holds its own weights instead of the sampler process (`trajtune.sources.vllm.VLLMRunner`):
    every draw goes through it, synced after every update, and for max_staleness K it is what `Overlapped` overlaps.
    stale partial: `build` gets a `PartialSampler` over the process (or runner) instead."""
    if runner is None and not overlap.in_process:
        return build(sampler)
    if runner is None:
        runner = SamplerProcess(engine, sampler.settings, overlap.sampler_threads,
                                overlap.tolerance(engine.autocast or "fp32"), overlap.sampler_timeout)
    partial = PartialSampler(runner, overlap.tokens_per_update) if overlap.stale == "partial" else None
    try:  # partial: the episode loop here (the background thread), sampling through the process in cuts
        source = build(runner if partial is None else partial)
    except BaseException:
        runner.close()
        raise
    return Overlapped(source, runner, overlap.max_staleness, overlap.stale, overlap.tokens_per_update, partial) \
        if overlap.max_staleness else source


class Overlapped(Wrapper):
    """`inner`'s episodes, the steps up to K ahead drawn while the current one trains, each exactly K updates
    behind (module docstring). `process`: the `SamplerProcess` (or `VLLMRunner`) the inner `EpisodeSource`
    samples through: it holds each update's sync until the rollouts it must precede (`hold_syncs`, `send_held`)."""

    def __init__(self, inner: Source, process: SamplerProcess | Any, max_staleness: int = 1, stale: str = "pace",
                 tokens_per_update: int = 0, partial: PartialSampler | None = None):
        super().__init__(inner)
        self.process, self.k, self.stale, self.tokens_per_update = process, max_staleness, stale, tokens_per_update
        self.partial = partial  # stale partial: the sampler the inner source's episode loop calls
        if (stale == "partial") != (partial is not None):
            raise ValueError("Overlapped: stale partial samples through a PartialSampler (and only it): build the "
                             "source with trajtune.sources.overlap.overlapped")
        if max_staleness < 1:
            raise ValueError(f"Overlapped: max_staleness must be >= 1, got {max_staleness}")
        if stale != "pace" and tokens_per_update < 1:
            raise ValueError(f"Overlapped: stale {stale} needs tokens_per_update >= 1, got {tokens_per_update}")
        self._pool: ThreadPoolExecutor | None = None  # one background thread, started after the process
        self._flight: collections.deque[tuple[int, Future]] = collections.deque()  # step, its episodes' future
        self._ready: collections.deque[Episodes] = collections.deque()  # restored or finished, in step order
        self._last = -1  # the last step drawn, in flight or ready
        self._taken = -1  # the last step taken

    def take(self, draw: Draw, ahead: Schedule | None = None) -> Episodes:
        episodes = self._drawn_ahead(draw)
        if episodes is None:  # nothing drawn ahead (the first step): now, with the current weights
            if self.partial is not None:
                self.partial.begin(draw.step, draw.step)
            episodes = self._stamped(self.inner.take(draw), draw.step, draw.step)
            self._last = draw.step
        self._taken = draw.step
        self.process.keep_probe_rows(episodes.trajs)  # the rows the next sync is checked on (also after a resume)
        if ahead is not None:
            if self._pool is None:  # the process first (a fork of a trainer without this thread), then the thread
                self.process.hold_syncs(self._last + 1, draw.step)  # (a resumed run's start: due with the first)
                self.process.start()
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="trajtune-overlap")
            while self._last < draw.step + self.k and (later := ahead(self._last + 1)) is not None:
                self._last += 1  # sampled with the weights now: after draw.step updates
                self._flight.append((later.step, self._pool.submit(self._draw, later, draw.step)))
        kept = [t for t in episodes.trajs if t.outcome is not Outcome.STALE]
        episodes.metrics.update(staleness_metrics(episodes.trajs, kept, draw.step, self.k))
        return episodes

    def after_update(self, engine) -> dict[str, float]:
        """The sampler holds the new weights until the next step drawn (`_last + 1`, K updates later) is about to
        send its rollouts, whatever the background thread's timing."""
        self.process.hold_syncs(self._last + 1, self._taken)
        out = self.inner.after_update(engine)
        if self.partial is not None:  # (the inner source samples through the partial sampler, not the process)
            out = {**out, **self.process.after_update(engine)}
        return out

    def _draw(self, draw: Draw, version: int) -> Episodes:
        """In the background thread: the held syncs this draw must see, then its episodes (with the weights after
        update `version`)."""
        self.process.send_held(draw.step)
        if self.partial is not None:  # (one update at most: see trajtune.sources.partial)
            self.partial.begin(version, min(version + 1, draw.step))
        sent = self.process.rollouts_sent
        episodes = self.inner.take(dataclasses.replace(draw, version=version))
        if self.process.rollouts_sent == sent and any(t.count(Owner.POLICY) for t in episodes.trajs):
            raise ValueError("Overlapped: the inner source sampled its episodes without the sampler process, from the "
                             "trainer's live weights while they trained; build it with the process as its policy: "
                             "EpisodeSource(process, ...) (or use trajtune.sources.overlap.overlapped)")
        if self.stale == "partial":  # each token the version of its decode step (`partial.partial_versions`)
            partial_versions(episodes.trajs, version, min(version + 1, draw.step), self.tokens_per_update)
            episodes.behind = draw.step - version
            return episodes
        episodes = self._stamped(episodes, draw.step, version)
        if self.stale == "discard":
            discard_stale(episodes.trajs, episodes.behind, self.tokens_per_update)
        return episodes

    @staticmethod
    def _stamped(episodes: Episodes, step: int, version: int) -> Episodes:
        """`episodes` of step `step`, sampled with the weights after update `version`: every POLICY token stamped
        with it (`Trajectory.versions`), `behind` = step - version."""
        for t in episodes.trajs:
            t.stamp(version)
        episodes.behind = step - version
        return episodes

    def _drawn_ahead(self, draw: Draw) -> Episodes | None:
        """The episodes drawn ahead for `draw` (restored from a checkpoint, or in flight), or None."""
        if self._ready:
            episodes = self._ready.popleft()
        elif self._flight:
            episodes = self._flight.popleft()[1].result()
        else:
            return None
        if episodes.step != draw.step:
            raise ValueError(f"Overlapped: asked for step {draw.step}'s episodes, but step {episodes.step}'s were "
                             "drawn ahead (a loop asks for the steps in order and passes its schedule as `ahead`)")
        if draw.generator is not None and episodes.generator is not None:
            draw.generator.set_state(episodes.generator.get_state())
            episodes.generator = draw.generator
        return episodes

    def pending(self) -> list[Episodes]:
        """Every draw in flight waited for; what is drawn ahead, in step order."""
        while self._flight:
            self._ready.append(self._flight.popleft()[1].result())
        return list(self._ready)

    def restore(self, episodes: list[Episodes]) -> None:
        self._ready = collections.deque(episodes)
        if episodes:
            self._last = episodes[-1].step

    def close(self) -> None:
        try:
            self.inner.close()  # the process first: a draw in flight fails at once
        finally:
            self.process.close()
            if self._pool is not None:
                self._pool.shutdown(wait=True)
