"""RLHF book ch.4 Suggested Experiments (S4.1-S4.2): instruction tuning a base model, watched as it goes.

    sft_lr<i>   SFT of chapter 13's `pretrain` base model on its narrow demonstrations (16 words) at each of `lrs`,
                with the same fixed prompts answered every `every` steps (step 0 included): the share of replies
                that stop with `<|end|>` within the reply budget, the share that follow the format (start with
                the word) on seen and on unseen words, the mean reply length, and the NLL of held-out
                demonstrations (the 4 unseen words' corpus lines); the middle LR is chapter 13's (S4.1), the three
                are the sweep (S4.2)

How this departs from the book's companion code, and why:

1. OLMo-2-1B on No Robots becomes chapter 13's character-level Shakespeare model on its word-prompted lines;
   `<|endoftext|>` is the renderer's `<|end|>`.
2. The LRs are the tiny model's (chapter 13 SFTs at 1e-3 with AdamW), a decade apart as the book's 1e-6 /
   5e-6 / 5e-5 are; "template-shaped slop" is read as overfitting the 16 training words: the held-out NLL rising
   from its minimum, and the format on unseen words.
3. Replies are sampled at temperature 1 (`adherence_samples` per word), not greedy, so a share can be measured.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...algorithms.sft import train_sft
from ...envs.instruct import SEEN, UNSEEN, InstructTask, demo_sets
from ...models.tiny import load_model
from ...runs.plots import line_plot
from ...runs.report import Claim, fmt, image, markdown_table
from ...runs.verdicts import NOISE, Estimate, Holds, difference, judge
from ...runs.stages import Stage
from ...seeding import derive
from ...sources.episodes import sample_episodes
from ...trajectory import collate
from ..shared.instruct import corpus, demo, instruct_source, renderer
from ...runs.verdicts import Part
from .evidence import cite, decide, share


@dataclass
class Demo:
    """this chapter's settings"""

    lrs: list[float] = field(default_factory=lambda: [1e-4, 1e-3, 1e-2])
    """the sweep (S4.2); the middle one is S4.1's run (chapter 13's 1e-3)"""
    steps: int = 300
    """SFT steps of every run (chapter 13's)"""
    every: int = 50
    """answer the fixed prompts every this many steps"""
    samples: int = 2
    """sampled replies per fixed prompt (16 seen + 4 unseen words)"""

    def __post_init__(self) -> None:
        if len(self.lrs) < 2 or not all(lr > 0 for lr in self.lrs):
            raise ValueError(f"rlhf_book sft: lrs must be >= 2 learning rates > 0, got {self.lrs}")
        if min(self.steps, self.every, self.samples) < 1:
            raise ValueError("rlhf_book sft: steps, every and samples must be >= 1")


def watch(engine, config, d: Demo, held_out, seed: int) -> dict:
    """The fixed prompts answered now: stop share, format (seen / unseen), length, held-out NLL, two replies."""
    pad = corpus()[0].pad_id
    seen = sample_episodes(instruct_source(engine, "format", config.max_reply), [InstructTask(w) for w in SEEN],
                           d.samples, seed)
    unseen = sample_episodes(instruct_source(engine, "format", config.max_reply), [InstructTask(w) for w in UNSEEN],
                             d.samples, seed + 1)
    every = seen + unseen
    nll, chars = demo_nll(engine, held_out, pad)
    return {"stop": sum(not t.truncated for t in every) / len(every), "replies_n": len(every),
            "format_seen": sum(t.info["format_ok"] for t in seen) / len(seen), "seen_n": len(seen),
            "format_unseen": sum(t.info["format_ok"] for t in unseen) / len(unseen),
            "length": sum(len(t.info["reply"]) for t in every) / len(every),
            "lengths": [len(t.info["reply"]) for t in every],
            "heldout_nll": sum(nll) / sum(chars), "demo_nll": nll, "demo_chars": chars,
            "replies": [f"{t.info['word']} -> {t.info['reply']!r}" for t in (seen[0], unseen[0])]}


