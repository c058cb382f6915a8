"""The mismatch lab's report: run_dir/report.md (+ report.html) and run_dir/summary.json (every run's numbers, the
table over seeds, the verdicts).

Per mismatch and correction, over the seeds: the held-out reward after training minus the on-policy run's of the
same seed (the gap: 0 is "learns as on-policy"; the same of the mean over the run's evaluations beside it), the
share of POLICY tokens the correction cut, and per mismatch the sampler-trainer KL its live run measured. The
verdict (`verdict`) names the correction whose mean |gap| is smallest, and says "not separable at N seeds" unless
its lead over the runner-up is larger than the seeds' spread (the standard deviation over seeds of the gaps, pooled
over the mismatch's corrections): a difference inside the noise is reported as such, with its numbers, never as a
winner.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Sequence

from ...runs.report import markdown_table, mean_sd, write_report


def _mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def _sd(xs: Sequence[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def lab_table(config: Any, results: dict[str, dict]) -> dict[str, Any]:
    """{"onpolicy": {held_out, train_reward: [per seed]}, "mismatch": {m: {"live": {k3, abs_log_ratio,
    sync_logprob_diff, held_out, train_reward: [per seed]}, "corrections": {c: {"gap", "curve_gap", "held_out",
    "cut": [per seed]}}}}} from the stages' results (curve_gap: of the mean held-out reward over the evaluations)."""
    from . import stage_name

    seeds = list(config.seeds)
    on = [results[stage_name(s, "onpolicy")] for s in seeds]
    table: dict[str, Any] = {"seeds": seeds, "onpolicy": {k: [r[k] for r in on] for k in (
        "held_out_before", "held_out", "held_out_mean", "train_reward", "k3", "abs_log_ratio")}, "mismatch": {}}
    for m in config.mismatches:
        live = [results[stage_name(s, m, config.recorded_with)] for s in seeds]
        row: dict[str, Any] = {"live": {k: [r[k] for r in live] for k in (
            "k3", "abs_log_ratio", "sync_logprob_diff", "held_out", "train_reward")}, "corrections": {}}
        for c in config.corrections:
            runs = [results[stage_name(s, m, c)] for s in seeds]
            row["corrections"][c] = {"held_out": [r["held_out"] for r in runs],
                                     "gap": [r["held_out"] - o["held_out"] for r, o in zip(runs, on)],
                                     "curve_gap": [r["held_out_mean"] - o["held_out_mean"] for r, o in zip(runs, on)],
                                     "cut": [r["cut"] for r in runs]}
        table["mismatch"][m] = row
    return table


def verdict(corrections: dict[str, dict], n_seeds: int) -> dict[str, Any]:
    """The correction of `corrections` ({name: {"gap": [per seed]}}) whose mean held-out gap to on-policy is smallest
    in size, its lead over the runner-up, the seeds' spread (the sd of the gaps over seeds, pooled: the root mean
    square of the corrections' sds) and whether the lead is larger than it -> {"best", "runner_up", "lead",
    "spread", "separable", "text"}."""
    size = {c: abs(_mean(v["gap"])) for c, v in corrections.items()}
    order = sorted(size, key=lambda c: (size[c], c))
    best = order[0]
    spread = (statistics.fmean(_sd(v["gap"]) ** 2 for v in corrections.values())) ** 0.5
    if len(order) == 1:
        return {"best": best, "runner_up": None, "lead": None, "spread": spread, "separable": False,
                "text": f"{best} alone (nothing to compare)"}
    second = order[1]
    lead = size[second] - size[best]
    separable = n_seeds > 1 and lead > spread
    g = {c: _mean(corrections[c]["gap"]) for c in (best, second)}
    numbers = (f"{best} gap {g[best]:+.3f}, runner-up {second} {g[second]:+.3f}: lead {lead:.3f} "
               f"{'>' if separable else '<='} seeds' spread {spread:.3f}")
    text = (f"**{best}** keeps learning closest to on-policy ({numbers})" if separable
            else f"not separable at {n_seeds} seeds ({numbers})")
    return {"best": best, "runner_up": second, "lead": lead, "spread": spread, "separable": separable,
            "text": text}


