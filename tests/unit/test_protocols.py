"""Each implementation satisfies its Protocol: statically -- mypy checks this file (tests/unit/test_types.py), where
each implementation is assigned to its Protocol -- and at runtime: every member the Protocol lists exists on the
implementation, and every method takes the Protocol's parameters (names, kinds, defaults)."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Protocol

import pytest
import torch

from trajtune.engine import Collective, Engine, Layout, make_engine
from trajtune.engine import distributed
from trajtune.engine.collectives import DDP, FSDP, Sharded, SingleProcess, Whole
from trajtune.engine.distributed import Ranks
from trajtune.envs.adapters.textarena import TextArenaEnv
from trajtune.envs.base import Env, SingleTurnEnv
from trajtune.envs.bugfix import BugFixEnv
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.runs.hooks import Hook
from trajtune.runs.recorder import EpisodeRecorder
from trajtune.sources.base import Source
from trajtune.sources.ensemble import RewardEnsemble
from trajtune.sources.episodes import EpisodeRunner, EpisodeSource, Here, Measured
from trajtune.sources.graders import Grader
from trajtune.sources.judge import Judge
from trajtune.sources.overlap import Overlapped
from trajtune.sources.record import Recording, Replayed
from trajtune.sources.process import SamplerProcess
from trajtune.sources.rewards import RewardFunction
from trajtune.sources.rewards.rubric import Rubric, RubricItem, RubricReward
from trajtune.sources.sampler import Decoder, Sampler, SamplerSettings, WeightSampler, engine_sampler
from trajtune.sources.scoring import RewardModel, Scored
from trajtune.text.render import Renderer
from trajtune.text.tokenizers import CharTokenizer


def members(proto: type) -> dict[str, Any]:
    """name -> declaration (a function, a property, or an annotation) of every public member `proto` lists."""
    out: dict[str, Any] = {}
    for klass in proto.__mro__:
        if klass is Protocol or not getattr(klass, "_is_protocol", False):
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_"):
                out.setdefault(name, value)
        for name, annotation in vars(klass).get("__annotations__", {}).items():
            out.setdefault(name, annotation)
    return out


def mismatches(impl: object, proto: type) -> list[str]:
    """What `impl` lacks of `proto`: missing members, and methods that do not take the Protocol's parameters
    (by name and kind, with a default wherever the Protocol has one) or that require parameters it lacks."""
    problems = []
    for name, declared in members(proto).items():
        if not hasattr(impl, name):
            problems.append(f"{name}: missing")
            continue
        if not inspect.isfunction(declared):
            continue  # an attribute or a property: present is what can be checked at runtime
        method = getattr(impl, name)
        if not callable(method):
            problems.append(f"{name}: not a method")
            continue
        want = list(inspect.signature(declared).parameters.values())[1:]  # without self
        have = inspect.signature(method).parameters
        takes_kw = any(p.kind is p.VAR_KEYWORD for p in have.values())
        for p in want:
            if p.kind is p.VAR_KEYWORD:
                if not takes_kw:
                    problems.append(f"{name}: takes no **{p.name}")
                continue
            q = have.get(p.name)
            if q is None:
                problems.append(f"{name}: no parameter {p.name!r}")
            elif p.default is not p.empty and q.default != p.default:
                problems.append(f"{name}: {p.name} defaults to {q.default!r}, the Protocol to {p.default!r}")
            elif p.kind is p.KEYWORD_ONLY and q.kind not in (q.KEYWORD_ONLY, q.POSITIONAL_OR_KEYWORD):
                problems.append(f"{name}: {p.name} is not a keyword")
            elif p.kind is p.POSITIONAL_OR_KEYWORD and q.kind is not q.POSITIONAL_OR_KEYWORD:
                problems.append(f"{name}: {p.name} is not positional-or-keyword")
        named = {p.name for p in want}
        extra = [q.name for q in have.values() if q.name not in named and q.default is q.empty
                 and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)]
        if extra:
            problems.append(f"{name}: requires {extra}, which the Protocol does not pass")
    return problems


def tiny() -> TinyTransformer:
    torch.manual_seed(0)
    return TinyTransformer(TinyConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2, max_len=16))


@pytest.fixture
def two_ranks(monkeypatch):
    """DDP and FSDP built as on rank 1 of 2 (their constructors read the process group; no group is started)."""
    monkeypatch.setattr(distributed, "is_distributed", lambda: True)
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: 2)


def test_the_engine_and_its_reference_are_engines():
    engine: Engine = make_engine(tiny())
    reference: Engine = engine.reference_engine()
    assert "copy_weights_from" in members(Engine) and "step" in members(Engine)  # methods and attributes listed
    assert mismatches(engine, Engine) == [] and mismatches(reference, Engine) == []


def test_each_collective_is_a_collective(two_ranks):
    strategies: list[Collective] = [SingleProcess(), DDP(), FSDP()]
    assert {"ranks", "layout", "prepare", "no_sync"} <= set(members(Collective))
    for c in strategies:
        assert mismatches(c, Collective) == [] and isinstance(c.ranks, Ranks), type(c).__name__
    assert [type(c.layout) for c in strategies] == [Whole, Whole, Sharded]
    assert [(c.ranks.rank, c.ranks.world_size, c.ranks.is_main) for c in strategies] == [(0, 1, True), (1, 2, False),
                                                                                       (1, 2, False)]
    assert not any(issubclass(type(a), type(b)) for a in strategies for b in strategies if a is not b)  # flat


def test_each_layout_is_a_layout():
    layouts: list[Layout] = [Whole(), Sharded(Ranks(1, 2))]
    assert {"copy_model", "copy_weights", "full_parameters", "full_weights", "load_weights"} <= set(members(Layout))
    for layout in layouts:
        assert mismatches(layout, Layout) == [], type(layout).__name__


def test_each_environment_is_an_env():
    envs: list[Env] = [SingleTurnEnv(), BugFixEnv(), TextArenaEnv()]
    for env in envs:
        assert isinstance(env, Env) and mismatches(env, Env) == [], type(env).__name__


def test_each_source_is_a_source_and_each_runner_a_runner(tmp_path):
    engine = make_engine(tiny())
    renderer = Renderer(CharTokenizer.from_corpus("Q: pick ab"))
    base = EpisodeSource(Decoder(engine.sample), SingleTurnEnv, renderer)
    process = SamplerProcess(engine)  # not started: nothing runs
    sources: list[Source] = [base, Measured(base, lambda trajs: {"cost/sampled": float(len(trajs))}),
                             Scored(base, engine, []), Overlapped(base, process),
                             EpisodeSource(process, SingleTurnEnv, renderer), Recording(base, tmp_path / "rec"),
                             Replayed(tmp_path)]
    for source in sources:
        assert isinstance(source, Source) and mismatches(source, Source) == [], type(source).__name__
    from trajtune.sources.vllm import VLLMRunner, VLLMSampler, WeightSync

    vllm = VLLMSampler(None)  # type: ignore[arg-type]  # no client: nothing runs
    runners: list[EpisodeRunner] = [Here(Decoder(engine.sample)), process,
                                    VLLMRunner(engine, vllm, WeightSync(vllm, 1e-3, tmp_path))]
    for runner in runners:
        assert mismatches(runner, EpisodeRunner) == [], type(runner).__name__
    hooks: list[Hook] = [EpisodeRecorder("episodes.jsonl")]
    assert all(isinstance(h, Hook) for h in hooks)


def test_each_grader_is_a_grader():
    engine = make_engine(tiny())
    renderer = Renderer(CharTokenizer.from_corpus("Q: pick ab"))
    model = RewardModel(engine, renderer)
    met = lambda completions, **kw: [1.0] * len(completions)  # noqa: E731 - a rubric item's verifier
    graders: list[Grader] = [RewardFunction(met, name="met"), model, RewardEnsemble([model]),
                             Judge(engine, renderer, "compact_pair"), RubricReward(Rubric([RubricItem("a", "a", 1.0,
                                                                                                      check=met)]))]
    assert {"name", "finished_only", "main_only", "start", "close"} <= set(members(Grader))
    for grader in graders:
        assert mismatches(grader, Grader) == [], type(grader).__name__
    assert [g.main_only for g in graders] == [True, False, False, False, False]  # user code runs once, on rank 0
    assert [g.finished_only for g in graders] == [False, True, True, True, True]  # models: finished completions


def test_each_sampler_is_a_sampler():
    """The in-process decoders (the built-in sampler, HF generate, `decoding.sample` on a module), vLLM and the
    sampler process are `Sampler`s; vLLM, which holds its own weights, a `WeightSampler`."""
    from trajtune.engine import decoding
    from trajtune.sources.vllm import VLLMSampler

    engine = make_engine(tiny())
    settings = SamplerSettings(max_new_tokens=4, temperature=0.7)
    vllm = VLLMSampler(None, settings)  # type: ignore[arg-type]  # no client: nothing runs
    samplers: list[Sampler] = [engine_sampler(engine, settings), engine_sampler(engine, settings, "generate"),
                               Decoder(functools.partial(decoding.sample, engine.model), settings), vllm,
                               SamplerProcess(engine, settings)]  # not started: nothing runs
    holders: list[WeightSampler] = [vllm]
    for sampler in samplers:
        assert mismatches(sampler, Sampler) == [] and sampler.settings.max_new_tokens == 4, type(sampler).__name__
    for holder in holders:
        assert mismatches(holder, WeightSampler) == [], type(holder).__name__


def test_the_runtime_check_catches_a_broken_implementation():
    """A check that cannot fail is no check: a layout whose copy renames a parameter, a strategy without ranks."""
    class Renamed:
        def __getattr__(self, name):
            return getattr(Whole(), name)

        def copy_weights(self, target, src):
            pass

    class Missing:
        prepare = SingleProcess.prepare

    assert mismatches(Renamed(), Layout) == ["copy_weights: no parameter 'dst'",
                                                 "copy_weights: requires ['target'], which the Protocol does not pass"]
    assert ("ranks: missing" in mismatches(Missing(), Collective)
            and "prepare: missing" not in mismatches(Missing(), Collective))


def test_each_registered_experiment_is_an_experiment():
    """`trajtune run` calls an experiment through `Experiment` alone: every registered module is one (mypy checks the
    assignment below; the runtime check the members and the signature of `run`)."""
    from trajtune.experiments import EXPERIMENTS, addition, agent, chapter13, graders, hf_gym, hf_pipeline
    from trajtune.experiments import mismatch_lab, reasoning_gym, rlhf_book, smollm2, textarena
    from trajtune.experiments.base import Experiment
    from trajtune.experiments.hf import dpo, grpo, rft, rm, sft
    from trajtune.experiments.iw_sft import bandit, bugfix

    experiments: list[Experiment] = [addition, agent, chapter13, bandit, bugfix, sft, rm, dpo, grpo, rft, hf_pipeline,
                                     reasoning_gym, textarena, hf_gym, graders, rlhf_book, smollm2, mismatch_lab]
    assert sorted(m.__name__ for m in experiments) == sorted(EXPERIMENTS.values())  # type: ignore[attr-defined]
    for m in experiments:
        assert mismatches(m, Experiment) == [], m.__name__  # type: ignore[attr-defined]
    assert agent.parse_options is not None and chapter13.parse_options is None and chapter13.run_over_seeds is not None

