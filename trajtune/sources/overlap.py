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
weight against the sampler's log-probs (`RLConfig.tis_cap`, which `sampling.check_sampling` requires).
Everything inside `inner` (reward functions, reward models, an experiment's measurements) runs in
the background thread too, overlapped with the update.

At a checkpoint, the episodes drawn ahead are waited for and saved (`pending`), and a resumed run
trains on them (`restore`): it ends with the weights and rows of an uninterrupted one. An error
while drawing ahead is raised by the next `take` (or `pending`); the update it overlapped has
finished by then. `close()` stops the process and the thread however the run ends.

The sampling section (`trajtune.sources.sampling.SamplingConfig`: max_staleness, sampler_process) asks for
this, and `overlapped` builds the source it describes: `sampler_process` alone runs the episodes in the
process on-policy, the one-process run bit for bit (with the trainer's thread count), a check of the machinery.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from ..trajectory import Owner
from .base import Draw, Episodes, Source, Wrapper
from .process import SamplerProcess
from .sampler import Sampler
from .sampling import SamplingConfig


def overlapped(engine, overlap: SamplingConfig, build: Callable[[Any], Source], sampler: Sampler,
               runner: Any = None) -> Source:
    """The source the sampling section `overlap` describes: `build(policy)` with `policy` = `sampler` (on-policy, in
    the trainer: e.g.
    `Decoder(engine.sample, settings)`), or a `SamplerProcess` on `engine` drawing with `sampler`'s settings
    (`sampler_process`), wrapped in `Overlapped` for max_staleness 1.

        source = overlapped(engine, config.sampling,
                            lambda policy: Scored(EpisodeSource(policy, make_env, renderer), rewards), sampler)

    `runner`: a sampler that holds its own weights instead of the sampler process (`trajtune.sources.vllm.VLLMRunner`):
    every draw goes through it, synced after every update, and for max_staleness 1 it is what `Overlapped` overlaps."""
    if runner is None and not overlap.in_process:
        return build(sampler)
    if runner is None:
        runner = SamplerProcess(engine, sampler.settings, overlap.sampler_threads,
                                overlap.tolerance(engine.autocast or "fp32"), overlap.sampler_timeout)
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
            raise ValueError(f"Overlapped: asked for step {draw.step}'s episodes, but step {episodes.step}'s were "
                             "drawn "
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
