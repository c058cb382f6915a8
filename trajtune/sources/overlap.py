"""Overlapped sampling: step s+1's episodes drawn while step s trains, one update behind.

`Overlapped(inner, process)` is a source whose `take(draw, ahead)` returns `draw`'s episodes --
drawn ahead during the previous step, or now for the first -- and at once starts `inner.take(ahead)`
in a background thread. The episodes run in `process`, a `SamplerProcess` holding its own copy of
the weights (the inner `EpisodeSource` must sample through it: checked on every draw), so the
trainer's interpreter only trains while they are sampled (the PipelineRL / prime-rl / verl-async
scheme, `max_staleness = 1`):

    training thread:  take s | score + update s (-> theta_s+1) | after_update: sync theta_s+1 | take s+1 ...
    background:              | inner.take(s+1): sampled with theta_s, then the wrappers inside (rewards ...)
    sampler process:         | episodes of s+1 (theta_s)                  | load theta_s+1 | episodes of s+2 ...

The loop stays a straight loop: the machinery is here. Episodes drawn ahead are `behind` = 1 (their
policy lagged the trained one by an update): the loop corrects that with the truncated importance
weight against the sampler's log-probs (`RLConfig.tis_cap`, which `check_overlap` requires).
Everything inside `inner` (reward functions, reward models, an experiment's measurements) runs in
the background thread too, overlapped with the update.

At a checkpoint, the episodes drawn ahead are waited for and saved (`pending`), and a resumed run
trains on them (`restore`): it ends with the weights and rows of an uninterrupted one. An error
while drawing ahead is raised by the next `take` (or `pending`); the update it overlapped has
finished by then. `close()` stops the process and the thread however the run ends.

`OverlapConfig` is the section of an experiment's config that asks for this (`overlapped` builds
the source it describes): `sampler_process` alone runs the episodes in the process on-policy, the
one-process run bit for bit (with the trainer's thread count), a check of the machinery.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from ..config import check_ranges
from ..trajectory import Owner
from .base import Draw, Episodes, Source, Wrapper
from .process import SamplerProcess
from .sampler import Sampler


@dataclass
class OverlapConfig:
    """Where an RL run's episodes are sampled, and how far behind the trained policy."""

    max_staleness: int = 0
    """how many updates the sampling policy may lag: 0 samples step s with the policy step s updates (on-policy);
    1 samples step s+1 while step s trains, in a sampler process holding its own copy of the weights, one update
    behind (needs the loop's tis_cap > 0: the truncated importance weight against the sampler's log-probs)"""
    sampler_process: bool = False
    """run the episodes in a separate process with its own copy of the weights, synced and checked after every
    update (implied by max_staleness 1; with 0 a run equals the one-process run: bit for bit when sampler_threads
    is the trainer's torch thread count, else up to float rounding)"""
    sampler_threads: int = 1
    """torch threads of the sampler process (1: the sampler on one core, the trainer on the others)"""
    sampler_timeout: float = 600.0
    """longest wait for the sampler process to answer (one step's episodes, a weight sync) before the run stops
    with an error (0: no limit); a sampler process that dies stops the run at once, naming the cause"""
    sync_tolerance: float = 1e-3
    """after every weight sync the sampler's and the trainer's log-probs of the same tokens (a few rows of the
    last episodes) must agree to this (max abs difference, nats; logged as sync/logprob_diff), and the sampler's
    weights must equal the trainer's, or the run stops"""

    def __post_init__(self) -> None:
        if self.max_staleness not in (0, 1):
            raise ValueError(f"overlap: max_staleness must be 0 (on-policy) or 1 (sample the next step while this "
                             f"one trains), got {self.max_staleness}")
        check_ranges(self, "overlap", counts=("sampler_threads",), non_negative=("sampler_timeout",),
                     positive=("sync_tolerance",))

    @property
    def in_process(self) -> bool:
        """Whether the episodes run in a sampler process."""
        return bool(self.sampler_process or self.max_staleness)


def check_overlap(overlap: OverlapConfig, rl: Any, where: str = "") -> None:
    """An experiment config's cross-check: max_staleness 1 needs the RL loop's truncated importance weight."""
    if overlap.max_staleness and not rl.tis_cap:
        raise ValueError(f"{where or 'overlap'}: max_staleness 1 samples with the policy one update behind; set "
                         "the RL loop's tis_cap (recipes: [config.rl] tis_cap; the command line: --tis-cap), e.g. "
                         "2.0, so the truncated importance weight against the sampler's log-probs corrects the lag")


