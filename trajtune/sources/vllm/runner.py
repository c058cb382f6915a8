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
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ...config import ConfigError, check_ranges
from ...engine import Engine
from ...envs.base import Env
from ...text.render import RendererProtocol
from ...trajectory import Owner, Trajectory
from ..episodes import Limits, run_episodes
from ..sampler import SamplerSettings
from ..sync import RolloutsSent
from .clients import Colocated, Servers, VLLMEngine
from .sampler import VLLMSampler
from .weights import AdapterSampler, WeightSync, lora_rank


@dataclass
class VLLMConfig:
    """Where vLLM runs when a run samples with it (--backend vllm)."""

    vllm_server: list[str] = field(default_factory=list)
    """URLs of `trajtune vllm-serve` servers (e.g. http://127.0.0.1:8000); several share each step's prompts
    (data-parallel inference). Empty: a vLLM engine colocated with the trainer (started by the run)"""
    vllm_gpu_memory_utilization: float = 0.3
    """colocated: the share of the device's memory vLLM may take (weights + KV cache), the rest is the trainer's"""
    vllm_sync_tolerance: float = 0.0
    """after every weight sync vLLM's and the trainer's log-probs of the same tokens must agree to this (max abs
    difference, nats), or the run stops; 0: 1e-3 in float32, 5e-2 in bf16 / fp16 (their rounding)"""
    vllm_timeout: float = 600.0
    """longest wait for vLLM to answer one call (a step's samples, a weight load) before the run stops"""
    vllm_weights_dir: str = ""
    """where the trainer writes the weights each sync loads (servers on other machines: a shared file system);
    empty: a temporary directory (in /dev/shm where there is one)"""

    def __post_init__(self) -> None:
        check_ranges(self, "vllm", label=lambda n: "--" + n.replace("_", "-"), non_negative=(
            "vllm_sync_tolerance", "vllm_timeout"))
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(f"vllm: --vllm-gpu-memory-utilization must be in (0, 1], got "
                             f"{self.vllm_gpu_memory_utilization}")
        for url in self.vllm_server:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"vllm: --vllm-server {url!r} is not a URL; give http://HOST:PORT of a "
                                 "`trajtune vllm-serve`")

    def tolerance(self, precision: str) -> float:
        """The sync check's tolerance: `vllm_sync_tolerance`, or the default of `precision`."""
        return self.vllm_sync_tolerance or (1e-3 if precision == "fp32" else 5e-2)


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


def vllm_runner(engine: Engine, policy_dir: str | os.PathLike, config: VLLMConfig, settings: SamplerSettings, *,
                precision: str = "fp32", max_model_len: int = 2048, seed: int = 0) -> VLLMRunner:
    """The runner a run's options ask for, sampling with `settings`: servers when `config.vllm_server` lists some
    (they must serve the model the trainer starts from: the first sync sends the trainer's weights anyway), else a
    colocated engine loaded from `policy_dir` (the model the trainer starts from), its weights then set to the
    trainer's (a resumed run's: the first sync happens before any sample). `max_model_len`: the run's length
    budget, within the model's context (`experiments.hf.prepare.budget`; vLLM refuses a longer one)."""
    if engine.shard is not None and not config.vllm_server:
        raise ConfigError("--backend vllm under torchrun needs --vllm-server URL (a `trajtune vllm-serve` the ranks "
                          "share); a colocated vLLM engine per rank is not supported")
    dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[precision]
    client: VLLMEngine
    if config.vllm_server:
        client = Servers(config.vllm_server, config.vllm_timeout)
    else:
        with engine.policy_weights() as policy:
            rank = lora_rank(policy)
        client = Colocated(policy_dir, dtype=dtype, max_model_len=max_model_len,
                           gpu_memory_utilization=config.vllm_gpu_memory_utilization, seed=seed, lora_rank=rank)
    sampler = VLLMSampler(client, settings)
    return VLLMRunner(engine, sampler, WeightSync(sampler, config.tolerance(precision), config.vllm_weights_dir))
