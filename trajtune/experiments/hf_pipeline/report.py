"""The HF pipeline's report: the per-stage table of held-out pass@1, which stage raised what, and the plots."""

from __future__ import annotations

from pathlib import Path

from .config import MODEL_STAGES, TRAINING, Config


# --- the report -------------------------------------------------------------------------------
STAGE_METRIC = {"pretrain": ("completion_greedy", "chat_greedy", "chat_sampled"),
                "sft": ("chat_greedy", "chat_sampled"), "dpo": ("chat_greedy", "chat_sampled"),
                "grpo": ("chat_greedy", "chat_sampled")}
"""the held-out metrics each training stage is judged by (pretraining also in the form its corpus has)"""
TRAINED_ON = {"base": "random init", "pretrain": "raw text, every token", "sft": "chat rows, assistant turn",
              "dpo": "on-policy pairs", "grpo": "exact-match reward"}


def rises(results: dict) -> dict[str, dict[str, float]]:
    """stage -> {metric: after - before} for the stage's own metrics (before: the previous model's score)."""
    out, previous = {}, "base"
    for name in TRAINING:
        out[name] = {m: results[name]["eval"][m] - results[previous]["eval"][m] for m in STAGE_METRIC[name]}
        previous = name
    return out


def verdict(deltas: dict[str, float]) -> str:
    """'chat greedy +2.3% (rises), chat sampled -0.4% (does NOT rise)'."""
    return ", ".join(f"{m.replace('_', ' ')} {d:+.1%} ({'rises' if d > 0 else 'does NOT rise'})"
                     for m, d in deltas.items())


def table(results: dict, config: Config) -> str:
    """The per-stage markdown table: held-out pass@1 of each stage's model, and whether its metrics rose."""
    from ...runs.report import markdown_table

    delta, rows = rises(results), []
    for name in MODEL_STAGES:
        e, r = results[name]["eval"], results[name]
        rows.append((name, TRAINED_ON[name], r.get("steps", 0), f"{e['completion_greedy']:.1%}",
                     f"{e['chat_greedy']:.1%}", f"{e['chat_sampled']:.1%}", f"{e['chat_pass_at_k']:.1%}",
                     f"{e['chat_answer_nll']:.3f}", f"{r['time']['wall_s']:.0f}s", verdict(delta[name]) if name in delta else ""))
    k = config.eval_samples
    return markdown_table(["stage", "trained on", "steps", "completion pass@1 (greedy)", "chat pass@1 (greedy)",
                           "chat pass@1 (sampled)", f"chat pass@{k}", "answer NLL", "wall",
                           "its metric vs the stage before"], rows)


def stage_plot(path: Path, results: dict, config: Config) -> Path:
    """Held-out pass@1 after each stage: a group of bars per stage (in order), one per metric, each with its
    value written on it; the legend right of the axes."""
    from ...runs.report import grouped_bar_plot

    metrics = (("completion_greedy", "completion pass@1 (greedy)"), ("chat_greedy", "chat pass@1 (greedy)"),
               ("chat_sampled", "chat pass@1 (sampled, T=1)"), ("chat_pass_at_k", f"chat pass@{config.eval_samples}"))
    groups = {s: {label: results[s]["eval"][key] for key, label in metrics} for s in MODEL_STAGES}
    return grouped_bar_plot(path, groups, f"held-out 2-digit addition ({config.n_eval} problems never trained on)",
                            "after stage", "share correct", (0, 1.1), value_format="{:.0%}")


def curve_plots(run_dir: Path) -> list[str]:
    """Training curves from metrics.jsonl: loss of pretrain / sft / dpo, GRPO's mean reward."""
    from ...metrics import read_metrics
    from ...runs.report import image, line_plot

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