@torch.no_grad()
def demo_nll(engine, demos: list, pad_id: int, batch: int = 64) -> tuple[list[float], list[float]]:
    """Each held-out demonstration's summed NLL (nats) and its character count: their ratio of sums is the
    held-out NLL per character (chapter 13's `corpus_loss`), the per-demonstration sums give its paired SE."""
    nll, chars = [], []
    for i in range(0, len(demos), batch):
        b = collate(demos[i : i + batch], pad_id)
        lp = engine.forward(b).logprobs  # [B, T-1]
        nll += (-(lp * b.action_mask).sum(-1)).tolist()
        chars += b.action_mask.sum(-1).float().tolist()
    return nll, chars


def nll_rise(a: dict, b: dict) -> Estimate:
    """b's held-out NLL per character minus a's (the same demonstrations): the difference of two ratios
    sum(nll) / sum(chars), with its SE from the per-demonstration residuals (the ratio estimator's linearization:
    z_i = d_i - value * c_i, SE = sqrt(n / (n - 1) * sum z_i^2) / sum c_i)."""
    d = [y - x for x, y in zip(a["demo_nll"], b["demo_nll"])]
    c, n = a["demo_chars"], len(d)
    value = sum(d) / sum(c)
    z = [di - value * ci for di, ci in zip(d, c)]
    se = math.sqrt(n / (n - 1) * sum(x * x for x in z)) / sum(c) if n > 1 else 0.0
    return Estimate(value, se, n, f"held-out NLL, paired over {n} demonstrations")


def stage_sft(ctx, lr: float) -> dict:
    config, d = ctx.config, ctx.config.sft_book
    tok, _, _, demos = corpus()
    narrow, _ = demo_sets(demos, seed=1)
    r = renderer()
    held_out = [demo(r, InstructTask(w), x) for w in UNSEEN for x in demos.get(w, [])]
    model, _ = load_model(ctx.run_dir / "pretrain" / "model")
    engine = ctx.engine(model, dataclasses.replace(config.sft_optim, lr=lr))
    seed = derive(config.seed, 401)
    curve = [{"step": 0, **watch(engine, config, d, held_out, seed)}]

    def evaluate(step: int) -> dict:
        curve.append({"step": step, **watch(engine, config, d, held_out, seed)})
        return {"eval/loss": curve[-1]["heldout_nll"]}

    sft = dataclasses.replace(config.sft, steps=d.steps, eval_every=d.every, seed=config.seed)
    train_sft(engine, [demo(r, task, x) for task, x in narrow], sft, tok.pad_id, ctx.run(evaluate))
    return {"lr": lr, "curve": curve, "held_out_demos": len(held_out)}


def name(i: int) -> str:
    return f"sft_lr{i}"


def stages(config) -> list[Stage]:
    return [Stage(name(i), stage_sft, after=("pretrain",), args=(lr,), reads=("seed", "sft_book", "sft", "sft_optim",
                                                                                "max_reply"))
            for i, lr in enumerate(config.sft_book.lrs)]


def stop_clean(c: dict, stop: float = 0.8) -> Holds:
    """Whether the replies at this watched step stop with <|end|> on more than `stop` of them, beyond the noise."""
    return judge(share(c["stop"], c["replies_n"], stop, "stop share"), ">")


def first_clean(curve: list[dict], stop: float = 0.8) -> int | None:
    """The first watched step where more than `stop` of the replies end with <|end|>, beyond the noise (None: never)."""
    return next((c["step"] for c in curve if stop_clean(c, stop) is True), None)


def lowest(curve: list[dict]) -> dict:
    """The watched step with the lowest held-out NLL."""
    return min(curve, key=lambda c: c["heldout_nll"])


def overfit(curve: list[dict]) -> Estimate:
    """How far the held-out NLL ends above its minimum over the run (nats per character), paired over the
    held-out demonstrations."""
    return nll_rise(lowest(curve), curve[-1])


