"""The episode loop here, each turn's samples from vLLM, the weights synced after every update: `VLLMRunner`, and
`vllm_runner`, which builds it from a run's sampling section.

`VLLMRunner(engine, sampler, sync)` is an `EpisodeRunner` (`trajtune.sources.episodes`): its three jobs are split
between the `sampler` (a `VLLMSampler`: tokens from vLLM), the `sync` (a `WeightSync`: weights to vLLM, checked)
and itself (the order of rollouts and syncs, so episodes drawn ahead are sampled exactly one update behind).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Sequence

import torch

from ...engine import Engine
from ...envs.base import Env
from ...text.render import RendererProtocol
from ...trajectory import Owner, Trajectory
from ..episodes import Limits, run_episodes
from ..sampling import SamplingConfig
from ..sync import RolloutsSent
from .clients import Colocated, Servers, VLLMEngine
from .sampler import VLLMSampler
from .weights import AdapterSampler, WeightSync, lora_rank


class VLLMRunner(RolloutsSent):
    """An `EpisodeRunner` sampling with `sampler` (module docstring): `rollout` runs the episode loop here;
    `after_update(engine)` has `sync` send the trainer's new weights and check them.

    With an `Overlapped` source around it (max_staleness 1) a rollout runs in a background thread while the
    trainer updates; rollouts and syncs take turns under one lock, the sync after the rollout in flight, so
    episodes drawn ahead are sampled exactly one update behind (`rollouts_sent`, `wait_rollout_sent`: the
    interface `Overlapped` uses, as `SamplerProcess`'s). The first rollout syncs first (a resumed run's weights,
    a server that holds another run's), so no episode samples from weights it never had."""

    PROBE_ROWS = 4

    def __init__(self, engine: Engine, sampler: AdapterSampler, sync: WeightSync):
        self.engine, self.sampler, self.sync = engine, sampler, sync
        self._lock = threading.Lock()  # a rollout or a sync at a time, in the order they took it
        self._cv = threading.Condition()
        self._rollouts_sent = 0
        self._probe_rows: list[Trajectory] = []
        self._started = False  # the first rollout's sync done

    def rollout(self, envs: Sequence[Env], tasks: Sequence[Any], renderer: RendererProtocol,
                generator: torch.Generator | None, limits: Limits, groups: Sequence[int] | None = None,
                row_seeds: Sequence[int] | None = None) -> list[Trajectory]:
        """`episodes.run_episodes` with vLLM as the sampler, after the first sync (class docstring)."""
        if not self._started:
            from ...engine.distributed import barrier

            with self._lock:
                self.sync.sync(self.engine, self._probe_rows)
            barrier()
            self._started = True
        with self._lock:
            with self._cv:
                self._rollouts_sent += 1
                self._cv.notify_all()
            trajs = run_episodes(self.sampler, envs, tasks, renderer, generator, limits, groups, row_seeds)
        self.keep_probe_rows(trajs)
        return trajs

    def keep_probe_rows(self, trajs: Sequence[Trajectory]) -> None:
        """The next syncs are checked on the first rows of `trajs` with POLICY tokens."""
        rows = [t for t in trajs if t.count(Owner.POLICY)][: self.PROBE_ROWS]
        if rows:
            self._probe_rows = rows

    def after_update(self, engine: Engine) -> dict[str, float]:
        """Send the trainer's new weights to vLLM and check them (`WeightSync`) -> sync/logprob_diff (max),
        sync/logprob_diff_mean, time/sync_s. Rank 0 sends; every rank waits for it."""
        from ...engine.distributed import barrier

        t0 = time.perf_counter()
        with self._lock:
            out = self.sync.sync(engine, self._probe_rows)
        barrier()
        return {**out, "time/sync_s": time.perf_counter() - t0}

    def start(self) -> None:
        """vLLM is running already (nothing to start)."""

    def close(self) -> None:
        try:
            self.sampler.close()
        finally:
            self.sync.close()


def vllm_runner(engine: Engine, policy_dir: str | os.PathLike, sampling: SamplingConfig, *, precision: str = "fp32",
                max_model_len: int = 2048, seed: int = 0) -> VLLMRunner:
    """The runner the sampling section asks for (backend vllm; `sources.sampling.check_sampling` passed): servers
    when `sampling.vllm_server` lists some (they must serve the model the trainer starts from: the first sync sends
    the trainer's weights anyway), else a colocated engine loaded from `policy_dir` (the model the trainer starts
    from), its weights then set to the trainer's (a resumed run's: the first sync happens before any sample).
    `max_model_len`: the run's length budget, within the model's context (`experiments.hf.prepare.budget`; vLLM
    refuses a longer one)."""
    dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[precision]
    client: VLLMEngine
    if sampling.vllm_server:
        client = Servers(sampling.vllm_server, sampling.sampler_timeout)
    else:
        with engine.policy_weights() as policy:
            rank = lora_rank(policy)
        client = Colocated(policy_dir, dtype=dtype, max_model_len=max_model_len,
                           gpu_memory_utilization=sampling.vllm_gpu_memory_utilization, seed=seed, lora_rank=rank)
    sampler = VLLMSampler(client, sampling.settings())
    return VLLMRunner(engine, sampler, WeightSync(sampler, sampling.tolerance(precision), sampling.vllm_weights_dir))
