"""benchmarks/async_rl.py's bound for a K-step pipeline (`pipeline_step_s`): the s/step an ideal pipeline would
give over given collect and update seconds, worked by hand. The benchmark prints it beside the measured
speed-ups, so a wrong model would misstate what K > 1 can buy."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from async_rl import pipeline_step_s  # noqa: E402

# Steps alternating a slow collect (2 s) and a fast one (0.5 s), every update 1 s.
COLLECT = [2.0, 0.5, 2.0, 0.5, 2.0, 0.5]
UPDATE = [1.0] * 6


def test_synchronous_is_the_mean_step_after_the_first():
    # step ends 3, 4.5, 7.5, 9, 12, 13.5 -> (13.5 - 3) / 5 = 2.1
    assert pipeline_step_s(COLLECT, UPDATE, 0) == pytest.approx(2.1)


def test_one_step_pipeline_idles_the_sampler_behind_a_slow_draw():
    # K = 1: draw j may start at the end of update j-2 (D: draw ends, F: update ends)
    # j0: D 2, F 3 | j1: D 2.5, F 4 | j2: waits for F0 = 3: D 5, F 6 | j3: D 5.5, F 7
    # j4: waits for F2 = 6: D 8, F 9 | j5: D 8.5, F 10 -> (10 - 3) / 5 = 1.4
    assert pipeline_step_s(COLLECT, UPDATE, 1) == pytest.approx(1.4)


def test_a_deeper_pipeline_absorbs_the_variation():
    # K = 2: draw j may start at the end of update j-3
    # j0: D 2, F 3 | j1: D 2.5, F 4 | j2: D 4.5, F 5.5 | j3: D 5, F 6.5 | j4: D 7, F 8 | j5: D 7.5, F 9
    # -> (9 - 3) / 5 = 1.2; K = 4 releases every draw earlier still, and the sampler never waits: also 1.2
    assert pipeline_step_s(COLLECT, UPDATE, 2) == pytest.approx(1.2)
    assert pipeline_step_s(COLLECT, UPDATE, 4) == pytest.approx(1.2)


def test_constant_steps_overlap_fully_at_k_1():
    # c = u = 1: j0 D 1 F 2 | j1 D 2 F 3 | j2 D 3 F 4 | j3 D 4 F 5 -> 1 s/step at K = 1, 2 and 4 (sync: 2)
    for k, expected in ((0, 2.0), (1, 1.0), (2, 1.0), (4, 1.0)):
        assert pipeline_step_s([1.0] * 4, [1.0] * 4, k) == pytest.approx(expected)
