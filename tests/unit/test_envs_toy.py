"""The book's toy environments (ch.3.4): the thermostat's reward band and the CartPole Euler step by hand, and
both played end to end through the library's scripted rollout."""

import math
import re

import pytest

from trajtune.envs.toy import (CartPoleEnv, CartPoleTask, ThermostatEnv, ThermostatTask, cartpole_policy, cartpole_step,
                               thermostat_policy)
from trajtune.sources.rollout import scripted_rollout
from trajtune.text.render import Renderer
from trajtune.text.tokenizers import CharTokenizer


def test_thermostat_band_and_the_books_policy():
    env = ThermostatEnv()
    env.reset(ThermostatTask(start=66.0, steps=4))
    # on: 67.5 (out: |67.5 - 70| = 2.5 > 2), on: 69 (in), off: 68 (in), a bad action (counted), on: 69.5 (in)
    rewards = [env.step(a).reward for a in ("on", "on", "off")]
    assert rewards == [0.0, 1.0, 1.0]
    bad = env.step("heat!")
    assert bad.reward == 0.0 and not bad.done and bad.info["n_invalid"] == 1
    last = env.step("on")
    assert last.done and last.reward == 1.0 and last.info["in_band_steps"] == 3
    assert thermostat_policy(69.9) == "on" and thermostat_policy(70.0) == "off"


def test_cartpole_euler_step_by_hand():
    task = CartPoleTask()
    # from rest, a = +10: alpha = 10 / 1.1; theta_ddot = -alpha / (0.5 (4/3 - 0.1/1.1));
    # x_ddot = alpha - 0.05 theta_ddot / 1.1
    alpha = 10 / 1.1
    theta_ddot = -alpha / (0.5 * (4 / 3 - 0.1 / 1.1))
    x_ddot = alpha - 0.1 * 0.5 * theta_ddot / 1.1
    assert cartpole_step((0.0, 0.0, 0.0, 0.0), 10.0, task) == pytest.approx((0.0, 0.02 * x_ddot, 0.0,
                                                                             0.02 * theta_ddot))
    assert theta_ddot == pytest.approx(-14.634, abs=1e-3) and x_ddot == pytest.approx(9.7561, abs=1e-4)
    # a still pole tilted right falls right: theta_ddot = g sin(theta) / (l (4/3 - m_p cos^2 / 1.1)) > 0
    state = cartpole_step((0.0, 0.0, 0.1, 0.0), 0.0, task)
    assert state[3] > 0 and state[2] == 0.1


def test_cartpole_bounds_end_the_episode():
    env = CartPoleEnv()
    env.reset(CartPoleTask(seed=1, max_steps=500))
    steps = 0
    while True:
        out = env.step("right")  # always right: the pole falls within a few dozen steps
        steps += 1
        if out.done:
            break
    assert out.reward == 0.0 and out.info["balanced_steps"] == steps - 1 < 100
    x, _, theta, _ = env.state
    assert abs(x) > 2.4 or abs(theta) > 12 * math.pi / 180


class Scripted:
    def __init__(self, fn):
        self.fn = fn

    def act(self, messages):
        numbers = [float(v) for v in re.findall(r"-?\d+\.\d+", messages[-1]["content"])]
        return self.fn(numbers[0] if len(numbers) == 1 else tuple(numbers))


def test_both_play_through_the_scripted_rollout():
    tok = CharTokenizer.from_corpus(["temperature F; target Say 'on' or 'off'. x_dot theta left right 0123456789.-"])
    r = Renderer(tok)
    t = scripted_rollout(Scripted(thermostat_policy), ThermostatEnv(), ThermostatTask(start=64.0, steps=12), r,
                         max_turns=12, max_tokens=4096)
    assert t.reward >= 8  # 64 -> 65.5 -> 67 -> 68.5 (in band) and it stays there
    c = scripted_rollout(Scripted(cartpole_policy), CartPoleEnv(), CartPoleTask(seed=0, max_steps=30), r,
                         max_turns=30, max_tokens=100_000)
    assert c.reward == 30  # the controller balances it for the whole episode
