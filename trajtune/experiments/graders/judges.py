"""Graders recipe, part 'judges': LLM-as-a-judge, rubrics and AI feedback on the chapter-13 instruct gym (RLHF
book ch.5.9, 12.11-12.14, 16.3; checklist 5.9, 11.1-11.2, 12.11-12.14, 16.3-16.4).

The gym's hidden "human" preference is `ends_with_period`. A tiny character model cannot read the MT-Bench
prompt (its vocabulary has no brackets or digits, its context is 128 characters), so the judge here is
*trained*, and every number is put beside the verifier it was trained to imitate:

    judge_train          the chapter-13 SFT(narrow) network, SFT'd to answer the compact pairwise template
                         ("Judge: word / A: ... / B: ..." -> "A", "B" or "C") with the verifier's label, and the
                         compact yes/no template ("Check: ends with a period / A: ..." -> "Yes" / "No"), on
                         half of chapter 13's training pairs (both orders) plus tie pairs. Then, on the
                         held-out pairs: agreement with the verifier, unparseable share, position-swap
                         inconsistency; greedy vs temperature-1 repeat agreement; Constitutional AI's
                         P(A) vs P(B) next-token labels; a rubric (verifier items + one judge item) on
                         samples of the SFT policy, with per-item pass rates
    judge_dpo_ai         DPO from the SFT policy on the other half of the training pairs, labelled by the judge
                         (RLAIF: swap-consistent; ties and unparseable dropped)
    judge_dpo_verifier   DPO on the same pairs labelled by the verifier (as chapter 13's B5)

Both DPO runs are read with chapter 13's reward-at-KL harness (`shared.preference.evaluate_policy`, claim
B5: true reward, sampled KL from the SFT model, format), on the same evaluation seed.

How this departs from the book, and why:

1. The judge is a 355k-parameter char model trained on verifier labels, not a prompted GPT-4-class model:
   the book's judges are prompted; ours must be taught the task. The MT-Bench templates are in
   `trajtune.sources.judge` for real models (`load_judge`); here the compact templates run the same code.
2. The compact template shows an answer longer than 50 characters with its middle cut ('..'), so that two
   answers fit the 128-token context; both ends stay visible.
3. "Human" labels are the gym's verifier: what the book contrasts with AI labels (human data) is played by a
   noiseless, unbiased labeller, so "AI labels replace human labels" reads here as "the trained judge's labels
   buy what the verifier's labels buy".
4. Constitutional AI's feedback prompt is the compact pairwise template, read at the judge's first reply token
   (where its verdict letter goes, as after CAI's "The answer is: "); its one principle, "ends with a period",
   is what the judge was trained on, not text in the prompt (`ai_feedback.feedback_messages` writes the
   principles out for a real model).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ...algorithms.ai_feedback import choice_logprobs, label_pairs, soft_labels
from ...algorithms.dpo import train_dpo
from ...algorithms.sft import SFTConfig, train_sft
from ...config import check_ranges
from ...engine import OptimConfig
from ...envs.instruct import SEEN, InstructTask, ends_with_period, first_letter_ok, format_ok, preference_pairs
from ...models.tiny import load_model
from ...runs.plots import line_plot
from ...runs.report import Claim, fmt, image, markdown_table
from ...runs.stages import Stage
from ...runs.verdicts import Estimate, Holds, decide, judge, share, share_se, shares, two_shares
from ...seeding import derive
from ...sources.episodes import sample_episodes
from ...sources.judge import TEMPLATES, Judge, parse_verdict, swap_consistent
from ...sources.rewards import RewardBatch
from ...sources.rewards.rubric import Rubric, RubricItem, RubricReward, slug
from ..shared.instruct import corpus, instruct_source, renderer
from ..shared.preference import evaluate_policy, rendered_pairs, sft_model

PAIR, YES_NO = TEMPLATES["compact_pair"], TEMPLATES["compact_yes_no"]
PERIOD = "ends with a period"
"""the yes/no criterion the judge is taught (and the rubric's judge-graded item)"""


@dataclass
class Demo:
    """this part's settings (the DPO loop is chapter 13's `dpo`, at `dpo_beta`)"""

    judge_sft: SFTConfig = field(default_factory=lambda: SFTConfig(steps=150, batch_size=32))
    """the judge's SFT on compact judge prompts (its seed is the recipe's)"""
    judge_optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, weight_decay=0.0, beta2=0.999,
                                                                         grad_clip=0.0))
    """the judge's optimizer (chapter 13's plain AdamW)"""
    tie_share: float = 0.2
    """share of tie items (both or neither answer ends with a period: verdict "C") among the pairwise examples"""
    yes_no_share: float = 0.3
    """share of yes/no examples ("Check: ends with a period") in the judge's training set"""
    eval_ties: int = 32
    """tie pairs added to chapter 13's 128 held-out pairs for the judge's evaluation"""
    dpo_beta: float = 0.3
    """DPO beta of both runs (AI labels, verifier labels)"""
    rubric_samples: int = 4
    """SFT-policy replies per seen word graded by the rubric"""

    def __post_init__(self) -> None:
        check_ranges(self, "graders.judges", counts=("eval_ties", "rubric_samples"), positive=("dpo_beta",))
        if not (0 <= self.tie_share < 1 and 0 <= self.yes_no_share < 1):
            raise ValueError(f"graders.judges: tie_share and yes_no_share must be in [0, 1), got {self.tie_share}, "
                             f"{self.yes_no_share}")


