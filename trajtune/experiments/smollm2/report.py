"""The smollm2 recipe's reports: per seed, the held-out table (base / sft / grpo; accuracy and format rate, greedy
and sampled), the replies side by side, the learning curves and a verdict; over seeds, each gain's mean against
its seed-to-seed spread (`verdict`)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from .config import MODEL_STAGES, Config

METRICS = {"greedy_accuracy": "accuracy (greedy)", "sampled_accuracy": "accuracy (sampled)",
           "greedy_format": "format (greedy)", "sampled_format": "format (sampled)"}
"""the held-out numbers of each model, as the tables name them"""
GAINS = {"learned": ("base", "grpo"), "warm start": ("base", "sft"), "RL": ("sft", "grpo")}
"""the gains judged over seeds: (before, after) models"""
JUDGED = ("greedy_accuracy", "sampled_accuracy")
"""the metrics a gain is judged on"""
LABEL = {"base": "base (pretrained)", "sft": "after the warm start (SFT)", "grpo": "after RL (GRPO)"}


# --- verdicts ---------------------------------------------------------------------------------
def verdict(gains: Sequence[float]) -> str:
    """The verdict on one gain measured once per seed: "rises" when every seed's gain is > 0 and their mean exceeds
    their spread (max - min over seeds); "falls" when every gain is < 0 and the mean's size exceeds the spread;
    otherwise "within the seed spread" (with one seed there is no spread: "one seed, no spread")."""
    gains = [float(g) for g in gains]
    if len(gains) < 2:
        return "one seed, no spread"
    m, spread = statistics.fmean(gains), max(gains) - min(gains)
    if min(gains) > 0 and m > spread:
        return "rises"
    if max(gains) < 0 and -m > spread:
        return "falls"
    return "within the seed spread"


def binomial_se(p: float, n: int) -> float:
    """The standard error of a share `p` measured on `n` independent trials."""
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else float("nan")


# --- one seed ---------------------------------------------------------------------------------
def summary(config: Config, results: dict) -> dict:
    """What the seeds report reads (summary.json): each model's held-out numbers and each stage's wall time."""
    return {"seed": config.seed, "n_eval": config.n_eval, "eval_samples": config.eval_samples,
            "eval": {s: {k: results[s]["eval"][k] for k in (*METRICS, "per_op")} for s in MODEL_STAGES},
            "examples": {s: results[s]["eval"]["examples"] for s in MODEL_STAGES},
            "wall_s": {s: results[s]["time"]["wall_s"] for s in MODEL_STAGES}}


def table(evals: dict[str, dict], config: Config) -> str:
    """One row per model: accuracy and format rate, greedy and sampled, with the binomial standard error."""
    from ...runs.report import markdown_table

    n = {"greedy": config.n_eval, "sampled": config.n_eval * config.eval_samples}
    rows = [[LABEL[s]] + [f"{e[k]:.1%} ± {binomial_se(e[k], n[k.split('_')[0]]):.1%}" for k in METRICS]
            + [", ".join(f"{op} {v:.0%}" for op, v in e["per_op"].items())] for s, e in evals.items()]
    return markdown_table(["model", *METRICS.values(), "greedy accuracy per operation"], rows)


def side_by_side(examples: dict[str, list]) -> str:
    """The first held-out problems: the right answer, then each model's greedy and first sampled reply."""
    from ...runs.report import markdown_table

    rows = []
    for i, (q, a, *_) in enumerate(examples["base"]):
        rows.append([q, a] + [f"{examples[s][i][2]!r} / {examples[s][i][3]!r}" for s in MODEL_STAGES])
    return markdown_table(["held-out problem", "answer", *(f"{s}: greedy / sampled" for s in MODEL_STAGES)], rows)


