"""Rewards from graders: `Scored(source, engine, graders)` gives a source's episodes the weighted sum of their
graders' scores (`graders.Weighted`: reward functions, TRL's, `trajtune.sources.rewards`; reward models,
`RewardModel`; ensembles, judges, rubrics).

One draw's scoring, top to bottom:

    1. score    every grader once on the whole batch of completions: the reward functions at the same time, in
                worker processes under their time limit (rank 0 calls them; the rewards are broadcast under
                torchrun), then every reward model on the rendered prompt + completion (sharded, gathered)
    2. combine  reward = the weighted sum over the graders that scored the episode (None left out)
    3. mark     an episode whose reward call timed out is REWARD_ERROR, one no grader scored UNSCORED
                (`trajectory.Outcome`): no loss or group baseline sees them

A reward function that raises or returns a non-reward stops the run with a message naming it, the
rows and its traceback (`RewardError`). The episodes come back with reward/<grader>/mean and /std,
what the graders logged (reward/<function>/<name>, a judge's reward/judge/...), reward/failed, reward/unscored
and time/reward_s in their metrics. The episodes are one-turn answers to prompt tasks
(`trajtune.sources.data.PromptTask`): episode i answers `draw.tasks[i // draw.n]`.

Reward models as scorers also serve evaluation and best-of-N: `reward_model_scores(engine, trajs,
pad_id)` (the value head at each episode's last token: a Bradley-Terry model), `token_reward_scores` (an
outcome or process reward model: the head's per-token probabilities aggregated over the completion's tokens
or the step ends), `scorer(engine, kind, pad_id)` (the one a saved model's `RewardKind` says) and
`pair_accuracy(engine, pairs, pad_id)`.

The book's convention (ch.6 "Implementation", checklist 0.4): a reward model scores only finished
completions. `Scored(..., unfinished=...)` gives an unfinished one (no stop token: cut at the token budget)
a penalty instead of a `finished_only` grader's score: by default 1 below the lowest score that grader gave a
finished completion of the same batch, so a truncated answer is worse than every finished one whatever the
model's scale (TRL's `missing_eos_penalty` subtracts a fixed number from the score instead).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..engine.distributed import broadcast_object, sharded_map
from ..metrics import register
from ..objectives.reward_model import AGGREGATES, aggregate_scores, last_token_values, pairwise_accuracy
from ..objectives.reward_model import step_ends as _step_ends
from ..trajectory import Outcome, Owner, Trajectory, collate
from .base import Draw, Episodes, Schedule, Source, Wrapper
from .graders import Grades, Weighted, check_faults, grade_all
from .rewards import RewardBatch, RewardError, RewardState, combine, source_metrics

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
    """A trained reward model as a grader (`graders.Grader`): its score of the prompt + completion, rendered with
    the reward model's own chat template as it was trained (`renderer.render_samples`' last sample), scored in
    shares over the ranks. `engine`: a frozen engine on the model (with its value head); `kind`: how it scores (a
    Bradley-Terry model: the head at the last token; orm / prm: `token_reward_scores` with its aggregation, a
    PRM's steps cut at `kind.step_separator`)."""

    finished_only = True
    main_only = False

    def __init__(self, engine, renderer, name: str = RM_NAME, kind: RewardKind | None = None):
        self.engine, self.renderer, self.name, self.kind = engine, renderer, name, kind or RewardKind()
        self.metrics: dict[str, float] = {}

    def start(self, batch: RewardBatch, state: RewardState) -> Callable[[], Grades]:
        return lambda: Grades(self(batch), self.metrics)

    def close(self) -> None:
        pass

    def __call__(self, batch: RewardBatch) -> list[float]:
        trajs = [self.render(prompt, batch.text(i), batch.where[i])
                 for prompt, i in zip(batch.prompts, range(len(batch)), strict=True)]
        return sharded_map(self.engine, trajs, self.scores)

    def render(self, prompt, text: str, where: str = "") -> Trajectory:
        """The prompt + completion as the model was trained on it (a PRM: the completion's steps marked)."""
        opening = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if self.kind.objective == "prm":
            from .data import DataError
            from .reward_data import split_steps, step_trajectory

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
    """`inner`'s episodes with rewards from `graders`, weighted (module docstring).

    engine:    the policy's engine (its step is the graders' `trainer_state.global_step`; under torchrun rank 0
               starts the `main_only` graders, reward functions, and broadcasts their grades)
    graders:   the one weighted list (`graders.Weighted`: a grader and its weight; closed with the source)
    max_steps: the run's optimizer steps (`trainer_state.max_steps`)
    unfinished, score_unfinished: a `finished_only` grader's score of an unfinished episode (no stop token: cut at
               the token budget, `Trajectory.truncated`) is replaced by `unfinished_scores(..., unfinished)`
               (None: 1 below the batch's lowest finished score), unless `score_unfinished`
    max_fault_share: more rows failed (a reward call past its time limit) than this share of a batch stop the run
    """

    def __init__(self, inner: Source, engine, graders: Sequence[Weighted], max_steps: int = 0,
                 unfinished: float | None = None, score_unfinished: bool = False, max_fault_share: float = 0.5):
        super().__init__(inner)
        self.engine, self.graders = engine, list(graders)
        self.names = [w.grader.name for w in self.graders]
        if len(set(self.names)) < len(self.names):
            raise ValueError(f"Scored: two graders have the same name: {self.names}")
        self.weights = [w.weight for w in self.graders]
        self.max_steps, self.max_fault_share = max_steps, max_fault_share
        self.unfinished, self.score_unfinished = unfinished, score_unfinished

    def take(self, draw: Draw, ahead: Schedule | None = None) -> Episodes:
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
        grades = self._grade(batch)
        failed = check_faults(grades, batch, self.max_fault_share)
        cut = [t.truncated for t in trajs]
        finished_only = [w.grader.finished_only for w in self.graders]
        values = [unfinished_scores(g.scores, cut, self.unfinished) if only and not self.score_unfinished
                  else list(g.scores) for g, only in zip(grades, finished_only, strict=True)]
        extras: list[dict] = [dict() for _ in range(len(batch))]
        for g in grades:
            for col, xs in g.extras.items():
                for i, x in zip(range(len(batch)), xs):
                    extras[i][col] = x
        totals = combine(values, self.weights)
        unscored = []
        for i, (t, total) in enumerate(zip(trajs, totals, strict=True)):
            t.info["rewards"] = {name: v[i] for name, v in zip(self.names, values, strict=True)}
            if extras[i]:
                t.info["reward_extra"] = extras[i]
            if not t.trainable:  # its environment failed: no reward to give
                continue
            if i in failed:
                t.info["reward_error"] = failed[i]
                t.outcome = Outcome.REWARD_ERROR
            elif total is None:
                unscored.append(i)
                t.outcome = Outcome.UNSCORED
            else:
                t.reward = total
        self._report(batch, failed, unscored)
        metrics = {k: v for g in grades for k, v in g.metrics.items()}
        if any(finished_only):
            metrics["reward/unfinished"] = float(sum(cut))
        return {**source_metrics(self.names, values), **metrics,
                "reward/failed": float(len(failed)), "reward/unscored": float(len(unscored))}

    def _grade(self, batch: RewardBatch) -> list[Grades]:
        """Every grader's Grades: the `main_only` ones started together on rank 0 and their grades (or the
        RewardError one raised) broadcast, then the others on every rank, in order."""
        state = RewardState(self.engine.step, self.max_steps)
        main = [w.grader for w in self.graders if w.grader.main_only]
        out: list[Grades] | RewardError | None = None
        if main and self.engine.is_main:
            try:
                out = grade_all(main, batch, state)
            except RewardError as e:
                out = e
        if main:
            out = broadcast_object(out)
        if isinstance(out, RewardError):
            raise out
        ranked = iter(out or [])
        rest = iter(grade_all([w.grader for w in self.graders if not w.grader.main_only], batch, state))
        return [next(ranked) if w.grader.main_only else next(rest) for w in self.graders]

    def _report(self, batch: RewardBatch, failed: dict[int, str], unscored: list[int]) -> None:
        n = len(batch)
        if len(unscored) == n:
            raise RewardError(f"no reward source scored any of the batch's {n} completions (every one returned "
                              f"None, e.g. for {batch.where[0]}); None means 'does not apply to this row' (or a "
                              "judge's verdict that did not parse), and every row needs at least one source that "
                              "applies")
        if not self.engine.is_main:
            return
        for i in sorted(failed)[:3]:
            log.warning("%s: the episode gets no reward and is left out of this update", failed[i])
        if unscored:
            log.warning("every reward source returned None for %d of %d completions (%s ...): left out of this "
                        "update (TRL: unscorable)", len(unscored), n, batch.where[unscored[0]])

    def close(self) -> None:
        try:
            for w in self.graders:
                w.grader.close()
        finally:
            self.inner.close()
