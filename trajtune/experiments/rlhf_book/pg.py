"""RLHF book ch.6 Suggested Experiments (S6.1-S6.4): policy gradients on the chapter-13 calculator.

    pg_grpo              S6.1  GRPO from the cold start with the companion code's three signals tracked per step:
                               correctness (partial credit), format (a well-formed number), binary (exact)
    pg_rloo, pg_reinforce S6.2 the same run with RLOO, and with REINFORCE without a baseline (the raw reward)
    pg_g<G>, pg_t<T>,    S6.3  GRPO with another group size (num_rollouts), temperature, training-set size or
    pg_data<n>, pg_fw<w>       format weight
    pg_instruct          S6.4  GRPO on another task (chapter 13's instruct gym from `sft_narrow`, reward: the reply
                               ends with a period), with the same group-contrast diagnostics

The reward is `correctness + format_weight * format` (the companion code's shape): correctness is the share of
the answer's digits the reply has right at their place, format 1 when the reply is a number (digits, no leading
zero), binary 1 when the reply is the sum. Every step logs their means (book/correctness, book/format,
book/binary), the share of groups whose binary rewards are all equal (book/binary_no_contrast: "an all-right or
all-wrong group gives no group-relative signal") and the share of distinct replies per group (book/distinct_share).

How this departs from the book's companion code, and why:

1. reasoning-gym's `spell_backward` on Qwen3-1.7B becomes the chapter-13 calculator (the task a tiny model
   learns on a CPU); S12's string reversal is the spelling task's cousin.
2. "REINFORCE" is the raw-reward policy gradient (`advantage="none"`): the library's `reinforce` already
   subtracts the group mean, and S6.2 is about the value of within-prompt baselines.
3. S6.4's "another task" is the instruct gym, not GSM8K: the calculator already is the math task.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path


from ...algorithms.rl import RLConfig, train_rl
from ...envs.arithmetic import ArithmeticTask, train_tasks
from ...envs.base import SingleTurnEnv
from ...envs.instruct import SEEN, InstructTask
from ...metrics import register
from ...models.tiny import load_model
from ...runs.plots import line_plot
from ...runs.report import Claim, fmt, image, markdown_table
from ...runs.verdicts import Estimate, difference, judge, paired
from ...runs.stages import Stage
from ...seeding import derive
from ...sources.build import episode_source
from ...text.render import Renderer
from ...trajectory import Trajectory
from ..shared.instruct import instruct_source
from ..shared.preference import evaluate_policy
from ..shared.calculator import answer_sampling, math_eval
from ...runs.verdicts import Part, minus
from .evidence import change, cite, decide, fmt_est, level, relabel, step_noise

for _key, _doc in (
        ("book/correctness",
         "rlhf_book S6: mean partial credit of the step's replies (share of the answer's digits right)"),
        ("book/format", "rlhf_book S6: share of the step's replies that are well formed (a number; a reply on the "
                        "instruct gym: starts with the word)"),
        ("book/binary", "rlhf_book S6: share of the step's replies that are exactly right"),
        ("book/binary_no_contrast", "rlhf_book S6: share of the step's groups whose binary rewards are all equal "
                                    "(all right or all wrong: no group-relative signal)"),
        ("book/distinct_share", "rlhf_book S6: distinct replies per group / group size, mean over groups")):
    register(_key, _doc)


@dataclass
class Demo:
    """this chapter's settings"""

    steps: int = 60
    """policy updates per run"""
    tasks_per_step: int = 16
    """problems per step"""
    group_size: int = 8
    """samples per problem (num_rollouts)"""
    temperature: float = 1.0
    """sampling temperature"""
    format_weight: float = 0.2
    """weight of the format reward"""
    data_size: int = 0
    """training problems (0: a fresh problem every draw, steps x tasks_per_step of them)"""
    lr: float = 3e-4
    """learning rate (chapter 13's GRPO)"""
    sweep_group: list[int] = field(default_factory=lambda: [2])
    """S6.3: other group sizes"""
    sweep_temperature: list[float] = field(default_factory=lambda: [0.3, 2.0])
    """S6.3: other temperatures (one below 1, one above: collapse and malformed answers)"""
    sweep_data: list[int] = field(default_factory=lambda: [16])
    """S6.3: other training-set sizes"""
    sweep_format_weight: list[float] = field(default_factory=lambda: [0.0])
    """S6.3: other format weights"""
    instruct_steps: int = 30
    """S6.4: GRPO steps on the instruct gym"""

    def __post_init__(self) -> None:
        if (min(self.steps, self.tasks_per_step, self.instruct_steps) < 1
                or min([self.group_size, *self.sweep_group]) < 2):
            raise ValueError("rlhf_book pg: steps, tasks_per_step, instruct_steps >= 1 and group sizes >= 2")
        if not all(t > 0 for t in [self.temperature, *self.sweep_temperature]) or not self.lr > 0:
            raise ValueError("rlhf_book pg: temperatures and lr must be > 0")
        if min([self.format_weight, *self.sweep_format_weight, self.data_size, *self.sweep_data]) < 0:
            raise ValueError("rlhf_book pg: format weights and data sizes must be >= 0")

    def runs(self) -> dict[str, dict]:
        """stage name -> its settings (advantage, group, temperature, data, format weight); pg_grpo first."""
        base = {"advantage": "grpo", "group": self.group_size, "temperature": self.temperature,
                "data": self.data_size, "format_weight": self.format_weight}
        out = {"pg_grpo": base, "pg_rloo": {**base, "advantage": "rloo"}, "pg_reinforce": {**base, "advantage": "none"}}
        out.update({f"pg_g{g}": {**base, "group": g} for g in self.sweep_group})
        out.update({f"pg_t{t:g}": {**base, "temperature": t} for t in self.sweep_temperature})
        out.update({f"pg_data{n}": {**base, "data": n} for n in self.sweep_data})
        out.update({f"pg_fw{w:g}": {**base, "format_weight": w} for w in self.sweep_format_weight})
        return out


