"""The sampler process drawing from rounded weights (`sampling.sampler_dtype`, the mismatch lab's low-precision
sampler): it samples what a bf16 / fp8-rounded copy of the trainer's weights samples, from the first step on; its
syncs are checked on the weights it received, with the user's log-prob tolerance, the measured difference logged."""

import copy

import pytest
import torch

from trajtune.algorithms.rl import RLConfig, train_rl
from trajtune.engine.decoding import sample
from trajtune.envs.base import SingleTurnEnv
from trajtune.sources.episodes import EpisodeSource
from trajtune.sources.overlap import overlapped
from trajtune.sources.process import SamplerProcess, SyncError
from trajtune.sources.sampler import Decoder, SamplerSettings
from trajtune.sources.sampling import SamplingConfig
from trajtune.sources.serve import round_weights

from test_async_rl import one_thread  # noqa: F401 - autouse: one torch thread
from test_algorithms import RENDER, TASKS, TOK, engine, verifier



@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_the_process_samples_what_the_rounded_weights_sample(dtype):
    e = engine()
    settings = SamplerSettings(max_new_tokens=3, draw="cdf", weights_dtype=dtype)
    prompts = [TOK.encode("Q: pick")] * 8
    rounded = copy.deepcopy(e.model).eval()
    round_weights(rounded.state_dict(), dtype)
    want = sample(rounded, prompts, 3, torch.Generator().manual_seed(0), stop_ids=[TOK.eos_id], draw="cdf")
    fp32 = sample(e.model.eval(), prompts, 3, torch.Generator().manual_seed(0), stop_ids=[TOK.eos_id], draw="cdf")
    with SamplerProcess(e, settings) as process:
        got = process.sample(prompts, [TOK.eos_id], torch.Generator().manual_seed(0))
    assert got == want and got.logprobs != fp32.logprobs


def rounded_run(dtype, tolerance, steps=3):
    """`steps` GRPO steps on-policy through a sampler process drawing from `dtype`-rounded weights -> (history,
    the process's rollouts answered)."""
    e = engine()
    started = []
    section = SamplingConfig(max_new_tokens=2, sampler_process=True, sampler_dtype=dtype, sync_tolerance=tolerance)

    def build(policy):
        started.append(policy)
        return EpisodeSource(policy, lambda: SingleTurnEnv(verifier), RENDER, max_turns=1, max_tokens=32)

    source = overlapped(e, section, build, Decoder(e.sample, section.settings()))
    with source:
        history = train_rl(e, TASKS, source, RLConfig(steps=steps, tasks_per_step=2, group_size=4), TOK.pad_id)
    return history, started[0].calls


def test_rounded_syncs_are_checked_with_the_users_tolerance_and_their_difference_logged():
    history, calls = rounded_run("fp8", 5.0)
    assert calls == 3  # every step sampled in the process, the first too (never the trainer's fp32 weights)
    diffs = [r["sync/logprob_diff"] for r in history if "sync/logprob_diff" in r]
    assert diffs and all(0 < d <= 5.0 for d in diffs)  # the weights received match; the log-probs differ by design
    with pytest.raises(SyncError, match=r"differ by .* \(mean .*; tolerance 1e-09, sync_tolerance\)"):
        rounded_run("fp8", 1e-9)
