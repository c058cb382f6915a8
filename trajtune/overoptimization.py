"""Over-optimization probe (RLHF book ch.14; checklist 14.1-14.2 and 0.7): a proxy reward, a gold reward and
the KL to the reference, side by side, on a fixed evaluation set.

The book's curve: "the training reward keeps climbing, but downstream quality eventually peaks and
declines", plotted "against training steps or KL distance" from the reference (ch.14, Quantitative
Over-Optimization; Bai et al. 2022 split the preference data in half for a train RM and a test RM).
`OverOptProbe` measures the three numbers of that plot; as a loop's `Run.evaluate` it logs them every
`eval_every` steps (checklist 14.2 [NOTE]: an `overopt_eval` callback):

    1. sample   `n` completions of each evaluation task from the policy, from the same seed every call
                (the same prompts and the same random numbers: the curve moves only because the policy does)
    2. grade    the proxy grader (what the run optimizes: usually the source's own reward) and every gold
                grader on those completions; each the mean over the completions it scored (None left out)
    3. KL       KL(pi || pi_ref) sampled on the same completions: per completion the sum over its
                POLICY tokens of log pi - log pi_ref (the k1 estimator, `objectives.kl.sequence_kl`),
                then the mean over completions -- the book's Monte Carlo KL (ch.15, checklist 15.2)

A grader maps the episodes (and the tasks they answer) to one score each, or None where it does not apply:

    episode_rewards()        the reward the source gave each episode (a `Scored` source's weighted
                             reward sources, an environment's verifier)
    batch_grader(scorer)     a `RewardBatch` scorer: a `sources.scoring.RewardModel`, a
                             `sources.ensemble.RewardEnsemble`, a judge, any `RewardBatch -> [N]` callable
    reward_set_graders(set)  each TRL-style reward function of a `sources.rewards.RewardSet`, by name
    verifier_grader(verify)  a per-row verifier `verify(task, reply) -> reward` (or `(reward, checks)`)

Metrics (registered below): overopt/proxy, overopt/gold (the first gold grader), overopt/gold/<name> (every
gold grader, when there are several), overopt/kl, overopt/graded (completions the KL and the scores are over), and
overopt/sd/<each of those> (the standard deviation over the completions: what a report needs to say whether two
evaluations differ beyond sampling noise).

The KL is the policy's at temperature 1 (what `engine.forward` computes); sampled at another temperature
the completions are not draws of that policy and the number is the sampled log-ratio, not the KL.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import torch

from .metrics import register
from .objectives.kl import sequence_kl
from .sources.base import Source
from .sources.episodes import sample_episodes
from .sources.rewards import RewardBatch
from .trajectory import Owner, Trajectory, collate

register("overopt/proxy", "over-optimization probe: mean proxy reward (what the run optimizes) of the fixed "
         "evaluation completions (overoptimization.OverOptProbe)")
register("overopt/gold", "over-optimization probe: mean gold reward (the first gold grader: a verifier, a "
         "held-out reward model) of the same completions")
register("overopt/gold/*", "over-optimization probe: mean score of each gold grader, by name, when there are several")
register("overopt/kl", "over-optimization probe: sampled KL(pi || pi_ref) of the same completions, nats per "
         "completion (sum over its POLICY tokens of log pi - log pi_ref, mean over completions)")
register("overopt/sd/*", "over-optimization probe: the standard deviation over the graded completions of the score "
         "or KL it names (overopt/sd/proxy, overopt/sd/gold/<name>, overopt/sd/kl): a difference of two evaluations "
         "has standard error sqrt(sd_a^2 / n_a + sd_b^2 / n_b), n = overopt/graded")
register("overopt/graded", "over-optimization probe: completions the probe's scores and KL are over (sampled "
         "and trainable)")

Grader = Callable[[Sequence[Any], Sequence[Trajectory]], list]
"""(tasks, episodes) -> [N] scores (float, or None where the grader does not apply); episode i answers tasks[i]"""


def reply_of(traj: Trajectory) -> str:
    """The completion's text: the episode's last action."""
    return (traj.info.get("actions") or [""])[-1]


def reward_batch(tasks: Sequence[Any], trajs: Sequence[Trajectory]) -> RewardBatch:
    """The episodes as the `RewardBatch` a scorer takes: `RewardBatch.of` for prompt rows (tasks with columns),
    else the task's prompt text and name (a gym's task: `prompt` and `name`, no columns)."""
    replies = [reply_of(t) for t in trajs]
    ids = [t.tokens_of(Owner.POLICY) for t in trajs]
    if all(hasattr(task, "columns") for task in tasks):
        return RewardBatch.of(tasks, replies, ids)
    return RewardBatch([task.prompt for task in tasks], replies, [list(i) for i in ids], {},
                       [getattr(task, "where", "") or task.name for task in tasks])


def episode_rewards() -> Grader:
    """The reward each episode came with from its source."""
    return lambda tasks, trajs: [t.reward for t in trajs]


def batch_grader(scorer: Callable[[RewardBatch], Sequence]) -> Grader:
    """A `RewardBatch` scorer (a reward model, an ensemble, a judge) as a grader."""
    return lambda tasks, trajs: list(scorer(reward_batch(tasks, trajs)))


def verifier_grader(verify: Callable[[Any, str], Any]) -> Grader:
    """A per-row verifier `verify(task, reply) -> reward or (reward, checks)` as a grader."""

    def grade(tasks: Sequence[Any], trajs: Sequence[Trajectory]) -> list:
        out = [verify(task, reply_of(t)) for task, t in zip(tasks, trajs, strict=True)]
        return [v[0] if isinstance(v, tuple) else v for v in out]

    return grade


def reward_set_graders(functions) -> dict[str, Grader]:
    """Every function of a `sources.rewards.RewardSet` (TRL-style reward functions) as a grader, by its name.
    The set is called once per batch of episodes: the first grader's call scores every function, the others read
    it. A row whose call ran past the time limit scores None."""
    last: dict = {}

    def grader(k: int) -> Grader:
        def grade(tasks: Sequence[Any], trajs: Sequence[Trajectory]) -> list:
            if last.get("trajs") is not trajs:
                last.update(trajs=trajs, scores=functions.score(reward_batch(tasks, trajs)))
            scores = last["scores"]
            return [None if i in scores.failed else v for i, v in enumerate(scores.values[k])]

        return grade

    return {f.name: grader(k) for k, f in enumerate(functions.functions)}


def mean_score(scores: Sequence) -> float:
    """Mean of the scores that are not None (NaN when none is)."""
    xs = [float(s) for s in scores if s is not None]
    return math.fsum(xs) / len(xs) if xs else float("nan")


def sd_score(scores: Sequence) -> float:
    """Sample standard deviation of the scores that are not None (0 for fewer than two)."""
    xs = [float(s) for s in scores if s is not None]
    if len(xs) < 2:
        return 0.0
    m = math.fsum(xs) / len(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))


@torch.no_grad()
def episode_kls(policy, reference, trajs: Sequence[Trajectory], pad_id: int) -> torch.Tensor:
    """Per episode, the sum over its POLICY tokens of log pi - log pi_ref (k1, `sequence_kl`): [N] episodes -> [N].
    `policy`, `reference`: engines (their `forward`)."""
    batch = collate(list(trajs), pad_id)
    mask = batch.action_mask  # [N, T-1]
    logp = policy.forward(batch, positions="actions").logprobs  # [N, T-1]
    ref_logp = reference.forward(batch, positions="actions").logprobs  # [N, T-1]
    per_episode = sequence_kl(logp.float(), ref_logp.float(), mask, kind="k1", reduce="sum")  # [N]
    assert per_episode.shape == (len(trajs),)
    return per_episode


def sampled_kl(policy, reference, trajs: Sequence[Trajectory], pad_id: int) -> float:
    """KL(pi || pi_ref) from the policy's own samples: the mean over the [N] episodes of `episode_kls`."""
    return float(episode_kls(policy, reference, trajs, pad_id).mean())


