"""Recipe tables build the experiment's own nested defaults, not the loop dataclass's."""

from dataclasses import dataclass, field

import pytest

from trajtune.algorithms.rl import RLConfig
from trajtune.config import ConfigError, from_dict
from trajtune.engine import OptimConfig


@dataclass
class Experiment:
    seed: int = 0
    rl: RLConfig = field(default_factory=lambda: RLConfig(steps=60, advantage="grpo", length_buckets=4))
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=3e-3, grad_clip=0.0))


def test_a_nested_table_starts_from_the_fields_default_instance():
    c = from_dict(Experiment, {"rl": {"steps": 100}, "optim": {"warmup_steps": 5}})
    assert c.rl == RLConfig(steps=100, advantage="grpo", length_buckets=4)  # not RLConfig(steps=100)
    assert c.optim == OptimConfig(lr=3e-3, grad_clip=0.0, warmup_steps=5)
    assert from_dict(Experiment, {}).rl.steps == 60


def test_a_nested_table_is_still_checked_by_its_dataclass():
    with pytest.raises(ConfigError, match=r"\[config\].rl: unknown key 'stepz'; did you mean 'steps'"):
        from_dict(Experiment, {"rl": {"stepz": 1}}, where="[config]")
    with pytest.raises(ConfigError, match="group_size >= 2"):
        from_dict(Experiment, {"rl": {"group_size": 1}}, where="[config]")
    with pytest.raises(ConfigError, match="expected an integer"):
        from_dict(Experiment, {"rl": {"steps": "many"}}, where="[config]")


def test_a_renamed_key_names_where_it_went():
    @dataclass
    class Renamed:
        RENAMED = {"rl_lr": "rl_optim.lr"}
        rl_optim: OptimConfig = field(default_factory=OptimConfig)

    with pytest.raises(ConfigError, match=r"\[config\]: key 'rl_lr' is now 'rl_optim.lr'"):
        from_dict(Renamed, {"rl_lr": 0.1}, where="[config]")
    from trajtune.experiments import agent, chapter13

    for cls in (agent.Config, chapter13.Config):  # every new place an old key points to exists
        for old, new in cls.RENAMED.items():
            obj = cls()
            for part in new.split(" and ")[0].split("."):
                obj = getattr(obj, part)


def test_the_rl_loops_old_overlap_keys_name_their_new_section_in_every_experiment_with_an_rl_loop():
    """RLConfig's sampler keys moved to the source's `overlap` section: an old recipe is told where, and every
    experiment that nests an RL loop has that section (the message never names a place that does not exist)."""
    import typing

    from trajtune.algorithms.rl import RLConfig
    from trajtune.experiments import EXPERIMENTS, get_experiment
    from trajtune.sources.sampling import SamplingConfig

    with_rl = []
    for name in EXPERIMENTS:
        cls = get_experiment(name).Config
        hints = typing.get_type_hints(cls)
        if hints.get("rl") is RLConfig:
            with_rl.append(name)
            assert hints.get("sampling") is SamplingConfig, name
            with pytest.raises(ConfigError, match=r"\.rl: key 'max_staleness' is now 'sampling.max_staleness'"):
                from_dict(cls, {"rl": {"max_staleness": 1}}, where="[config]")
    assert {"agent", "chapter13", "textarena", "reasoning_gym", "hf_grpo"} <= set(with_rl)
