"""The BugFix gym as the agent experiment sees it: tasks, data sources, measurements.

Helpers for `experiments/agent.py` (seed agent-rl ch.15). Everything here samples
through an engine and measures; nothing trains. Measurements return plain
floats and dicts so stages can hand them across processes and into the report.

    Gym                  tokenizer, renderer, train / held-out tasks, rollout limits
    scripted_play        episodes of a scripted policy (oracle / blind / random)
    episodes             the engine's own episodes, n per task, seeded
    evaluate             train / held-out pass, invalid calls, reads (every eval point)
    describe             evaluate + action entropy (seed §15.2 `describe`)
    probe                held-out pass, informative groups, entropy (A10)
    rft_round_summary    what a round of expert iteration kept (A5, A12)
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..algorithms.common import dedup_and_cap, select_episodes, shares
from ..engine import LocalEngine
from ..envs.bugfix import BugFixEnv, build_tokenizer
from ..envs.bugfix_tasks import FAMILIES, BugFixTask, make_tasks
from ..envs.scripted import bugfix_policy
from ..evaluation import informative_group_share, mean_action_entropy
from ..rollout import make_collect, scripted_rollout
from ..text.render import Renderer
from ..text.tokenizers import WordTokenizer
from ..trajectory import Trajectory, collate


@dataclass
class Gym:
    """The BugFix gym with one tokenizer and one renderer (wrappers on, the rollout format)."""

    max_turns: int = 6
    max_action_tokens: int = 8
    tok: WordTokenizer = field(default_factory=build_tokenizer)
    train: list[BugFixTask] = field(default_factory=lambda: make_tasks("train"))
    heldout: list[BugFixTask] = field(default_factory=lambda: make_tasks("heldout"))

    def __post_init__(self) -> None:
        self.renderer = Renderer(self.tok)
        self.sampling_seconds = 0.0  # wall time spent in rollouts (sampling + environments)

    @property
    def pad_id(self) -> int:
        return self.tok.pad_id

    def collect(self, engine: LocalEngine, reward: str = "hidden"):
        """`collect(tasks, n_per_task, generator)` for the algorithm loops (rollout.make_collect), timed."""
        collect = make_collect(engine.sample, lambda: BugFixEnv(reward=reward), self.renderer,
                               max_turns=self.max_turns, max_action_tokens=self.max_action_tokens)

        def timed(tasks, n, generator):
            t0 = time.perf_counter()
            try:
                return collect(tasks, n, generator)
            finally:
                self.sampling_seconds += time.perf_counter() - t0

        return timed


def scripted_play(gym: Gym, kind: str, seeds: Sequence[int], tasks: Sequence[BugFixTask],
                  renderer: Renderer | None = None) -> list[Trajectory]:
    """One episode of scripted policy `kind` per (seed, task), rendered by `renderer` (default: the gym's)."""
    r = renderer or gym.renderer
    return [scripted_rollout(bugfix_policy(kind, s), BugFixEnv(), t, r, max_turns=gym.max_turns,
                             max_action_tokens=gym.max_action_tokens) for s in seeds for t in tasks]


def episodes(engine: LocalEngine, gym: Gym, tasks: Sequence[BugFixTask], n: int, seed: int,
             reward: str = "hidden") -> list[Trajectory]:
    """n episodes of every task with the engine's current policy (temperature 1), seeded."""
    return gym.collect(engine, reward)(list(tasks), n, torch.Generator().manual_seed(seed))


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def pass_rate(trajs: Sequence[Trajectory]) -> float:
    return mean(t.reward >= 1.0 for t in trajs)


def evaluate(engine: LocalEngine, gym: Gym, n_per_task: int, seed: int) -> dict[str, float]:
    """Train and held-out pass rates (hidden tests), invalid calls and reads per train episode.

    The same seed at every evaluation point: curves compare policies on common random numbers.
    """
    tr = episodes(engine, gym, gym.train, n_per_task, seed)
    ho = episodes(engine, gym, gym.heldout, n_per_task, seed + 1)
    return {"eval/pass_rate": pass_rate(tr), "eval/heldout_pass_rate": pass_rate(ho),
            "eval/invalid_per_episode": mean(t.info["n_invalid"] for t in tr),
            "eval/read_share": mean(t.info["n_reads"] > 0 for t in tr)}


def action_entropy(engine: LocalEngine, gym: Gym, trajs: Sequence[Trajectory]) -> float:
    """Mean next-token entropy (nats) at the policy's own action tokens."""
    batch = collate(trajs, gym.pad_id)
    return mean_action_entropy(engine.forward(batch).logits, batch.action_mask)


def describe(engine: LocalEngine, gym: Gym, n_per_task: int, seed: int) -> dict[str, float]:
    """`evaluate` plus the action entropy of the train episodes (seed §15.2 `describe`)."""
    tr = episodes(engine, gym, gym.train, n_per_task, seed)
    ho = episodes(engine, gym, gym.heldout, n_per_task, seed + 1)
    return {"train": pass_rate(tr), "heldout": pass_rate(ho),
            "invalid": mean(t.info["n_invalid"] for t in tr),
            "reads": mean(t.info["n_reads"] > 0 for t in tr),
            "entropy": action_entropy(engine, gym, tr)}


def probe(engine: LocalEngine, gym: Gym, group: int, seed: int) -> dict[str, float]:
    """A10: held-out pass, share of groups (one per task) with reward variance, action entropy."""
    trajs = episodes(engine, gym, gym.heldout, group, seed)
    rewards = torch.tensor([t.reward for t in trajs])  # [tasks * group]
    groups = torch.tensor([t.group for t in trajs])  # [tasks * group]
    return {"heldout": pass_rate(trajs), "informative": informative_group_share(rewards, groups),
            "entropy": action_entropy(engine, gym, trajs)}


def rft_round_summary(trajs: Sequence[Trajectory]) -> dict:
    """What one expert-iteration round sampled and kept (A5, A12)."""
    kept = select_episodes(trajs, "accepted")
    distinct = dedup_and_cap(kept, dedup=True, per_task_cap=0)
    first = Counter(t.info["actions"][0].split(" ")[0] if t.info["actions"] else "" for t in kept)
    return {
        "sample_pass": pass_rate(trajs), "kept": len(kept), "distinct": len(distinct),
        "solved": sorted({t.info["task"] for t in kept}),
        "first_action_edit_share": first.get("edit", 0) / max(1, len(kept)),
        "first_action_read_share": first.get("read", 0) / max(1, len(kept)),
        "shares_raw": {f: shares(kept, "family").get(f, 0.0) for f in FAMILIES},
        "shares_dedup": {f: shares(distinct, "family").get(f, 0.0) for f in FAMILIES},
        "hack_share": mean(t.info["hacked"] for t in kept),
        "verifier_calls": sum(t.info["submitted"] for t in trajs),
    }


def preference_pairs(trajs: Sequence[Trajectory], tasks: Sequence[BugFixTask], seed: int):
    """Offline pairs (seed §15.4): every success paired with a random failure of the same task."""
    rng, pairs = random.Random(seed), []
    for task in tasks:
        mine = [t for t in trajs if t.info["task"] == task.name]
        wins, losses = [t for t in mine if t.reward >= 1.0], [t for t in mine if t.reward < 1.0]
        if losses:
            pairs += [(w, rng.choice(losses)) for w in wins]
    return pairs