class OverOptProbe:
    """Proxy reward, gold reward(s) and KL(pi || pi_ref) of the policy on a fixed evaluation set (module docstring).

    policy:    the trained engine (its `forward`); `source` samples from it
    reference: a frozen engine on the starting policy (e.g. `Run.reference`, `engine.reference_engine()` before
               training)
    source:    the episodes of the policy (a `Source`: `EpisodeSource`, `Scored` ...), sampled `n` per task
    tasks:     the evaluation tasks (fixed: the same every call)
    proxy:     the grader the run optimizes (usually `episode_rewards()`)
    gold:      {name: grader}; the first is overopt/gold
    seed:      the evaluation's seed: every call samples from a generator seeded with it

    `probe(step) -> {"overopt/proxy", "overopt/gold", "overopt/kl", ...}`: use it as `Run.evaluate`.
    `history` keeps every call's row (with its step).
    """

    def __init__(self, policy, reference, source: Source, tasks: Sequence[Any], n: int, proxy: Grader,
                 gold: Mapping[str, Grader], pad_id: int, seed: int):
        if not tasks or n < 1:
            raise ValueError(f"OverOptProbe: needs evaluation tasks and n >= 1 samples each (got {len(tasks)} tasks, "
                             f"n={n})")
        if not gold:
            raise ValueError("OverOptProbe: needs at least one gold grader (gold={name: grader})")
        self.policy, self.reference, self.source = policy, reference, source
        self.tasks, self.n, self.proxy, self.gold = list(tasks), n, proxy, dict(gold)
        self.pad_id, self.seed = pad_id, seed
        self.history: list[dict] = []

    def __call__(self, step: int) -> dict[str, float]:
        # 1. sample: the same tasks and random numbers every call
        trajs = sample_episodes(self.source, self.tasks, self.n, self.seed)
        tasks = [task for task in self.tasks for _ in range(self.n)]  # episode i answers tasks[i] (task-major)
        kept = [i for i, t in enumerate(trajs) if t.trainable]
        if not kept:
            raise RuntimeError(f"OverOptProbe: every one of the {len(trajs)} evaluation episodes failed (environment "
                               f"or reward): nothing to score at step {step}")
        trajs, tasks = [trajs[i] for i in kept], [tasks[i] for i in kept]
        # 2. grade: the proxy and every gold grader on the same completions
        proxy = self.proxy(tasks, trajs)
        row = {"overopt/proxy": mean_score(proxy), "overopt/sd/proxy": sd_score(proxy)}
        golds = {name: grade(tasks, trajs) for name, grade in self.gold.items()}
        first = next(iter(golds.values()))
        row.update({"overopt/gold": mean_score(first), "overopt/sd/gold": sd_score(first)})
        if len(golds) > 1:
            row.update({f"overopt/gold/{name}": mean_score(v) for name, v in golds.items()})
            row.update({f"overopt/sd/gold/{name}": sd_score(v) for name, v in golds.items()})
        # 3. KL(pi || pi_ref) on them
        kl = episode_kls(self.policy, self.reference, trajs, self.pad_id)  # [N]
        row.update({"overopt/kl": float(kl.mean()), "overopt/sd/kl": sd_score(kl.tolist())})
        row["overopt/graded"] = float(len(trajs))
        self.history.append({"step": step, **row})
        return row