def not_rising(results: dict, config: Config) -> list[str]:
    """One line per (stage, metric) that did not rise, with its numbers: how many answers moved, and
    the level it started from (near the ceiling a few problems decide)."""
    out, previous = [], "base"
    for name, deltas in rises(results).items():
        for m, d in deltas.items():
            if d > 0:
                continue
            n = config.n_eval * (1 if "greedy" in m else config.eval_samples)
            before = results[previous]["eval"][m]
            out.append(f"{name}: {m.replace('_', ' ')} {before:.1%} -> {before + d:.1%} ({round(abs(d) * n)} of {n} "
                       f"answers {'fewer' if d < 0 else 'more'} right)")
        previous = name
    return out


PASS_METRICS = {"completion_greedy": "completion pass@1 (greedy)", "chat_greedy": "chat pass@1 (greedy)",
                "chat_sampled": "chat pass@1 (sampled)", "chat_pass_at_k": "chat pass@k"}
"""the table's held-out pass columns, as the summary names them"""


def stage_summary(results: dict, config: Config) -> str:
    """What the table shows, computed from it: a headline (did each stage raise the metrics it targets,
    `STAGE_METRIC`), then per stage which pass metrics rose and which fell, with their numbers; and, when
    the completion form loses what pretraining gave it, a sentence naming that forgetting."""
    flat = not_rising(results, config)
    lines, previous, fell = [], "base", {}  # fell: metric label -> the stages after which it fell
    for name in TRAINING:
        before, after = results[previous]["eval"], results[name]["eval"]
        moved = {"rose": [], "fell": []}
        for key, label in PASS_METRICS.items():
            label = label.replace("@k", f"@{config.eval_samples}")
            d = after[key] - before[key]
            if d:
                moved["rose" if d > 0 else "fell"].append(f"{label} {before[key]:.1%} -> {after[key]:.1%}")
                if d < 0:
                    fell.setdefault(label, []).append(name)
        text = "; ".join(f"{way}: {', '.join(ms)}" for way, ms in moved.items() if ms) or "no pass metric moved"
        lines.append(f"- {name}: {text}")
        previous = name
    falls = "; ".join(f"{label} fell after {', '.join(stages)}" for label, stages in fell.items())
    if flat:
        head = "**Not every stage raised the metrics it targets:** " + "; ".join(flat) + "."
    else:
        head = "**Every training stage raised the held-out metrics it targets" + (
            f", but not every metric rose: {falls}.**" if falls else ", and no pass metric fell.**")
    out = head + "\n\n" + "\n".join(lines)
    completion = [results[s]["eval"]["completion_greedy"] for s in TRAINING]
    later = TRAINING[1:]
    if min(completion[1:]) <= completion[0] - 0.1:  # ten points or more below what pretraining reached
        worst = min(range(1, len(TRAINING)), key=lambda i: completion[i])
        out += ("\n\nThe pretraining format is forgotten: completion pass@1 (`a+b=`, the form of "
                f"{1 - config.chat_share:.0%} of the pretraining corpus) goes " + " -> ".join(f"{x:.1%}" for x in completion) + f" over {', '.join(TRAINING)} "
                f"(lowest after {TRAINING[worst]}) while {', '.join(later)} train on the chat format only. This is the "
                "forgetting the RLHF book describes in ch. 15 (the alignment tax: post-training on a new format or "
                "task loses what the base model did, which PPO-ptx counters by mixing pretraining data back in).")
    return out


def write_pipeline_report(run_dir: Path, config: Config, results: dict) -> Path:
    from ...runs.report import image, write_report

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
    sections = [intro, stage_summary(results, config), table(results, config),
                image(stage_plot(run_dir / "pipeline_pass_at_1.png", results, config), "pass@1 per stage"),
                *curve_plots(run_dir),
                f"DPO pairs: {pairs['pairs']} of {pairs['problems']} fresh problems had a wrong sample among "
                f"{pairs['samples_per_problem']} from the SFT model ({pairs['wrong_share']:.1%} of samples wrong).",
                "The final model on the first held-out problems (greedy):\n\n" + shown,
                "Try it: `trajtune chat --model " + results["grpo"]["model"] + " --temperature 0`"]
    return write_report(run_dir, "HF pipeline: pretrain -> SFT -> DPO -> GRPO on 2-digit addition", sections)
