"""Evaluation statistics: pass@k, maj@k, pass^k, distinct answers, entropy, KL, informative groups, hacks,
multiple-choice scoring by conditional log-likelihood (Elo / Bradley-Terry ratings from pairwise verdicts:
`trajtune.ratings`), and `score_policy`: a policy's mean reward, pass@k, token budget and per-task table on a
list of tasks.

Pure functions of counts, answers, verdicts, trajectories and tensors; nothing here trains. The function
that samples (`score_policy`) does it through the source it is given (`trajtune.sources.base.Source`,
e.g. an `EpisodeSource`), and the one that reads log-probs (`multiple_choice_logprobs`) through an
engine's `forward` and a renderer, so this module knows nothing about model classes or environments.
Sources: RLHF book ch.16 "Evaluation" (checklist 16.2: (b) maj@k, (c) pass@k [EXT]: Chen et al.
2021's unbiased estimator, (d) conditional log-likelihood scoring of the letter vs the answer string;
16.4 Elo rankings and [EXT] a Bradley-Terry fit; 16.5 the inference token budget), ch.13 (pass^k of
tau-bench, checklist 13.6 [EXT]), post-training ch.13 (distinct answers per k samples, share of groups
with signal), agent-rl ch.15 / REPRODUCE A10, A13 (informative groups, reward hacking).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Sequence

import torch

from .logprobs import entropy_from_logits, masked_mean
from .metrics import register
from .objectives.advantages import group_reward_range
from .objectives.kl import KLEstimator, sequence_kl
from .sources.base import Draw, Source
from .trajectory import Owner, Trajectory, collate

register("eval/tokens_per_sample", "generated (POLICY) tokens per evaluation episode: the inference token budget "
         "(RLHF book ch.16; evaluation.score_policy)")
register("eval/tokens_total", "generated (POLICY) tokens over all evaluation episodes (evaluation.score_policy)")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task from n samples of which c are correct (Chen et al.
    2021, "Evaluating Large Language Models Trained on Code", numerically stable form):

        pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k / i)

    The probability that at least one of k samples drawn without replacement from the
    n is correct. Needs 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k (tau-bench; checklist 13.6 [EXT]): the probability that k samples drawn
    without replacement are *all* correct, C(c, k) / C(n, k). Measures consistency."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_hat_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return math.comb(c, k) / math.comb(n, k)


def mean_pass_at_k(correct_per_task: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k averaged over tasks; task i contributes pass_at_k(len(s_i), sum(s_i), k).

    correct_per_task: one sequence of booleans (or 0/1) per task, each of length >= k.
    """
    if not correct_per_task:
        raise ValueError("mean_pass_at_k: no tasks")
    vals = [pass_at_k(len(s), int(sum(bool(x) for x in s)), k) for s in correct_per_task]
    return sum(vals) / len(vals)


def distinct_answers(answers_per_task: Sequence[Sequence[Hashable]], k: int | None = None) -> float:
    """Mean number of distinct answers among the first k samples of each task (post-training
    ch.13: diversity collapse under RL, e.g. 7.3 -> 4.3 distinct answers per 16 samples).

    answers_per_task: one sequence of hashable answers per task (e.g. parsed numbers,
    or None for unparsable); k None = all samples of the task.
    """
    if not answers_per_task:
        raise ValueError("distinct_answers: no tasks")
    counts = []
    for answers in answers_per_task:
        picked = list(answers) if k is None else list(answers)[:k]
        if k is not None and len(picked) < k:
            raise ValueError(f"distinct_answers: a task has {len(picked)} samples, fewer than k={k}")
        counts.append(len(set(picked)))
    return sum(counts) / len(counts)


def majority_answer(answers: Sequence[Hashable]) -> Hashable:
    """The most frequent answer of a list of samples (RLHF book ch.16, "majority voting when aggregating
    multiple samples"; checklist 16.2(b)). None stands for an unparsable answer and never wins while any
    sample has an answer (all None: None). Tie rule, deterministic: among the answers with the top count,
    the one whose first occurrence comes first in `answers`.

    ["7", "5", "5", "7"] -> "7" (2 votes each; "7" came first);  [None, None, "3"] -> "3"
    """
    if not answers:
        raise ValueError("majority_answer: no answers")
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    top = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == top)


