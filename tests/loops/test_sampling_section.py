"""The one sampling section (`trajtune.sources.sampling`) and the one builder (`trajtune.sources.build`): every rule
that ties backend, overlap and sharding together fires from `check_sampling` with one line naming the fields; the
keys and flags of the sections it replaced are refused naming their place; the builder's source is the hand-built
one, episode for episode."""

import pytest
import torch

from trajtune.algorithms.rl import RLConfig
from trajtune.cli import main
from trajtune.config import ConfigError, from_dict
from trajtune.envs.base import SingleTurnEnv
from trajtune.sources.base import Draw
from trajtune.sources.build import episode_source, make_sampler
from trajtune.sources.episodes import EpisodeSource
from trajtune.sources.sampler import Decoder, SamplerSettings
from trajtune.sources.sampling import OVERLAP, SamplingConfig, check_sampling

from test_algorithms import RENDER, TASKS, engine, verifier


class Sharded:
    """An engine as the rules see one under torchrun (a shard)."""

    shard = object()


@pytest.mark.parametrize("section,kw,message", [
    ({"backend": "vllm", "sampler_process": True}, {}, "sampling.sampler_process runs the built-in sampler in a "
                                                       "process of its own; sampling.backend vllm samples in vLLM"),
    ({"backend": "generate", "max_staleness": 1}, {"rl": RLConfig(tis_cap=2.0)},
     "sampling.max_staleness 1 / sampling.sampler_process sample in a separate process"),
    ({"max_staleness": 1}, {"rl": RLConfig()}, "max_staleness 1 samples with the policy 1 update\\(s\\) behind"),
    ({"backend": "generate"}, {"sharded": True}, "sampling.backend generate cannot sample sharded under torchrun"),
    ({"sampler_process": True}, {"sharded": True}, "need a one-process engine"),
    ({"backend": "vllm"}, {"sharded": True}, "sampling.backend vllm under torchrun needs sampling.vllm_server"),
    ({"backend": "vllm", "max_staleness": 1, "vllm_server": ["http://h:1"]},
     {"sharded": True, "rl": RLConfig(tis_cap=2.0)}, "sampling.max_staleness with sampling.backend vllm needs one"),
    ({"backend": "vllm"}, {"backends": ("sampler",)}, "sampling.backend vllm is not one of this run's: sampler"),
    ({"temperature": 0.5}, {"reads": OVERLAP}, "sampling.temperature set, but this run draws its actions its own way"),
])
def test_every_rule_is_checked_in_one_place(section, kw, message):
    with pytest.raises((ValueError, ConfigError), match=message):
        check_sampling(SamplingConfig(**section), "run", **kw)


def test_the_replaced_sections_keys_and_flags_name_their_new_place(capsys):
    from trajtune.experiments.hf.grpo import GRPORun

    with pytest.raises(ConfigError, match=r"key 'overlap' is now 'sampling'"):
        from_dict(GRPORun, {"overlap": {"max_staleness": 1}}, where="[config]")
    with pytest.raises(ConfigError, match=r"key 'vllm_timeout' is now 'sampling.sampler_timeout'"):
        from_dict(SamplingConfig, {"vllm_timeout": 5.0}, where="[config.sampling]")
    with pytest.raises(SystemExit) as stop:
        main(["grpo", "--vllm-sync-tolerance", "0.1"])
    assert stop.value.code == 2
    assert "--vllm-sync-tolerance is now --sync-tolerance (recipes: sampling.sync_tolerance)" in capsys.readouterr().err


def test_the_builders_source_is_the_hand_built_one():
    section = SamplingConfig(max_new_tokens=2, temperature=0.9, draw="race", share_prompts=False)
    hand = EpisodeSource(Decoder(engine().sample, SamplerSettings(2, 0.9)), lambda: SingleTurnEnv(verifier), RENDER,
                         max_turns=1, max_tokens=32, episode_seeds=True)
    built = episode_source(section, engine(), lambda: SingleTurnEnv(verifier), RENDER, "test", max_turns=1,
                           max_tokens=32)
    a, b = (s.take(Draw(TASKS[:2], 3, torch.Generator().manual_seed(5))).trajs for s in (hand, built))
    assert [(t.ids, t.logprobs, t.reward) for t in a] == [(t.ids, t.logprobs, t.reward) for t in b]
    assert make_sampler("generate", engine())(SamplerSettings(draw="cdf")).settings.draw == "race"


def test_a_greedy_pass_through_the_builder_is_the_argmax_and_refused_on_vllm():
    """`episode_source(..., greedy=True)` (an evaluation's greedy pass) samples the argmax whatever the temperature;
    vLLM's backend has no such pass here, so asking for one is a one-line error before anything starts."""
    section = SamplingConfig(max_new_tokens=2, temperature=5.0, draw="race", share_prompts=False)
    sources = [episode_source(section, engine(), lambda: SingleTurnEnv(verifier), RENDER, "test", max_turns=1,
                              max_tokens=32, greedy=True) for _ in range(2)]
    a, b = (s.take(Draw(TASKS[:2], 2, torch.Generator().manual_seed(seed))).trajs for s, seed in zip(sources, (1, 2)))
    assert [t.ids for t in a] == [t.ids for t in b]  # the argmax: the seeds change nothing
    with pytest.raises(ValueError, match=r"^test: a greedy pass samples with sampling.backend sampler or generate"):
        episode_source(SamplingConfig(backend="vllm"), engine(), lambda: SingleTurnEnv(verifier), RENDER, "test",
                       greedy=True)