def stages(config) -> list[Stage]:
    dpo = ("seed", "judges", "dpo", "dpo_optim", "eval_per_word", "max_reply")  # `Stage.reads`
    return [Stage("judge_train", stage_judge_train, after=("sft_narrow",), reads=("seed", "judges", "max_reply")),
            Stage("judge_dpo_ai", stage_judge_dpo, after=("judge_train",), args=("ai",), reads=dpo),
            Stage("judge_dpo_verifier", stage_judge_dpo, after=("sft_narrow",), args=("verifier",), reads=dpo)]


# --- data -----------------------------------------------------------------------------------------
def split_pairs(seed: int):
    """(judge's training pairs, the DPO pool, held-out pairs): chapter 13's training pairs cut in two halves."""
    _, _, _, demos = corpus()
    train, test = preference_pairs(demos, seed=seed)
    half = len(train) // 2
    return train[:half], train[half:], test


def tie_pairs(n: int, seed: int):
    """n (task, a, b) pairs where both or neither line ends with a period (the verifier's tie)."""
    demos, rng, out = corpus()[3], random.Random(seed), []
    for _ in range(n):
        w, period = rng.choice(SEEN), rng.random() < 0.5
        pool = [r for r in demos[w] if ends_with_period(r) == period]
        out.append((InstructTask(w), rng.choice(pool), rng.choice(pool)))
    return out


def verifier_verdict(a: str, b: str) -> str:
    """The verifier's pairwise label: A, B, or tie when both or neither end with a period."""
    return "tie" if ends_with_period(a) == ends_with_period(b) else "A" if ends_with_period(a) else "B"


def oriented(pairs, seed: int):
    """(task, a, b) with the chosen line in position A or B at random (seeded)."""
    rng = random.Random(seed)
    return [(t, c, r) if rng.random() < 0.5 else (t, r, c) for t, c, r in pairs]


def judge_examples(pairs, ties, demo: Demo, seed: int):
    """The judge's SFT conversations: each pair in both orders, the ties, and yes/no checks of single lines."""
    r, rng = renderer(), random.Random(seed)
    convs = []
    for t, c, rj in pairs:
        for a, b in ((c, rj), (rj, c)):
            convs.append(PAIR.messages(t.word, a, b) + [{"role": "assistant", "content": "A" if a == c else "B"}])
    convs += [PAIR.messages(t.word, a, b) + [{"role": "assistant", "content": "C"}] for t, a, b in ties]
    n_yes_no = int(len(convs) * demo.yes_no_share / (1 - demo.yes_no_share))
    lines = [(t, x) for t, c, rj in pairs for x in (c, rj)]
    for t, x in rng.sample(lines, min(n_yes_no, len(lines))):
        convs.append(YES_NO.messages(t.word, x, criterion=PERIOD)
                     + [{"role": "assistant", "content": "Yes" if ends_with_period(x) else "No"}])
    return [r.render(c) for c in convs]


