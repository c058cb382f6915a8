"""Graders recipe, part 'evals': the RLHF book's evaluation chapter (ch.16) on chapter 13's calculator.

From the calculator's cold start (`coldstart`, chapter 13's stage) three stages:

    evals_grpo     GRPO with the verifier's reward, chapter 13's budget (`Demo.grpo`: 200 steps x 32 problems x 8)
    evals_random   the same budget with `trajtune.sources.rewards.controls:random_reward` (Bernoulli 1/2, seeded
                   from prompt, completion and step): the random-reward control of ch.16 "Contamination"
    evals          the three policies (cold start, GRPO, random-reward GRPO) on the held-out problems,
                   `Demo.samples` samples each: pass@1 and pass@k beside maj@k (evaluation.maj_at_k), the
                   token budget of every evaluation, Elo and Bradley-Terry ratings from the verifier's pairwise
                   verdicts on the same problems and samples, multiple choice by conditional log-likelihood
                   (the choice's label vs the answer string); and the decontamination check of the calculator's
                   training problems against its held-out set, clean and with planted held-out problems

What differs from the book, and why: the judge of the pairwise verdicts is the verifier (exact match), not a
person or an LLM, so a verdict is a tie whenever both samples are right or both wrong; the prompts are too short
for 8 words or 50 characters, so decontamination flags them by the whole-row rule (trajtune.decontamination).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ...algorithms.rl import RLConfig, train_rl
from ...decontamination import find_contamination
from ...envs.arithmetic import heldout_tasks, train_tasks
from ...evaluation import (MultipleChoice, generated_tokens, maj_at_k, mean_pass_at_k, score_multiple_choice)
from ...ratings import bradley_terry_ratings, elo_ratings
from ...metrics import register
from ...models.tiny import load_model
from ...runs.plots import bar_plot, grouped_bar_plot, line_plot
from ...runs.report import Claim, fmt, image, markdown_table
from ...runs.stages import Stage
from ...runs.verdicts import NOISE, Z, Estimate, Holds, decide, judge, paired, share
from ...sources.base import Draw, Episodes, Schedule, Wrapper
from ...sources.episodes import sample_episodes
from ...sources.rewards.controls import random_reward
from ...sources.rewards.functions import RewardState
from ...text.render import Renderer
from ..shared.calculator import source_for

POLICIES = {"coldstart": "cold start", "evals_grpo": "GRPO", "evals_random": "random-reward GRPO"}
"""stage -> the policy's name in the tables"""
RATINGS = {"elo": "Elo", "bt": "Bradley-Terry"}
"""rating method -> its name in the tables and the chart (one colour each)"""

register("control/verifier_pass_rate", "share of the step's episodes the verifier accepts, when the training reward "
         "is something else (the random-reward control; graders part evals)")


@dataclass
class Demo:
    """this part's settings"""

    grpo: RLConfig = field(default_factory=lambda: RLConfig(steps=200, tasks_per_step=32, group_size=8,
                                                            advantage="grpo", aggregation="token"))
    """the budget both GRPO runs get (the real reward and the random one): chapter 13's GRPO (200 steps x 32
    problems x 8 samples; ~20 CPU-seconds each). 60 steps were tried first: the real reward then moved seed 0's
    pass@1 only 0.07 -> 0.08 (paired SE 0.007), too little for a control to be read against"""
    samples: int = 16
    """samples per held-out problem for pass@k, maj@k and the pairwise verdicts"""
    problems: int = 256
    """held-out problems evaluated (the first N of the calculator's 256)"""
    planted: int = 8
    """held-out problems planted in a copy of the training data, which decontamination must flag"""
    elo_k: float = 4.0
    """Elo K-factor (small: thousands of verdicts)"""
    bt_prior: float = 1.0
    """Bradley-Terry: tied pseudo-games between every pair of policies (keeps the fit finite)"""
    token_spread: float = 0.1
    """E5: the policies' tokens per sample may differ by at most this share of the smallest"""

    def __post_init__(self) -> None:
        if self.samples < 1 or not 1 <= self.problems <= len(heldout_tasks()) or self.planted < 1:
            raise ValueError(f"graders evals: samples >= 1, problems in 1..{len(heldout_tasks())}, planted >= 1; got "
                             f"{self.samples}, {self.problems}, {self.planted}")