def overlapped(engine, overlap: OverlapConfig, build: Callable[[Any], Source], sampler: Sampler,
               runner: Any = None) -> Source:
    """The source `overlap` describes: `build(policy)` with `policy` = `sampler` (on-policy, in the trainer: e.g.
    `Decoder(engine.sample, settings)`), or a `SamplerProcess` on `engine` drawing with `sampler`'s settings
    (`sampler_process`), wrapped in `Overlapped` for max_staleness 1.

        source = overlapped(engine, config.overlap,
                            lambda policy: Scored(EpisodeSource(policy, make_env, renderer), rewards), sampler)

    `runner`: a sampler that holds its own weights instead of the sampler process (`trajtune.sources.vllm.VLLMRunner`):
    every draw goes through it, synced after every update, and for max_staleness 1 it is what `Overlapped` overlaps."""
    if runner is None and not overlap.in_process:
        return build(sampler)
    if runner is None:
        runner = SamplerProcess(engine, sampler.settings, overlap.sampler_threads, overlap.sync_tolerance,
                                overlap.sampler_timeout)
    try:
        source = build(runner)
    except BaseException:
        runner.close()
        raise
    return Overlapped(source, runner) if overlap.max_staleness else source


class Overlapped(Wrapper):
    """`inner`'s episodes, each step's drawn while the previous one trained (module docstring). `process`: the
    `SamplerProcess` the inner `EpisodeSource` samples through."""

    def __init__(self, inner: Source, process: SamplerProcess | Any):
        super().__init__(inner)
        self.process = process
        self._pool: ThreadPoolExecutor | None = None  # one background thread, started after the process
        self._ahead: tuple[Draw, Future, int] | None = None  # the draw in flight, its future, rollouts sent before
        self._restored: Episodes | None = None

    def take(self, draw: Draw, ahead: Draw | None = None) -> Episodes:
        episodes = self._drawn_ahead(draw)
        if episodes is None:  # the first step: now, with the current weights
            episodes = self.inner.take(draw)
        self.process.keep_probe_rows(episodes.trajs)  # the rows the next sync is checked on (also after a resume)
        if ahead is not None:
            if self._pool is None:  # the process first (a fork of a trainer without this thread), then the thread
                self.process.start()
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="trajtune-overlap")
            sent = self.process.rollouts_sent  # read before the thread may send
            self._ahead = (ahead, self._pool.submit(self.inner.take, ahead), sent)
        return episodes

    def after_update(self, engine) -> dict[str, float]:
        """The new weights go to the process only after the draw in flight asked for its episodes: those are then
        sampled with the weights before the update (exactly one behind), whatever the background thread's timing."""
        if self._ahead is not None:
            _, future, sent = self._ahead
            self.process.wait_rollout_sent(sent, future)
        return self.inner.after_update(engine)

    def _drawn_ahead(self, draw: Draw) -> Episodes | None:
        """The episodes drawn ahead for `draw` (restored from a checkpoint, or in flight), or None."""
        if self._restored is not None:
            episodes, self._restored = self._restored, None
        elif self._ahead is not None:
            episodes = self._finish()
        else:
            return None
        if episodes.step != draw.step:
            raise ValueError(f"Overlapped: asked for step {draw.step}'s episodes, but step {episodes.step}'s were drawn "
                             "ahead (a loop asks for the steps in order and passes the next one as `ahead`)")
        if draw.generator is not None and episodes.generator is not None:
            draw.generator.set_state(episodes.generator.get_state())
            episodes.generator = draw.generator
        return episodes

    def _finish(self) -> Episodes:
        """Wait for the draw in flight -> its episodes, one update behind."""
        assert self._ahead is not None
        _, future, sent = self._ahead
        self._ahead = None
        episodes = future.result()
        if self.process.rollouts_sent == sent and any(t.count(Owner.POLICY) for t in episodes.trajs):
            raise ValueError("Overlapped: the inner source sampled its episodes without the sampler process, from the "
                             "trainer's live weights while they trained; build it with the process as its policy: "
                             "EpisodeSource(process, ...) (or use trajtune.sources.overlap.overlapped)")
        episodes.behind = 1
        return episodes

    def pending(self) -> Episodes | None:
        if self._ahead is not None:
            self._restored = self._finish()
        return self._restored

    def restore(self, episodes: Episodes) -> None:
        self._restored = episodes

    def close(self) -> None:
        try:
            self.inner.close()  # the process first: a draw in flight fails at once
        finally:
            self.process.close()
            if self._pool is not None:
                self._pool.shutdown(wait=True)