def maj_at_k(answers_per_task: Sequence[Sequence[Hashable]], references: Sequence[Hashable], k: int) -> float:
    """maj@k: the share of tasks whose majority answer over k samples (`majority_answer`) is the reference.

    Estimator: task i's n_i >= k samples are cut into floor(n_i / k) disjoint blocks of k consecutive
    samples (the first k, the next k, ...; a remainder < k is not used), and the task scores the share of
    its blocks whose majority answer equals references[i]; the result is the mean over tasks. Samples drawn
    independently make every block k fresh samples, so each block's verdict -- and their mean -- is an
    unbiased estimate of the probability that a vote over k samples is right (the in-block tie rule, first
    come, is then a uniformly random tie-break); with n_i = k it is maj@k over the k samples.

    answers_per_task: one sequence per task of hashable answers in sampling order (None: unparsable);
    references: the correct answer per task.
    """
    if not answers_per_task or len(answers_per_task) != len(references):
        raise ValueError(f"maj_at_k: {len(answers_per_task)} tasks of answers vs {len(references)} references "
                         "(needs one reference per task, at least one task)")
    if k < 1:
        raise ValueError(f"maj_at_k: k must be >= 1, got {k}")
    scores = []
    for i, (answers, ref) in enumerate(zip(answers_per_task, references, strict=True)):
        answers = list(answers)
        if len(answers) < k:
            raise ValueError(f"maj_at_k: task {i} has {len(answers)} samples, fewer than k={k}")
        blocks = [answers[j:j + k] for j in range(0, len(answers) - k + 1, k)]
        scores.append(sum(majority_answer(b) == ref for b in blocks) / len(blocks))
    return sum(scores) / len(scores)


