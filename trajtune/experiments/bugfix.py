"""The BugFix gym as the experiments see it: tasks, data sources, measurements, the weak base.

Shared by the agent experiment (`experiments/agent/`, seed agent-rl ch.15) and the
iw-SFT comparison on BugFix (`experiments/iw_sft/bugfix.py`, REPRODUCE C4); neither
imports the other. Measurements return plain floats and dicts so stages can hand them
across processes and into the reports.

    Gym                  tokenizer, renderer, train / held-out tasks, rollout limits, the stage's counters;
                         `Gym.source(engine)`: the engine's episodes in the gym (a source for the loops)
    costs                what a draw cost: sampled episodes, verifier calls (for `Measured`)
    scripted_play        episodes of a scripted policy (oracle / blind / random)
    episodes             the engine's own episodes, n per task, seeded (outside a loop: evaluation)
    evaluate             train / held-out pass, invalid calls, reads (every eval point)
    describe             evaluate + action entropy (seed §15.2 `describe`)
    probe                held-out pass, informative groups, entropy (A10)
    rft_round_summary    what a round of expert iteration kept (A5, A12)
    preference_pairs     offline DPO pairs from one sample (seed §15.4)
    seeded, eval_seed    every loop's and every evaluation's seed, derived from the experiment's one seed
    new_model, load_engine, train_weak_base
                         the model, a stage's engine on an earlier stage's weights, the weak base (A2)
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..algorithms.common import dedup_and_cap, select_episodes, shares
from ..algorithms.sft import SFTConfig, train_sft
from ..sources.base import Draw
from ..sources.base import Source
from ..sources.build import episode_source
from ..sources.sampling import SamplingConfig
from ..engine import Engine, OptimConfig
from ..envs.bugfix import FAMILY_OP, OPS, BugFixEnv, build_tokenizer, parse_action
from ..envs.bugfix_tasks import FAMILIES, BugFixTask, make_tasks
from ..envs.scripted import bugfix_policy
from ..evaluation import informative_group_share, mean_action_entropy
from ..models.tiny import TinyConfig, TinyTransformer, load_model
from ..sources.rollout import scripted_rollout
from ..runs.stages import StageContext
from ..text.render import Renderer
from ..text.tokenizers import WordTokenizer
from ..trajectory import Owner, Trajectory, collate
from ..metrics import register
from ..seeding import derive


@dataclass
class Gym:
    """The BugFix gym with one tokenizer and one renderer (wrappers on, the rollout format).

    counters: where the evaluations' episodes add their wall seconds (`sampling_s`: `episodes`); a stage passes
    `ctx.counters` so the runner reports each stage's sampling share (its loops' add up there through `ctx.run`)."""

    max_turns: int = 6
    max_action_tokens: int = 8
    episode_seeds: bool = False
    """every episode samples from its own generator (implied under torchrun: `sources.episodes.EpisodeSource`)"""
    counters: dict = field(default_factory=dict)
    tok: WordTokenizer = field(default_factory=build_tokenizer)
    train: list[BugFixTask] = field(default_factory=lambda: make_tasks("train"))
    heldout: list[BugFixTask] = field(default_factory=lambda: make_tasks("heldout"))

    def __post_init__(self) -> None:
        self.renderer = Renderer(self.tok)
        self.counters.setdefault("sampling_s", 0.0)  # wall time spent in rollouts (sampling + environments)

    @property
    def pad_id(self) -> int:
        return self.tok.pad_id

    def sampling(self, section: SamplingConfig | None = None) -> SamplingConfig:
        """How an action is sampled: up to `max_action_tokens` tokens at temperature 1, each token drawn as
        torch.multinomial draws it; where the episodes run: `section`'s fields (a run's sampling section; default
        here, on-policy)."""
        return dataclasses.replace(section or SamplingConfig(), max_new_tokens=self.max_action_tokens, draw="race",
                                   share_prompts=False)

    def source(self, engine: Engine, reward: str = "hidden", sampling: SamplingConfig | None = None, *,
               measure: Callable[[list[Trajectory]], dict[str, float]] | None = None, rl=None) -> Source:
        """The engine's episodes in the gym, a source for the loops (`trajtune.sources.build.episode_source`),
        sampled as `self.sampling(sampling)` says (`sampling`: a run's section, e.g. one update ahead in a sampler
        process, with `rl` the RL loop's config); `measure`: the run's counts added to each draw's metrics. Under
        torchrun every rank samples its shard of the episodes and all ranks get the whole list."""
        return episode_source(self.sampling(sampling), engine, BugFixEnvFactory(reward), self.renderer, "bugfix",
                              max_turns=self.max_turns, measure=measure, rl=rl, episode_seeds=self.episode_seeds)


@dataclass(frozen=True)
class BugFixEnvFactory:
    """`make_env` of a BugFix source: a fresh `BugFixEnv(reward)` per episode (picklable, for a sampler process)."""

    reward: str = "hidden"

    def __call__(self) -> BugFixEnv:
        return BugFixEnv(reward=self.reward)


def stage_gym(ctx: StageContext, max_turns: int = 6, max_action_tokens: int = 8, episode_seeds: bool = False) -> Gym:
    """The stage's gym, its rollouts timed into the stage's `ctx.counters["sampling_s"]`."""
    return Gym(max_turns, max_action_tokens, episode_seeds, counters=ctx.counters)


# --- seeds ----------------------------------------------------------------------------------
def seeded(loop_config, seed: int, offset: int):
    """The loop's config with its seed derived from the experiment's one seed."""
    return dataclasses.replace(loop_config, seed=derive(seed, offset))


def eval_seed(seed: int, k: int = 0) -> int:
    """Seed of evaluation k: the same episodes' random numbers at every evaluation point."""
    return derive(seed, 17 + 2 * k)


# --- data sources ---------------------------------------------------------------------------
def scripted_play(gym: Gym, kind: str, seeds: Sequence[int], tasks: Sequence[BugFixTask],
                  renderer: Renderer | None = None, ops: Sequence[str] = OPS) -> list[Trajectory]:
    """One episode of scripted policy `kind` per (seed, task), rendered by `renderer` (default: the gym's);
    blind and random play edit with `ops` only (`envs.scripted.bugfix_policy`)."""
    r = renderer or gym.renderer
    return [scripted_rollout(bugfix_policy(kind, s, ops), BugFixEnv(), t, r, max_turns=gym.max_turns,
                             max_action_tokens=gym.max_action_tokens) for s in seeds for t in tasks]


def episodes(engine: Engine, gym: Gym, tasks: Sequence[BugFixTask], n: int, seed: int,
             reward: str = "hidden") -> list[Trajectory]:
    """n episodes of every task with the engine's current policy (temperature 1), seeded; their wall time is added
    to the gym's counters."""
    source = gym.source(engine, reward)
    draw = source.take(Draw(list(tasks), n, torch.Generator().manual_seed(seed)))
    gym.counters["sampling_s"] += draw.metrics["time/sampling_s"]
    return draw.trajs


def costs(trajs: Sequence[Trajectory]) -> dict[str, int]:
    """What a draw cost, for the cost table (a `Measured` source's metrics): sampled episodes, verifier calls
    (submits)."""
    return {"cost/sampled": len(trajs), "cost/verifier_calls": sum(t.info.get("submitted", 0) for t in trajs)}


register("rollout/malformed_token_share", "share of the step's POLICY tokens in calls the gym could not parse (BugFix: "
         "invalid calls; a policy losing its format fills its turns with them)")
register("rollout/turns_gap", "in groups whose rewards differ: mean policy turns of a failing episode minus of a "
                              "passing "
         "one (> 0: the token-sum loss gives the once-per-turn tokens, e.g. the call's closing token, a net push down)")


def format_measures(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """What keeps or loses the call format in a step's episodes (a `Measured` source's metrics; issue 32's RL-only
    collapse): `rollout/malformed_token_share` and `rollout/turns_gap` (documented above)."""
    policy = int(Owner.POLICY)
    bad = total = 0
    turns: dict[int, list[tuple[float, int]]] = {}
    for t in trajs:
        own = [tu for o, tu in zip(t.owners, t.turns, strict=True) if o == policy]
        order = sorted(set(own))
        invalid = {tu for tu, a in zip(order, t.info.get("actions", []), strict=False) if parse_action(a) is None}
        bad += sum(tu in invalid for tu in own)
        total += len(own)
        turns.setdefault(t.group, []).append((t.reward, len(order)))
    gaps = []
    for group in turns.values():
        won = [n for r, n in group if r >= 1.0]
        lost = [n for r, n in group if r < 1.0]
        if won and lost:
            gaps.append(mean(lost) - mean(won))
    return {"rollout/malformed_token_share": bad / max(total, 1), "rollout/turns_gap": mean(gaps)}


def measured(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """`costs` and `format_measures` of a draw (the RL stages' `Measured` source)."""
    return {**costs(trajs), **format_measures(trajs)}


def total_costs(rows: Sequence[dict]) -> dict[str, int]:
    """The cost table's counts summed over a loop's rows (its `Measured` source's cost/* metrics)."""
    return {"sampled": sum(r.get("cost/sampled", 0) for r in rows),
            "verifier_calls": sum(r.get("cost/verifier_calls", 0) for r in rows)}


def preference_pairs(trajs: Sequence[Trajectory], tasks: Sequence[BugFixTask], seed: int):
    """Offline pairs (seed §15.4): every success paired with a random failure of the same task."""
    rng, pairs = random.Random(seed), []
    for task in tasks:
        mine = [t for t in trajs if t.info["task"] == task.name]
        wins, losses = [t for t in mine if t.reward >= 1.0], [t for t in mine if t.reward < 1.0]
        if losses:
            pairs += [(w, rng.choice(losses)) for w in wins]
    return pairs


# --- measurements ---------------------------------------------------------------------------
def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def pass_rate(trajs: Sequence[Trajectory]) -> float:
    return mean(t.reward >= 1.0 for t in trajs)


def pass_sources(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Where a policy's passes come from: the share of passing episodes whose every edit came before any read,
    with one edit (`blind_one`: a guess, what the seed's RFT keeps) or several (`blind_stacked`: another family's op
    leaves a listing unchanged, so blind edits stack), and the share with an edit after a read (`after_read`);
    `passes`: how many passed, `first_read`: the share of all episodes whose first action is a read."""
    def blind(t: Trajectory) -> bool:
        acts = t.info["actions"]
        return "read" not in acts or all(i < acts.index("read") for i, a in enumerate(acts) if a.startswith("edit "))

    won = [t for t in trajs if t.reward >= 1.0]
    n = max(len(won), 1)
    return {"passes": len(won), "blind_one": sum(blind(t) and len(t.info["edits"]) == 1 for t in won) / n,
            "blind_stacked": sum(blind(t) and len(t.info["edits"]) > 1 for t in won) / n,
            "after_read": sum(not blind(t) for t in won) / n,
            "first_read": mean(bool(t.info["actions"]) and t.info["actions"][0] == "read" for t in trajs)}


def evaluate(engine: Engine, gym: Gym, n_per_task: int, seed: int) -> dict[str, float]:
    """Train and held-out pass rates (hidden tests), invalid calls and reads per train episode.

    The same seed at every evaluation point: curves compare policies on common random numbers.
    """
    tr = episodes(engine, gym, gym.train, n_per_task, seed)
    ho = episodes(engine, gym, gym.heldout, n_per_task, seed + 1)
    return {"eval/pass_rate": pass_rate(tr), "eval/heldout_pass_rate": pass_rate(ho),
            "eval/invalid_per_episode": mean(t.info["n_invalid"] for t in tr),
            "eval/read_share": mean(t.info["n_reads"] > 0 for t in tr)}


def action_entropy(engine: Engine, gym: Gym, trajs: Sequence[Trajectory]) -> float:
    """Mean next-token entropy (nats) at the policy's own action tokens."""
    batch = collate(trajs, gym.pad_id)
    return mean_action_entropy(engine.forward(batch, logits=True).logits, batch.action_mask)


def describe(engine: Engine, gym: Gym, n_per_task: int, seed: int) -> dict[str, float]:
    """`evaluate` plus the action entropy of the train episodes (seed §15.2 `describe`)."""
    tr = episodes(engine, gym, gym.train, n_per_task, seed)
    ho = episodes(engine, gym, gym.heldout, n_per_task, seed + 1)
    return {"train": pass_rate(tr), "heldout": pass_rate(ho),
            "invalid": mean(t.info["n_invalid"] for t in tr),
            "reads": mean(t.info["n_reads"] > 0 for t in tr),
            "entropy": action_entropy(engine, gym, tr)}


def probe(engine: Engine, gym: Gym, group: int, seed: int) -> dict[str, float]:
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


# --- models and the weak base -----------------------------------------------------------------
def new_model(seed: int, gym: Gym, dim: int = 64, n_layers: int = 2, n_heads: int = 4,
              tied: bool = False, positions: str = "learned") -> TinyTransformer:
    """A fresh TinyTransformer over the gym's vocabulary, initialised from `seed`.

    Untied output layer by default: with the GPT-2 tied layout a held-out function name, a token no
    training input contains, is still pushed by every output softmax (Adam moves its row as far as
    any trained token's: norm ~1.0 after the weak base) and reaches the held-out listing as noise;
    and oracle SFT learns the listing -> edit map about twice as slowly (seed 0, train pass at SFT
    step 20: 0.57 tied, 0.97 untied; the seed's 0.80)."""
    torch.manual_seed(seed)
    return TinyTransformer(TinyConfig(gym.tok.vocab_size, dim, n_layers, n_heads, max_len=512, tied=tied,
                                      positions=positions))


def load_engine(ctx: StageContext, checkpoint: str, optim: OptimConfig | None = None) -> Engine:
    """A fresh optimizer on the weights of run_dir/<checkpoint> (an earlier stage's checkpoint or snapshot)."""
    model, _ = load_model(ctx.run_dir / checkpoint)
    return ctx.engine(model, optim)


def train_weak_base(ctx: StageContext, gym: Gym, seed: int, sft: SFTConfig, optim: OptimConfig, *,
                    play_seeds: int = 32, describe_samples: int = 8, dim: int = 64, n_layers: int = 2,
                    n_heads: int = 4, tied: bool = False, positions: str = "learned",
                    blind_spot: str | None = None, coverage_samples: int = 0) -> dict:
    """A2: SFT a fresh model on format-correct, skill-free play (blind + random), saved as the stage's
    checkpoint. `sft` is used as given (its seed already derived); the defaults are the flagship's.

    play_seeds: episodes per (policy, task). 32 (1,280 episodes), not the seed's 4: 160 episodes over
    150 steps of 32 are each seen ~30 times, and the base memorises every task's own scripted moves
    (low action entropy, 0.17-0.39), which oracle SFT has to unlearn before the listing can decide
    the edit; with 1,280 the base keeps the policies' spread (entropy 0.5-0.6) and the cold start
    (oracle SFT step 20) passes 0.91-0.94 of the train tasks on seeds 0-2, against 0.64-0.79.

    blind_spot: a task family whose op the blind and random play never use, so the base never sees that
    family solved (the seed's weak base never solves `init`); None: every op.
    coverage_samples: > 0 also samples this many episodes of every train task from the base and returns the
    tasks any of them solves (`coverage`: what expert iteration from this base can reach, A5)."""
    if blind_spot is not None and blind_spot not in FAMILY_OP:
        raise ValueError(f"blind_spot must be one of {', '.join(FAMILY_OP)} or None; got {blind_spot!r}")
    ops = tuple(op for op in OPS if blind_spot is None or op != FAMILY_OP[blind_spot])
    seeds = [seed * 100 + s for s in range(play_seeds)]
    play = scripted_play(gym, "blind", seeds, gym.train, ops=ops) + scripted_play(gym, "random", seeds, gym.train,
                                                                                  ops=ops)
    engine = ctx.engine(new_model(seed, gym, dim, n_layers, n_heads, tied, positions), optim)
    train_sft(engine, play, sft, gym.pad_id, run=ctx.run())
    ctx.save_model(engine.model, gym.tok, meta={"stage": ctx.name})
    out = {"describe": describe(engine, gym, describe_samples, eval_seed(seed, 1)),
           "scripted_episodes": len(play),
           "blind_pass": sum(t.reward for t in play[: len(play) // 2]) / (len(play) // 2)}
    if coverage_samples:
        sample = episodes(engine, gym, gym.train, coverage_samples, derive(seed, 23))
        out["coverage"] = sorted({t.info["task"] for t in sample if t.reward >= 1.0})
        out["coverage_samples"] = coverage_samples
    return out