def curves(run_dir: Path, seeds: dict[int, Path] | None = None) -> list[str]:
    """The learning curves from metrics.jsonl (of each seed's directory with `seeds`): SFT's loss, GRPO's mean
    reward (the share of right samples)."""
    from ...metrics import read_metrics
    from ...runs.report import image, line_plot

    dirs = seeds or {None: run_dir}
    loss, reward = {}, {}
    for s, d in dirs.items():
        rows = read_metrics(Path(d) / "metrics.jsonl") if (Path(d) / "metrics.jsonl").is_file() else []
        name = "" if s is None else f"seed {s}: "
        for stage, key, out in (("sft", "train/loss", loss), ("grpo", "rollout/reward", reward)):
            pts = [(r["step"], r[key]) for r in rows if r.get("stage") == stage and key in r]
            if pts:
                out[f"{name}{stage}"] = ([p[0] for p in pts], [p[1] for p in pts])
    out = []
    if loss:
        out.append(image(line_plot(run_dir / "sft_loss.png", loss, "warm start: SFT loss (assistant tokens)", "step",
                                   "loss"), "SFT loss"))
    if reward:
        out.append(image(line_plot(run_dir / "grpo_reward.png", reward, "RL: GRPO mean exact-match reward", "step",
                                   "reward", (0, 1.02)), "GRPO reward"))
    return out


def one_seed_verdict(evals: dict[str, dict], config: Config) -> str:
    """Per gain, its size against its binomial standard error (one seed: the sampling noise of the held-out set,
    not the seed-to-seed spread, which only --seeds measures)."""
    lines = []
    for name, (a, b) in GAINS.items():
        parts = []
        for k in JUDGED:
            n = config.n_eval * (1 if k.startswith("greedy") else config.eval_samples)
            d = evals[b][k] - evals[a][k]
            se = math.sqrt(binomial_se(evals[a][k], n) ** 2 + binomial_se(evals[b][k], n) ** 2)
            parts.append(f"{METRICS[k]} {evals[a][k]:.1%} -> {evals[b][k]:.1%} ({d:+.1%}, "
                         f"{d / se if se else float('inf'):+.1f} standard errors)")
        lines.append(f"- {name} ({a} -> {b}): " + "; ".join(parts))
    return ("One seed: each gain against the binomial standard error of the held-out set; whether it exceeds the "
            "seed-to-seed spread needs `--seeds 0,1,2`.\n\n" + "\n".join(lines))


def intro(config: Config) -> str:
    ops = ", ".join({"+": "a+b", "-": "a-b (a >= b)", "*": "a*d (d a digit 2..9)"}[o] for o in config.ops)
    return (f"SmolLM2-135M-Instruct (`{config.model.path}`; Apache-2.0; dequantized from a Q4_1 GGUF, not the bf16 "
            f"original) on mixed arithmetic: {ops}, a, b 2-digit, asked `What is 47*6?` after the system turn "
            f"{config.system!r}. Every model is scored loaded from its folder on the same {config.n_eval} held-out "
            "problems (never in a training file): greedy, and "
            f"{config.eval_samples} samples per problem at temperature {config.sampling.temperature}. Accuracy: the "
            "reply, ended by the stop token, is the answer; format: it is one integer. Warm start: "
            f"{config.sft.steps} SFT steps x {config.sft.batch_size} demonstrations (lr {config.sft_optim.lr:g}); "
            f"RL: {config.grpo.steps} GRPO steps x {config.grpo.tasks_per_step} prompts x {config.grpo.group_size} "
            f"samples (lr {config.grpo_optim.lr:g}), reward 1 for the exact answer.")


def write_report(run_dir: Path, config: Config, results: dict) -> Path:
    """report.md / report.html and summary.json of one seed."""
    from ...runs.report import write_report as write

    s = summary(config, results)
    (run_dir / "summary.json").write_text(json.dumps(s, indent=1), encoding="utf-8")
    walls = ", ".join(f"{k} {v:.0f} s" for k, v in s["wall_s"].items())
    sections = [intro(config), one_seed_verdict(s["eval"], config), table(s["eval"], config),
                "The first held-out problems, each model's greedy / first sampled reply:\n\n" + side_by_side(s["examples"]),
                *curves(run_dir), f"Wall time per stage (evaluation included): {walls}; "
                f"{sum(s['wall_s'].values()):.0f} s in all.",
                f"Try it: `trajtune chat --model {results['grpo']['model']} --temperature 0`"]
    return write(run_dir, f"SmolLM2-135M learns arithmetic on a CPU: warm start, then GRPO (seed {config.seed})",
                 sections)


