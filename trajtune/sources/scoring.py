"""Rewards from scorers: `Scored(source, engine, functions, models)` gives a source's episodes the weighted
sum of reward functions (TRL's, `trajtune.sources.rewards`) and reward models (`RewardModel`).

One draw's scoring, top to bottom:

    1. score    every reward function once on the whole batch of completions, at the same time, in worker
                processes under their time limit (rank 0 calls them; the rewards are broadcast under
                torchrun), and every reward model on the rendered prompt + completion (sharded, gathered)
    2. combine  reward = the `weights` sum over the sources that scored the episode (None left out)
    3. mark     an episode whose reward call timed out is REWARD_ERROR, one no source scored UNSCORED
                (`trajectory.Outcome`): no loss or group baseline sees them

A reward function that raises or returns a non-reward stops the run with a message naming it, the
rows and its traceback (`RewardError`). The episodes come back with reward/<source>/mean and /std,
what the functions logged (reward/<function>/<name>), reward/failed, reward/unscored and
time/reward_s in their metrics. The episodes are one-turn answers to prompt tasks
(`trajtune.sources.data.PromptTask`): episode i answers `draw.tasks[i // draw.n]`.

Reward models as scorers also serve evaluation and best-of-N: `reward_model_scores(engine, trajs,
pad_id)` (the value head at each episode's last token: a Bradley-Terry model), `token_reward_scores` (an
outcome or process reward model: the head's per-token probabilities aggregated over the completion's tokens
or the step ends), `scorer(engine, kind, pad_id)` (the one a saved model's `RewardKind` says) and
`pair_accuracy(engine, pairs, pad_id)`.

The book's convention (ch.6 "Implementation", checklist 0.4): a reward model scores only finished
completions. `Scored(..., unfinished=...)` gives an unfinished one (no stop token: cut at the token budget)
a penalty instead of the model's score: by default 1 below the lowest score a reward model gave a finished
completion of the same batch, so a truncated answer is worse than every finished one whatever the model's
scale (TRL's `missing_eos_penalty` subtracts a fixed number from the score instead).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..engine.distributed import broadcast_object, sharded_map
from ..metrics import register
from ..objectives.reward_model import AGGREGATES, aggregate_scores, last_token_values, pairwise_accuracy
from ..objectives.reward_model import step_ends as _step_ends
from ..trajectory import Outcome, Owner, Trajectory, collate
from .base import Draw, Episodes, Source, Wrapper
from .rewards import RewardBatch, RewardError, RewardSet, RewardState, Scores, combine, source_metrics

log = logging.getLogger("trajtune.sources.scoring")

register("reward/unfinished", "completions a reward model did not score because they are unfinished (no stop "
         "token: cut at --max-new-tokens); each got --unfinished-reward instead (RLHF book ch.6)")
register("reward/*/member_std", "a reward-model ensemble's disagreement: the mean over completions of the std of "
         "its members' scores (trajtune.sources.ensemble)")

register("reward/*", "per reward source (a reward function's name, reward_model, reward_ensemble for several "
         "reward models, judge, rubric): reward/<name>/mean and "
         "/std over the completions it scored (None left out); reward/<function>/<name>: what the function "
         "logged with log_metric (mean); reward/failed: completions whose reward call ran past --reward-timeout; "
         "reward/unscored: completions no source scored (all None); both are left out of the update")

RM_NAME = "reward_model"
"""a reward model's name among the reward sources when there is one (its metrics: reward/reward_model/*)"""