# --- the rubric of the demo ------------------------------------------------------------------------
def starts_with_word(completions, word, **kw):
    return [float(format_ok(w, c)) for c, w in zip(completions, word, strict=True)]


def right_first_letter(completions, word, **kw):
    return [float(first_letter_ok(w, c)) for c, w in zip(completions, word, strict=True)]


def over_fifty(completions, **kw):
    return [float(len(c) > 50) for c in completions]


def demo_rubric() -> Rubric:
    """Format A's categories on the gym: two verifier items, the judge's item, a pitfall."""
    return Rubric([RubricItem("Starts with the word", "The reply starts with the capitalised word.", 5, "Essential",
                              starts_with_word),
                   RubricItem("First letter", "The reply starts with the word's first letter.", 2, "Important",
                              right_first_letter),
                   RubricItem("Ends with a period", PERIOD, 3, "Important"),
                   RubricItem("Rambles", "The reply is longer than 50 characters.", -1, "Pitfall", over_fifty)],
                  "graders.judges")


def reward_batch(tasks, replies) -> RewardBatch:
    return RewardBatch([t.prompt for t in tasks], list(replies), [[] for _ in replies],
                       {"word": [t.word for t in tasks]}, [f"{t.word} #{i}" for i, t in enumerate(tasks)])


def compact_judge(engine) -> Judge:
    """The demo's judge: compact templates, the task's word as the {question}, replies of up to 3 tokens."""
    return Judge(engine, renderer(), PAIR, ask_template=YES_NO, name="judge", max_new_tokens=3, batch_size=256)


# --- stages ---------------------------------------------------------------------------------------
def stage_judge_train(ctx) -> dict:
    """Train the tiny judge, then measure it: agreement, unparseable, swap-inconsistency, temperature, CAI, rubric."""
    config, demo = ctx.config, ctx.config.judges
    tok = corpus()[0]
    train, _, test = split_pairs(config.seed)
    ties = tie_pairs(int(2 * len(train) * demo.tie_share / (1 - demo.tie_share)), derive(config.seed, 31, stride=7919))
    model = sft_model(ctx.run_dir)
    engine = ctx.engine(model, demo.judge_optim)
    data = judge_examples(train, ties, demo, derive(config.seed, 32, stride=7919))
    history = train_sft(engine, data, replace(demo.judge_sft, seed=config.seed), tok.pad_id, ctx.run())
    ctx.save_model(model, tok, "judge", meta={"stage": ctx.name})
    judge = compact_judge(engine)
    items = oriented(test, derive(config.seed, 33, stride=7919)) + tie_pairs(demo.eval_ties,
                                                                             derive(config.seed, 34, stride=7919))
    result = {"n_train_examples": len(data), "train_loss": history[-1]["train/loss"]}
    result.update(held_out(judge, items))
    result.update(repeats(engine, items, result.pop("first"), config.seed))
    result["cai"] = cai_labels(engine, items)
    result["rubric"] = rubric_on_samples(ctx, judge)
    return result