def claims(results: dict, config) -> list[Claim]:
    d, out = config.sft_book, []
    runs = [results.get(name(i)) for i in range(len(d.lrs))]
    main = runs[len(runs) // 2]
    if main:
        c0, c1 = main["curve"][0], main["curve"][-1]
        holds, est, why = decide([
            Part("step 0 stops on at most 0.2", share(c0["stop"], c0["replies_n"], 0.2, "stop share at step 0 - 0.2"),
                 "<"),
            Part("the end stops on more than 0.8",
                 share(c1["stop"], c1["replies_n"], 0.8, "stop share at the end - 0.8")),
            Part("shorter replies", difference(c1["lengths"], c0["lengths"], f"reply length, end - step 0, Welch over "
                                               f"{len(c0['lengths'])} replies each"), "<")])
        out.append(Claim("S4.1", "SFT a base model, watched every N steps", cite(4),
                         f"step 0: stop {fmt(c0['stop'])}, format {fmt(c0['format_seen'])}, length {c0['length']:.0f}; "
                         f"step {c1['step']}: stop {fmt(c1['stop'])}, format {fmt(c1['format_seen'])}, length "
                         f"{c1['length']:.0f} (LR {main['lr']:g}); e.g. {c0['replies'][0]} -> {c1['replies'][0]}",
                         '"At step 0 the model rambles ... After a few hundred steps the same prompts get concise '
                         'answers '
                         'that terminate": at step 0 under 0.2 of replies stop within the budget, at the end over '
                         "0.8, and replies are shorter", holds, est, why=why))
    if all(runs):
        clean = {r["lr"]: first_clean(r["curve"]) for r in runs}
        steps = [stop_clean(c) for r in runs for c in r["curve"]]  # some step of some LR clearly over 0.8?
        some_clean = True if True in steps else NOISE if NOISE in steps else False
        over = {r["lr"]: overfit(r["curve"]) for r in runs}
        worst = max(over, key=lambda lr: over[lr].value)
        holds, est, why = decide([
            Part("some LR stops cleanly", None, exact=some_clean),
            Part(f"LR {worst:g} ends 0.05 above its minimum NLL", over[worst], ">", 0.05)])
        out.append(Claim("S4.2", "the SFT LR sweep", cite(4),
                         "first step stopping cleanly (over 0.8 of replies, beyond the noise): "
                         + ", ".join(f"LR {lr:g} {'never' if s is None else s}" for lr, s in clean.items())
                         + "; held-out NLL at the end above its minimum: "
                         + ", ".join(f"LR {lr:g} {fmt(v.value, 3)}" for lr, v in over.items())
                         + "; unseen-word format at the end: "
                         + ", ".join(f"LR {r['lr']:g} {fmt(r['curve'][-1]['format_unseen'])}" for r in runs),
                         '"Find the LR where the model first answers and stops cleanly, vs where it overfits into '
                         '\'template-shaped slop\'": some LR stops cleanly within the run, and some LR ends with its '
                         "held-out NLL more than 0.05 above its minimum", holds, est, why=why))
    return out


def section(run_dir: Path, results: dict, config) -> str:
    d = config.sft_book
    runs = [r for r in (results.get(name(i)) for i in range(len(d.lrs))) if r]
    parts = ["## Ch.4 Instruction tuning (S4.1-S4.2)",
             f"Chapter 13's base model SFT'd on its narrow demonstrations, {d.steps} steps; every {d.every} steps "
             f"{d.samples} sampled replies to each of the 16 seen and 4 unseen word prompts."]
    if not runs:
        return "\n\n".join(parts)
    for key, title in (("stop", "share of replies that stop with <|end|>"), ("heldout_nll", "held-out NLL")):
        series = {f"LR {r['lr']:g}": ([c["step"] for c in r["curve"]], [c[key] for c in r["curve"]]) for r in runs}
        line_plot(run_dir / f"book-s4-{key}.png", series, f"S4: {title}", "SFT step",
                  {"stop": "share of replies", "heldout_nll": "held-out NLL (nats per character)"}[key])
        parts.append(image(run_dir / f"book-s4-{key}.png", title))
    rows = [[f"{r['lr']:g}", c["step"], fmt(c["stop"]), fmt(c["format_seen"]), fmt(c["format_unseen"]),
             f"{c['length']:.0f}", fmt(c["heldout_nll"], 3), c["replies"][0]] for r in runs for c in r["curve"]]
    parts.append(markdown_table(["LR", "step", "stop", "format seen", "format unseen", "length", "held-out NLL",
                                 "a reply"], rows))
    return "\n\n".join(parts)