def mean_action_entropy(logits: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean entropy (nats) of the policy's next-token distribution at the positions that
    predict POLICY tokens.

    logits [B, T, V] from a forward pass over the batch, mask [B, T-1] (Batch.action_mask):
    position t of the mask is predicted by logits[:, t].
    """
    if logits.dim() != 3 or mask.shape != (logits.shape[0], logits.shape[1] - 1):
        raise ValueError(f"mean_action_entropy: logits {tuple(logits.shape)} vs mask {tuple(mask.shape)}")
    with torch.no_grad():
        ent = entropy_from_logits(logits[:, :-1])  # [B, T-1]
        return float(masked_mean(ent, mask))


def kl_from_reference(
    logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, kind: KLEstimator = "k3"
) -> dict[str, float]:
    """KL(pi || pi_ref) estimated on the policy's own samples (RLHF book ch.15 "KL
    Divergence in RL Optimization"; checklist 0.7: always log it).

    logp, ref_logp, mask [B, T-1]: log-probs of sampled POLICY tokens under the policy
    and the reference. returns {"kl/sequence": mean over episodes of the summed per-token
    estimate, "kl/token": mean per POLICY token} in nats; `kind` picks k1 / k2 / k3.
    """
    with torch.no_grad():
        seq = sequence_kl(logp, ref_logp, mask, kind, reduce="sum")  # [B]
        n_tok = mask.float().sum().clamp(min=1)
        return {"kl/sequence": float(seq.mean()), "kl/token": float(seq.sum() / n_tok)}


def informative_group_share(rewards: torch.Tensor, groups: torch.Tensor) -> float:
    """Share of groups whose rewards are not all equal: the groups that give a group
    baseline any signal (REPRODUCE A10; RLHF book checklist 6.7 / DAPO dynamic sampling).

    rewards [B], groups [B] long (any ids, any order, any sizes). A group of one is
    not informative.
    """
    if rewards.dim() != 1 or groups.shape != rewards.shape:
        raise ValueError(f"informative_group_share: rewards {tuple(rewards.shape)}, groups {tuple(groups.shape)}")
    if len(rewards) == 0:
        return 0.0
    spread, _ = group_reward_range(rewards, groups)  # [n_groups]
    return float((spread > 0).float().mean())


def hack_rate(public_pass: Sequence[bool], hidden_pass: Sequence[bool], among_public_pass: bool = False) -> float:
    """Share of episodes that pass the public tests but fail the hidden ones (REPRODUCE
    A13: reward hacking with `hardcode_tests`).

    public_pass, hidden_pass: one bool per episode. `among_public_pass=True` divides by
    the episodes that passed the public tests (the hack share of a filtered / kept set)
    instead of all episodes; 0.0 when that set is empty.
    """
    if len(public_pass) != len(hidden_pass):
        raise ValueError(f"hack_rate: {len(public_pass)} public vs {len(hidden_pass)} hidden results")
    hacks = sum(1 for p, h in zip(public_pass, hidden_pass, strict=True) if p and not h)
    denom = sum(1 for p in public_pass if p) if among_public_pass else len(public_pass)
    return hacks / denom if denom else 0.0


@dataclass(frozen=True)
class TaskScore:
    """One task's row of a `PolicyScore`: its name (info["task"]), episodes, mean reward, correct episodes."""

    name: str
    n: int
    mean_reward: float
    n_correct: int
    n_failed: int = 0
    """episodes whose environment or reward failed (`Trajectory.outcome`; they count as reward 0, not correct)"""


@dataclass(frozen=True)
class PolicyScore:
    """A policy scored on a list of tasks, `n` episodes each (`score_policy`, `score_trajectories`).

    mean_reward: mean episode reward over all episodes (every task weighs the same: each has n)
    pass_at:     {k: pass@k averaged over tasks}, unbiased estimator (`pass_at_k`) from the n episodes
    per_task:    one `TaskScore` per task, in the order of the tasks
    threshold:   an episode is correct when its reward >= threshold
    tokens:      the inference token budget (RLHF book ch.16 "controlling evaluation scores by the total
                 number of tokens for inference is important"): POLICY tokens the policy generated over all
                 episodes (stop tokens included); `tokens_per_sample` is its mean per episode
    """

    mean_reward: float
    pass_at: dict[int, float]
    per_task: tuple[TaskScore, ...]
    threshold: float = 1.0
    tokens: int = 0

    @property
    def n_episodes(self) -> int:
        return sum(t.n for t in self.per_task)

    @property
    def tokens_per_sample(self) -> float:
        """Generated (POLICY) tokens per episode."""
        return self.tokens / max(self.n_episodes, 1)

    @property
    def n_failed(self) -> int:
        """Episodes whose environment raised (reported per task in `per_task`)."""
        return sum(t.n_failed for t in self.per_task)

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        """Flat metrics for a log row: {prefix}/reward, {prefix}/pass@k for each k, {prefix}/env_errors, and the
        token budget {prefix}/tokens_per_sample, {prefix}/tokens_total."""
        out = {f"{prefix}/reward": self.mean_reward, **{f"{prefix}/pass@{k}": v for k, v in self.pass_at.items()}}
        out[f"{prefix}/env_errors"] = float(self.n_failed)
        out[f"{prefix}/tokens_per_sample"] = self.tokens_per_sample
        out[f"{prefix}/tokens_total"] = float(self.tokens)
        return out

    def table(self, max_rows: int | None = 20) -> str:
        """A markdown table, one row per task (the worst first, so what fails is on top; `max_rows`
        None: all), then the totals."""
        ks = sorted(self.pass_at)
        head = "| task | episodes | mean reward | correct |" + "".join(f" pass@{k} |" for k in ks)
        lines = [head, "|---" * (4 + len(ks)) + "|"]
        rows = sorted(self.per_task, key=lambda t: (t.mean_reward, t.name))
        for t in rows if max_rows is None else rows[:max_rows]:
            passes = "".join(f" {pass_at_k(t.n, t.n_correct, k):.2f} |" for k in ks)
            failed = f" ({t.n_failed} env errors)" if t.n_failed else ""
            lines.append(f"| {t.name} | {t.n} | {t.mean_reward:.3f} | {t.n_correct}/{t.n}{failed} |{passes}")
        if max_rows is not None and len(rows) > max_rows:
            lines.append(f"| ... {len(rows) - max_rows} more tasks | | | |" + " |" * len(ks))
        total = "".join(f" **{self.pass_at[k]:.3f}** |" for k in ks)
        lines.append(f"| **all {len(rows)} tasks** | {sum(t.n for t in rows)} | **{self.mean_reward:.3f}** | "
                     f"{sum(t.n_correct for t in rows)}/{sum(t.n for t in rows)} |{total}")
        return "\n".join(lines)


def score_trajectories(trajs: Sequence[Trajectory], ks: Sequence[int] = (1,), threshold: float = 1.0) -> PolicyScore:
    """Score finished episodes grouped by `traj.group` (a source's layout: group i = tasks[i]).

    Each group is one task; its name is the first episode's info["task"]. Every group needs at
    least max(ks) episodes (pass@k draws k of them). Correct: reward >= threshold.
    """
    if not trajs:
        raise ValueError("score_trajectories: no episodes")
    groups: dict[int, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(t.group, []).append(t)
    per_task = []
    for g, episodes in groups.items():
        rewards = [float(t.reward) for t in episodes]
        per_task.append(TaskScore(str(episodes[0].info.get("task", f"group {g}")), len(episodes),
                                  sum(rewards) / len(rewards), sum(r >= threshold for r in rewards),
                                  sum(not t.trainable for t in episodes)))
    fewest = min(t.n for t in per_task)
    if not ks or min(ks) < 1 or max(ks) > fewest:
        raise ValueError(f"score_trajectories: every k of ks={list(ks)} must be in 1..{fewest} "
                         f"(the fewest episodes of a task)")
    pass_at = {k: sum(pass_at_k(t.n, t.n_correct, k) for t in per_task) / len(per_task) for k in sorted(set(ks))}
    mean = sum(float(t.reward) for t in trajs) / len(trajs)
    return PolicyScore(mean, pass_at, tuple(per_task), threshold, generated_tokens(trajs))


def generated_tokens(trajs: Iterable[Trajectory]) -> int:
    """POLICY tokens over the episodes: what the policy generated (its stop tokens included), the inference
    token budget of an evaluation (RLHF book ch.16; checklist 16.5)."""
    return sum(sum(1 for o in t.owners if o == Owner.POLICY) for t in trajs)


def score_policy(source: Source, tasks: Sequence[Any], n: int = 8, ks: Sequence[int] = (1,), *, seed: int = 0,
                 threshold: float = 1.0) -> PolicyScore:
    """Run `n` episodes of every task with the policy behind `source` and score them.

    source:  e.g. `EpisodeSource(Decoder(engine.sample, settings), make_env, renderer, ...)`; its sampler
             `SamplerSettings(greedy=True)` for greedy decoding (then use n=1), a temperature otherwise.
    n:       episodes per task; pass@k for every k in `ks` (each <= n, unbiased estimator)
    seed:    the sampling seed (same seed, same episodes)
    Returns a `PolicyScore`: `.mean_reward`, `.pass_at[k]`, `.per_task`, `.table()`, `.metrics()`.
    """
    if not tasks:
        raise ValueError("score_policy: no tasks")
    if n < 1 or max(ks, default=1) > n:
        raise ValueError(f"score_policy: n={n} episodes per task; it must be >= 1 and >= every k of ks={list(ks)}")
    with torch.no_grad():
        trajs = source.take(Draw(list(tasks), n, torch.Generator().manual_seed(seed))).trajs
    return score_trajectories(trajs, ks, threshold)


# --- multiple choice by conditional log-likelihood (RLHF book ch.16 "Few-Shot Prompting and Log-Likelihood
# Scoring"; checklist 16.2(d)) ----------------------------------------------------------------------------------
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class MultipleChoice:
    """One multiple-choice question: `question`, its `choices` (2..len(labels) answer strings) and the index of
    the correct one (`answer`). `labels` name the choices (choice i is labels[i]: A, B, C ... by default) and
    `line` is how a choice is listed ('(A) Paris', the book's MMLU example); a model whose tokenizer lacks
    letters or parentheses can be given others."""

    question: str
    choices: tuple[str, ...]
    answer: int
    labels: str = LETTERS
    line: str = "({label}) {choice}"

    def __post_init__(self) -> None:
        if not 2 <= len(self.choices) <= len(self.labels) or not 0 <= self.answer < len(self.choices):
            raise ValueError(f"MultipleChoice: {len(self.choices)} choices (needs 2..{len(self.labels)}, one per "
                             f"label) and answer index {self.answer} (needs 0..{len(self.choices) - 1}) for "
                             f"{self.question!r}")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"MultipleChoice: labels {self.labels!r} repeat a label")

    def prompt(self, list_choices: bool = True) -> str:
        """The question, then (list_choices) one line per choice, '(A) ...' by default."""
        lines = [self.question]
        if list_choices:
            lines += [self.line.format(label=self.labels[i], choice=c) for i, c in enumerate(self.choices)]
        return "\n".join(lines)


def continuation_logprobs(engine, renderer, prompt: str,
                          continuations: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(continuation | prompt) for each continuation, conditioned on a user turn `prompt`.

    Each conversation [user: prompt, assistant: continuation] is rendered by `renderer` (the model's own
    template, the one rendering path) and read in one `engine.forward`; the log-prob sums over the
    assistant's content tokens only: the turn's stop tokens (`renderer.stop_ids`) and what follows them
    are not part of the answer, so they are left out.
    returns (logp [C] summed log-probs in nats, n_tokens [C] content tokens of each continuation).
    """
    if not continuations:
        raise ValueError("continuation_logprobs: no continuations")
    stop = set(renderer.stop_ids)
    trajs = []
    for text in continuations:
        traj = renderer.render([{"role": "user", "content": prompt}, {"role": "assistant", "content": text}])
        policy = [i for i, o in enumerate(traj.owners) if o == Owner.POLICY]
        cut = next((i for i in policy if traj.ids[i] in stop), None)
        if cut is not None:  # the stop token and anything after it: not the answer's
            traj.owners = [Owner.TEMPLATE if (i >= cut and o == Owner.POLICY) else o for i, o in enumerate(traj.owners)]
        trajs.append(traj)
    batch = collate(trajs, 0)  # padding sits off the mask and off the attention: its id is never read
    with torch.no_grad():
        logp = engine.forward(batch, positions="actions").logprobs  # [C, T-1]
    mask = batch.action_mask.to(logp.dtype)  # [C, T-1]
    n_tokens = mask.sum(-1)  # [C]
    if (n_tokens == 0).any():
        empty = [continuations[i] for i in (n_tokens == 0).nonzero().flatten().tolist()]
        raise ValueError(f"continuation_logprobs: continuation(s) {empty} render to no answer tokens")
    return (logp * mask).sum(-1), n_tokens


MC_METHODS = ("letter", "answer_sum", "answer_per_token", "answer_per_char")
"""letter: log pi('A') after the question with its lettered choices; answer_sum: log pi(answer string) after
the bare question, summed; answer_per_token / answer_per_char: that sum divided by the answer's tokens /
characters (length normalized: a long answer is not penalized for its length)"""


def multiple_choice_scores(engine, renderer, item: MultipleChoice) -> dict[str, torch.Tensor]:
    """Every choice's score under every method of `MC_METHODS` -> {method: scores [C]}; the pick is the argmax.

    The letter (the choice's label) is scored as the book's example writes it, with the choices listed in the
    prompt; the answer string after the question alone (as the log-likelihood harnesses do for cloze-style
    scoring).
    """
    letters = [item.labels[i] for i in range(len(item.choices))]
    letter_logp, _ = continuation_logprobs(engine, renderer, item.prompt(list_choices=True), letters)
    answer_logp, n_tok = continuation_logprobs(engine, renderer, item.prompt(list_choices=False), item.choices)
    n_char = torch.tensor([max(len(c), 1) for c in item.choices], dtype=answer_logp.dtype)
    return {"letter": letter_logp, "answer_sum": answer_logp, "answer_per_token": answer_logp / n_tok,
            "answer_per_char": answer_logp / n_char}


def score_multiple_choice(engine, renderer, items: Sequence[MultipleChoice]) -> dict[str, float]:
    """Accuracy of each scoring method over `items` -> {method: share of items whose argmax is the answer}.
    A tie goes to the earliest choice (torch.argmax's first maximum)."""
    if not items:
        raise ValueError("score_multiple_choice: no items")
    right = dict.fromkeys(MC_METHODS, 0)
    for item in items:
        for method, scores in multiple_choice_scores(engine, renderer, item).items():
            right[method] += int(int(torch.argmax(scores)) == item.answer)
    return {m: right[m] / len(items) for m in MC_METHODS}
