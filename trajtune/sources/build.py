"""THE builder of an episode source from a run's sampling section (`episode_source`), and the one place a backend
name becomes a sampler (`make_sampler`; `trajtune chat` samples with it, without episodes).

    source = episode_source(config.sampling, engine, make_env, renderer, "grpo", max_turns=1, max_tokens=512,
                            score=lambda episodes: Scored(episodes, engine, ...))

What it assembles, in order: the section checked (`sampling.check_sampling`: every backend x overlap x sharding
rule, once); the sampler the backend names (`sampler.engine_sampler`: the built-in sampler or HF generate, here;
or vLLM, colocated or served, holding its own weights: `vllm.vllm_runner`); the episodes (`episodes.EpisodeSource`:
each episode from its own seed where the backend has per-episode seeds, sharded under torchrun); the experiment's
measurements (`Measured`) and graders (`score`) around them; and where they run (`overlap.overlapped`: here, in a
sampler process, or one update ahead); recorded as the loop takes them (`record.Recording`, sampling.record), or
all of it replaced by a recording (`record.Replayed`, sampling.replay). Close the source when done
(`with episode_source(...) as source:`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Literal

from ..envs.base import Env
from ..text.render import RendererProtocol
from ..trajectory import Trajectory
from .base import Source
from .episodes import EpisodeSource, Measured
from .faults import STEP_TIMEOUT_S
from .overlap import overlapped
from .record import RECORDING, Recording, Replayed, find_recording
from .sampler import Sampler, SamplerSettings, engine_sampler
from .sampling import SamplingConfig, check_sampling


def episode_source(sampling: SamplingConfig, engine: Any, make_env: Callable[[], Env], renderer: RendererProtocol,
                   where: str, *, max_turns: int = 6, max_tokens: int = 512, pad_id: int = 0,
                   score: Callable[[Source], Source] | None = None,
                   measure: Callable[[list[Trajectory]], dict[str, float]] | None = None, rl: Any = None,
                   model_dir: str | os.PathLike = "", precision: str = "fp32", seed: int = 0,
                   max_model_len: int | None = None, episode_seeds: bool | None = None, sharded: bool = True,
                   greedy: bool = False, name: Callable[[str], str] = lambda n: f"sampling.{n}",
                   step_timeout_s: float | None = STEP_TIMEOUT_S, stage_dir: str | os.PathLike | None = None,
                   agent: Any = None, tokenizer: Any = None, template_kwargs: dict | None = None) -> Source:
    """The episode source `sampling` describes (module docstring).

    engine:      the trainer's (an `Engine`): samples here, or sends its weights to the sampler that holds its own
    make_env, renderer: the environments and how their conversations become tokens
    where:       the run's name in error messages; `name(field)` spells a section field there (a flag, a key)
    max_turns, max_tokens: an episode's limits; `pad_id`: the built-in decoders' padding
    score:       wraps the episodes in the run's graders (e.g. `lambda episodes: Scored(episodes, engine, ...)`)
    measure:     an experiment's counts added to the metrics (`Measured`)
    rl:          the RL loop's config, when there is one (an overlapped run needs its tis_cap)
    model_dir, precision, seed, max_model_len: what a colocated vLLM engine starts from (backend vllm; its length
                 budget: default `max_tokens`)
    episode_seeds: every episode samples from its own seed (default: where the backend can, the built-in sampler
                 and vLLM; HF generate draws one seed per call); `sharded`: under torchrun each rank samples its
                 share of the episodes (`engine.shard`)
    greedy:      take the argmax instead of drawing (an evaluation's greedy pass; backend sampler or generate)
    agent, tokenizer, template_kwargs: an agent program instead of the episode loop (`endpoint.agents.AgentConfig`
                 with its `run` set; the policy's tokenizer, with its chat template and variables): each episode is
                 its session with an OpenAI-compatible endpoint over the sampler (`trajtune.sources.endpoint`);
                 make_env and renderer are unused then
    stage_dir:   the directory of the stage whose loop trains on this source: `sampling.record` writes to its
                 recording/, `sampling.replay` of a run directory reads <replay>/<its name>/recording
                 (`record.Recording`, `record.Replayed`); a source the loop does not train on (an evaluation's)
                 is built from a section without record / replay
    """
    check_sampling(sampling, where, rl=rl, sharded=engine.shard is not None, name=name,
                   agent=agent is not None and bool(agent.run))
    if sampling.replay:  # the recorded episodes, nothing sampled
        return Replayed(find_recording(sampling.replay, None if stage_dir is None else Path(stage_dir).name))
    if sampling.record and stage_dir is None:
        raise ValueError(f"{where}: {name('record')} is set, but this run gives its source no stage directory to "
                         "record into (episode_source(stage_dir=...))")
    if greedy and sampling.backend == "vllm":
        raise ValueError(f"{where}: a greedy pass samples with {name('backend')} sampler or generate, not vllm")
    runner = None
    if sampling.backend == "vllm":  # vLLM holds its own weights: synced after every update, overlapped or not
        from .vllm import vllm_runner

        runner = vllm_runner(engine, model_dir, sampling, precision=precision, seed=seed,
                             max_model_len=max_tokens if max_model_len is None else max_model_len)
        here: Sampler = runner.sampler
    else:
        here = make_sampler(sampling.backend, engine, pad_id=pad_id)(replace(sampling.settings(), greedy=greedy))
    if episode_seeds is None:
        episode_seeds = sampling.own_seeds
    shard = engine.shard if sharded else None


    def build(policy: Any) -> Source:
        if agent is not None and agent.run:  # the agent's sessions with an endpoint over the policy
            holder = policy if hasattr(policy, "rollout") else None  # a sampler process / vLLM: synced, probed
            source: Source = agent.source(policy, tokenizer, max_tokens=max_tokens, shard=shard, holder=holder,
                                          graded=score is not None, template_kwargs=template_kwargs,
                                          row_seeds=sampling.own_seeds)
            if measure is not None:
                source = Measured(source, measure)
            return score(source) if score is not None else source
        source = EpisodeSource(policy, make_env, renderer, shard=shard, episode_seeds=episode_seeds,
                                       max_turns=max_turns, max_tokens=max_tokens, step_timeout_s=step_timeout_s)
        if measure is not None:
            source = Measured(source, measure)
        return score(source) if score is not None else source

    source = overlapped(engine, sampling, build, here, runner=runner)
    return Recording(source, Path(stage_dir) / RECORDING) if sampling.record and stage_dir is not None else source


def make_sampler(backend: Literal["sampler", "generate", "vllm"], engine: Any, *, pad_id: int = 0,
                 client: Any = None) -> Callable[[SamplerSettings], Sampler]:
    """The one place a backend name becomes a sampler: `make_sampler(backend, ...)(settings)`. "sampler" /
    "generate": the engine's decoders (`sampler.engine_sampler`); "vllm": vLLM through `client` (a
    `vllm.Colocated` or `vllm.Servers`; a run's vLLM that also takes the trainer's weights is `vllm.vllm_runner`'s)."""
    if backend == "vllm":
        from .vllm import VLLMSampler

        return functools.partial(VLLMSampler, client)
    return functools.partial(engine_sampler, engine, backend=backend, pad_id=pad_id)
