"""The smollm2 recipe's reports: per seed, the held-out table (base / sft / grpo; accuracy and format rate, greedy
and sampled), the replies side by side, the learning curves and each gain's verdict; over seeds, each gain pooled
over the seeds with its standard error (`gain_claims`, decided by `runs.verdicts`, the one helper of every recipe)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ...runs.report import Claim, pooled_claims
from ...runs.verdicts import Estimate, paired, share_se, two_shares
from .config import MODEL_STAGES, Config

METRICS = {"greedy_accuracy": "accuracy (greedy)", "sampled_accuracy": "accuracy (sampled)",
           "greedy_format": "format (greedy)", "sampled_format": "format (sampled)"}
"""the held-out numbers of each model, as the tables name them"""
GAINS = {"learned": ("base", "grpo"), "warm start": ("base", "sft"), "RL": ("sft", "grpo")}
"""the gains judged over seeds: (before, after) models"""
GAIN_IDS = {"learned": "L", "warm start": "W", "RL": "RL"}
"""each gain's claim id, with .g (greedy) or .s (sampled): L.g, W.s, RL.g ..."""
JUDGED = ("greedy_accuracy", "sampled_accuracy")
"""the metrics a gain is judged on"""
LABEL = {"base": "base (pretrained)", "sft": "after the warm start (SFT)", "grpo": "after RL (GRPO)"}


# --- verdicts: every gain decided by runs.verdicts with its standard error --------------------------------------
def accuracy_se(p: float, config: Config) -> float:
    """The standard error of a held-out accuracy `p` (one model, one seed), binomial over the `n_eval` problems --
    for the sampled accuracy too: its `eval_samples` replies per problem share the problem's difficulty, so they
    are not independent trials (over all replies the SE would be up to sqrt(eval_samples) too small)."""
    return share_se(p, config.n_eval)


def gain(before: dict, after: dict, metric: str, config: Config) -> Estimate:
    """after - before of one held-out accuracy on the same problems: paired per problem when both evaluations kept
    their per-problem scores (`stages.heldout_eval`'s per_problem), else two binomial shares over the problems."""
    kind = metric.split("_")[0]  # greedy / sampled
    if "per_problem" in before and "per_problem" in after:
        return paired(before["per_problem"][kind], after["per_problem"][kind], f"paired {config.n_eval} problems")
    n = config.n_eval
    return two_shares(after[metric] * n, n, before[metric] * n, n, f"binomial {n} problems")


def gain_claims(per_seed: dict[int, dict], config: Config) -> list[Claim]:
    """One claim per gain (`GAINS`) and judged metric (`JUDGED`): the accuracy rose from `before` to `after`, decided
    on its estimate -- over the seeds when there are several (`runs.report.pooled_claims`: the per-seed estimates
    pooled, `verdicts.over_seeds`)."""
    def claims(ev: dict) -> list[Claim]:
        return [Claim.compare(f"{GAIN_IDS[name]}.{k[0]}", f"{name} ({a} -> {b}), {METRICS[k]}", "-",
                              f"{ev[a][k]:.1%} -> {ev[b][k]:.1%}", "the held-out accuracy rises",
                              gain(ev[a], ev[b], k, config), ">")
                for name, (a, b) in GAINS.items() for k in JUDGED]

    by_seed = {s: claims(r["eval"]) for s, r in per_seed.items()}
    return by_seed[next(iter(by_seed))] if len(by_seed) == 1 else pooled_claims(by_seed)


# --- one seed ---------------------------------------------------------------------------------
def summary(config: Config, results: dict) -> dict:
    """What the seeds report reads (summary.json): each model's held-out numbers and each stage's wall time."""
    return {"seed": config.seed, "n_eval": config.n_eval, "eval_samples": config.eval_samples,
            "eval": {s: {k: results[s]["eval"][k] for k in (*METRICS, "per_op",
                                                            "per_problem") if k in results[s]["eval"]}
                     for s in MODEL_STAGES},
            "examples": {s: results[s]["eval"]["examples"] for s in MODEL_STAGES},
            "wall_s": {s: results[s]["time"]["wall_s"] for s in MODEL_STAGES}}


