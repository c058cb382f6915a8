"""Graders recipe, part 'reward_models': reward models as graders (RLHF book ch.5; Suggested Experiments S5.1-S5.3).

    orm      (after coldstart)   an outcome reward model on the chapter-13 calculator's own samples, labelled
                                 by the verifier (correct / wrong): its held-out AUC and accuracy, and best-of-N
                                 reranking with it against a random pick and the verifier's oracle pick
    prm      (no upstream)       a process reward model on scripted BugFix episodes with one label per action
                                 (read 1, the right edit 1, a wrong edit 0, hardcode_tests 0, submit 1 iff the
                                 hidden tests pass): per-step accuracy on held-out tasks, and how its min / mean
                                 over steps ranks episodes that fix the bug above those that do not
    bt       (after sft_narrow)  S5.1, S5.3: the chapter-13 Bradley-Terry RM (ends-with-a-period pairs) with its
                                 margin logged every step; then rm-eval's function on the 128 held-out pairs,
                                 one category per prompt word
    kwise    (after sft_narrow)  K-wise Plackett-Luce vs all-pairs Bradley-Terry (InstructGPT) on the same
                                 ranked lists of K = 4 corpus lines

How this departs from the book, and why:

1. The ORM's and PRM's labels come from verifiers (the calculator's exact answer, BugFix's tests), not from
   human step annotations (PRM800K): the gyms can check them, the tiny models cannot be asked.
2. The PRM's "steps" are an agent's actions (one label per action, on its last token), not lines of a
   chain of thought; the loss and the packaging (label on the step's last token) are the book's.
3. The ranked lists' order is a made-up graded preference extending chapter 13's hidden one (a line ending in
   '.' > '!' or '?' > ',' ';' ':' > anything else), so that K = 4 completions have a strict order.
4. Models are tiny (a 2-layer, 64-wide network): where one cannot show the book's point, the claim says so
   with the numbers.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

import torch

from ...algorithms.best_of_n import best_of_n
from ...algorithms.reward_model import (RewardModelConfig, outcome_labels, process_labels, train_ranked_reward_model,
                                        train_reward_model, train_token_reward_model)
from ...engine import OptimConfig
from ...envs.arithmetic import heldout_tasks, train_tasks
from ...envs.bugfix import OPS, BugFixEnv
from ...envs.instruct import SEEN, InstructTask, preference_pairs
from ...models.tiny import TinyConfig, TinyTransformer, load_model
from ...objectives.reward_model import AGGREGATES
from ...config import check_choices
from ...runs.plots import Panel, bar_plot, line_plot, panel_plot
from ...runs.report import Claim, fmt, image, markdown_table
from ...runs.stages import Stage
from ...runs.verdicts import Estimate, decide, difference, judge, share, shares
from ...seeding import derive
from ...sources.episodes import sample_episodes
from ...sources.rollout import scripted_rollout
from ...sources.scoring import RewardKind, reward_model_scores, scorer, step_ends, token_reward_scores
from ...text.render import Renderer
from ...trajectory import collate
from ..shared.instruct import corpus, demo, renderer
from ..shared.preference import rendered_pairs, sft_model
from ..shared.calculator import source_for
from ..hf.rm_eval import evaluate_pairs


@dataclass
class Demo:
    """this part's settings"""

    orm_tasks: int = 192
    """calculator training problems the ORM's samples answer"""
    orm_samples: int = 8
    """samples of each training problem (labelled by the verifier)"""
    orm_steps: int = 150
    """ORM optimizer steps"""
    orm_batch: int = 64
    """episodes per ORM step"""
    orm_aggregate: Literal["mean", "min", "product", "last"] = "mean"
    """how the ORM's per-token probabilities become the best-of-N score (mean, min, product, last)"""
    bon_n: int = 8
    """best-of-N: samples per held-out problem (the 256 of chapter 13)"""
    prm_steps: int = 150
    """PRM optimizer steps"""
    prm_batch: int = 32
    """episodes per PRM step"""
    prm_dim: int = 64
    """the PRM network's width (2 layers, trained from scratch on BugFix's words)"""
    bt_steps: int = 40
    """Bradley-Terry RM steps (S5.1: its margin every step)"""
    kwise_lists: int = 96
    """ranked lists (K = 4) to train on; 64 more are held out"""
    kwise_steps: int = 40
    """optimizer steps of each of Plackett-Luce and all-pairs Bradley-Terry"""
    lr: float = 1e-3
    """learning rate of the ORM, the PRM and the K-wise models (the BT model uses chapter 13's)"""

    def __post_init__(self) -> None:
        check_choices(self)  # orm_aggregate
        counts = ("orm_tasks", "orm_samples", "orm_steps", "orm_batch", "bon_n", "prm_steps", "prm_batch", "prm_dim",
                  "bt_steps", "kwise_lists", "kwise_steps")
        bad = [n for n in counts if getattr(self, n) < 1]
        if bad or not self.lr > 0:
            raise ValueError(f"reward_models: {', '.join(bad) or 'lr'} must be positive")