def write_lab_report(config: Any, run_dir: Path, results: dict[str, dict]) -> Path:
    """report.md / report.html and summary.json of a finished lab run -> the path of report.md."""
    table = lab_table(config, results)
    n = len(table["seeds"])
    verdicts = {m: verdict(row["corrections"], n) for m, row in table["mismatch"].items()}
    table["verdicts"] = verdicts
    (Path(run_dir) / "summary.json").write_text(json.dumps(table, indent=1))
    on = table["onpolicy"]
    corrections = list(config.corrections)
    kl_rows = [["on-policy (reference)", mean_sd(on["k3"], 4), mean_sd(on["abs_log_ratio"], 4), "-",
                mean_sd(on["train_reward"], 3), mean_sd(on["held_out"], 3)]]
    kl_rows += [[m, mean_sd(r["live"]["k3"], 4), mean_sd(r["live"]["abs_log_ratio"], 4),
                 mean_sd(r["live"]["sync_logprob_diff"], 3) if m in ("bf16", "fp8") else "-",
                 mean_sd(r["live"]["train_reward"], 3), mean_sd(r["live"]["held_out"], 3)]
                for m, r in table["mismatch"].items()]
    gap_rows = [[m] + [mean_sd(r["corrections"][c]["gap"], 3) for c in corrections]
                for m, r in table["mismatch"].items()]
    curve_rows = [[m] + [mean_sd(r["corrections"][c]["curve_gap"], 3) for c in corrections]
                  for m, r in table["mismatch"].items()]
    cut_rows = [[m] + [f"{_mean(r['corrections'][c]['cut']):.3f}" for c in corrections]
                for m, r in table["mismatch"].items()]
    sections = [
        f"{n} seeds ({', '.join(map(str, table['seeds']))}), {config.rl.steps} GRPO steps of "
        f"{config.rl.tasks_per_step} x {config.rl.group_size} episodes each; task: the first letter of a 3-letter "
        f"word (held-out words never trained on). On-policy reference: held-out reward "
        f"{mean_sd(on['held_out_before'], 3)} before -> **{mean_sd(on['held_out'], 3)}** after (mean ± sd over "
        "seeds).",
        "## The injected mismatch, measured (the live runs, trained with "
        f"{config.recorded_with})\n\nk3: the k3 estimate of KL(sampler || trainer) per sampled token against the "
        "weights each step trains, mean over steps; |log ratio|: the mean |log pi_trainer - log pi_sampler|; sync "
        "diff: the largest sampler-trainer log-prob difference of the weight sync check (bf16 / fp8).\n\n"
        + markdown_table(["mismatch", "k3", "|log ratio|", "sync diff", "train reward", "held-out reward"], kl_rows),
        "## Held-out reward minus on-policy's, per correction (mean ± sd over seeds)\n\nEvery correction of a "
        f"mismatch trains on the same recorded episodes (the {config.recorded_with} column is the live run that "
        "recorded them); 0 is on-policy's score.\n\n" + markdown_table(["mismatch", *corrections], gap_rows),
        "## The same over the whole run: mean held-out reward of the evaluations (every rl.eval_every steps and "
        "the last) minus on-policy's\n\nHow fast it learns; shown beside the verdict's numbers, not deciding it.\n\n"
        + markdown_table(["mismatch", *corrections], curve_rows),
        "## Share of sampled tokens each correction cut (mean over steps and seeds)\n\ntis: clipped at the cap "
        "(pg/tis_capped_frac); the others: masked (pg/correction_masked_frac); none cuts nothing.\n\n"
        + markdown_table(["mismatch", *corrections], cut_rows),
        "## Verdicts: which correction keeps learning closest to on-policy\n\nThe smallest mean |gap| wins only if its "
        "lead over the runner-up is larger than the seeds' spread (the gaps' sd over seeds, pooled over the "
        "corrections).\n\n" + "\n".join(f"- {m}: {v['text']}" for m, v in verdicts.items()),
    ]
    report = write_report(run_dir, "Train-inference mismatch lab", sections)
    print("\n".join(f"{m}: {v['text'].replace('**', '')}" for m, v in verdicts.items()))
    return report