def table(evals: dict[str, dict], config: Config) -> str:
    """One row per model: accuracy and format rate, greedy and sampled, with the binomial standard error over the
    problems (`accuracy_se`)."""
    from ...runs.report import markdown_table

    rows = [[LABEL[s]] + [f"{e[k]:.1%} ± {accuracy_se(e[k], config):.1%}" for k in METRICS]
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
    from ...runs.plots import line_plot
    from ...runs.report import image

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


def verdict_section(claims: list[Claim], seeds: int) -> str:
    """The gains' claims table with its count: each gain beside the difference ± 2 SE that decided it."""
    from ...runs.report import claims_table, claims_verdict

    over = (f"pooled over {seeds} seeds (each seed's estimate; the SE never below the seeds' mean sampling SE)"
            if seeds > 1 else "one seed: the held-out set's sampling noise; the seed-to-seed spread needs `--seeds "
                              "0,1,2`")
    return (f"{claims_verdict(claims)}: each gain against its standard error, {over}. A gain inside twice its "
            "standard error is \"not distinguishable\".\n\n" + claims_table(claims))


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

    from ...runs.report import claims_summary
    from ...runs.view import write_view_if_recorded

    s = summary(config, results)
    (run_dir / "summary.json").write_text(json.dumps(s, indent=1), encoding="utf-8")
    claims = gain_claims({config.seed: s}, config)
    write_view_if_recorded(run_dir)
    walls = ", ".join(f"{k} {v:.0f} s" for k, v in s["wall_s"].items())
    sections = [intro(config), verdict_section(claims, 1), table(s["eval"], config),
                "The first held-out problems, each model's greedy / first sampled reply:\n\n"
                + side_by_side(s["examples"]),
                *curves(run_dir), f"Wall time per stage (evaluation included): {walls}; "
                f"{sum(s['wall_s'].values()):.0f} s in all.",
                f"Try it: `trajtune chat --model {results['grpo']['model']} --temperature 0`"]
    print(claims_summary(claims))
    return write(run_dir, f"SmolLM2-135M learns arithmetic on a CPU: warm start, then GRPO (seed {config.seed})",
                 sections)


# --- over seeds -------------------------------------------------------------------------------
def gains_table(per_seed: dict[int, dict], config: Config) -> str:
    """The gains per seed (each with its own ± 2 SE), their mean and sd over the seeds."""
    from ...runs.report import markdown_table
    from ...runs.verdicts import Z

    seeds, rows = sorted(per_seed), []
    for name, (a, b) in GAINS.items():
        for k in JUDGED:
            est = [gain(per_seed[s]["eval"][a], per_seed[s]["eval"][b], k, config) for s in seeds]
            g = [e.value for e in est]
            rows.append([f"{name} ({a} -> {b})", METRICS[k],
                         *(f"{e.value:+.1%} ± {Z * e.se:.1%}" for e in est), f"{statistics.fmean(g):+.1%}",
                         f"{statistics.stdev(g) if len(g) > 1 else 0.0:.1%}"])
    return markdown_table(["gain", "metric", *(f"seed {s} (± 2 SE)" for s in seeds), "mean", "sd over seeds"], rows)


def levels_table(per_seed: dict[int, dict]) -> str:
    """Each model's held-out numbers, mean ± sd over seeds."""
    from ...runs.report import markdown_table, mean_sd

    seeds = sorted(per_seed)
    return markdown_table(["model", *METRICS.values()],
                          [[LABEL[m]] + [mean_sd([100 * per_seed[s]["eval"][m][k] for s in seeds], 1) + "%"
                                         for k in METRICS] for m in MODEL_STAGES])


def write_seeds_report(run_dir: Path, config: Config, per_seed: dict[int, dict]) -> Path:
    """report.md / report.html over seeds: the headline (did it learn; did RL add to the warm start, each gain
    judged pooled over the seeds with its standard error, `gain_claims`), the gains per seed, each model's levels,
    the curves of every seed, one seed's replies side by side; prints the claims' summary."""
    from ...runs.report import claims_summary, seed_links, write_report as write

    seeds = sorted(per_seed)
    claims = gain_claims(per_seed, config)
    by_id = {c.id: c for c in claims}
    learned = [by_id[f"L.{k[0]}"] for k in JUDGED]
    rl = [by_id[f"RL.{k[0]}"] for k in JUDGED]
    head = ("**It learned**: the held-out accuracy gain (base -> after RL), greedy and sampled, clears twice its "
            f"standard error pooled over {len(seeds)} seeds." if all(c.holds is True for c in learned) else
            "**It did not learn measurably**: the held-out accuracy gain (base -> after RL) does not clear twice its "
            f"standard error over {len(seeds)} seeds for " + ", ".join(
                f"{c.what.split(', ')[-1]} ({c.verdict})" for c in learned if c.holds is not True) + ".")
    head += (" RL adds to the warm start beyond the noise." if all(c.holds is True for c in rl) else
             " RL's own gain (after the warm start -> after RL): " + "; ".join(
                 f"{c.what.split(', ')[-1]} {c.verdict}, {c.evidence}" for c in rl) + ".")
    walls = [sum(per_seed[s]["wall_s"].values()) for s in seeds]
    sections = [intro(config), head, verdict_section(claims, len(seeds)),
                "Gains per seed (accuracy after minus before, held-out), each with twice its standard error:\n\n"
                + gains_table(per_seed, config), levels_table(per_seed),
                *curves(run_dir, {s: run_dir / f"seed-{s}" for s in seeds}),
                f"Seed {seeds[0]}, the first held-out problems, each model's greedy / first sampled reply:\n\n"
                + side_by_side(per_seed[seeds[0]]["examples"]),
                "Wall time per seed (evaluation included): " + ", ".join(
                    f"seed {s} {w:.0f} s" for s, w in zip(seeds, walls,
                                                          strict=True)) + ". Per seed: " + seed_links(seeds)]
    print(claims_summary(claims))
    return write(run_dir, f"SmolLM2-135M learns arithmetic on a CPU, over seeds {', '.join(map(str, seeds))}", sections)
