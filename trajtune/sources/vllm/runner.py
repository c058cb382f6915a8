"""The episode loop here, each turn's samples from vLLM, the weights synced after every update: `VLLMRunner`, and
`vllm_runner`, which builds it from a run's sampling section.

`VLLMRunner(engine, sampler, sync)` is an `EpisodeRunner` (`trajtune.sources.episodes`): its three jobs are split
between the `sampler` (a `VLLMSampler`: tokens from vLLM), the `sync` (a `WeightSync`: weights to vLLM, checked)
and itself (the order of rollouts and syncs, so episodes drawn ahead are sampled exactly K updates behind: under
an `Overlapped` source each update's sync is prepared as the update ends -- the trainer's probe log-probs and a
CPU copy of its weights -- and held until the rollouts of the step K later are about to start, as the sampler
process's are; `trajtune.sources.overlap`).
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
from ..sync import HeldSyncs
from .clients import Colocated, Servers, VLLMEngine
from .sampler import VLLMSampler
from .weights import AdapterSampler, PreparedSync, WeightSync, lora_rank


class VLLMRunner(HeldSyncs):
    """An `EpisodeRunner` sampling with `sampler` (module docstring): `rollout` runs the episode loop here;
    `after_update(engine)` has `sync` send the trainer's new weights and check them.

    With an `Overlapped` source around it (max_staleness K) rollouts run in a background thread while the trainer
    updates; each update's sync is held (`hold_syncs`) and sent by that thread before the rollouts it must
    precede (`send_held`), so episodes drawn ahead are sampled exactly K updates behind (the interface
    `Overlapped` uses, as `SamplerProcess`'s); a held sync's check is reported in the row of the step whose
    episodes it preceded. The first rollout syncs first (a resumed run's weights, a server that holds another
    run's), so no episode samples from weights it never had."""

    PROBE_ROWS = 4

    def __init__(self, engine: Engine, sampler: AdapterSampler, sync: WeightSync):
        self.engine, self.sampler, self.sync = engine, sampler, sync
        self._lock = threading.Lock()  # a rollout or a sync at a time, in the order they took it
        self._cv = threading.Condition()
        self._rollouts_sent = 0
        self._probe_rows: list[Trajectory] = []
        self._started = False  # the first rollout's sync done
        self._init_holding()
        self._checked: list[tuple[int, dict[str, float]]] = []  # (due step, the sync's metrics), not reported

    def rollout(self, envs: Sequence[Env], tasks: Sequence[Any], renderer: RendererProtocol,
                generator: torch.Generator | None, limits: Limits, groups: Sequence[int] | None = None,
                row_seeds: Sequence[int] | None = None) -> list[Trajectory]:
        """`episodes.run_episodes` with vLLM as the sampler, after the first sync (class docstring)."""
        self.start()
        with self._lock:
            with self._cv:
                self._rollouts_sent += 1
                self._cv.notify_all()
            trajs = run_episodes(self.sampler, envs, tasks, renderer, generator, limits, groups, row_seeds)
        self.keep_probe_rows(trajs)
        return trajs

    @property
    def settings(self):
        return self.sampler.settings

    def sample(self, prompts: Sequence[Sequence[int]], stop_ids: Sequence[int], seeds: Any, *,
               max_new_tokens: int | None = None):
        """One call of vLLM's sampler after the first sync (a partial rollout's cut: `trajtune.sources.partial`,
        the episode loop in the caller's thread)."""
        self.start()
        with self._lock:
            with self._cv:
                self._rollouts_sent += 1
            return self.sampler.sample(prompts, stop_ids, seeds, max_new_tokens=max_new_tokens)

    def keep_probe_rows(self, trajs: Sequence[Trajectory]) -> None:
        """The next syncs are checked on the first rows of `trajs` with POLICY tokens."""
        rows = [t for t in trajs if t.count(Owner.POLICY)][: self.PROBE_ROWS]
        if rows:
            self._probe_rows = rows

    def after_update(self, engine: Engine) -> dict[str, float]:
        """Send the trainer's new weights to vLLM and check them (`WeightSync`) -> sync/logprob_diff (max),
        sync/logprob_diff_mean, time/sync_s. Rank 0 sends; every rank waits for it. Holding (`hold_syncs`): the
        sync is prepared now and sent later (`send_held`); the metrics are those of the syncs due by the last step
        taken (done: their rollouts came back)."""
        from ...engine.distributed import barrier

        t0 = time.perf_counter()
        if self.holding:
            prepared = self.sync.prepare(engine, self._probe_rows)
            if prepared is not None:
                self._hold(prepared)
            with self._cv:
                done = [m for due, m in self._checked if due <= self._taken]
                self._checked = [(due, m) for due, m in self._checked if due > self._taken]
            out = {k: max(m[k] for m in done if k in m) for k in {k for m in done for k in m}}
            return {**out, "time/sync_s": time.perf_counter() - t0}
        with self._lock:
            out = self.sync.sync(engine, self._probe_rows)
        barrier()
        return {**out, "time/sync_s": time.perf_counter() - t0}

    def _send_held(self, due: int, item: PreparedSync) -> None:
        with self._lock:
            out = self.sync.send(item)
        with self._cv:
            self._checked.append((due, out))

    def start(self) -> None:
        """The first sync (idempotent): vLLM gets the trainer's current weights -- a resumed run's, restored --
        checked on the probe rows there are (the restored episodes drawn ahead). An overlapped source calls it in
        the thread that trains before its first draw ahead; otherwise the first rollout does."""
        if self._started:
            return
        from ...engine.distributed import barrier

        with self._lock:
            self.sync.sync(self.engine, self._probe_rows)
        barrier()
        self._started = True

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
