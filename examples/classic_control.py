"""The RLHF book's picture of standard RL (ch.3 "Training Overview") as text gyms: a thermostat and CartPole,
each played by the book's policy and by a random one.

    python examples/classic_control.py            # ~1 s; mean return per episode of each policy

Both are plain `Env`s (`trajtune.envs.toy`): a state as text, an action per step, a reward per step, transitions
the agent does not control -- where RLHF's usual episode is one step. Measured with the defaults (10 episodes,
seed 0): the book's thermostat policy (heater on iff the room is below 70 F) keeps the room in the 68-72 F band
18.8 of its 20 steps, random switching 3.7; a controller that pushes toward the side the pole falls to balances
CartPole for all 200 steps, random pushes drop it after 15. A learning policy in their place is the RL loop of
examples/guess_number.py: the environments return text, so any policy the library trains can play them.
"""

from __future__ import annotations

import argparse
import random

from trajtune.envs.toy import (CartPoleEnv, CartPoleTask, ThermostatEnv, ThermostatTask, cartpole_policy,
                               thermostat_policy)


def play(env, task, act) -> float:
    """One episode: `act(observation) -> action` until the episode ends -> its return (the sum of step rewards)."""
    observation, total = env.reset(task), 0.0
    while True:
        result = env.step(act(observation))
        total += result.reward
        if result.done:
            return total
        observation = result.observation


def numbers(text: str) -> list[float]:
    """The numbers of an observation ('temperature 65.0 F', 'x 0.012 x_dot -0.020 ...'), in order."""
    out = []
    for word in text.replace(";", " ").split():
        try:
            out.append(float(word.rstrip(".,")))
        except ValueError:
            pass
    return out


def main(episodes: int = 10, seed: int = 0, verbose: bool = True) -> dict[str, float]:
    rng = random.Random(seed)
    thermostat = [ThermostatTask(start=rng.uniform(60.0, 80.0)) for _ in range(episodes)]
    cartpole = [CartPoleTask(seed=seed + k) for k in range(episodes)]
    policies = {
        "thermostat, the book's policy": (ThermostatEnv(), thermostat, lambda o: thermostat_policy(numbers(o)[0])),
        "thermostat, random": (ThermostatEnv(), thermostat, lambda o: rng.choice(["on", "off"])),
        "cartpole, push toward the fall": (CartPoleEnv(), cartpole, lambda o: cartpole_policy(tuple(numbers(o)[:4]))),
        "cartpole, random": (CartPoleEnv(), cartpole, lambda o: rng.choice(["left", "right"])),
    }
    out = {name: sum(play(env, t, act) for t in tasks) / len(tasks) for name, (env, tasks, act) in policies.items()}
    if verbose:
        for name, ret in out.items():
            print(f"{name:32} mean return {ret:6.1f}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    main(args.episodes, args.seed)