def auc(scores: Sequence[float], positive: Sequence[bool]) -> float:
    """Area under the ROC curve: the chance that a random positive scores above a random negative (ties count
    half; the Mann-Whitney statistic). NaN when either class is empty."""
    pos = [s for s, y in zip(scores, positive, strict=True) if y]
    neg = [s for s, y in zip(scores, positive, strict=True) if not y]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def _value_model(model: TinyTransformer) -> TinyTransformer:
    """The network plus a fresh scalar head (a reward model initialised from it, as the book's)."""
    rm = TinyTransformer(dataclasses.replace(model.config, value_head=True))
    rm.load_state_dict(model.state_dict(), strict=False)
    return rm


# --- ORM on the calculator ---------------------------------------------------------------------------
def stage_orm(ctx) -> dict:
    """Sample, label by the verifier, train the ORM; held-out AUC / accuracy; best-of-N with it."""
    config, d = ctx.config, ctx.config.reward_models
    calc, tok = load_model(ctx.run_dir / "coldstart" / "model")
    r = Renderer(tok)
    policy = ctx.engine(calc)
    # 1. the calculator's samples of training problems, labelled by the verifier
    tasks = train_tasks(d.orm_tasks, seed=derive(config.seed, 41))
    samples = sample_episodes(source_for(policy, r), tasks, d.orm_samples, derive(config.seed, 42))
    data = [(t, outcome_labels(t, t.reward >= 1)) for t in samples]
    # 2. the ORM: the calculator plus a per-token head, per-token BCE on the outcome
    torch.manual_seed(config.seed)
    engine = ctx.engine(_value_model(calc), OptimConfig(lr=d.lr))
    history = train_token_reward_model(engine, data, RewardModelConfig(steps=d.orm_steps, batch_size=d.orm_batch,
                                       objective="orm", seed=derive(config.seed, 43)), tok.pad_id, ctx.run())
    # 3. best-of-N on the 256 held-out problems: the ORM's pick, a random pick, the verifier's (oracle) pick
    g = torch.Generator().manual_seed(derive(config.seed, 44))
    kind = RewardKind("orm", d.orm_aggregate)
    held = list(heldout_tasks())
    chosen, every = best_of_n(held, source_for(policy, r), d.bon_n, g, scorer(engine, kind, tok.pad_id))
    correct = [t.reward >= 1 for t in every]
    n = d.bon_n
    groups = [correct[i * n:(i + 1) * n] for i in range(len(held))]
    scores = {how: token_reward_scores(engine, every, tok.pad_id, "orm", how) for how in AGGREGATES}
    mean_p = scores["mean"]
    return {
        "train_samples": len(data), "train_correct": sum(t.reward >= 1 for t in samples) / len(samples),
        "loss": [h["train/loss"] for h in history],
        "heldout_samples": len(every), "heldout_correct": sum(correct) / len(correct),
        "auc": {how: auc(s, correct) for how, s in scores.items()},
        "accuracy": sum((p > 0.5) == y for p, y in zip(mean_p, correct, strict=True)) / len(correct),
        "bon": {"orm": sum(t.reward >= 1 for t in chosen) / len(chosen),
                "random": sum(correct) / len(correct),  # the expected pass rate of a uniformly random pick
                "oracle": sum(any(gr) for gr in groups) / len(groups)},
        "n": n, "aggregate": d.orm_aggregate}