def peak(steps: Sequence[float], values: Sequence[float]) -> tuple[float, float]:
    """(the step where `values` is highest, that value): the first such step on a tie."""
    if len(steps) != len(values) or not values:
        raise ValueError(f"peak: {len(steps)} steps and {len(values)} values (equal, and at least one)")
    i = max(range(len(values)), key=lambda j: (values[j], -j))
    return steps[i], values[i]


def fit_scaling_law(kl: Sequence[float], gold: Sequence[float], form: str = "rl") -> dict[str, float]:
    """Gao et al.'s over-optimization forms (checklist 14.8 [EXT]) fitted by least squares to a gold curve, with
    d = sqrt(KL) and R the gold score's gain over its value at KL 0:

        best-of-n:  R(d) = d (alpha - beta d)          (linear in alpha, beta)
        rl:         R(d) = d (alpha - beta log d)      (linear in alpha, beta; d > 0 only)

    kl [n] >= 0 nats, gold [n] (the first point is the reference, KL 0) -> {"alpha", "beta", "d_peak" (where the
    fitted gold peaks: alpha / (2 beta), or exp(alpha / beta - 1) for rl; inf when beta <= 0), "r2"}."""
    if form not in ("bon", "rl"):
        raise ValueError(f"fit_scaling_law: form must be 'bon' or 'rl', got {form!r}")
    if len(kl) != len(gold) or len(kl) < 3:
        raise ValueError(f"fit_scaling_law: needs equal kl and gold lists of at least 3 points, got {len(kl)}, "
                         f"{len(gold)}")
    if min(kl) < 0:
        raise ValueError("fit_scaling_law: a KL is negative")
    base = gold[min(range(len(kl)), key=lambda i: kl[i])]
    points = [(math.sqrt(k), g - base) for k, g in zip(kl, gold) if k > 0]
    if len(points) < 2:
        raise ValueError("fit_scaling_law: needs at least 2 points with KL > 0")
    x1 = torch.tensor([d for d, _ in points], dtype=torch.float64)
    x2 = -x1 * (x1 if form == "bon" else x1.log())
    X = torch.stack([x1, x2], 1)  # [n, 2]
    y = torch.tensor([r for _, r in points], dtype=torch.float64)
    alpha, beta = torch.linalg.lstsq(X, y[:, None]).solution.squeeze(1).tolist()
    resid = y - X @ torch.tensor([alpha, beta], dtype=torch.float64)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid ** 2).sum()) / ss_tot if ss_tot > 0 else float("nan")
    if beta <= 0:
        d_peak = float("inf")
    else:
        d_peak = alpha / (2 * beta) if form == "bon" else math.exp(alpha / beta - 1)
    return {"alpha": alpha, "beta": beta, "d_peak": d_peak, "r2": r2}
