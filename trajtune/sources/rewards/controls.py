"""Control rewards: reward functions that carry no information about the task, for control runs.

RLHF book ch.16 "Contamination" (checklist 16.6): benchmarks improving "when models are trained with RL on
random rewards -- a contrived setup that should only increase performance if a model has certain types of
data contamination" (Shao et al. 2025, "Spurious Rewards: Rethinking Training Signals in RLVR"). Run it
beside the real run, with the same budget:

    trajtune grpo --model M --data prompts.jsonl --reward trajtune.sources.rewards.controls:random_reward ...

A rise in the held-out score under this reward is a red flag (the model knew the answers, or the evaluation
leaks), not a success.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Sequence

from .functions import RewardState

PROBABILITY = 0.5
"""P(reward = 1): Shao et al.'s random reward is Bernoulli(0.5)"""


def random_reward(prompts: Sequence[Any], completions: Sequence[Any], trainer_state: RewardState | None = None,
                  **kwargs) -> list[float]:
    """A TRL-style reward function: 1.0 with probability 1/2, else 0.0, independent of whether the completion
    is right. Deterministic: each reward is a function of (prompt, completion, step) -- the first 8 bytes
    of the SHA-256 of their JSON, read as a number in [0, 1) -- so a rerun (or a resumed run) gets the same
    rewards, and the same completion of the same prompt at another step gets a fresh draw (a fixed function
    of the text alone would be a reward the policy could learn).

    prompts, completions: as TRL passes them (strings, or lists of messages); trainer_state.global_step is
    the step (0 when absent). Other columns are accepted and ignored.
    """
    step = getattr(trainer_state, "global_step", 0) or 0
    return [1.0 if uniform(p, c, step) < PROBABILITY else 0.0 for p, c in zip(prompts, completions, strict=True)]


def uniform(prompt: Any, completion: Any, step: int) -> float:
    """A number in [0, 1) that is a fixed function of (prompt, completion, step)."""
    key = json.dumps([prompt, completion, int(step)], sort_keys=True, ensure_ascii=False, default=str)
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2.0**64