def reward_model_scores(engine, trajs: Sequence[Trajectory], pad_id: int, batch_size: int = 256, *,
                        sort_by_length: bool = False) -> list[float]:
    """A reward model's scores of episodes (no gradient): its value head at each one's last real token.

    sort_by_length: batch the episodes shortest first, so each batch pads to a near length (book ch.9
    "Implementation details", checklist 9.4b: less padding, faster inference); the scores still come back in
    the order of `trajs`, equal to the unsorted ones (float rounding aside). Off by default."""
    order = sorted(range(len(trajs)), key=lambda i: len(trajs[i])) if sort_by_length else list(range(len(trajs)))
    scores = [0.0] * len(trajs)
    for i in range(0, len(trajs), batch_size):
        rows = order[i : i + batch_size]
        batch = collate([trajs[j] for j in rows], pad_id)
        values = engine.forward(batch, values=True).values  # [b, T]
        for j, v in zip(rows, last_token_values(values, batch.attention_mask).tolist(), strict=True):
            scores[j] = v
    return scores


@dataclass(frozen=True)
class RewardKind:
    """What a saved reward model is and how it scores (`reward_model.json` beside an HF model's weights)."""

    objective: str = "bt"
    """bt or plackett-luce: the head at the last token; orm / prm: the head per token or per step"""
    aggregate: str = "mean"
    """orm / prm: mean, min, product or last (objectives.reward_model.aggregate_scores)"""
    step_separator: str = "\n"
    """prm on text: the string that ends each step of a completion"""

    def __post_init__(self) -> None:
        if self.objective not in ("bt", "plackett-luce", "orm", "prm"):
            raise ValueError(f"RewardKind: objective must be bt, plackett-luce, orm or prm, got {self.objective!r}")
        if self.aggregate not in AGGREGATES:
            raise ValueError(f"RewardKind: aggregate must be one of {AGGREGATES}, got {self.aggregate!r}")

    @property
    def per_token(self) -> bool:
        return self.objective in ("orm", "prm")


def step_ends(traj: Trajectory) -> list[int]:
    """Positions of the last token of each step: `traj.info['step_ends']` where the data put them (steps inside
    one message, `trajtune.sources.data.step_trajectory`), else the last POLICY token of each policy turn."""
    return _step_ends(traj.owners, traj.turns, Owner.POLICY, traj.info.get("step_ends"))


def scored_positions(traj: Trajectory, objective: str) -> list[int]:
    """Where a token-level reward model reads its head: every completion (POLICY) token (orm), or the last
    token of each step (prm, `step_ends`)."""
    if objective == "orm":
        return [i for i, o in enumerate(traj.owners) if o == Owner.POLICY]
    return step_ends(traj)


def token_reward_scores(engine, trajs: Sequence[Trajectory], pad_id: int, objective: str = "orm",
                        aggregate: str = "mean", batch_size: int = 256) -> list[float]:
    """An outcome (orm) or process (prm) reward model's scores of episodes (no gradient): sigma of its head at
    `scored_positions`, aggregated (`aggregate_scores`: mean, min, product = sum of log p, last)."""
    out: list[float] = []
    for i in range(0, len(trajs), batch_size):
        part = trajs[i : i + batch_size]
        batch = collate(part, pad_id)
        values = engine.forward(batch, values=True).values.float().cpu()  # [b, T]
        mask = torch.zeros_like(values)
        for row, t in enumerate(part):
            mask[row, scored_positions(t, objective)] = 1.0
        out += aggregate_scores(values, mask, aggregate).tolist()
    return out


def scorer(engine, kind: RewardKind, pad_id: int):
    """trajs -> scores, as `kind` says (a `best_of_n` score, an evaluation's)."""
    if kind.per_token:
        return lambda trajs: token_reward_scores(engine, trajs, pad_id, kind.objective, kind.aggregate)
    return lambda trajs: reward_model_scores(engine, trajs, pad_id)


def pair_accuracy(engine, pairs: Sequence[tuple[Trajectory, Trajectory]], pad_id: int) -> float:
    """Share of (chosen, rejected) pairs whose chosen episode the reward model scores higher."""
    s = reward_model_scores(engine, [c for c, _ in pairs] + [r for _, r in pairs], pad_id)
    P = len(pairs)
    return float(pairwise_accuracy(torch.tensor(s[:P]), torch.tensor(s[P:])))