# --- PRM on BugFix actions -----------------------------------------------------------------------------
@dataclass
class Script:
    """A scripted BugFix agent: its actions in order (`ScriptedPolicy`)."""

    actions: list[str]

    def act(self, messages) -> str:
        return self.actions[sum(m["role"] == "assistant" for m in messages)]


def action_label(action: str, right_op: str, info: dict) -> tuple[str, int]:
    """(kind, 0/1 label) of one action: read 1, the right edit 1, a wrong edit 0, hardcode_tests 0, submit 1 iff
    the hidden tests pass."""
    if action == "read":
        return "read", 1
    if action == "submit":
        return "submit", int(bool(info.get("hidden_pass")))
    if action == "hardcode_tests":
        return "hardcode", 0
    return ("right edit", 1) if action == f"edit {right_op}" else ("wrong edit", 0)


def bugfix_episodes(tasks, renderer: Renderer, seed: int) -> list[tuple]:
    """Scripted episodes per task: read + right edit + submit, read + each wrong edit + submit, a wrong edit then
    the right one, the right edit without reading, the exploit -> [(episode, kinds, labels, task)]."""
    rng, out = random.Random(seed), []
    for task in tasks:
        right = task.op
        wrong = [op for op in OPS if op != right]
        scripts = ([["read", f"edit {right}", "submit"], [f"edit {right}", "submit"],
                    ["read", "hardcode_tests", "submit"],
                    ["read", f"edit {rng.choice(wrong)}", f"edit {right}", "submit"]]
                   + [["read", f"edit {w}", "submit"] for w in wrong])
        for actions in scripts:
            t = scripted_rollout(Script(actions), BugFixEnv(), task, renderer, max_turns=6, max_action_tokens=8)
            kinds, labels = zip(*(action_label(a, right, t.info) for a in actions), strict=True)
            out.append((t, list(kinds), list(labels), task.name))
    return out


def stage_prm(ctx) -> dict:
    """Train the PRM on the training tasks' scripted episodes; per-step accuracy and episode ranking on held-out
    tasks."""
    from ...envs.bugfix import build_tokenizer
    from ...envs.bugfix_tasks import make_tasks

    config, d = ctx.config, ctx.config.reward_models
    tok = build_tokenizer()
    r = Renderer(tok)
    train = bugfix_episodes(make_tasks("train"), r, derive(config.seed, 51))
    test = bugfix_episodes(make_tasks("heldout"), r, derive(config.seed, 52))
    longest = max(len(t) for t, *_ in train + test)
    torch.manual_seed(config.seed)
    model = TinyTransformer(TinyConfig(tok.vocab_size, d.prm_dim, 2, 4, max_len=longest, value_head=True))
    engine = ctx.engine(model, OptimConfig(lr=d.lr))
    data = [(t, process_labels(t, labels)) for t, _, labels, _ in train]
    history = train_token_reward_model(engine, data, RewardModelConfig(steps=d.prm_steps, batch_size=d.prm_batch,
                                       objective="prm", seed=derive(config.seed, 53)), tok.pad_id, ctx.run())
    # per-step accuracy on held-out tasks, by kind of action
    with torch.no_grad():
        trajs = [t for t, *_ in test]
        values = engine.forward(collate(trajs, tok.pad_id), values=True).values.float()
    right: dict[str, list[bool]] = {}
    for row, (t, kinds, labels, _) in enumerate(test):
        p = torch.sigmoid(values[row, step_ends(t)]).tolist()
        for kind, y, q in zip(kinds, labels, p, strict=True):
            right.setdefault(kind, []).append((q > 0.5) == bool(y))
    good = [bool(labels[-1]) for _, _, labels, _ in test]  # the hidden tests passed at submit
    ranking = {}
    for how in ("min", "mean", "last"):
        s = token_reward_scores(engine, trajs, tok.pad_id, "prm", how)
        ranking[how] = auc(s, good)
    return {"train_episodes": len(train), "test_episodes": len(test), "loss": [h["train/loss"] for h in history],
            "step_accuracy": {k: sum(v) / len(v) for k, v in right.items()},
            "step_counts": {k: len(v) for k, v in right.items()},
            "good_share": sum(good) / len(good), "auc": ranking}


