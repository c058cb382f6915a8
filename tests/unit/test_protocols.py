"""Each implementation satisfies its Protocol: statically -- mypy checks this file (tests/unit/test_types.py), where
each implementation is assigned to its Protocol -- and at runtime: every member the Protocol lists exists on the
implementation, and every method takes the Protocol's parameters (names, kinds, defaults)."""

from __future__ import annotations

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
from trajtune.sources.episodes import EpisodeRunner, EpisodeSource, Here, Measured
from trajtune.sources.overlap import Overlapped
from trajtune.sources.process import SamplerProcess
from trajtune.sources.rewards import RewardSet
from trajtune.sources.scoring import Scored
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
    base = EpisodeSource(engine.sample, SingleTurnEnv, renderer)
    process = SamplerProcess(engine)  # not started: nothing runs
    sources: list[Source] = [base, Measured(base, lambda trajs: {"cost/sampled": float(len(trajs))}), Scored(base, engine, RewardSet([])), Overlapped(base, process),
                             EpisodeSource(process, SingleTurnEnv, renderer)]
    for source in sources:
        assert isinstance(source, Source) and mismatches(source, Source) == [], type(source).__name__
    from trajtune.sources.vllm import VLLMRunner

    runners: list[EpisodeRunner] = [Here(engine.sample), process, VLLMRunner(engine, None, 1e-3, tmp_path)]  # type: ignore[arg-type]
    for runner in runners:
        assert mismatches(runner, EpisodeRunner) == [], type(runner).__name__
    hooks: list[Hook] = [EpisodeRecorder("episodes.jsonl")]
    assert all(isinstance(h, Hook) for h in hooks)


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
    assert "ranks: missing" in mismatches(Missing(), Collective) and "prepare: missing" not in mismatches(Missing(), Collective)
