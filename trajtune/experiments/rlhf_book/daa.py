"""RLHF book ch.8 Suggested Experiments (S8.1-S8.4): direct alignment on chapter 13's preference pairs.

Every run starts from chapter 13's `sft_narrow` policy and trains on its (ends with '.', does not) pairs
(`envs.instruct.preference_pairs`), with the library's `train_dpo` and one `DPOConfig.loss` per stage:

    daa_<loss>_lr<i>     loss in dpo / ipo / dpo_norm / simpo / orpo, at each of `lrs` (S8.1-S8.3)
    daa_dpo_pairs<n>     DPO at the first LR on the first n training pairs only (S8.4: data changes)

Each stage logs the loss's own statistics every step (loss, accuracy, margin, chosen / rejected rewards), scores
the 128 held-out pairs with the loss's own implicit reward, and samples the policy as chapter 13 does
(`preference.evaluate_policy`: the hidden preference's reward, the format, the KL to the SFT model, examples)
plus the share of distinct replies (collapse).

How this departs from the book's companion code, and why:

1. The pairs are chapter 13's (one hidden preference a verifier can check), not UltraFeedback; "sample
   generations" are the instruct gym's replies, scored by that verifier.
2. `max_samples` is `pairs`: the first n of the shuffled training pairs; `max_length` is not varied (cutting a
   reply would remove the period the preference is about, which changes the task, not the data's size).
3. Betas per loss are the companion code's kind of values (`betas`): DPO / IPO 0.1 on sequence sums, dpo_norm and
   SimPO 2.0 on per-token averages; ORPO reads `orpo_lambda` (0.1) and no beta.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...algorithms.dpo import DPOConfig, preference_loss_fn, train_dpo, with_reference
from ...envs.instruct import SEEN, InstructTask, preference_pairs
from ...runs.plots import Panel, panel_plot
from ...runs.report import Claim, fmt, image, markdown_table
from ...runs.verdicts import Estimate, two_shares
from ...runs.stages import Stage
from ...seeding import derive
from ...sources.episodes import sample_episodes
from ..shared.instruct import corpus, instruct_source
from ..shared.preference import evaluate_policy, rendered_pairs, sft_model
from ...runs.verdicts import Part, minus
from .evidence import change, cite, decide, level, share

LOSSES = ("dpo", "ipo", "dpo_norm", "simpo", "orpo")
PREFIX = {"dpo": "dpo", "ipo": "dpo", "dpo_norm": "dpo", "simpo": "simpo", "orpo": "orpo"}
"""the metric prefix each loss logs under (its accuracy: <prefix>/accuracy)"""


@dataclass
class Demo:
    """this chapter's settings"""

    steps: int = 60
    """optimizer steps of every run"""
    batch_size: int = 32
    """pairs per step"""
    lrs: list[float] = field(default_factory=lambda: [1e-4, 1e-3])
    """the learning rates every loss runs at (S8.2, S8.3: LR sensitivity); the first is the main one"""
    losses: list[str] = field(default_factory=lambda: list(LOSSES))
    """which losses run (dpo must be one: S8.1 and S8.4 read it)"""
    betas: dict[str, float] = field(default_factory=lambda: {"dpo": 0.1, "ipo": 0.1, "dpo_norm": 2.0, "simpo": 2.0,
                                                             "orpo": 0.1})
    """beta per loss (ORPO's is unused: its weight is DPOConfig.orpo_lambda)"""
    pairs: list[int] = field(default_factory=lambda: [32, 128])
    """S8.4: DPO on only the first n training pairs, one run each (all pairs is the main DPO run)"""

    def __post_init__(self) -> None:
        bad = [x for x in self.losses if x not in LOSSES]
        if bad or "dpo" not in self.losses:
            raise ValueError(f"rlhf_book daa: losses must be among {LOSSES} and include 'dpo', got {self.losses}")
        if self.steps < 1 or self.batch_size < 1 or not self.lrs or not all(lr > 0 for lr in self.lrs):
            raise ValueError("rlhf_book daa: steps and batch_size must be >= 1, lrs a non-empty list of LRs > 0")
        missing = [x for x in self.losses if x not in self.betas or not self.betas[x] > 0]
        if missing:
            raise ValueError(f"rlhf_book daa: betas needs a beta > 0 for {missing}")
        if any(n < 2 for n in self.pairs):
            raise ValueError(f"rlhf_book daa: pairs must be counts >= 2, got {self.pairs}")


@torch.no_grad()
def heldout_accuracy(engine, full, config: DPOConfig) -> float:
    """The share of held-out pairs the loss's own implicit reward orders right (its `<prefix>/accuracy` on the
    pair batch `full`, whose reference sums are the SFT model's)."""
    _, metrics = preference_loss_fn(config)(engine.forward(full), full)
    return float(metrics[f"{PREFIX[config.loss]}/accuracy"])