class RandomRewards(Wrapper):
    """`inner`'s episodes with `random_reward` as their reward (called as TRL would, trainer_state.global_step = the
    draw's step); the verifier's reward stays in info["verifier_reward"], its pass rate in the step's metrics."""

    def take(self, draw: Draw, ahead: Schedule | None = None) -> Episodes:
        episodes = self.inner.take(draw, ahead)
        tasks = [t for t in draw.tasks for _ in range(draw.n)]  # episode i answers tasks[i] (task-major)
        replies = [t.info.get("reply", "") for t in episodes.trajs]
        rewards = random_reward([t.prompt for t in tasks], replies, trainer_state=RewardState(draw.step))
        for traj, r in zip(episodes.trajs, rewards, strict=True):
            traj.info["verifier_reward"] = traj.reward
            traj.reward = r
        n = max(len(episodes.trajs), 1)
        episodes.metrics["control/verifier_pass_rate"] = sum(t.info["verifier_reward"] >= 1 for t in episodes.trajs) / n
        return episodes


def stage_grpo(ctx, reward: str) -> dict:
    """GRPO from the cold start with the verifier's reward ("verifier") or the random one ("random")."""
    config = ctx.config
    model, tok = load_model(ctx.run_dir / "coldstart" / "model")
    r = Renderer(tok)
    engine = ctx.engine(model, config.rl_optim)
    cfg = replace(config.evals.grpo, seed=config.seed)
    tasks = train_tasks(cfg.steps * cfg.tasks_per_step, seed=config.seed + 1)
    source = source_for(engine, r)
    if reward == "random":
        source = RandomRewards(source)
    history = train_rl(engine, tasks, source, cfg, tok.pad_id, ctx.run())
    ctx.save_model(model, tok, "model", meta={"stage": ctx.name, "reward": reward})
    key = "control/verifier_pass_rate" if reward == "random" else "rollout/pass_rate"
    return {"reward": reward, "curve": [(h["step"], h[key], h["rollout/reward"]) for h in history]}


@torch.no_grad()
def sample_policy(engine, r: Renderer, tasks, k: int, seed: int) -> dict:
    """k samples per problem: per-problem correctness and answers, and the token budget."""
    trajs = sample_episodes(source_for(engine, r), tasks, k, seed)  # task-major
    correct = [[t.reward >= 1 for t in trajs[i * k:(i + 1) * k]] for i in range(len(tasks))]
    answers = [[t.info["reply"] if not t.truncated else None for t in trajs[i * k:(i + 1) * k]]
               for i in range(len(tasks))]
    total = generated_tokens(trajs)
    per_problem = [generated_tokens(trajs[i * k:(i + 1) * k]) / k for i in range(len(tasks))]
    return {"correct": correct, "answers": answers,
            "tokens": {"total": total, "per_sample": total / len(trajs), "per_problem": per_problem}}


def stage_evals(ctx) -> dict:
    """The three policies on the held-out problems; ratings from pairwise verdicts; decontamination."""
    config, demo = ctx.config, ctx.config.evals
    tasks = list(heldout_tasks())[:demo.problems]
    refs = [t.answer for t in tasks]
    seed = config.seed * 7919 + 5
    per_policy, samples = {}, {}
    ks = sorted({1, *(j for j in (4, demo.samples) if j <= demo.samples)})
    for stage in POLICIES:
        model, tok = load_model(ctx.run_dir / stage / "model")
        engine, r = ctx.engine(model), Renderer(tok)
        s = sample_policy(engine, r, tasks, demo.samples, seed)  # the same seed for every policy
        samples[stage] = s
        per_policy[stage] = {"pass_at": {str(j): mean_pass_at_k(s["correct"], j) for j in ks},
                             "maj_at": {str(j): maj_at_k(s["answers"], refs, j) for j in ks},
                             "maj_per_problem": {str(j): [maj_at_k([a], [ref], j) for a, ref in zip(s["answers"], refs)]
                                                 for j in ks},
                             "tokens": s["tokens"],
                             "per_problem": [sum(c) / len(c) for c in s["correct"]],
                             # multiple choice by conditional log-likelihood: the label vs the answer string
                             "mc": score_multiple_choice(engine, r, choice_items(tasks, seed))}
    verdicts = pairwise_verdicts({st: s["correct"] for st, s in samples.items()})
    ratings = {"elo": elo_ratings(verdicts, k_factor=demo.elo_k, seed=config.seed),
               "bt": bradley_terry_ratings(verdicts, prior=demo.bt_prior)}
    return {"policies": per_policy, "ratings": ratings, "verdicts": verdict_counts(verdicts),
            "decontamination": decontamination(ctx, config, demo)}