# --- S5.1 / S5.3: the BT model's margin, a held-out eval with categories ----------------------------------
def stage_bt(ctx) -> dict:
    """Chapter 13's Bradley-Terry RM (its settings, `bt_steps` steps) with rm/margin every step; then rm-eval's
    `evaluate_pairs` on the held-out pairs, one category per prompt word."""
    config, d = ctx.config, ctx.config.reward_models
    tok, _, _, demos = corpus()
    train, test = preference_pairs(demos, seed=config.seed)
    torch.manual_seed(config.seed)
    engine = ctx.engine(_value_model(sft_model(ctx.run_dir)), config.reward_model_optim)
    rm_config = dataclasses.replace(config.reward_model, steps=d.bt_steps)
    history = train_reward_model(engine, rendered_pairs(train), rm_config, tok.pad_id, ctx.run())
    held = rendered_pairs(test)
    for (task, _, _), (chosen, _) in zip(test, held, strict=True):
        chosen.info["category"] = task.word
    t0 = time.perf_counter()
    with torch.no_grad():
        report = evaluate_pairs(lambda ts: reward_model_scores(engine, ts, tok.pad_id), held)
    return {"margin": [h["rm/margin"] for h in history], "accuracy": [h["rm/accuracy"] for h in history],
            "eval": report, "eval_s": time.perf_counter() - t0}


# --- K-wise Plackett-Luce vs all-pairs Bradley-Terry ------------------------------------------------------
def finish_rank(line: str) -> int:
    """How finished a line reads (the ranked lists' made-up graded preference): '.' 3, '!' '?' 2, ',' ';' ':' 1,
    anything else 0."""
    end = line.rstrip()[-1:]
    return 3 if end == "." else 2 if end in "!?" else 1 if end in ",;:" else 0


def ranked_lists(demos: dict, n: int, seed: int) -> list[list]:
    """n lists of K = 4 lines of one seen word, one per finish rank, best first: [(task, [lines])]."""
    rng, out = random.Random(seed), []
    while len(out) < n:
        w = rng.choice(SEEN)
        by_rank = [[x for x in demos[w] if finish_rank(x) == k] for k in (3, 2, 1, 0)]
        if all(by_rank):
            out.append((InstructTask(w), [rng.choice(b) for b in by_rank]))
    return out


def stage_kwise(ctx) -> dict:
    """Plackett-Luce and all-pairs Bradley-Terry from the same start on the same ranked lists; held-out pair and
    top-1 accuracy of each."""
    config, d = ctx.config, ctx.config.reward_models
    tok, _, _, demos = corpus()
    rr = renderer()
    lists = ranked_lists(demos, d.kwise_lists + 64, derive(config.seed, 61))
    rendered = [[demo(rr, task, x) for x in lines] for task, lines in lists]
    train, test = rendered[:d.kwise_lists], rendered[d.kwise_lists:]
    out = {}
    for objective in ("plackett-luce", "bt"):
        torch.manual_seed(config.seed)
        engine = ctx.engine(_value_model(sft_model(ctx.run_dir)), OptimConfig(lr=d.lr))
        history = train_ranked_reward_model(engine, train, RewardModelConfig(steps=d.kwise_steps, batch_size=16,
                                            objective=objective, seed=derive(config.seed, 62)), tok.pad_id, ctx.run())
        with torch.no_grad():
            s = reward_model_scores(engine, [t for g in test for t in g], tok.pad_id)
        K = 4
        per = [s[i * K:(i + 1) * K] for i in range(len(test))]
        pairs = [(g[i] > g[j]) for g in per for i in range(K) for j in range(i + 1, K)]
        out[objective] = {"pair_accuracy": sum(pairs) / len(pairs),
                          "top1": sum(max(range(K), key=g.__getitem__) == 0 for g in per) / len(per),
                          "loss": [h["train/loss"] for h in history]}
    out["test_lists"], out["train_lists"] = len(test), len(train)
    return out