def distinct_share(replies: list[str]) -> float:
    """Distinct replies / replies: 1 when every sample differs, 1/n when all n are the same (collapse)."""
    return len(set(replies)) / len(replies) if replies else float("nan")


def stage_daa(ctx, loss: str, lr: float, n_pairs: int) -> dict:
    """One direct-alignment run from sft_narrow: per-step statistics, held-out pair accuracy, samples."""
    config, d = ctx.config, ctx.config.daa
    tok, _, _, demos = corpus()
    train, test = preference_pairs(demos, seed=config.seed)
    train = train[:n_pairs] if n_pairs else train
    sft = sft_model(ctx.run_dir)
    ref = ctx.engine(copy.deepcopy(sft))
    dpo = DPOConfig(steps=d.steps, batch_size=d.batch_size, loss=loss, beta=d.betas[loss], seed=config.seed)
    held = with_reference(ref, rendered_pairs(test), tok.pad_id)
    seed = derive(config.seed, 801)
    before = evaluate_policy(ref, ref, config, seed=seed) if (loss, lr, n_pairs) == ("dpo", d.lrs[0], 0) else None
    engine = ctx.engine(sft, dataclasses.replace(config.dpo_optim, lr=lr))
    history = train_dpo(engine, rendered_pairs(train), dpo, tok.pad_id, ctx.run())
    after = evaluate_policy(engine, ref, config, seed=seed)
    replies = sample_replies(engine, config, seed)
    p = PREFIX[loss]
    keys = ["train/loss", f"{p}/accuracy"] + ([f"{p}/margin"] if p != "orpo" else ["orpo/log_odds_ratio"]) + \
        ([f"{p}/chosen_reward", f"{p}/rejected_reward"] if p != "orpo" else ["orpo/nll"])
    out = {"loss": loss, "lr": lr, "beta": d.betas[loss], "pairs": len(train),
           "curves": {k: [h[k] for h in history] for k in keys},
           "heldout_accuracy": heldout_accuracy(engine, held, dpo), "heldout_pairs": len(test), "after": after,
           "distinct": distinct_share(replies), "samples": len(replies)}
    if before is not None:
        out["before"] = {**before, "distinct": distinct_share(sample_replies(ref, config, seed))}
    return out


def sample_replies(engine, config, seed: int) -> list[str]:
    """The replies `evaluate_policy` samples (the same draw), as text."""
    trajs = sample_episodes(instruct_source(engine, "preference", config.max_reply), [InstructTask(w) for w in SEEN],
                            config.eval_per_word, seed)
    return [t.info["reply"] for t in trajs]


def name(loss: str, i: int) -> str:
    return f"daa_{loss}_lr{i}"


def stages(config) -> list[Stage]:
    d, reads = config.daa, ("seed", "daa", "dpo_optim", "eval_per_word", "max_reply")  # `Stage.reads`
    out = [Stage(name(loss, i), stage_daa, after=("sft_narrow",), args=(loss, lr, 0), reads=reads)
           for i, lr in enumerate(d.lrs) for loss in d.losses]
    out += [Stage(f"daa_dpo_pairs{n}", stage_daa, after=("sft_narrow",), args=("dpo", d.lrs[0], n), reads=reads)
            for n in d.pairs]
    return out


def _mean(xs, k):
    k = max(1, min(k, len(xs)))
    return sum(xs[:k]) / k, sum(xs[-k:]) / k


def outcome(r: dict) -> float:
    """The number the data-vs-loss comparison reads: the sampled replies' reward (the hidden preference)."""
    return r["after"]["reward"]


def spread(values: list[float], n: int, what: str) -> Estimate:
    """max - min of shares each measured on n samples, with the binomial SE of that one difference."""
    hi, lo = max(values), min(values)
    return two_shares(hi * n, n, lo * n, n, f"{what}, binomial over {n} each")


def sensitivity(runs: list[dict]) -> Estimate:
    """The larger of the ranges over LRs of the samples' preference and format, with its binomial SE."""
    n = runs[0]["samples"]
    return max((spread([r["after"][key] for r in runs], n, f"{key} range over LRs") for key in ("reward", "format")),
               key=lambda e: e.value)


