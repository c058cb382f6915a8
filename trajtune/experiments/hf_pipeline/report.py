"""The HF pipeline's report: the per-stage table of held-out pass@1, which stage raised what (each gain decided by
`runs.verdicts` with its standard error, `stage_claims`), and the plots."""

from __future__ import annotations

from pathlib import Path

from ...runs.report import VERDICT_WORDS, Claim, claims_verdict
from ...runs.verdicts import Z, Estimate, judge, paired, two_shares
from .config import MODEL_STAGES, TRAINING, Config


# --- the report -------------------------------------------------------------------------------
STAGE_METRIC = {"pretrain": ("completion_greedy", "chat_greedy", "chat_sampled"),
                "sft": ("chat_greedy", "chat_sampled"), "dpo": ("chat_greedy", "chat_sampled"),
                "grpo": ("chat_greedy", "chat_sampled")}
"""the held-out metrics each training stage is judged by (pretraining also in the form its corpus has)"""
TRAINED_ON = {"base": "random init", "pretrain": "raw text, every token", "sft": "chat rows, assistant turn",
              "dpo": "on-policy pairs", "grpo": "exact-match reward"}


SHORT = {"completion_greedy": "completion", "chat_greedy": "chat greedy", "chat_sampled": "chat sampled"}


def gain(before: dict, after: dict, metric: str, config: Config) -> Estimate:
    """after - before of one held-out pass@1 on the same problems: paired per problem when both evaluations kept
    their per-problem scores (`stages.heldout_eval`), else two binomial shares over the `n_eval` problems (also
    for the sampled pass@1: a problem's samples share its difficulty, they are not independent trials)."""
    if "per_problem" in before and "per_problem" in after:
        return paired(before["per_problem"][metric], after["per_problem"][metric], f"paired {config.n_eval}")
    n = config.n_eval
    return two_shares(after[metric] * n, n, before[metric] * n, n, f"binomial {n}")


def stage_claims(results: dict, config: Config) -> list[Claim]:
    """One claim per training stage and metric it targets (`STAGE_METRIC`): the stage raises it over the model
    before it, decided by `runs.verdicts` on the paired gain and its standard error."""
    out, previous = [], "base"
    for name in TRAINING:
        before, after = results[previous]["eval"], results[name]["eval"]
        for m in STAGE_METRIC[name]:
            out.append(Claim.compare(f"{name}.{m.split('_')[-1][0]}" if m != "completion_greedy" else f"{name}.c",
                                     f"{name}: {SHORT[m]} pass@1", "-", f"{before[m]:.1%} -> {after[m]:.1%}",
                                     f"{name} raises {SHORT[m]} pass@1", gain(before, after, m, config), ">"))
        previous = name
    return out


def verdict(claims: list[Claim]) -> str:
    """A stage's cell: 'chat greedy +2.3% ± 4.1% (not distinguishable), chat sampled ...' from its claims."""
    return ", ".join(f"{c.what.split(': ')[1].replace(' pass@1', '')} {c.estimate.value:+.1%} ± "
                     f"{Z * c.estimate.se:.1%} ({VERDICT_WORDS[c.holds].replace('*', '')})" for c in claims)


def table(results: dict, config: Config) -> str:
    """The per-stage markdown table: held-out pass@1 of each stage's model, and whether its metrics rose."""
    from ...runs.report import markdown_table

    claims, rows = stage_claims(results, config), []
    for name in MODEL_STAGES:
        mine = [c for c in claims if c.id.startswith(f"{name}.")]
        e, r = results[name]["eval"], results[name]
        rows.append((name, TRAINED_ON[name], r.get("steps", 0), f"{e['completion_greedy']:.1%}",
                     f"{e['chat_greedy']:.1%}", f"{e['chat_sampled']:.1%}", f"{e['chat_pass_at_k']:.1%}",
                     f"{e['chat_answer_nll']:.3f}", f"{r['time']['wall_s']:.0f}s", verdict(mine)))
    k = config.eval_samples
    return markdown_table(["stage", "trained on", "steps", "completion pass@1 (greedy)", "chat pass@1 (greedy)",
                           "chat pass@1 (sampled)", f"chat pass@{k}", "answer NLL", "wall",
                           f"its metrics vs the stage before (± {Z:g} SE)"], rows)