class RewardModel:
    """A trained reward model as a reward source: its score of the prompt + completion, rendered with the reward
    model's own chat template as it was trained (`renderer.render_samples`' last sample), scored in shares over
    the ranks. `engine`: a frozen engine on the model (with its value head); `kind`: how it scores (a
    Bradley-Terry model: the head at the last token; orm / prm: `token_reward_scores` with its aggregation, a
    PRM's steps cut at `kind.step_separator`)."""

    def __init__(self, engine, renderer, name: str = RM_NAME, kind: RewardKind | None = None):
        self.engine, self.renderer, self.name, self.kind = engine, renderer, name, kind or RewardKind()

    def __call__(self, batch: RewardBatch) -> list[float]:
        trajs = [self.render(prompt, batch.text(i), batch.where[i])
                 for prompt, i in zip(batch.prompts, range(len(batch)), strict=True)]
        return sharded_map(self.engine, trajs, self.scores)

    def render(self, prompt, text: str, where: str = "") -> Trajectory:
        """The prompt + completion as the model was trained on it (a PRM: the completion's steps marked)."""
        opening = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if self.kind.objective == "prm":
            from .data import DataError, split_steps, step_trajectory

            try:
                return step_trajectory(self.renderer, opening, split_steps(text, self.kind.step_separator),
                                       self.kind.step_separator, where)
            except DataError:  # a separator the tokenizer merged with the next step: the completion is one step
                pass
        return self.renderer.render_samples(opening + [{"role": "assistant", "content": text}])[-1]

    def scores(self, trajs: Sequence[Trajectory]) -> list[float]:
        pad = self.renderer.pad_id
        if self.kind.per_token:
            return token_reward_scores(self.engine, trajs, pad, self.kind.objective, self.kind.aggregate)
        return reward_model_scores(self.engine, trajs, pad)


def unfinished_scores(scores: Sequence[float | None], unfinished: Sequence[bool],
                      penalty: float | None = None) -> list[float | None]:
    """A reward model's scores with every unfinished completion's replaced (the book's convention: a reward model
    scores finished sequences only; ch.6 Implementation, checklist 0.4).

    scores [N] (None: not scored), unfinished [N] -> [N]: an unfinished completion gets `penalty`, or with None
    1 below the lowest score of a finished completion (0.0 when none finished: all equal, no signal)."""
    if len(scores) != len(unfinished):
        raise ValueError(f"unfinished_scores: {len(scores)} scores for {len(unfinished)} completions")
    if penalty is None:
        finished = [s for s, u in zip(scores, unfinished, strict=True) if not u and s is not None]
        penalty = min(finished) - 1.0 if finished else 0.0
    return [penalty if u and s is not None else s for s, u in zip(scores, unfinished, strict=True)]