def claims(results: dict, config) -> list[Claim]:
    d, out = config.daa, []
    main = results.get(name("dpo", 0))
    if main:
        c = main["curves"]
        k = max(1, d.steps // 5)
        m0, m1 = _mean(c["dpo/margin"], k)
        a0, a1 = _mean(c["dpo/accuracy"], k)
        b, a, n = main["before"], main["after"], main["samples"]
        holds, est, why = decide([
            Part("margin rise", change(c["dpo/margin"], k, "margin")),
            Part("margin above 0", level(c["dpo/margin"][-k:], 0, "margin of the last steps")),
            Part("accuracy rise", change(c["dpo/accuracy"], k, "accuracy")),
            Part("distinct replies kept (>= half)", minus(share(main["distinct"], n, 0, "distinct"),
                                                          share(b["distinct"], n, 0, "distinct"),
                                                          f"distinct - 0.5 x SFT's, binomial over {n}", 0.5), "not <"),
            Part("format kept (within 0.1)", two_shares(a["format"] * n, n, b["format"] * n, n,
                                                        f"format DPO - SFT, binomial over {n}"), "not <", -0.1)])
        out.append(Claim("S8.1", "DPO: loss, accuracy, margins, rewards", cite(8),
                         f"margin (first / last {k} steps) {fmt(m0, 3)} -> {fmt(m1, 3)}, accuracy {fmt(a0)} -> "
                         f"{fmt(a1)}, "
                         f"chosen reward {fmt(c['dpo/chosen_reward'][-1], 3)}, rejected "
                         f"{fmt(c['dpo/rejected_reward'][-1], 3)}; "
                         f"samples: distinct {fmt(b['distinct'])} -> {fmt(main['distinct'])}, format "
                         f"{fmt(b['format'])} -> "
                         f"{fmt(a['format'])}, preference {fmt(b['reward'])} -> {fmt(a['reward'])}",
                         '"The implicit reward margin should move the right way while sample generations do not '
                         'collapse": the margin and accuracy of the last steps above the first\'s (margin > 0), and '
                         "the samples keep >= half their distinct replies and their format within 0.1",
                         holds, est, why=why))
    rows = {loss: [results.get(name(loss, i)) for i in range(len(d.lrs))] for loss in d.losses}
    if all(all(rows[x]) for x in ("dpo", "ipo") if x in rows) and "ipo" in rows:
        dp, ip = rows["dpo"][0], rows["ipo"][0]
        l_d, l_i = dp["curves"]["train/loss"][0], ip["curves"]["train/loss"][0]
        n = ip["heldout_pairs"]
        gap = two_shares(ip["heldout_accuracy"] * n, n, dp["heldout_accuracy"] * n, n,
                         f"held-out pair accuracy IPO - DPO, binomial over {n}")
        holds, est, why = decide([
            Part("IPO's accuracy above 0.5", share(ip["heldout_accuracy"], n, 0.5, "IPO held-out pair accuracy - 0.5")),
            Part("IPO's accuracy within 0.1 of DPO's (above)", gap, "not <", -0.1),
            Part("IPO's accuracy within 0.1 of DPO's (below)", gap, "not >", 0.1),
            Part("IPO's first loss >= 10x DPO's (one batch, exact)", None, exact=l_i >= 10 * l_d)])
        out.append(Claim("S8.2", "DPO vs IPO vs dpo_norm: scale", cite(8),
                         f"first-step loss: DPO {fmt(l_d, 3)}, IPO {fmt(l_i, 3)}; held-out pair accuracy DPO "
                         f"{fmt(dp['heldout_accuracy'])}, IPO {fmt(ip['heldout_accuracy'])}"
                         + (f", dpo_norm {fmt(rows['dpo_norm'][0]['heldout_accuracy'])}"
                            if rows.get("dpo_norm", [None])[0] else ""),
                         '"IPO\'s loss is on a different scale, so judge it by accuracy and margin": IPO\'s loss >= '
                         '10x '
                         "DPO's at the start, and its held-out pair accuracy within 0.1 of DPO's (> 0.5)",
                         holds, est, why=why))
    if len(d.lrs) > 1 and all(all(v) for v in rows.values()):
        sens = {loss: sensitivity(v) for loss, v in rows.items()}
        ref_free = [x for x in ("simpo", "orpo") if x in sens]
        if ref_free:
            holds, est, why = decide([Part(f"{x} more sensitive than DPO", minus(sens[x], sens["dpo"],
                                                                               f"{x} - DPO change between LRs, "
                                                                               "binomial"))
                                      for x in ref_free])
            out.append(Claim("S8.3", "SimPO and ORPO: LR sensitivity", cite(8),
                             "change in the samples' preference / format between LRs "
                             f"{', '.join(fmt(lr, 5) for lr in d.lrs)}: "
                             + ", ".join(f"{k} {fmt(v.value)}" for k, v in sens.items()),
                             '"Both are more sensitive to log-prob scaling and LR": each reference-free loss\'s change '
                             "between LRs (the larger of |d preference| and |d format|) exceeds DPO's",
                             holds, est, why=why))
    data = [results.get(f"daa_dpo_pairs{n}") for n in d.pairs]
    same_lr = [rows[x][0] for x in d.losses if x in ("dpo", "ipo", "dpo_norm") and rows[x][0]]
    if main and all(data) and len(same_lr) > 1:
        by_data = [main] + data
        n = main["samples"]
        spread_data = spread([outcome(r) for r in by_data], n, "preference range over pair counts")
        spread_loss = spread([outcome(r) for r in same_lr], n, "preference range over losses")
        out.append(Claim.compare("S8.4", "data changes vs loss changes", cite(8),
                                 "preference of the samples: by pairs ("
                                 + ", ".join(f"{r['pairs']} {fmt(outcome(r))}" for r in by_data)
                                 + f"; spread {fmt(spread_data.value)}); by loss at the same LR ("
                                 + ", ".join(f"{r['loss']} {fmt(outcome(r))}" for r in same_lr)
                                 + f"; spread {fmt(spread_loss.value)})",
                                 '"If data changes move results more than loss changes, that confirms data dominates '
                                 'small algorithmic differences": the spread over pair counts exceeds the spread over '
                                 "DPO / IPO / dpo_norm",
                                 minus(spread_data, spread_loss, f"binomial, {n} samples each")))
    return out


def section(run_dir: Path, results: dict, config) -> str:
    d = config.daa
    parts = ["## Ch.8 Direct alignment (S8.1-S8.4)",
             f"From chapter 13's `sft_narrow` on its preference pairs, {d.steps} steps of {d.batch_size} pairs; "
             "preference = the share of sampled replies ending with a period (the hidden preference), format = starts "
             "with the word, KL = sampled KL to the SFT model (nats per reply)."]
    main = results.get(name("dpo", 0))
    if main:
        c = main["curves"]
        steps = list(range(1, len(c["train/loss"]) + 1))
        panels = [Panel(unit, {k: (steps, v) for k, v in c.items() if pick(k)}, ylim) for unit, pick, ylim in (
            ("training loss", lambda k: k == "train/loss", None),
            ("pair accuracy", lambda k: k.endswith("/accuracy"), (0, 1.02)),
            ("margin, implicit rewards", lambda k: k != "train/loss" and not k.endswith("/accuracy"), None))]
        panel_plot(run_dir / "book-s8-dpo.png", [p for p in panels if p.series], "S8.1: DPO statistics per step",
                   "step")
        b = main["before"]
        parts.append("**S8.1** DPO's logged statistics:\n\n" + image(run_dir / "book-s8-dpo.png", "DPO per step")
                     + "\n\n" + markdown_table(["", "preference", "format", "distinct replies", "KL"],
                                               [["SFT", fmt(b["reward"]), fmt(b["format"]), fmt(b["distinct"]), "0"],
                                                ["DPO", fmt(main["after"]["reward"]), fmt(main["after"]["format"]),
                                                 fmt(main["distinct"]), fmt(main["after"]["kl"])]])
                     + "\n\nSamples after DPO: " + "; ".join(f"`{x}`" for x in main["after"]["examples"]))
    rows = []
    for i, lr in enumerate(d.lrs):
        for loss in d.losses:
            r = results.get(name(loss, i))
            if r:
                c = r["curves"]
                acc = c[f"{PREFIX[loss]}/accuracy"]
                rows.append([loss, fmt(lr, 5), r["beta"], fmt(c["train/loss"][0], 3), fmt(c["train/loss"][-1], 3),
                             fmt(acc[-1]), fmt(r["heldout_accuracy"]), fmt(r["after"]["reward"]),
                             fmt(r["after"]["format"]), fmt(r["distinct"]), fmt(r["after"]["kl"], 1),
                             "; ".join(f"`{x}`" for x in r["after"]["examples"][:2])])
    if rows:
        parts.append("**S8.2 / S8.3** every loss at every LR (ORPO's beta is unused):\n\n" + markdown_table(
            ["loss", "LR", "beta", "loss first", "loss last", "train pair accuracy (last step)",
             "held-out pair accuracy", "preference", "format",
             "distinct", "KL", "samples"], rows))
    data = [results.get(f"daa_dpo_pairs{n}") for n in d.pairs]
    if main and all(data):
        parts.append("**S8.4** DPO at the first LR on fewer pairs:\n\n" + markdown_table(
            ["pairs", "held-out pair accuracy", "preference", "format", "KL"],
            [[r["pairs"], fmt(r["heldout_accuracy"]), fmt(r["after"]["reward"]), fmt(r["after"]["format"]),
              fmt(r["after"]["kl"], 1)] for r in data + [main]]))
    return "\n\n".join(parts)