def stage_plot(path: Path, results: dict, config: Config) -> Path:
    """Held-out pass@1 after each stage: a group of bars per stage (in order), one per metric, each with its
    value written on it; the legend right of the axes."""
    from ...runs.plots import grouped_bar_plot

    metrics = (("completion_greedy", "completion pass@1 (greedy)"), ("chat_greedy", "chat pass@1 (greedy)"),
               ("chat_sampled", "chat pass@1 (sampled, T=1)"), ("chat_pass_at_k", f"chat pass@{config.eval_samples}"))
    groups = {s: {label: results[s]["eval"][key] for key, label in metrics} for s in MODEL_STAGES}
    return grouped_bar_plot(path, groups, f"held-out 2-digit addition ({config.n_eval} problems never trained on)",
                            "after stage", "share correct", (0, 1.1), value_format="{:.0%}")


def curve_plots(run_dir: Path) -> list[str]:
    """Training curves from metrics.jsonl: loss of pretrain / sft / dpo, GRPO's mean reward."""
    from ...metrics import read_metrics
    from ...runs.plots import line_plot
    from ...runs.report import image

    rows = read_metrics(run_dir / "metrics.jsonl")
    series = lambda stage, key: ([r["step"] for r in rows if r.get("stage") == stage and key in r],  # noqa: E731
                                 [r[key] for r in rows if r.get("stage") == stage and key in r])
    loss = {s: series(s, "train/loss") for s in ("pretrain", "sft", "dpo")}
    reward = {"grpo: mean reward": series("grpo", "rollout/reward")}
    out = []
    if any(xs for xs, _ in loss.values()):
        out.append(image(line_plot(run_dir / "pipeline_loss.png", {k: v for k, v in loss.items() if v[0]},
                                   "training loss per stage", "step", "loss", styles=dict.fromkeys(loss, "-")),
                         "training loss"))
    if reward["grpo: mean reward"][0]:
        out.append(image(line_plot(run_dir / "pipeline_reward.png", reward, "GRPO: mean exact-match reward", "step",
                                   "reward", (0, 1.02), styles=dict.fromkeys(reward, "-")), "GRPO reward"))
    return out


PASS_METRICS = {"completion_greedy": "completion pass@1 (greedy)", "chat_greedy": "chat pass@1 (greedy)",
                "chat_sampled": "chat pass@1 (sampled)", "chat_pass_at_k": "chat pass@k"}
"""the table's held-out pass columns, as the summary names them"""