# --- over seeds -------------------------------------------------------------------------------
def gains_table(per_seed: dict[int, dict]) -> tuple[str, list[str]]:
    """The gains over seeds (per seed, mean, sd, spread, verdict) and one headline line per gain."""
    from ...runs.report import markdown_table

    seeds, rows, lines = sorted(per_seed), [], []
    for name, (a, b) in GAINS.items():
        for k in JUDGED:
            g = [per_seed[s]["eval"][b][k] - per_seed[s]["eval"][a][k] for s in seeds]
            sd = statistics.stdev(g) if len(g) > 1 else 0.0
            v = verdict(g)
            rows.append([f"{name} ({a} -> {b})", METRICS[k], *(f"{x:+.1%}" for x in g),
                         f"{statistics.fmean(g):+.1%}", f"{sd:.1%}", f"{max(g) - min(g):.1%}", v])
            lines.append(f"{name} ({a} -> {b}), {METRICS[k]}: {statistics.fmean(g):+.1%} mean gain, spread "
                         f"{max(g) - min(g):.1%}: {v}")
    return markdown_table(["gain", "metric", *(f"seed {s}" for s in seeds), "mean", "sd", "spread (max - min)",
                           "verdict"], rows), lines


def levels_table(per_seed: dict[int, dict]) -> str:
    """Each model's held-out numbers, mean ± sd over seeds."""
    from ...runs.report import markdown_table, mean_sd

    seeds = sorted(per_seed)
    return markdown_table(["model", *METRICS.values()],
                          [[LABEL[m]] + [mean_sd([100 * per_seed[s]["eval"][m][k] for s in seeds], 1) + "%"
                                         for k in METRICS] for m in MODEL_STAGES])


def write_seeds_report(run_dir: Path, config: Config, per_seed: dict[int, dict]) -> Path:
    """report.md / report.html over seeds: the headline (did it learn; did RL add to the warm start), the gains
    table, each model's levels, the curves of every seed, one seed's replies side by side."""
    from ...runs.report import seed_links, write_report as write

    seeds = sorted(per_seed)
    gains, lines = gains_table(per_seed)
    learned = [verdict([per_seed[s]["eval"]["grpo"][k] - per_seed[s]["eval"]["base"][k] for s in seeds]) for k in JUDGED]
    rl = [verdict([per_seed[s]["eval"]["grpo"][k] - per_seed[s]["eval"]["sft"][k] for s in seeds]) for k in JUDGED]
    head = ("**It learned**: the held-out accuracy gain (base -> after RL), greedy and sampled, exceeds its "
            f"seed-to-seed spread over {len(seeds)} seeds." if all(v == "rises" for v in learned) else
            "**It did not learn measurably**: the held-out accuracy gain (base -> after RL) does not exceed its "
            f"seed-to-seed spread over {len(seeds)} seeds for " + ", ".join(
                METRICS[k] for k, v in zip(JUDGED, learned, strict=True) if v != "rises") + ".")
    head += (" RL adds to the warm start beyond the spread." if all(v == "rises" for v in rl) else
             " RL's own gain (after the warm start -> after RL) is " + "; ".join(
                 f"{METRICS[k]}: {v}" for k, v in zip(JUDGED, rl, strict=True)) + ".")
    walls = [sum(per_seed[s]["wall_s"].values()) for s in seeds]
    sections = [intro(config), head + "\n\n" + "\n".join(f"- {x}" for x in lines),
                "Gains per seed (accuracy after minus before, held-out); the verdict `rises` needs every seed's gain "
                "above 0 and the mean above the spread (max - min over seeds):\n\n" + gains, levels_table(per_seed),
                *curves(run_dir, {s: run_dir / f"seed-{s}" for s in seeds}),
                f"Seed {seeds[0]}, the first held-out problems, each model's greedy / first sampled reply:\n\n"
                + side_by_side(per_seed[seeds[0]]["examples"]),
                "Wall time per seed (evaluation included): " + ", ".join(
                    f"seed {s} {w:.0f} s" for s, w in zip(seeds, walls, strict=True)) + ". Per seed: " + seed_links(seeds)]
    return write(run_dir, f"SmolLM2-135M learns arithmetic on a CPU, over seeds {', '.join(map(str, seeds))}", sections)