def held_out(judge: Judge, items) -> dict:
    """1. Agreement with the verifier on (task, a, b) items, unparseable and swap-inconsistent shares, and the
    judge's errors split into systematic ones (reproducible, with a direction: the same wrong label in both
    orders, or the same position A, A / B, B whatever the order) and the rest."""
    words, a, b = [t.word for t, _, _ in items], [x for _, x, _ in items], [y for _, _, y in items]
    truth = [verifier_verdict(x, y) for x, y in zip(a, b, strict=True)]
    labels = judge.compare(words, a, b)
    first = [parse_verdict(PAIR, x) for x in judge.replies([PAIR.messages(w, x, y) for w, x, y in zip(words, a, b)])]
    swapped = [parse_verdict(PAIR, x) for x in judge.replies([PAIR.messages(w, y, x) for w, x, y in zip(words, a, b)])]
    inconsistent = [swap_consistent(f, s)[1] for f, s in zip(first, swapped, strict=True)]
    same_place = [f == s and f in ("A", "B") for f, s in zip(first, swapped, strict=True)]
    errors = [i for i in range(len(items)) if labels[i] != truth[i]]
    n = len(items)
    return {"n_eval": n, "first": first,
            "agreement": (n - len(errors)) / n,
            "first_order_agreement": sum(f == t for f, t in zip(first, truth, strict=True)) / n,
            "unparseable": (sum(f is None for f in first) + sum(s is None for s in swapped)) / (2 * n),
            "inconsistent": sum(inconsistent) / n,
            "consistent_wrong": sum(labels[i] is not None and not inconsistent[i] for i in errors) / n,
            "position_bias": sum(same_place) / n,
            "errors": len(errors) / n,
            "systematic_errors": sum((labels[i] is not None and not inconsistent[i]) or same_place[i]
                                     for i in errors) / n}


def repeats(engine, items, first, seed: int) -> dict:
    """2. How often two judgments of the same prompt disagree: greedy (a second, uncached pass) vs two samples at
    temperature 1 (book ch.5.9)."""
    tok, r = corpus()[0], renderer()
    convs = [PAIR.messages(t.word, a, b) for t, a, b in items]
    prompts = [r.generation_prompt(c) for c in convs]
    draws = []
    for k in range(2):
        g = torch.Generator().manual_seed(derive(seed, 40 + k, stride=7919))
        out = engine.sample(prompts, 3, g, temperature=1.0, stop_ids=r.stop_ids, pad_id=tok.pad_id)
        draws.append([parse_verdict(PAIR, r.action_text(t)) for t in out.tokens])
    again = [parse_verdict(PAIR, x) for x in Judge(engine, r, PAIR, max_new_tokens=3, cache=False).replies(convs)]
    n = len(items)
    return {"repeat_disagreement_t1": sum(x != y for x, y in zip(*draws, strict=True)) / n,
            "repeat_disagreement_t0": sum(x != y for x, y in zip(first, again, strict=True)) / n}


def cai_labels(engine, items) -> dict:
    """3. Constitutional AI's label: P(A) vs P(B) as the judge's first reply token after the (compact) feedback
    prompt, on the items the verifier decides; beside the judge's generated verdict."""
    tok, r = corpus()[0], renderer()
    decided = [(t, a, b) for t, a, b in items if verifier_verdict(a, b) != "tie"]
    truth = [verifier_verdict(a, b) for _, a, b in decided]
    prompts = [r.generation_prompt(PAIR.messages(t.word, a, b)) for t, a, b in decided]
    logp = choice_logprobs(engine, prompts, [tok.encode("A")[0], tok.encode("B")[0]], tok.pad_id)  # [n, 2]
    p_a = soft_labels(logp).tolist()  # [n]
    greedy = [parse_verdict(PAIR, x) for x in compact_judge(engine).replies(
        [PAIR.messages(t.word, a, b) for t, a, b in decided])]
    n = len(decided)
    return {"agreement": sum((p > 0.5) == (t == "A") for p, t in zip(p_a, truth, strict=True)) / n,
            "greedy_agreement": sum(g == t for g, t in zip(greedy, truth, strict=True)) / n,
            "mean_p_right": sum(p if t == "A" else 1 - p for p, t in zip(p_a, truth, strict=True)) / n,
            "p_a_when_a": sorted(p for p, t in zip(p_a, truth, strict=True) if t == "A"),
            "p_a_when_b": sorted(p for p, t in zip(p_a, truth, strict=True) if t == "B")}