def stage_summary(results: dict, config: Config, claims: list[Claim]) -> str:
    """What the table shows, decided by `runs.verdicts`: a headline (did each stage raise the metrics it targets,
    `stage_claims`), then per stage which pass metrics rose and fell beyond their noise and which moved inside it;
    and, when the completion form clearly loses what pretraining gave it, a sentence naming that forgetting."""
    lines, previous, fell = [], "base", {}  # fell: metric label -> the stages after which it fell beyond the noise
    for name in TRAINING:
        before, after = results[previous]["eval"], results[name]["eval"]
        moved = {"rose": [], "fell": [], "inside the noise": []}
        for key, label in PASS_METRICS.items():
            label = label.replace("@k", f"@{config.eval_samples}")
            if after[key] == before[key]:
                continue
            way = judge(gain(before, after, key, config) if key != "chat_pass_at_k" else
                        two_shares(after[key] * config.n_eval, config.n_eval, before[key] * config.n_eval,
                                   config.n_eval))
            word = "rose" if way is True else "fell" if way is False else "inside the noise"
            moved[word].append(f"{label} {before[key]:.1%} -> {after[key]:.1%}")
            if way is False:
                fell.setdefault(label, []).append(name)
        text = "; ".join(f"{way}: {', '.join(ms)}" for way, ms in moved.items() if ms) or "no pass metric moved"
        lines.append(f"- {name}: {text}")
        previous = name
    falls = "; ".join(f"{label} fell after {', '.join(stages)}" for label, stages in fell.items())
    short = [c for c in claims if c.holds is not True]
    if short:
        head = ("**Not every stage raised the metrics it targets beyond the noise:** "
                + "; ".join(f"{c.what} {c.ours}, {c.evidence}: {VERDICT_WORDS[c.holds].replace('*', '')}"
                            for c in short) + ".")
    else:
        head = "**Every training stage raised the held-out metrics it targets beyond the noise" + (
            f", but not every metric rose: {falls}.**" if falls else ", and no pass metric fell beyond it.**")
    out = (f"{claims_verdict(claims)}: a stage raises a metric when the gain clears twice its standard error (paired "
           "over the held-out problems).\n\n" + head + "\n\n" + "\n".join(lines))
    completion = [results[s]["eval"]["completion_greedy"] for s in TRAINING]
    later = TRAINING[1:]
    worst = min(range(1, len(TRAINING)), key=lambda i: completion[i])
    drop = gain(results[TRAINING[0]]["eval"], results[TRAINING[worst]]["eval"], "completion_greedy", config)
    if judge(drop, "<", -0.1) is True:  # ten points or more below what pretraining reached, beyond the noise
        out += ("\n\nThe pretraining format is forgotten: completion pass@1 (`a+b=`, the form of "
                f"{1 - config.chat_share:.0%} of the pretraining corpus) goes "
                + " -> ".join(f"{x:.1%}" for x in completion) + f" over {', '.join(TRAINING)} "
                f"(lowest after {TRAINING[worst]}: {drop}) while {', '.join(later)} train on the chat format only. "
                "This "
                "is the forgetting the RLHF book describes in ch. 15 (the alignment tax: post-training on a new format "
                "or task loses what the base model did, which PPO-ptx counters by mixing pretraining data back in).")
    return out


def write_pipeline_report(run_dir: Path, config: Config, results: dict) -> tuple[Path, list[Claim]]:
    """report.md / report.html (linking view.html, written first when GRPO recorded episodes): (path, claims)."""
    from ...runs.report import image, write_report
    from ...runs.view import write_view_if_recorded

    claims = stage_claims(results, config)
    write_view_if_recorded(run_dir)
    base = results["base"]
    pairs = results["pairs"]
    intro = (f"A {base['params']:,}-parameter Llama built from a config, with a {base['vocab']}-token BPE trained "
             f"here, learns 2-digit addition. Each model is scored on the same {config.n_eval} held-out problems "
             "(pairs never in any training file), loaded from its `<stage>/model` with AutoModelForCausalLM. "
             "Chat pass@1 asks `What is a+b?` through the chat template (greedy, and sampled at temperature 1: "
             f"the mean over {config.eval_samples} samples); completion pass@1 asks `a+b=`, the form of "
             f"{1 - config.chat_share:.0%} of the pretraining corpus (the rest: conversations in the chat "
             "template). Answer NLL: the mean negative log-likelihood of the right answer's tokens.")
    shown = "\n".join(f"    {q} -> {a!r}" for q, a in results["grpo"]["eval"]["examples"])
    sections = [intro, stage_summary(results, config, claims), table(results, config),
                image(stage_plot(run_dir / "pipeline_pass_at_1.png", results, config), "pass@1 per stage"),
                *curve_plots(run_dir),
                f"DPO pairs: {pairs['pairs']} of {pairs['problems']} fresh problems had a wrong sample among "
                f"{pairs['samples_per_problem']} from the SFT model ({pairs['wrong_share']:.1%} of samples wrong).",
                "The final model on the first held-out problems (greedy):\n\n" + shown,
                "Try it: `trajtune chat --model " + results["grpo"]["model"] + " --temperature 0`"]
    return write_report(run_dir, "HF pipeline: pretrain -> SFT -> DPO -> GRPO on 2-digit addition",
                        sections), claims