class Scored(Wrapper):
    """`inner`'s episodes with rewards from `functions` and `models`, weighted (module docstring).

    engine:    the policy's engine (its step is the functions' `trainer_state.global_step`; under torchrun
               rank 0 calls the functions)
    functions: a `RewardSet` (closed with the source)
    models:    `RewardModel`s, after the functions in `weights`' order
    weights:   one per source (functions, then models); empty: 1 each
    max_steps: the run's optimizer steps (`trainer_state.max_steps`)
    unfinished, score_unfinished: a reward model's score of an unfinished episode (no stop token: cut at the token
               budget, `Trajectory.truncated`) is replaced by `unfinished_scores(..., unfinished)` (None: 1
               below the batch's lowest finished score), unless `score_unfinished`
    """

    def __init__(self, inner: Source, engine, functions: RewardSet, models: Sequence[RewardModel] = (),
                 weights: Sequence[float] = (), max_steps: int = 0, unfinished: float | None = None,
                 score_unfinished: bool = False):
        super().__init__(inner)
        self.engine, self.functions, self.models = engine, functions, list(models)
        self.names = [f.name for f in functions.functions] + [m.name for m in self.models]
        self.weights = list(weights) or [1.0] * len(self.names)
        if len(self.weights) != len(self.names):
            raise ValueError(f"Scored: {len(self.weights)} weights for {len(self.names)} reward sources {self.names}")
        self.max_steps = max_steps
        self.unfinished, self.score_unfinished = unfinished, score_unfinished

    def take(self, draw: Draw, ahead: Draw | None = None) -> Episodes:
        episodes = self.inner.take(draw, ahead)
        t0 = time.perf_counter()
        tasks = [task for task in draw.tasks for _ in range(draw.n)]  # episode i answers tasks[i]
        episodes.metrics.update(self.score(episodes.trajs, tasks))
        episodes.metrics["time/reward_s"] = time.perf_counter() - t0
        return episodes

    def score(self, trajs: list[Trajectory], tasks: Sequence[Any]) -> dict[str, float]:
        """Give every episode its reward (or its failed outcome) -> the batch's reward metrics."""
        batch = RewardBatch.of(tasks, [(t.info.get("actions") or [""])[-1] for t in trajs],
                               [t.tokens_of(Owner.POLICY) for t in trajs])
        scores = self._call_functions(batch)
        modelled: list[list[float | None]] = [list(m(batch)) for m in self.models]
        cut = [t.truncated for t in trajs]
        if not self.score_unfinished:
            modelled = [unfinished_scores(v, cut, self.unfinished) for v in modelled]
        values = scores.values + modelled
        totals = combine(values, self.weights)
        unscored = []
        for i, (t, total) in enumerate(zip(trajs, totals, strict=True)):
            t.info["rewards"] = {name: v[i] for name, v in zip(self.names, values, strict=True)}
            if scores.extras[i]:
                t.info["reward_extra"] = scores.extras[i]
            if not t.trainable:  # its environment failed: no reward to give
                continue
            if i in scores.failed:
                t.info["reward_error"] = scores.failed[i]
                t.outcome = Outcome.REWARD_ERROR
            elif total is None:
                unscored.append(i)
                t.outcome = Outcome.UNSCORED
            else:
                t.reward = total
        self._report(batch, scores, unscored)
        model_metrics = {k: v for m in self.models for k, v in getattr(m, "metrics", {}).items()}
        if self.models:
            model_metrics["reward/unfinished"] = float(sum(cut))
        return {**source_metrics(self.names, values), **scores.metrics, **model_metrics,
                "reward/failed": float(len(scores.failed)), "reward/unscored": float(len(unscored))}

    def _call_functions(self, batch: RewardBatch) -> Scores:
        """The functions' Scores: called on rank 0 only, broadcast (every rank gets the same rewards)."""
        if not self.functions.functions:
            return Scores([], {}, {}, [{} for _ in range(len(batch))])
        out: Scores | RewardError | None = None
        if self.engine.is_main:
            try:
                out = self.functions.score(batch, RewardState(self.engine.step, self.max_steps))
            except RewardError as e:
                out = e
        out = broadcast_object(out)
        if isinstance(out, RewardError):
            raise out
        assert out is not None
        return out

    def _report(self, batch: RewardBatch, scores: Scores, unscored: list[int]) -> None:
        n = len(batch)
        if len(unscored) == n:
            raise RewardError(f"no reward source scored any of the batch's {n} completions (every one returned "
                              f"None, e.g. for {batch.where[0]}); None means 'does not apply to this row' (or a "
                              "judge's verdict that did not parse), and every row needs at least one source that applies")
        if not self.engine.is_main:
            return
        for i in sorted(scores.failed)[:3]:
            log.warning("%s: the episode gets no reward and is left out of this update", scores.failed[i])
        if unscored:
            log.warning("every reward source returned None for %d of %d completions (%s ...): left out of this "
                        "update (TRL: unscorable)", len(unscored), n, batch.where[unscored[0]])

    def close(self) -> None:
        try:
            self.functions.close()
        finally:
            self.inner.close()