def choice_items(tasks, seed: int) -> list[MultipleChoice]:
    """Each held-out problem as a two-way multiple choice: the sum and one distractor (sum+1, sum-1, sum+10 or
    sum-10, drawn from Random(seed + i), as is the order). The question is the calculator's own prompt
    'Q: 23+45\nA: ' (the answer string is scored where the calculator answers); the choices are listed as
    '1:68' with digit labels (its tokenizer has no B or parentheses), a format it never saw. Two choices, not
    four: the listed prompt must fit the calculator's 32-token context."""
    items = []
    for i, t in enumerate(tasks):
        rng, s = random.Random(seed + i), t.a + t.b
        pair = [str(s), str(s + rng.choice((1, -1, 10, -10)))]
        first = rng.randrange(2)
        choices = (pair[first], pair[1 - first])
        items.append(MultipleChoice(t.prompt, choices, choices.index(str(s)), labels="12", line="{label}:{choice}"))
    return items


def pairwise_verdicts(correct: dict[str, list[list[bool]]]) -> list[tuple[str, str, float]]:
    """The verifier as a pairwise judge: for every problem i, sample j and pair of policies (a, b), a's score is
    1 if a's j-th sample is right and b's wrong, 0 the other way round, 0.5 if both are right or both wrong."""
    out = []
    names = list(correct)
    n_problems, k = len(correct[names[0]]), len(correct[names[0]][0])
    for i in range(n_problems):
        for j in range(k):
            for a, b in itertools.combinations(names, 2):
                out.append((a, b, 0.5 + 0.5 * (int(correct[a][i][j]) - int(correct[b][i][j]))))
    return out


def verdict_counts(verdicts) -> dict[str, dict[str, int]]:
    """'a vs b' -> {a wins, b wins, ties}."""
    out: dict[str, dict[str, int]] = {}
    for a, b, s in verdicts:
        c = out.setdefault(f"{a} vs {b}", {"a": 0, "b": 0, "tie": 0})
        c["a" if s == 1 else "b" if s == 0 else "tie"] += 1
    return out