def well_formed(reply: str) -> bool:
    """A number: 1-3 digits, no leading zero."""
    return reply.isdigit() and len(reply) <= 3 and (reply == "0" or not reply.startswith("0"))


def correctness(answer: str, reply: str) -> float:
    """Share of the answer's places the reply has right (left-aligned; a longer reply's extra places count wrong)."""
    return sum(a == b for a, b in zip(answer, reply)) / max(len(answer), len(reply))


def calculator_verifier(format_weight: float):
    def verify(task: ArithmeticTask, reply: str) -> tuple[float, dict]:
        c, f = correctness(task.answer, reply), well_formed(reply)
        checks = {"correctness": c, "format_ok": f, "binary": reply == task.answer, "reply": reply}
        return c + format_weight * float(f), checks

    return verify


def diagnostics(trajs: list[Trajectory]) -> dict[str, float]:
    """The step's book/* metrics (module docstring)."""
    groups: dict[int, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(t.group, []).append(t)
    binary = [bool(t.info.get("binary", t.reward >= 1)) for t in trajs]
    out = {"book/format": sum(bool(t.info["format_ok"]) for t in trajs) / len(trajs),
           "book/binary": sum(binary) / len(trajs),
           "book/binary_no_contrast": sum(len({bool(t.info.get("binary", t.reward >= 1)) for t in g}) == 1
                                          for g in groups.values()) / len(groups),
           "book/distinct_share": sum(len({t.info["reply"] for t in g}) / len(g)
                                      for g in groups.values()) / len(groups)}
    if all("correctness" in t.info for t in trajs):
        out["book/correctness"] = sum(t.info["correctness"] for t in trajs) / len(trajs)
    return out


def stage_pg(ctx, name: str) -> dict:
    """One policy-gradient run from the cold start; the per-step diagnostics and the held-out evaluation."""
    config, d = ctx.config, ctx.config.pg
    s = d.runs()[name]
    model, tok = load_model(ctx.run_dir / "coldstart" / "model")
    r = Renderer(tok)
    engine = ctx.engine(model, dataclasses.replace(config.rl_optim, lr=d.lr))
    rl = RLConfig(steps=d.steps, tasks_per_step=d.tasks_per_step, group_size=s["group"], advantage=s["advantage"],
                  aggregation="token", seed=derive(config.seed, 601))
    tasks = train_tasks(s["data"] or d.steps * d.tasks_per_step, seed=derive(config.seed, 602))
    source = episode_source(answer_sampling(temperature=s["temperature"]), engine,
                            lambda: SingleTurnEnv(calculator_verifier(s["format_weight"])), r, "rlhf_book pg",
                            max_turns=1, max_tokens=32, measure=diagnostics, episode_seeds=False, sharded=False)
    history = train_rl(engine, tasks, source, rl, tok.pad_id, ctx.run())
    keys = ["book/correctness", "book/format", "book/binary", "book/binary_no_contrast", "book/distinct_share",
            "rollout/no_signal_share", "train/loss"]
    return {"settings": s, "curves": {k: [h.get(k, float("nan")) for h in history] for k in keys},
            "after": math_eval(engine, r, config.pass_k, derive(config.seed, 603))}


def stage_instruct(ctx) -> dict:
    """S6.4: GRPO of sft_narrow on the instruct gym (reward: ends with a period), same diagnostics."""
    config, d = ctx.config, ctx.config.pg
    model, tok = load_model(ctx.run_dir / "sft_narrow" / "model")
    ref = ctx.engine(load_model(ctx.run_dir / "sft_narrow" / "model")[0])  # the SFT model, for the KL
    engine = ctx.engine(model, config.rl_optim)
    rl = RLConfig(steps=d.instruct_steps, tasks_per_step=d.tasks_per_step, group_size=d.group_size, advantage="grpo",
                  seed=derive(config.seed, 604))
    source = instruct_source(engine, "preference", config.max_reply, measure=diagnostics)
    history = train_rl(engine, [InstructTask(w) for w in SEEN], source, rl, tok.pad_id, ctx.run())
    keys = ["book/format", "book/binary", "book/binary_no_contrast", "book/distinct_share", "rollout/no_signal_share"]
    return {"curves": {k: [h.get(k, float("nan")) for h in history] for k in keys},
            "after": evaluate_policy(engine, ref, config, seed=derive(config.seed, 605))}


def stages(config) -> list[Stage]:
    out = [Stage(name, stage_pg, after=("coldstart",), args=(name,), reads=("seed", "pg", "rl_optim", "pass_k"))
           for name in config.pg.runs()]
    return out + [Stage("pg_instruct", stage_instruct, after=("sft_narrow",),
                        reads=("seed", "pg", "rl_optim", "eval_per_word", "max_reply"))]


def ends(xs: list[float], k: int) -> tuple[float, float]:
    """(mean of the first k, mean of the last k)."""
    k = max(1, min(k, len(xs)))
    return sum(xs[:k]) / k, sum(xs[-k:]) / k


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def noise(xs: list[float]) -> float:
    """Standard deviation of step-to-step changes (the loss's noise, not its trend; `evidence.step_noise`)."""
    return step_noise(xs).value


def versus_cold_start(results: dict, run: dict) -> Estimate | None:
    """A run's held-out greedy accuracy minus the cold start's, paired over the 256 held-out sums (None when either
    evaluation has no per-problem results)."""
    cold = results.get("coldstart") or {}
    a, b = (cold.get("per_problem") or {}).get("greedy"), (run["after"].get("per_problem") or {}).get("greedy")
    return paired(a, b, f"held-out greedy vs cold start, paired over {len(a)}") if a and b else None


def claims(results: dict, config) -> list[Claim]:
    d, out = config.pg, []
    k = max(1, d.steps // 5)
    g = results.get("pg_grpo")
    if g:
        c = g["curves"]
        c0, c1 = ends(c["book/correctness"], k)
        b0, b1 = ends(c["book/binary"], k)
        f0, f1 = ends(c["book/format"], k)
        nc = mean(c["book/binary_no_contrast"])
        holds, est, why = decide([Part("correctness rise", change(c["book/correctness"], k, "correctness")),
                                  Part("binary rise", change(c["book/binary"], k, "binary")),
                                  Part("no-contrast share below 0.5", level(c["book/binary_no_contrast"], 0.5,
                                                                            "no-contrast share - 0.5"), "<")])
        out.append(Claim("S6.1", "GRPO: correctness, format, binary, contrast", cite(6),
                         f"first / last {k} steps: correctness {fmt(c0)} -> {fmt(c1)}, format {fmt(f0)} -> {fmt(f1)}, "
                         f"binary {fmt(b0)} -> {fmt(b1)}; groups all right or all wrong: {fmt(nc)} of groups on "
                         "average "
                         f"(held-out greedy {fmt(g['after']['greedy'])})",
                         '"Track avg_correctness, avg_format and avg_binary. Check that prompt groups contain '
                         'contrast: '
                         'an all-right or all-wrong group gives no group-relative signal": correctness and binary '
                         'rise, '
                         "and most groups have contrast (no-contrast share < 0.5)", holds, est, why=why))
    runs = {a: results.get(f"pg_{a}") for a in ("grpo", "rloo", "reinforce")}
    if all(runs.values()):
        gain = {a: change(r["curves"]["book/binary"], k, f"{a} binary") for a, r in runs.items()}
        loss_noise = {a: step_noise(r["curves"]["train/loss"]) for a, r in runs.items()}
        parts = [Part(f"{a} gain - reinforce's", minus(gain[a], gain["reinforce"], f"{a} - reinforce binary gain"))
                 for a in ("rloo", "grpo")]
        parts += [Part(f"reinforce loss noise - {a}'s", minus(loss_noise["reinforce"], loss_noise[a],
                                                                f"reinforce - {a} loss noise, bootstrap"))
                  for a in ("rloo", "grpo")]
        holds, est, why = decide(parts)
        out.append(Claim("S6.2", "REINFORCE vs RLOO vs GRPO", cite(6),
                         f"binary gain (last - first {k} steps): "
                         + ", ".join(f"{a} {fmt(v.value)}" for a, v in gain.items())
                         + "; loss noise (sd of step-to-step change): "
                         + ", ".join(f"{a} {fmt(v.value, 3)}" for a, v in loss_noise.items()),
                         '"how fast correctness improves and how noisy the loss is. This shows the value of '
                         'within-prompt baselines": RLOO and GRPO both gain more than REINFORCE without a baseline, '
                         "and its loss is the noisiest", holds, est, why=why))
    if g:
        base = g["curves"]
        for gs in d.sweep_group:
            r = results.get(f"pg_g{gs}")
            if r and gs < d.group_size:
                a, b = r["curves"]["book/binary_no_contrast"], base["book/binary_no_contrast"]
                out.append(Claim.compare("S6.3a", "few rollouts", cite(6),
                                         f"groups without contrast (mean over the steps): {gs} rollouts "
                                         f"{fmt(mean(a))}, "
                                         f"{d.group_size} rollouts {fmt(mean(b))}",
                                         '"Few rollouts -> little contrast": a larger share of groups all right or all '
                                         "wrong", difference(a, b, f"Welch, {len(a)} steps each")))
        for t in d.sweep_temperature:
            r = results.get(f"pg_t{t:g}")
            if not r:
                continue
            if t < d.temperature:
                a, b = r["curves"]["book/distinct_share"], base["book/distinct_share"]
                est = minus(level(a, 0, "distinct"), level(b, 0, "distinct"),
                            f"vs half of T {d.temperature:g}'s, {len(a)} steps each", 0.5)
                out.append(Claim.compare("S6.3b", f"very low temperature ({t:g})", cite(6),
                                         f"distinct replies per group, first step: {fmt(a[0])} vs {fmt(b[0])} at T "
                                         f"{d.temperature:g}; mean over the steps {fmt(mean(a))} vs {fmt(mean(b))}",
                                         '"Very low temperature -> samples collapse": at most half the distinct '
                                         'replies '
                                         f"per group of temperature {d.temperature:g}, over the run", est, "<"))
            elif t > d.temperature:
                a, b = r["curves"]["book/format"], base["book/format"]
                est = relabel(difference(b, a), f"Welch, {len(a)} steps each")
                out.append(Claim.compare("S6.3c", f"very high temperature ({t:g})", cite(6),
                                         f"malformed replies (mean over the steps): {fmt(1 - mean(a))} vs "
                                         f"{fmt(1 - mean(b))} at T {d.temperature:g}",
                                         '"Very high temperature -> malformed answers": malformed share more than 0.1 '
                                         f"above temperature {d.temperature:g}'s", est, ">", 0.1))
    ins = results.get("pg_instruct")
    if ins:
        c = ins["curves"]
        k2 = max(1, d.instruct_steps // 5)
        (b0, b1), (n0, n1), (f0, f1) = (ends(c[key], k2) for key in
                                        ("book/binary", "book/binary_no_contrast", "book/format"))
        holds, est, why = decide([
            Part("reward rise", change(c["book/binary"], k2, "reward")),
            Part("format kept (within 0.1)", change(c["book/format"], k2, "format"), "not <", -0.1),
            Part("diagnostics every step", None, exact=len(c["book/binary_no_contrast"]) == d.instruct_steps)])
        out.append(Claim("S6.4", "the same diagnostics on the instruct gym", cite(6),
                         f"first / last {k2} steps: reward (ends with '.') {fmt(b0)} -> {fmt(b1)}, groups without "
                         f"contrast {fmt(n0)} -> {fmt(n1)}, format {fmt(f0)} -> {fmt(f1)}",
                         '"a ... PG config ... that reports the same group-contrast diagnostics" (S6.4): the '
                         'diagnostics '
                         "are logged every step, and GRPO raises the task's reward without breaking the reply's format "
                         "(format of the last steps within 0.1 of the first's). Groups without contrast are shown, not "
                         "judged: at 1.0 the reward is saturated and GRPO has no signal left", holds, est, why=why))
    return out


def cold_start_note(results: dict, runs: dict[str, dict]) -> str:
    """Whether any policy-gradient run beat the calculator's cold start on held-out greedy accuracy (paired)."""
    cold = results.get("coldstart")
    ests = {k: versus_cold_start(results, r) for k, r in runs.items()}
    ests = {k: e for k, e in ests.items() if e is not None}
    if not cold or not ests:
        return ""
    better = [k for k, e in ests.items() if judge(e) is True]
    worse = [k for k, e in ests.items() if judge(e) is False]
    best = max(ests, key=lambda k: ests[k].value)
    head = (f"**{len(better)} of {len(ests)} policy-gradient runs beat the calculator's cold start** on held-out "
            f"greedy accuracy ({fmt(cold['greedy'])})" + (f": {', '.join(better)}" if better else ""))
    return (head + f". The best, `{best}`, ends at {fmt(runs[best]['after']['greedy'])}: {ests[best]}"
            + (f"; below the cold start beyond the noise: {', '.join(worse)}" if worse else "") + ".")


def section(run_dir: Path, results: dict, config) -> str:
    d = config.pg
    parts = ["## Ch.6 Policy gradients (S6.1-S6.4)",
             f"From chapter 13's calculator (`coldstart`), {d.steps} steps x {d.tasks_per_step} problems; reward = "
             "correctness + format_weight x format; binary = exact."]
    runs = {name: results.get(name) for name in d.runs()}
    runs = {k: v for k, v in runs.items() if v}
    if runs:
        for key, title in (("book/binary", "binary (exact) per step"), ("book/binary_no_contrast",
                                                                         "groups without contrast per step")):
            series = {k: (list(range(1, len(r["curves"][key]) + 1)), r["curves"][key]) for k, r in runs.items()}
            stem = "book-s6-" + key.split("/")[1]
            unit = "share of groups" if key.endswith("no_contrast") else "share of episodes"
            line_plot(run_dir / f"{stem}.png", series, f"S6: {title}", "step", f"{unit} ({key})")
            parts.append(image(run_dir / f"{stem}.png", title))
        rows = [[k, r["settings"]["advantage"], r["settings"]["group"], r["settings"]["temperature"],
                 r["settings"]["data"] or "fresh", r["settings"]["format_weight"],
                 fmt(mean(r["curves"]["book/binary"])), fmt(mean(r["curves"]["book/format"])),
                 fmt(mean(r["curves"]["book/binary_no_contrast"])), fmt(mean(r["curves"]["book/distinct_share"])),
                 fmt(noise(r["curves"]["train/loss"]), 3), fmt(r["after"]["greedy"]), fmt(r["after"]["pass_at"]["1"]),
                 (lambda e: fmt_est(e) if e else "-")(versus_cold_start(results, r))]
                for k, r in runs.items()]
        cold = results.get("coldstart")
        if cold:  # where every run starts: the bar a policy-gradient run must clear
            rows.insert(0, ["cold start (`coldstart`, no RL)", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-",
                            fmt(cold["greedy"]), fmt(cold["pass_at"]["1"]), "0"])
        parts.append("Every run (training columns: means over its steps; held-out: the 256 sums, greedy and pass@1 "
                     "from 16 samples; the last column: held-out greedy minus the cold start's, ± 2 SE paired over "
                     "the 256 sums):\n\n" + markdown_table(
                         ["run", "advantage", "group", "T", "problems", "format weight", "binary", "format",
                          "no contrast", "distinct", "loss noise", "held-out greedy", "held-out pass@1",
                          "held-out greedy vs cold start"], rows))
        note = cold_start_note(results, runs)
        if note:
            parts.append(note)
    ins = results.get("pg_instruct")
    if ins:
        c = ins["curves"]
        steps = list(range(1, len(c["book/binary"]) + 1))
        line_plot(run_dir / "book-s6-instruct.png", {k: (steps, v) for k, v in c.items()},
                  "S6.4: GRPO on the instruct gym", "step", "share")
        parts.append("**S6.4** GRPO on the instruct gym (reward: ends with a period), samples after: "
                     + "; ".join(f"`{x}`" for x in ins["after"]["examples"]) + "\n\n"
                     + image(run_dir / "book-s6-instruct.png", "S6.4 diagnostics"))
    return "\n\n".join(parts)