def rubric_on_samples(ctx, judge: Judge) -> dict:
    """4. The demo's rubric on samples of the SFT policy (verifier items and the judge's item): pass rates, and
    the judge-graded item beside the verifier."""
    config, demo = ctx.config, ctx.config.judges
    policy = ctx.engine(sft_model(ctx.run_dir))
    tasks = [InstructTask(w) for w in SEEN]
    trajs = sample_episodes(instruct_source(policy, "preference", config.max_reply), tasks, demo.rubric_samples,
                            derive(config.seed, 35, stride=7919))
    replies = [t.info["reply"] for t in trajs]
    asked = [tasks[i // demo.rubric_samples] for i in range(len(trajs))]  # episode i answers task i // n
    rubric = RubricReward(demo_rubric(), judge)
    scores = rubric(reward_batch(asked, replies))
    judged = judge.ask([t.word for t in asked], replies, [PERIOD] * len(replies))
    graded = [(j, ends_with_period(r)) for j, r in zip(judged, replies, strict=True) if j is not None]
    return {"pass": {i.title: rubric.metrics.get(f"reward/rubric/pass/{slug(i.title)}") for i in rubric.rubric.items},
            "verifier_period": sum(map(ends_with_period, replies)) / len(replies),
            "judge_item_agreement": sum(j == v for j, v in graded) / max(1, len(graded)),
            "ungraded": rubric.metrics["reward/rubric/ungraded"],
            "mean_score": _mean([s for s in scores if s is not None]), "n": len(replies),
            "examples": list(zip(replies, scores, strict=True))[:: demo.rubric_samples][:3]}


def stage_judge_dpo(ctx, labels: str) -> dict:
    """DPO from the SFT policy on the pool of pairs labelled by the judge ("ai") or the verifier ("verifier")."""
    config, demo = ctx.config, ctx.config.judges
    tok = corpus()[0]
    _, pool, _ = split_pairs(config.seed)
    items = oriented(pool, derive(config.seed, 36, stride=7919))
    result: dict = {"labels": labels, "n_pool": len(items)}
    if labels == "ai":
        judge_model, _ = load_model(ctx.run_dir / "judge_train" / "judge")
        judge = compact_judge(ctx.engine(judge_model))
        words, a, b = [t.word for t, _, _ in items], [x for _, x, _ in items], [y for _, _, y in items]
        got = label_pairs(judge.compare(words, a, b), a, b)
        pairs = [(items[i][0], c, r) for i, c, r in got.pairs]
        result.update(n_pairs=len(pairs), ties=got.ties, unparseable=got.unparseable,
                      inconsistent=judge.metrics["reward/judge/inconsistent"],
                      label_agreement=sum(ends_with_period(c) and not ends_with_period(r) for _, c, r in pairs)
                      / max(1, len(pairs)))
    else:
        pairs = [(t, x, y) if ends_with_period(x) else (t, y, x) for t, x, y in items]
        result.update(n_pairs=len(pairs), ties=0, unparseable=0, label_agreement=1.0)
    if not pairs:  # a judge that is all position bias: every pair a tie. Reported, not an error of the run
        return {**result, "reward": None, "kl": None, "format": None, "end_share": None, "examples": []}
    sft = sft_model(ctx.run_dir)
    ref = ctx.engine(copy.deepcopy(sft))
    eval_seed = derive(config.seed, 4, stride=7919)  # chapter 13's B5 evaluation seed
    if labels == "verifier":
        result["sft"] = {k: v for k, v in evaluate_policy(ref, ref, config, seed=eval_seed).items() if k != "examples"}
    torch.manual_seed(config.seed)
    engine = ctx.engine(sft, config.dpo_optim)
    train_dpo(engine, rendered_pairs(pairs), dataclasses.replace(config.dpo, beta=demo.dpo_beta), tok.pad_id, ctx.run())
    result.update(evaluate_policy(engine, ref, config, seed=eval_seed))
    return result


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


# --- claims and report ----------------------------------------------------------------------------
LABELS = {"ai": "AI (the judge's)", "verifier": "verifier"}
"""who labelled a DPO run's pairs, as the report says it"""


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def claims(results: dict, config) -> list[Claim]:
    j, ai, ver = results["judge_train"], results["judge_dpo_ai"], results["judge_dpo_verifier"]
    sft = ver["sft"]
    n_eval = j["n_eval"]
    count = lambda share: round(share * n_eval)  # noqa: E731 - a share of the held-out pairs, as a count
    n_dpo = config.eval_per_word * len(SEEN)  # replies per policy of the B5 harness, one seed for all three
    cai, rub = j["cai"], j["rubric"]
    n_decided = len(cai["p_a_when_a"]) + len(cai["p_a_when_b"])
    return [
        j1(ai, ver, sft, n_dpo),
        Claim("J2", "the judge's labels: repeat disagreement (noise) vs reproducible, directional errors (bias)",
              "RLHF book ch.12 §12.11: synthetic preference data is low-noise and high-bias",
              f"greedy repeats disagree on {pct(j['repeat_disagreement_t0'])}; labels differ from the verifier on "
              f"{count(j['errors'])} of {n_eval} pairs, {count(j['systematic_errors'])} of them systematically "
              f"(the same wrong label in both orders: {count(j['consistent_wrong'])}); the same position in both "
              f"orders on {count(j['position_bias'])} pairs",
              "Synthetic preference data is low-noise and high-bias: two greedy labellings of a pair never disagree, "
              "and more than half of the judge's errors are systematic (reproducible, with a direction; binomial "
              "over its errors)", *j2(j, n_eval)),
        Claim.compare("J3", "position-swap consistency on held-out pairs",
                      "RLHF book ch.12 §12.11 (and §5.9a): LLMs are inconsistent evaluators (Wang et al.)",
                      f"{count(j['inconsistent'])} of {n_eval} pairs ({pct(j['inconsistent'])}) get opposite verdicts "
                      f"when A and B swap; agreement with the verifier {pct(j['agreement'])} (one order "
                      f"{pct(j['first_order_agreement'])}), unparseable {pct(j['unparseable'])}",
                      "Several works have shown that LLMs are inconsistent evaluators: more than 1% of held-out pairs "
                      "get a different verdict when the answers swap places",
                      share(count(j["inconsistent"]), n_eval, 0.01), ">", 0.0),
        Claim.compare("J4", "temperature 0 vs 1: two judgments of the same prompt disagree",
                      "RLHF book ch.5 §5.9b: a sampling temperature of 0 reduces the variance of ratings",
                      f"greedy {count(j['repeat_disagreement_t0'])} of {n_eval} "
                      f"({pct(j['repeat_disagreement_t0'])}), temperature 1 {count(j['repeat_disagreement_t1'])} of "
                      f"{n_eval} ({pct(j['repeat_disagreement_t1'])})",
                      "A common trick to improve the robustness of LLM-as-a-judge workflows is to use a sampling "
                      "temperature of 0 to reduce variance: repeats disagree less at temperature 0 than at 1",
                      two_shares(count(j["repeat_disagreement_t1"]), n_eval, count(j["repeat_disagreement_t0"]),
                                 n_eval), ">", 0.0),
        Claim.compare("J5", "Constitutional AI's label: P(A) vs P(B) as the next token",
                      "RLHF book ch.12 §12.13: look at which token (A or B) had a higher probability",
                      f"agrees with the verifier on {pct(cai['agreement'])} of {n_decided} decided pairs (the "
                      f"generated verdict: {pct(cai['greedy_agreement'])}); mean soft label on the right answer "
                      f"{fmt(cai['mean_p_right'])}",
                      "Prompting the model and looking at which token (A or B) had a higher probability gives a label: "
                      "it agrees with the verifier at least as often as the judge's generated verdict, less 2 points "
                      "(not below that by more than 2 SE)",
                      shares(cai["agreement"], cai["greedy_agreement"], n_decided), "not <", -0.02),
        Claim.compare("J6", "a rubric item graded by the judge vs by the verifier (SFT samples)",
                      "RLHF book ch.12 §12.14: rubrics give nearly-verifiable criteria for prompts without "
                      "verifiable answers",
                      f"judge's 'ends with a period' agrees with the verifier on {pct(rub['judge_item_agreement'])} "
                      f"of {rub_graded(rub)} graded samples ({rub['n']} sampled; ungraded {pct(rub['ungraded'])})",
                      "The idea of rubrics emerged as a way to get nearly-verifiable criteria: the judge-graded item "
                      "agrees with the verifier on more than 90% of the policy's samples",
                      share(round(rub["judge_item_agreement"] * rub_graded(rub)), rub_graded(rub), 0.9), ">", 0.0),
    ]


def rub_graded(rub: dict) -> int:
    """The rubric samples the judge graded (the others were unparseable)."""
    return max(1, round(rub["n"] * (1 - rub["ungraded"])))


def j1(ai: dict, ver: dict, sft: dict, n: int) -> Claim:
    """J1: DPO on AI labels gains at least 80% of what DPO on verifier labels gains: ai - sft >= 0.8 (ver - sft),
    i.e. ai - 0.8 ver - 0.2 sft >= 0, each a share of n replies (binomial, independent); and the verifier's run
    gains at all (beyond 2 SE)."""
    base = (f"verifier {pct(ver['reward'])}@{fmt(ver['kl'], 1)} ({ver['n_pairs']} pairs); SFT {pct(sft['reward'])}; "
            f"{n} replies each")
    claim = ("Some early work in RLAIF shows that AI feedback can completely replace human data: DPO on the judge's "
             "labels gains at least 80% of the reward DPO on the verifier's labels gains over the SFT policy (not "
             "less by more than 2 SE), and the verifier's DPO gains (by more than 2 SE)")
    what = "DPO on AI labels vs on verifier labels (reward @ KL, B5 harness)"
    seed = ("RLHF book ch.12 §12.11: AI feedback can completely replace human data (Lee et al.); here the verifier "
            "plays the human")
    if ai["reward"] is None:
        return Claim("J1", what, seed, f"AI: no pair kept of {ai['n_pool']} ({ai['ties']} ties, {ai['unparseable']} "
                     f"unparseable), no DPO; " + base, claim, False, why="the judge kept no pair")
    se = lambda p: share_se(p, n)  # noqa: E731
    gap = Estimate(ai["reward"] - 0.8 * ver["reward"] - 0.2 * sft["reward"],
                   math.sqrt(se(ai["reward"]) ** 2 + (0.8 * se(ver["reward"])) ** 2 + (0.2 * se(sft["reward"])) ** 2),
                   n, f"AI - 0.8 verifier - 0.2 SFT, binomial over {n} replies each")
    holds, est = decide(*[(shares(ver["reward"], sft["reward"], n), ">", 0.0), (gap, "not <", 0.0)])
    ours = (f"AI {pct(ai['reward'])}@{fmt(ai['kl'], 1)} ({ai['n_pairs']} pairs, {ai['ties']} ties dropped, "
            f"{pct(ai['label_agreement'])} of them labelled as the verifier does); " + base)
    return Claim("J1", what, seed, ours, claim, holds, est)


def j2(j: dict, n_eval: int) -> tuple[Holds, Estimate | None, str, float, str]:
    """J2's (holds, estimate, test, margin, why): greedy repeats never disagree (a count: exact), and the
    systematic share of the errors is above one half (binomial over the errors)."""
    errors, systematic = round(j["errors"] * n_eval), round(j["systematic_errors"] * n_eval)
    if errors == 0:
        return None, None, "", 0.0, "the judge made no error: no bias to measure"
    est = share(systematic, errors, 0.5, f"binomial over its {errors} errors")
    if j["repeat_disagreement_t0"] != 0:
        return False, est, "", 0.0, "greedy repeats disagree"
    return judge(est, ">"), est, ">", 0.0, ""


def section(run_dir: Path, results: dict, config) -> str:
    j, ai, ver = results["judge_train"], results["judge_dpo_ai"], results["judge_dpo_verifier"]
    sft, cai, rub = ver["sft"], j["cai"], j["rubric"]
    run_dir = Path(run_dir)
    points = {"SFT": ([0.0], [sft["reward"]]), "DPO, verifier labels": ([ver["kl"]], [ver["reward"]])}
    if ai["reward"] is not None:
        points["DPO, AI labels (tiny judge)"] = ([ai["kl"]], [ai["reward"]])
    line_plot(run_dir / "judges_frontier.png", points,
              f"DPO (beta {config.judges.dpo_beta:g}) on AI vs verifier labels",
              "KL from the SFT model (nats per reply)",
              "replies ending with a period", (0, 1.05),
              styles={"SFT": "*", "DPO, verifier labels": "s", "DPO, AI labels (tiny judge)": "o"})
    when_a, when_b = cai["p_a_when_a"], cai["p_a_when_b"]
    line_plot(run_dir / "judges_cai.png",
              {"pairs where A ends with '.'": ([k / max(1, len(when_a) - 1) for k in range(len(when_a))], when_a),
               "pairs where B ends with '.'": ([k / max(1, len(when_b) - 1) for k in range(len(when_b))], when_b)},
              "Constitutional AI soft labels: P(A) / (P(A) + P(B))", "quantile of the held-out pairs",
              "soft label P(A)", (0, 1.02), styles={"pairs where A ends with '.'": "-",
                                                    "pairs where B ends with '.'": "--"})
    judge_rows = [("agreement with the verifier (swap-consistent label)", pct(j["agreement"])),
                  ("agreement, one order only", pct(j["first_order_agreement"])),
                  ("unparseable replies", pct(j["unparseable"])),
                  ("swap-inconsistent pairs (counted as ties)", pct(j["inconsistent"])),
                  ("swap-consistent but wrong", pct(j["consistent_wrong"])),
                  ("same position in both orders (A, A or B, B)", pct(j["position_bias"])),
                  ("labels unlike the verifier's / of them systematic", f"{pct(j['errors'])} / "
                                                                       f"{pct(j['systematic_errors'])}"),
                  ("repeat disagreement, greedy / temperature 1",
                   f"{pct(j['repeat_disagreement_t0'])} / {pct(j['repeat_disagreement_t1'])}"),
                  ("CAI P(A) vs P(B) label agreement", pct(cai["agreement"])),
                  ("training examples / final loss", f"{j['n_train_examples']} / {fmt(j['train_loss'], 3)}")]
    dpo_rows = [("SFT", pct(sft["reward"]), "0", pct(sft["format"]), "-", "-")]
    dpo_rows += [(f"DPO, {LABELS[r['labels']]} labels", pct(r["reward"]), fmt(r["kl"]), pct(r["format"]),
                  f"{r['n_pairs']} of {r['n_pool']} ({r['ties']} ties, {r['unparseable']} unparseable)",
                  pct(r["label_agreement"])) for r in (ver, ai)]
    rubric_rows = [(title, pct(rate)) for title, rate in rub["pass"].items()]
    examples = " / ".join(f"{_escape(r)!s} -> {fmt(s)}" for r, s in rub["examples"])
    return ("## Judges, rubrics and AI feedback (ch.5.9, 12.11-12.14)\n\n"
            f"A tiny judge (the SFT(narrow) network SFT'd on compact judge prompts labelled by `ends_with_period`) on "
            f"{j['n_eval']} held-out pairs ({config.judges.eval_ties} of them ties):\n\n"
            + markdown_table(["judge", "value"], judge_rows)
            + f"\n\nDPO (beta {config.judges.dpo_beta:g}, {config.dpo.steps} steps) from the SFT policy on the same "
              "pool of pairs, labelled by the judge (RLAIF) or by the verifier, read with the B5 harness:\n\n"
            + markdown_table(["policy", "reward", "KL (nats)", "format", "pairs kept", "labels agreeing with the "
                              "verifier"], dpo_rows)
            + f"\n\nA rubric (Format A categories; 'Ends with a period' graded by the judge, the rest by verifiers) "
              f"on {rub['n']} SFT samples: mean score {fmt(rub['mean_score'])}, judge item vs verifier "
              f"{pct(rub['judge_item_agreement'])} (verifier pass rate {pct(rub['verifier_period'])}).\n\n"
            + markdown_table(["rubric item", "pass rate"], rubric_rows)
            + f"\n\nExamples (reply -> rubric score): {examples}\n\n"
            + image(run_dir / "judges_frontier.png", "DPO on AI vs verifier labels") + " "
            + image(run_dir / "judges_cai.png", "CAI soft labels"))


def _escape(text: str) -> str:
    """Reply text for markdown: no raw HTML (`<`, `>`, `&`), no table pipes."""
    return repr(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