def decontamination(ctx, config, demo: Demo) -> dict:
    """The calculator's training problems (the cold start's worked examples and GRPO's prompts) against the
    held-out set, as files a user would check with `trajtune decontaminate`; then a copy with planted held-out
    problems."""
    n_sft = config.coldstart.steps * config.coldstart.batch_size
    train = [f"{t.prompt}{t.answer}" for t in train_tasks(n_sft, seed=config.seed)]
    train += [t.prompt for t in train_tasks(demo.grpo.steps * demo.grpo.tasks_per_step, seed=config.seed + 1)]
    held = list(heldout_tasks())
    ev = [t.prompt for t in held]
    clean = find_contamination(train, ev)
    planted = held[:: len(held) // demo.planted][:demo.planted]
    dirty = find_contamination(train + [f"{t.prompt}{t.answer}" for t in planted], ev)
    expected = sorted(i for i, t in enumerate(held) if t in set(planted))  # the held-out set keeps duplicates
    return {"train_rows": len(train), "eval_rows": len(ev), "clean_flagged": clean.contaminated,
            "planted": [t.name for t in planted], "planted_flagged": dirty.contaminated, "expected": expected,
            "example": dirty.matches[0].__dict__ if dirty.matches else None}


def stages(config) -> list[Stage]:
    grpo = ("seed", "evals", "rl_optim")  # `Stage.reads`
    return [Stage("evals_grpo", stage_grpo, after=("coldstart",), args=("verifier",), reads=grpo),
            Stage("evals_random", stage_grpo, after=("coldstart",), args=("random",), reads=grpo),
            Stage("evals", stage_evals, after=("coldstart", "evals_grpo", "evals_random"),
                  reads=("seed", "evals", "coldstart"))]


# --- claims -----------------------------------------------------------------------------------------------------
def rating_order(pol: dict, ratings: dict) -> tuple[Holds, Estimate | None, str]:
    """E6: do Elo and Bradley-Terry order the policies as pass@1 does? Judged on the pairs whose pass@1 differ
    beyond 2 paired SE (over problems): it fails on any such pair a rating puts the other way round, holds when
    at least one pair is that far apart and none is reversed, and is NOISE when no two policies are. (verdict,
    the pass@1 difference that decided it, which pair)."""
    clear, reversed_ = [], []
    for a, b in itertools.combinations(POLICIES, 2):
        est = paired(pol[b]["per_problem"], pol[a]["per_problem"], f"pass@1 {POLICIES[a]} - {POLICIES[b]}, paired "
                     f"over {len(pol[a]['per_problem'])} problems")
        v = judge(est, ">")
        if v == NOISE:
            continue
        hi, lo, est = (a, b, est) if v else (b, a, Estimate(-est.value, est.se, est.n, est.what))
        (clear if all(r[hi] > r[lo] for r in ratings.values()) else reversed_).append((est, f"{POLICIES[hi]} > "
                                                                                      f"{POLICIES[lo]}"))
    if reversed_:
        return False, reversed_[0][0], f"{reversed_[0][1]} on pass@1, a rating says otherwise"
    if clear:
        closest = min(clear, key=lambda c: c[0].value / c[0].se if c[0].se > 0 else math.inf)
        return True, closest[0], ""
    return NOISE, None, "no two policies differ in pass@1 beyond 2 SE"


def claims(results: dict, config) -> list[Claim]:
    if "evals" not in results:
        return []
    demo, ev = config.evals, results["evals"]
    pol = ev["policies"]
    per = {s: pol[s]["per_problem"] for s in POLICIES}
    n = len(per["coldstart"])
    p1 = {s: pol[s]["pass_at"]["1"] for s in POLICIES}
    k = str(max(int(j) for j in pol["coldstart"]["pass_at"]))
    rnd = paired(per["coldstart"], per["evals_random"], f"paired over {n} problems")
    real = paired(per["coldstart"], per["evals_grpo"], f"paired over {n} problems")
    out = [Claim.compare("E1", "random-reward GRPO (control)", "no rise on an uncontaminated model",
                         f"pass@1 {fmt(p1['coldstart'])} -> {fmt(p1['evals_random'])} (change {rnd.value:+.3f})",
                         "RLHF book ch.16 §16.6c: benchmarks improving \"when models are trained with RL on random "
                         "rewards -- a contrived setup that should only increase performance if a model has certain "
                         "types of data contamination\". The calculator is decontaminated (E3): pass@1 must not rise "
                         "by more than 2 paired SE", rnd, "not >", 0.0)]
    over_control = paired(per["evals_random"], per["evals_grpo"], f"GRPO - random control, paired over {n} problems")
    holds, est = decide(*[(real, ">", 0.0), (over_control, ">", 0.0)])
    out.append(Claim("E2", "GRPO with the verifier, same budget", "the real run beats its random control",
                     f"pass@1 {fmt(p1['coldstart'])} -> {fmt(p1['evals_grpo'])} (change {real.value:+.3f}); random "
                     f"control {fmt(p1['evals_random'])}",
                     "RLHF book ch.9 §S9.2: \"the RM-selected run must beat its random control\" -- here the "
                     "verifier's reward: pass@1 rises from the cold start and ends above the control's, each by more "
                     "than 2 paired SE", holds, est))
    d = ev["decontamination"]
    out.append(Claim("E3", "decontamination of the calculator", "Tülu 3: 8-gram overlap found contaminated sets",
                     f"{len(d['clean_flagged'])} of {d['eval_rows']} held-out rows flagged against {d['train_rows']} "
                     f"training rows; with {len(d['planted'])} planted: {len(d['planted_flagged'])} flagged "
                     f"({len(d['expected'])} expected)",
                     "RLHF book ch.16 §16.6a: \"looking for matches in n-gram overlap over words/subword tokens, or "
                     "fixed-length character substring matching\": the training problems, which skip every held-out "
                     "pair, are clean, and a copy with planted held-out problems is caught, exactly those rows",
                     not d["clean_flagged"] and d["planted_flagged"] == d["expected"]))
    bounded = all(pol[s]["maj_at"][k] <= pol[s]["pass_at"][k] + 1e-9 for s in POLICIES)  # a vote picks a sampled answer
    holds, est = decide(*[(paired(pol[s]["maj_per_problem"]["1"], pol[s]["maj_per_problem"][k],
                                   f"{POLICIES[s]} maj@{k} - maj@1, paired over {n} problems"), "not <", 0.0)
                           for s in POLICIES])
    rows = "; ".join(f"{POLICIES[s]} {fmt(pol[s]['maj_at']['1'])} / {fmt(pol[s]['maj_at'][k])} / "
                     f"{fmt(pol[s]['pass_at'][k])}" for s in POLICIES)
    out.append(Claim("E4", f"maj@{k} beside maj@1 and pass@{k}", "-", f"maj@1 / maj@{k} / pass@{k}: {rows}",
                     "RLHF book ch.16 §16.2b: exact match \"for single attempts, or majority voting when aggregating "
                     f"multiple samples\": a vote over {k} samples scores at least one sample's accuracy (maj@1; not "
                     f"below it by more than 2 paired SE) [EXT: self-consistency] and at most pass@{k} (a vote picks "
                     "an answer some sample gave: exact)", holds if bounded else False, est,
                     why="" if bounded else f"maj@{k} above pass@{k}: a bug, not noise"))
    toks = {s: pol[s]["tokens"]["per_sample"] for s in POLICIES}
    low, high = min(POLICIES, key=toks.get), max(POLICIES, key=toks.get)
    gap = paired(pol[low]["tokens"]["per_problem"], pol[high]["tokens"]["per_problem"])
    spread = Estimate(gap.value / toks[low], gap.se / toks[low], n,
                      f"({POLICIES[high]} - {POLICIES[low]}) / {POLICIES[low]}, paired over {n} problems")
    out.append(Claim.compare(
        "E5", "token budget of each evaluation", "-",
        "tokens per sample " + ", ".join(f"{POLICIES[s]} {toks[s]:.2f}" for s in POLICIES)
        + f" (spread {100 * spread.value:.0f}%)",
        "RLHF book ch.16 §16.5a: \"controlling evaluation scores by the total number of tokens for inference is "
        f"important\": the policies are compared at the same budget (tokens per sample within "
        f"{100 * demo.token_spread:.0f}%, not beyond it by more than 2 SE), so no difference in E1/E2 is bought "
        "with tokens", spread, "not >", demo.token_spread))
    elo, bt = ev["ratings"]["elo"], ev["ratings"]["bt"]
    holds, est, why = rating_order(pol, ev["ratings"])
    out.append(Claim("E6", "Elo and Bradley-Terry from the verifier's pairwise verdicts", "-",
                     "pass@1 " + ", ".join(f"{POLICIES[s]} {fmt(p1[s])}" for s in POLICIES) + "; Elo "
                     + ", ".join(f"{POLICIES[s]} {elo[s]:.0f}" for s in POLICIES) + "; Bradley-Terry "
                     + ", ".join(f"{POLICIES[s]} {bt[s]:.0f}" for s in POLICIES),
                     "RLHF book ch.16 §16.4: pairwise evaluation \"yields Elo rankings\" ([EXT] a Bradley-Terry fit): "
                     "both ratings put the policies in their pass@1 order, wherever pass@1 tells two apart (by more "
                     "than 2 paired SE)", holds, est, why=why))
    mc = {s: pol[s]["mc"] for s in POLICIES}
    parts = []
    for s in POLICIES:
        letter = share(round(mc[s]["letter"] * n), n, 0.5)
        parts.append((Estimate(abs(letter.value), letter.se, n, f"{POLICIES[s]} |label - 1/2|, binomial over {n}"),
                      "not >", 0.0))
        parts.append((share(round(mc[s]["answer_sum"] * n), n, 0.5, f"{POLICIES[s]} answer string - 1/2, "
                                                                     f"binomial over {n}"), ">", 0.0))
    holds, est = decide(*parts)
    out.append(Claim("E7", "multiple choice by conditional log-likelihood: the label vs the answer string",
                     "60% -> near 0 from a format change",
                     "accuracy label / answer string summed / per token: " + "; ".join(
                         f"{POLICIES[s]} {fmt(mc[s]['letter'])} / {fmt(mc[s]['answer_sum'])} / "
                         f"{fmt(mc[s]['answer_per_token'])}" for s in POLICIES) + f" (chance 0.50, {n} problems)",
                     "RLHF book ch.16 §16.2d: \"If the evaluation format does not match how the model generates, "
                     "scores can plummet\": scored by the label of a listed choice (a format the calculator never "
                     "saw) it is at chance (not away from 1/2 by more than 2 SE), scored by the answer string where it "
                     "answers it is above chance by more than 2 SE, on every policy", holds, est))
    return out


# --- the report section ---------------------------------------------------------------------------------------
def section(run_dir: Path, results: dict, config) -> str:
    if "evals" not in results:
        return "## Evaluation (ch.16)\n\nNot run."
    ev, pol = results["evals"], results["evals"]["policies"]
    ks = list(pol["coldstart"]["pass_at"])
    rows = [(POLICIES[s], *(fmt(pol[s]["pass_at"][j]) for j in ks), *(fmt(pol[s]["maj_at"][j]) for j in ks),
             f"{pol[s]['tokens']['per_sample']:.2f}", pol[s]["tokens"]["total"],
             f"{ev['ratings']['elo'][s]:.0f}", f"{ev['ratings']['bt'][s]:.0f}") for s in POLICIES]
    table = markdown_table(["policy", *(f"pass@{j}" for j in ks), *(f"maj@{j}" for j in ks), "tokens per sample",
                            "tokens in all", "Elo", "Bradley-Terry"], rows)
    mc = markdown_table(["policy", "label", "answer string (sum)", "answer string (per token)",
                         "answer string (per character)"],
                        [(POLICIES[s], *(fmt(pol[s]["mc"][m]) for m in ("letter", "answer_sum", "answer_per_token",
                                                                          "answer_per_char"))) for s in POLICIES])
    curves = {("GRPO (verifier reward)" if results[s]["reward"] == "verifier" else "random-reward GRPO"):
              ([c[0] for c in results[s]["curve"]], [c[1] for c in results[s]["curve"]])
              for s in ("evals_grpo", "evals_random") if s in results}
    line_plot(run_dir / "evals_training.png", curves, "Training: the verifier's pass rate of the sampled answers",
              "GRPO step", "share of samples the verifier accepts")
    p1 = {POLICIES[s]: pol[s]["pass_at"]["1"] for s in POLICIES}
    se = {POLICIES[s]: Z * paired(pol["coldstart"]["per_problem"], pol[s]["per_problem"]).se for s in POLICIES}
    bar_plot(run_dir / "evals_pass1.png", p1, "Held-out pass@1 (error bars: 2 paired SE of the change)",
             "pass@1 on the held-out problems", errors=se, xlabel="policy")
    grouped_bar_plot(run_dir / "evals_ratings.png",
                     {POLICIES[s]: {RATINGS[m]: ev["ratings"][m][s] - 1000 for m in RATINGS} for s in POLICIES},
                     "Ratings from the verifier's pairwise verdicts", "policy", "rating - 1000 (Elo scale)",
                     value_format="{:+.0f}")
    counts = markdown_table(["pair", "first wins", "second wins", "ties"],
                            [(p.replace("evals_", ""), c["a"], c["b"], c["tie"]) for p, c in ev["verdicts"].items()])
    d = ev["decontamination"]
    ex = d["example"]
    example = (f"For example held-out row {ex['eval_row']} matched training row {ex['train_row']} by the rule "
               f"`{ex['rule']}` on the words `{ex['text']}`." if ex else "")
    return "\n\n".join([
        "## Evaluation (ch.16): maj@k, token budgets, ratings, decontamination, the random-reward control",
        f"Three policies on the first {len(pol['coldstart']['per_problem'])} held-out problems, "
        f"{config.evals.samples} samples each at temperature 1, the same seed: the calculator's cold start, "
        f"{config.evals.grpo.steps} GRPO steps with the verifier's reward, and the same budget with a random reward "
        "(Bernoulli 1/2, `trajtune.sources.rewards.controls:random_reward`). maj@k is the mean over disjoint blocks "
        "of k samples (evaluation.maj_at_k); tokens are the generated tokens, the stop token included.",
        table, image(run_dir / "evals_pass1.png", "held-out pass@1 of the three policies"),
        image(run_dir / "evals_training.png", "verifier pass rate during the two GRPO runs"),
        "Multiple choice by conditional log-likelihood (each held-out problem against one distractor, sum +-1 or "
        "+-10; accuracy of the argmax; chance 0.50): the label's log-prob after the listed choices vs the "
        "answer string's after the calculator's own prompt, summed or per token / character:", mc,
        "Pairwise verdicts (the verifier as judge: one sample of each policy on the same problem):", counts,
        image(run_dir / "evals_ratings.png", "Elo and Bradley-Terry ratings"),
        f"Decontamination (8-grams of words, 50-character substrings; the prompts are shorter, so the whole-row "
        f"rule applies): {d['train_rows']} training rows against {d['eval_rows']} held-out prompts flag "
        f"{len(d['clean_flagged'])} rows; planting the held-out problems {', '.join(d['planted'])} flags rows "
        f"{d['planted_flagged']} (expected {d['expected']}). {example} The same check on your own files: "
        "`trajtune decontaminate --train train.jsonl --eval test.jsonl` (exit code 1 when contaminated)."])
