"""The RLHF book's two toy environments (ch.3 "Training Overview", checklist 3.4) as text gyms.

They are the book's picture of standard RL -- a state, an action per step, a per-step reward, transitions the
agent does not control -- beside RLHF's one-step bandit, and they serve as unit-test environments: a scripted
controller must score what the dynamics promise, a bad action is counted, never raised.

Thermostat (ch.3 "A Simple Example"): state the room temperature (F), action "on" / "off" (the heater); the room
warms by `heat` degrees per step with the heater on and cools by `cool` with it off; reward +1 each step the
temperature is within 2 F of the 70 F target, 0 otherwise. The book's policy, on iff s_t < 70 F, is `thermostat_policy`.

CartPole (ch.3 "Classic RL Example"): state (x, x_dot, theta, theta_dot), action "left" / "right" = -F / +F; the
book's Euler dynamics with cart mass m_c, pole mass m_p, pole half-length l, gravity g and step dt:

    alpha       = (a + m_p l theta_dot^2 sin theta) / (m_c + m_p)
    theta_ddot  = (g sin theta - cos theta alpha) / (l (4/3 - m_p cos^2 theta / (m_c + m_p)))
    x_ddot      = alpha - m_p l theta_ddot cos theta / (m_c + m_p)
    x' = x + dt x_dot,  x_dot' = x_dot + dt x_ddot,  theta' = theta + dt theta_dot,  theta_dot' = theta_dot + dt
    theta_ddot

reward 1 each step the pole stays balanced and the cart on the track (|x| <= 2.4, |theta| <= 12 degrees); the
episode ends (reward 0 for that step) when either bound is violated, or after `max_steps`. The constants default
to the textbook CartPole's (m_c 1.0, m_p 0.1, l 0.5, g 9.8, F 10, dt 0.02); the start state is drawn uniformly in
[-0.05, 0.05]^4 from the task's seed.

Observations are plain text ("temperature 65.0 F", "x 0.012 x_dot -0.020 theta 0.031 theta_dot 0.004"); an episode's
reward is the sum of its step rewards (the rollout adds them).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .base import StepResult

TARGET_F = 70.0
BAND_F = 2.0


@dataclass(frozen=True)
class ThermostatTask:
    start: float = 65.0
    """the room's temperature at the start (F)"""
    steps: int = 20
    """steps per episode"""
    heat: float = 1.5
    """degrees per step the heater adds"""
    cool: float = 1.0
    """degrees per step the room loses with the heater off"""

    @property
    def name(self) -> str:
        return f"thermostat-{self.start:g}F"


class ThermostatEnv:
    """The book's thermostat: keep the room within 2 F of 70 F by turning the heater 'on' or 'off'."""

    task_attributes = ("start", "steps", "heat", "cool")

    def reset(self, task: ThermostatTask) -> str:
        self.task, self.temp, self.t = task, float(task.start), 0
        self.info = {"task": task.name, "actions": [], "n_invalid": 0, "in_band_steps": 0}
        return f"temperature {self.temp:.1f} F; target 70 F. Say 'on' or 'off'."

    def step(self, action: str) -> StepResult:
        self.info["actions"].append(action)
        a = action.strip().lower()
        if a not in ("on", "off"):
            self.info["n_invalid"] += 1
            return StepResult("say 'on' or 'off'", 0.0, False, dict(self.info))
        self.temp += self.task.heat if a == "on" else -self.task.cool
        self.t += 1
        reward = float(abs(self.temp - TARGET_F) <= BAND_F)
        self.info["in_band_steps"] += int(reward)
        done = self.t >= self.task.steps
        return StepResult("" if done else f"temperature {self.temp:.1f} F", reward, done, dict(self.info))


def thermostat_policy(temperature: float) -> str:
    """The book's policy: pi(on | s) = 1 if s < 70 F, else 0."""
    return "on" if temperature < TARGET_F else "off"


@dataclass(frozen=True)
class CartPoleTask:
    seed: int = 0
    """draws the start state, uniform in [-0.05, 0.05]^4"""
    max_steps: int = 200
    """steps per episode at most"""
    force: float = 10.0
    """F: 'left' pushes -F, 'right' +F (N)"""
    cart_mass: float = 1.0
    pole_mass: float = 0.1
    half_length: float = 0.5
    gravity: float = 9.8
    dt: float = 0.02
    """Euler step (s)"""

    @property
    def name(self) -> str:
        return f"cartpole-{self.seed}"


X_LIMIT = 2.4
THETA_LIMIT = 12 * math.pi / 180


def cartpole_step(state: tuple[float, float, float, float], force: float, task: CartPoleTask
                  ) -> tuple[float, float, float, float]:
    """One Euler step of the book's CartPole dynamics (module docstring): (x, x_dot, theta, theta_dot), a = +-F."""
    x, x_dot, theta, theta_dot = state
    m_c, m_p, l_, g = task.cart_mass, task.pole_mass, task.half_length, task.gravity
    total = m_c + m_p
    sin, cos = math.sin(theta), math.cos(theta)
    alpha = (force + m_p * l_ * theta_dot ** 2 * sin) / total
    theta_ddot = (g * sin - cos * alpha) / (l_ * (4 / 3 - m_p * cos ** 2 / total))
    x_ddot = alpha - m_p * l_ * theta_ddot * cos / total
    dt = task.dt
    return x + dt * x_dot, x_dot + dt * x_ddot, theta + dt * theta_dot, theta_dot + dt * theta_ddot


class CartPoleEnv:
    """The book's CartPole: push the cart 'left' or 'right' to keep the pole up and the cart on the track."""

    task_attributes = ("seed", "max_steps", "force")

    def reset(self, task: CartPoleTask) -> str:
        rng = random.Random(task.seed)
        self.task, self.t = task, 0
        self.state = tuple(rng.uniform(-0.05, 0.05) for _ in range(4))
        self.info = {"task": task.name, "actions": [], "n_invalid": 0, "balanced_steps": 0}
        return self._show() + ". Say 'left' or 'right'."

    def _show(self) -> str:
        x, x_dot, theta, theta_dot = self.state
        return f"x {x:.3f} x_dot {x_dot:.3f} theta {theta:.3f} theta_dot {theta_dot:.3f}"

    def step(self, action: str) -> StepResult:
        self.info["actions"].append(action)
        a = action.strip().lower()
        if a not in ("left", "right"):
            self.info["n_invalid"] += 1
            return StepResult("say 'left' or 'right'", 0.0, False, dict(self.info))
        self.state = cartpole_step(self.state, self.task.force * (1 if a == "right" else -1), self.task)
        self.t += 1
        x, _, theta, _ = self.state
        balanced = abs(x) <= X_LIMIT and abs(theta) <= THETA_LIMIT
        self.info["balanced_steps"] += int(balanced)
        done = not balanced or self.t >= self.task.max_steps
        return StepResult("" if done else self._show(), float(balanced), done, dict(self.info))


def cartpole_policy(state: tuple[float, float, float, float]) -> str:
    """A simple controller for tests: push toward the side the pole falls to (theta + 0.5 theta_dot)."""
    _, _, theta, theta_dot = state
    return "right" if theta + 0.5 * theta_dot > 0 else "left"