# --- the recipe part ------------------------------------------------------------------------------------
def stages(config) -> list[Stage]:
    own = ("seed", "reward_models")  # `Stage.reads`
    return [Stage("rm_orm", stage_orm, after=("coldstart",), reads=own), Stage("rm_prm", stage_prm, reads=own),
            Stage("rm_bt", stage_bt, after=("sft_narrow",), reads=(*own, "reward_model", "reward_model_optim")),
            Stage("rm_kwise", stage_kwise, after=("sft_narrow",), reads=own)]


def auc_se(a: float, n_pos: int, n_neg: int) -> float:
    """The standard error of an AUC `a` from n_pos positives and n_neg negatives (Hanley and McNeil 1982):
    sqrt((a (1 - a) + (n_pos - 1)(q1 - a^2) + (n_neg - 1)(q2 - a^2)) / (n_pos n_neg)), q1 = a / (2 - a),
    q2 = 2 a^2 / (1 + a). NaN when either class is empty."""
    if n_pos < 1 or n_neg < 1 or math.isnan(a):
        return float("nan")
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    return math.sqrt(max(a * (1 - a) + (n_pos - 1) * (q1 - a * a) + (n_neg - 1) * (q2 - a * a), 0.0) / (n_pos * n_neg))


def auc_against(a: float, n_pos: int, n_neg: int, bar: float) -> Estimate:
    """An AUC against a bar, with its Hanley-McNeil standard error."""
    return Estimate(a - bar, auc_se(a, n_pos, n_neg), n_pos + n_neg, f"AUC, {n_pos} positives and {n_neg} negatives")


def claims(results: dict, config) -> list[Claim]:
    out = []
    orm, prm, bt, kw = (results.get(k) for k in ("rm_orm", "rm_prm", "rm_bt", "rm_kwise"))
    if orm:
        a, n = orm["auc"]["mean"], orm["heldout_samples"]
        pos = round(orm["heldout_correct"] * n)
        out.append(Claim.compare(
            "R1", "ORM on the calculator's samples", "RLHF book ch.5 §S5.2",
            f"held-out AUC {fmt(a)} (min {fmt(orm['auc']['min'])}, product {fmt(orm['auc']['product'])}, "
            f"last {fmt(orm['auc']['last'])}); accuracy {fmt(orm['accuracy'])} at a base rate of "
            f"{fmt(1 - orm['heldout_correct'])} wrong, {n} samples",
            '"The ORM should separate correct from incorrect final answers" (RLHF book ch.5 Suggested Experiments '
            "§S5.2; §5.6): held-out AUC of the mean p_t above 0.75 (by more than 2 SE)",
            auc_against(a, pos, n - pos, 0.75), ">", 0.0))
        b, problems = orm["bon"], orm["heldout_samples"] // orm["n"]
        out.append(Claim.compare(
            "R2", f"best-of-{orm['n']} reranked by the ORM", "RLHF book ch.9 §S9.2",
            f"pass rate on {problems} problems: ORM pick {fmt(b['orm'])}, random pick {fmt(b['random'])}, "
            f"oracle {fmt(b['oracle'])}",
            '"the RM-selected run must beat its random control" (RLHF book ch.9 §S9.2) with an ORM as the RM (ch.5 '
            "Inference: ORM usage, rerank finished candidates): by more than 2 SE",
            shares(b["orm"], b["random"], problems), ">", 0.0))
    if prm:
        acc, counts = prm["step_accuracy"], prm["step_counts"]
        parts = [(share(round(acc[k] * counts[k]), counts[k], 0.8, f"{k}: binomial over {counts[k]} steps"), ">", 0.0)
                 for k in ("right edit", "wrong edit") if k in acc]
        holds, est = decide(*parts) if len(parts) == 2 else (None, None)
        out.append(Claim("R3", "PRM on BugFix actions", "RLHF book ch.5 §S5.2",
                         "held-out step accuracy: " + ", ".join(f"{k} {fmt(v)} of {counts[k]}" for k, v in acc.items()),
                         '"the PRM should score intermediate steps" (RLHF book ch.5 §S5.2; §5.7): above 0.8 on both '
                         "right and wrong edits (the intermediate steps), each by more than 2 SE", holds, est,
                         why="" if len(parts) == 2 else "the held-out episodes lack right or wrong edits"))
        n_test = prm["test_episodes"]
        good = round(prm["good_share"] * n_test)
        out.append(Claim.compare(
            "R4", "PRM aggregation over steps", "RLHF book ch.5 §5.7d",
            f"AUC of fixed vs not fixed episodes ({good} and {n_test - good}): min {fmt(prm['auc']['min'])}, mean "
            f"{fmt(prm['auc']['mean'])}, last {fmt(prm['auc']['last'])}",
            '"Aggregation: over steps (not tokens) -- mean step score, minimum (fail-fast)" (RLHF book ch.5 '
            "Inference Across Reward Model Types, §5.7d): the min over steps ranks episodes that fix the bug "
            "above those that do not, AUC above 0.8 (by more than 2 SE)",
            auc_against(prm["auc"]["min"], good, n_test - good, 0.8), ">", 0.0))
    if bt:
        m = bt["margin"]
        k = max(2, len(m) // 5)
        first, last = m[:k], m[-k:]
        holds, est = decide(*[(difference(last, first, f"last {k} steps - first {k}, unpaired"), ">", 0.0),
                               (difference(last, [0.0] * k, f"last {k} steps, over the steps"), ">", 0.0)])
        out.append(Claim("R5", "BT reward model's margin", "RLHF book ch.5 §S5.1",
                         f"mean r_c - r_r: first {k} steps {fmt(statistics.fmean(first))}, last {k} steps "
                         f"{fmt(statistics.fmean(last))}",
                         '"Watch whether the reward margin between chosen and rejected responses grows" (RLHF book '
                         "ch.5 §S5.1; §5.2): the last steps' margin above the first steps' and above 0, each by more "
                         "than 2 SE (the step-to-step spread of the batch margins)", holds, est))
        e = bt["eval"]
        form = 50 <= e["n"] <= 200 and bt["eval_s"] < 10
        acc = share(round(e["accuracy"] * e["n"]), e["n"], 0.5, f"binomial over {e['n']} pairs")
        out.append(Claim("R6", "held-out RM eval (rm-eval)", "RLHF book ch.5 §S5.3",
                         f"{e['n']} pairs, {len(e['categories'])} categories, {bt['eval_s']:.2f} s: accuracy "
                         f"{fmt(e['accuracy'])}, margin {fmt(e['margin'])}",
                         '"a 50-200-example held-out RM eval reporting accuracy or pair ordering without a full '
                         'training run" (RLHF book ch.5 §S5.3): 50-200 pairs, in seconds, accuracy above chance '
                         "(0.5, by more than 2 SE)", judge(acc, ">") if form else False, acc,
                         ">" if form else "", why="" if form else "not 50-200 pairs in under 10 s"))
    if kw:
        pl, b = kw["plackett-luce"], kw["bt"]
        n_pairs = kw["test_lists"] * 6  # K = 4: 6 ordered pairs per list
        holds, est = decide(*[(share(round(pl["pair_accuracy"] * n_pairs), n_pairs, 0.5,
                                      f"binomial over {n_pairs} pairs"), ">", 0.0),
                               (shares(pl["pair_accuracy"], b["pair_accuracy"], n_pairs,
                                       f"PL - BT, binomial over {n_pairs} pairs"), "not <", -0.05)])
        out.append(Claim("R7", "K-wise Plackett-Luce vs all-pairs BT", "RLHF book ch.5 §5.4-5.5",
                         f"held-out pair accuracy PL {fmt(pl['pair_accuracy'])}, BT {fmt(b['pair_accuracy'])}; top-1 "
                         f"PL {fmt(pl['top1'])}, BT {fmt(b['top1'])} ({kw['test_lists']} lists of 4, {n_pairs} pairs)",
                         '"There are many other formulations that can create suitable models of human preferences ... '
                         'a K-wise loss function based on the Plackett-Luce model" (RLHF book ch.5 K-Wise Loss '
                         "Function, §5.5): PL's held-out pair accuracy above 0.5 (by more than 2 SE) and not more "
                         "than 0.05 below all-pairs BT's (beyond 2 SE)", holds, est))
    return out


def section(run_dir: Path, results: dict, config) -> str:
    parts = ["## Reward models as graders (ch.5)"]
    orm, prm, bt, kw = (results.get(k) for k in ("rm_orm", "rm_prm", "rm_bt", "rm_kwise"))
    if orm:
        b = orm["bon"]
        bar_plot(run_dir / "rm-orm-bon.png",
                 {"random pick": b["random"], "ORM pick": b["orm"], "oracle pick": b["oracle"]},
                 f"Best-of-{orm['n']} on 256 held-out sums", "pass rate", xlabel="which of the N samples is kept")
        q = orm["train_correct"]
        floor = -(q * math.log(q) + (1 - q) * math.log(1 - q)) if 0 < q < 1 else 0.0
        tail = orm["loss"][-10:]
        parts.append(f"**ORM** ({orm['train_samples']} calculator samples, {fmt(q)} correct; labels "
                     "copied onto every answer token). Its training loss ends at "
                     f"{fmt(sum(tail) / len(tail), 3)} (mean of the last {len(tail)} steps) against {fmt(floor, 3)}, "
                     "the loss of predicting the base rate everywhere: where the two meet, the ORM has learned how "
                     "often the calculator is right, not which answers are (to check a sum the grader must compute "
                     "it). Held-out AUC by aggregation:\n\n"
                     + markdown_table(["aggregation", "AUC"], [[k, fmt(v)] for k, v in orm["auc"].items()])
                     + "\n\n" + image(run_dir / "rm-orm-bon.png", "best-of-N pass rates"))
    if prm:
        bar_plot(run_dir / "rm-prm-steps.png", prm["step_accuracy"], "PRM accuracy per held-out step", "accuracy",
                 xlabel="step of the episode")
        parts.append(f"**PRM** ({prm['train_episodes']} scripted training episodes, {prm['test_episodes']} held-out; "
                     f"{fmt(prm['good_share'])} of held-out episodes fix the bug):\n\n"
                     + markdown_table(["step", "held-out steps", "accuracy"],
                                      [[k, prm["step_counts"][k], fmt(v)] for k, v in prm["step_accuracy"].items()])
                     + "\n\n" + markdown_table(["aggregation over steps", "AUC fixed vs not"],
                                               [[k, fmt(v)] for k, v in prm["auc"].items()])
                     + "\n\n" + image(run_dir / "rm-prm-steps.png", "PRM per-step accuracy"))
    if bt:
        steps = list(range(1, len(bt["margin"]) + 1))
        panel_plot(run_dir / "rm-bt-margin.png", [Panel("margin r_c - r_r", {"rm/margin": (steps, bt["margin"])}),
                                                  Panel("pair accuracy", {"rm/accuracy": (steps, bt["accuracy"])},
                                                        (0, 1.02))],
                   "Bradley-Terry RM: margin over training (S5.1)", "optimizer step")
        e = bt["eval"]
        rows = [[c, v["n"], fmt(v["accuracy"]), fmt(v["margin"])] for c, v in e["categories"].items()]
        parts.append("**Bradley-Terry margin (S5.1)** and **held-out eval (S5.3)**, `rm-eval`'s function "
                     f"(`pair_report`) on {e['n']} pairs: accuracy {fmt(e['accuracy'])}, margin {fmt(e['margin'])}\n\n"
                     + image(run_dir / "rm-bt-margin.png", "BT margin per step") + "\n\n"
                     + markdown_table(["category (prompt word)", "pairs", "accuracy", "margin"], rows))
    if kw:
        series = {f"{k} loss": (list(range(1, len(kw[k]["loss"]) + 1)), kw[k]["loss"]) for k in ("plackett-luce", "bt")}
        line_plot(run_dir / "rm-kwise-loss.png", series, "K-wise PL vs all-pairs BT (K = 4)", "optimizer step",
                  "training loss")
        parts.append("**K-wise Plackett-Luce vs all-pairs Bradley-Terry** on the same ranked lists (the order reads "
                     "a line's last character, which both objectives can learn; a tie at the top shows the mechanics "
                     "agree, not which objective is better):\n\n"
                     + markdown_table(["objective", "held-out pair accuracy", "held-out top-1"],
                                      [[k, fmt(kw[k]["pair_accuracy"]), fmt(kw[k]["top1"])]
                                       for k in ("plackett-luce", "bt")])
                     + "\n\n" + image(run_dir / "rm-kwise-loss.png", "K-wise training loss"))
    return "\n\n".join(parts)
