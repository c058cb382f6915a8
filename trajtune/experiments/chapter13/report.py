"""Claims (REPRODUCE B1-B8) and the report of the chapter13 recipe: the seed's numbers beside ours."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from ...runs.plots import grouped_bar_plot, line_plot
from ...runs.report import (Claim, claims_table, claims_verdict, fmt, image, markdown_table, claims_summary, mean_sd,
                            pooled_claims, seed_links, write_report)
from ...runs.verdicts import Estimate, decide, paired, share, share_se, two_shares


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def level(p: float, n: int, what: str) -> Estimate:
    """A share measured on n replies (problems, pairs), against a threshold: `verdicts.share`."""
    return share(round(p * n), n, what=f"{what}, binomial {n}")


def replies(r: dict, key: str) -> int:
    """How many sampled replies a share of an instruct stage counts ('seen' -> n_seen)."""
    return r[f"n_{key.split('_')[0]}"]


def instruct_claims(r: dict) -> list[Claim]:
    """B1-B2: shares of sampled replies with their binomial noise; the val-loss rise paired over the held-out
    windows (the same windows before and after SFT)."""
    base, nar, bro = r["pretrain"], r["sft_narrow"], r["sft_broad"]

    def two(a: dict, b: dict, key: str, what: str) -> Estimate:  # a's share minus b's
        return two_shares(a[key] * replies(a, key), replies(a, key), b[key] * replies(b, key), replies(b, key), what)

    b1 = decide(*((level(base[k], replies(base, k), k), "not >", 0.05) for k in ("seen", "unseen")))
    b2a = decide((level(nar["seen"], replies(nar, "seen"), "narrow seen"), "not <", 0.8),
                 (two(nar, bro, "seen", "narrow - broad"), ">", 0.0))
    b2c = decide(*((paired(base["window_losses"], m["window_losses"], f"{name}, paired "
                           f"{len(base['window_losses'])} windows"), ">", 0.1)
                   for name, m in (("narrow", nar), ("broad", bro))))
    return [
        Claim("B1", f"char LM, {base['params']:,} params", "val loss 1.77; format 0%",
              f"val loss {fmt(base['val_loss'])}; format seen {pct(base['seen'])}, unseen {pct(base['unseen'])}",
              "a base model that continues text but ignores `Q: word / A:` (at most 5% of replies keep the format)",
              *b1),
        Claim("B2a", f"SFT on seen words ({nar['n_words']} vs {bro['n_words']} words, {nar['n_demos']} demos each)",
              "narrow 95% vs broad 41%", f"narrow {pct(nar['seen'])} vs broad {pct(bro['seen'])}",
              "SFT installs the format (narrow >= 80% on its words); narrow beats broad on its own words", *b2a),
        Claim.compare("B2b", "unseen words: whole word / first letter", "narrow 0% / 0%; broad 16% / 81%",
                      f"narrow {pct(nar['unseen'])} / {pct(nar['unseen_letter'])}; broad {pct(bro['unseen'])} / "
                      f"{pct(bro['unseen_letter'])}",
                      "narrow learns a lookup table, broad starts to learn the rule (first letter: broad above "
                      "narrow by more than 25 points)",
                      two(bro, nar, "unseen_letter", "broad - narrow"), ">", 0.25),
        Claim("B2c", "Shakespeare val loss before -> after SFT", "1.78 -> 2.06 / 2.04",
              f"{fmt(base['val_loss'])} -> {fmt(nar['val_loss'])} / {fmt(bro['val_loss'])}",
              "SFT raises the loss on ordinary text (each by more than 0.1 nats; seed +0.28 / +0.26)", *b2c),
    ]


def per_nat_gap(sft: dict, big: dict, dpo: dict) -> Estimate:
    """Best-of-n's reward gain per nat of KL minus DPO's, (r_b - r_s) / k_b - (r_d - r_s) / k_d, with its standard
    error by the delta method: the three rewards binomial (the SFT reward enters both terms), best-of-n's KL the
    analytic bound (exact), DPO's KL sampled (`kl_se`)."""
    kb, kd = big["kl_bound"], max(dpo["kl"], 1e-9)
    v = {k: share_se(x["reward"], x["n"]) ** 2 for k, x in (("b", big), ("d", dpo), ("s", sft))}
    var = (v["b"] / kb ** 2 + v["d"] / kd ** 2 + v["s"] * (1 / kd - 1 / kb) ** 2
           + (dpo["reward"] - sft["reward"]) ** 2 * dpo["kl_se"] ** 2 / kd ** 4)
    gap = (big["reward"] - sft["reward"]) / kb - (dpo["reward"] - sft["reward"]) / kd
    return Estimate(gap, math.sqrt(var), min(big["n"], dpo["n"]), f"beta {dpo['beta']:g}, delta method")


def preference_claims(r: dict, betas) -> list[Claim]:
    """B3-B5: the reward model's held-out accuracy and every reward / format share with its binomial noise; DPO's
    reward per nat against best-of-n's by the delta method (`per_nat_gap`); the end share with its bootstrap SE."""
    rm = r["reward_model"]
    sft, bon = rm["sft"], rm["best_of_n"]
    ns = sorted(bon, key=int)
    steps = [sft] + [bon[n] for n in ns]
    bon_rewards = [x["reward"] for x in steps]
    big = bon[ns[-1]]
    dpo = [r[f"dpo_beta{b:g}"] for b in betas]
    smallest = min(dpo, key=lambda d: d["beta"])

    def rise(a: dict, b: dict, key: str, what: str) -> Estimate:  # b's share minus a's
        return two_shares(b[key] * b["n"], b["n"], a[key] * a["n"], a["n"], what)

    b4 = decide((rise(sft, big, "reward", f"best-of-{ns[-1]} - SFT"), ">", 0.2),
                *((rise(a, b, "reward", f"{m} -> best-of-{n}"), "not <", 0.0)
                  for (m, a), (n, b) in zip([("SFT", sft), *((n, bon[n]) for n in ns)], [(n, bon[n]) for n in ns])),
                (rise(sft, big, "format", f"format, best-of-{ns[-1]} - SFT"), "not <", -0.1))
    b5c = decide(*((Estimate(d["end_share"], d["end_share_se"], d["n"], f"beta {d['beta']:g}, delta method {d['n']}"),
                    "not >", 0.15) for d in dpo))
    return [
        Claim.compare("B3", "Bradley-Terry reward model, held-out pairs", "100%", pct(rm["rm_accuracy"]),
                      ">= 95% held-out pair accuracy", level(rm["rm_accuracy"], rm["n_test_pairs"], "pairs"),
                      "not <", 0.95),
        Claim("B4", f"best-of-n, n = {'/'.join(ns)} (SFT first)", "27% -> 38/62/88%, format 94%",
              " -> ".join(pct(x) for x in bon_rewards) + f", format {pct(big['format'])} (SFT {pct(sft['format'])})",
              f"reward rises with n (no step clearly down; best-of-{ns[-1]} above SFT by more than 20 points), "
              "format kept (down by less than 10 points)", *b4),
        Claim("B5a", "DPO beta " + "/".join(f"{b:g}" for b in betas) + ": reward @ KL",
              "62%@1.35, 80%@5.7, 81%@18.4; best-of-8 88%@<=1.2",
              ", ".join(f"{pct(d['reward'])}@{fmt(d['kl'], 1)}" for d in dpo)
              + f"; best-of-{ns[-1]} {pct(big['reward'])}@<={fmt(big['kl_bound'], 1)}",
              "less reward per nat than best-of-n (at every beta)",
              *decide(*((per_nat_gap(sft, big, d), ">", 0.0) for d in dpo))),
        Claim.compare("B5b", "DPO format adherence", "92/73/32% (SFT 95%)",
                      "/".join(pct(d["format"]) for d in dpo) + f" (SFT {pct(sft['format'])})",
                      "small beta breaks the format: at the smallest beta at most half the replies keep it (seed 32%)",
                      level(smallest["format"], smallest["n"], f"beta {smallest['beta']:g} format"), "not >", 0.5),
        Claim("B5c", "DPO's log-ratio on the last two tokens", "9/5/4%",
              "/".join(pct(d["end_share"]) for d in dpo)
              + ("" if max(d["end_share"] for d in dpo) <= 0.15 else
                 ": concentrated on the reply's end (the period the preference is about), not spread"),
              "the change is spread over the whole reply (the last two tokens carry <= 15% at every beta; seed <= 9%)",
              *b5c),
    ]


def per_problem(e: dict, what: str) -> list[float]:
    """One number per held-out problem (`rlvr.math_eval`'s per_problem): 'pass@1' (right samples / k), 'pass@k'
    (any right), 'distinct' (distinct answers)."""
    p = e["per_problem"]
    if what == "pass@1":
        return [c / p["k"] for c in p["correct"]]
    if what == "pass@k":
        return [float(c > 0) for c in p["correct"]]
    return [float(d) for d in p[what]]


def rlvr_claims(r: dict) -> list[Claim]:
    """B6-B7: every change measured on the same 256 held-out problems, paired per problem (`verdicts.paired`); the
    no-signal share with the standard error of its mean over the GRPO steps."""
    before, after, ctl = r["coldstart"], r["grpo"], r["sft_control"]
    no_signal = [c[2] for c in after["curve"]]
    steps = len(no_signal)
    signal = Estimate(statistics.fmean(no_signal), statistics.stdev(no_signal) / math.sqrt(steps) if steps > 1 else 0.0,
                      steps, f"{steps} steps")
    k = max(before["pass_at"], key=int)  # 16 at full budget

    def change(a: dict, b: dict, what: str, label: str) -> Estimate:  # b - a, per problem
        return paired(per_problem(a, what), per_problem(b, what), f"{label}, paired {len(a['per_problem']['correct'])}")

    return [
        Claim("B6a", f"GRPO: pass@1, pass@{k}", "25% -> 47%; 84% -> 80%",
              f"{pct(before['pass_at']['1'])} -> {pct(after['pass_at']['1'])}; "
              f"{pct(before['pass_at'][k])} -> {pct(after['pass_at'][k])}",
              f"pass@1 up (by more than 10 points; seed +22), pass@{k} flat or down (not above +2 points)",
              *decide((change(before, after, "pass@1", "pass@1"), ">", 0.1),
                      (change(before, after, "pass@k", f"pass@{k}"), "not >", 0.02))),
        Claim.compare("B6b", f"distinct answers in {k} samples; first-digit entropy", "7.3 -> 4.3; 0.23 -> 0.16 nats",
                      f"{fmt(before['distinct'], 1)} -> {fmt(after['distinct'], 1)}; {fmt(before['entropy'])} -> "
                      f"{fmt(after['entropy'])} nats",
                      "fewer distinct answers", change(before, after, "distinct", "distinct"), "<", 0.0),
        Claim("B6c", "share of GRPO groups with no signal (mean over steps)", "about a third", pct(signal.value),
              "about a third of groups carry no signal (between 20% and 50%)",
              *decide((signal, "not <", 0.2), (signal, "not >", 0.5))),
        Claim("B7", f"control: more SFT steps: pass@1, pass@{k}", "75%, 99% (GRPO 47%, 80%)",
              f"{pct(ctl['pass_at']['1'])}, {pct(ctl['pass_at'][k])} "
              f"(GRPO {pct(after['pass_at']['1'])}, {pct(after['pass_at'][k])})",
              f"when demonstrations are cheap, SFT wins (pass@1 above GRPO's, pass@{k} not below)",
              *decide((change(after, ctl, "pass@1", "pass@1"), ">", 0.0),
                      (change(after, ctl, "pass@k", f"pass@{k}"), "not <", 0.0))),
    ]


def instruct_section(run_dir: Path, results: dict) -> str:
    """B1-B2: the table of the three models, the pretraining curve and the adherence plot."""
    curve = results["pretrain"]["curve"]
    line_plot(run_dir / "pretrain_loss.png", {"val loss": ([c[0] for c in curve], [c[1] for c in curve])},
              "B1: pretraining on Shakespeare", "step", "held-out NLL per character")
    rows = [(name, pct(results[k]["seen"]), pct(results[k]["unseen"]), pct(results[k]["unseen_letter"]),
             fmt(results[k]["val_loss"], 3), "; ".join(results[k]["examples"][:2]))
            for name, k in (("base", "pretrain"), ("SFT, 16 words", "sft_narrow"), ("SFT, broad", "sft_broad"))]
    groups = {cat: {name: results[k][key] for name, k in (("base", "pretrain"), ("SFT narrow", "sft_narrow"),
                                                          ("SFT broad", "sft_broad"))}
              for cat, key in (("seen words", "seen"), ("unseen words", "unseen"),
                               ("unseen words: first letter", "unseen_letter"))}
    grouped_bar_plot(run_dir / "adherence.png", groups, "B2: the reply starts with the word",
                     "prompt words", "share of replies", (0, 1.1), value_format="{:.0%}")
    return ("## B1-B2: base model and SFT\n\n" + markdown_table(
        ["model", "seen words", "unseen words", "unseen: first letter", "val loss", "examples"], rows)
        + "\n\n" + image(run_dir / "pretrain_loss.png", "pretraining loss") + " "
        + image(run_dir / "adherence.png", "adherence"))


def preference_section(run_dir: Path, results: dict, betas) -> str:
    """B3-B5: the reward model, best-of-n and DPO table and the two frontier plots."""
    rm = results["reward_model"]
    bon = rm["best_of_n"]
    dpo = [results[f"dpo_beta{b:g}"] for b in betas]
    frontier = {"SFT": ([0.0], [rm["sft"]["reward"]]),
                "best-of-n (KL bound)": ([bon[n]["kl_bound"] for n in bon], [bon[n]["reward"] for n in bon]),
                "DPO (sampled KL)": ([d["kl"] for d in dpo], [d["reward"] for d in dpo])}
    line_plot(run_dir / "frontier.png", frontier, "B4-B5: reward bought per nat of KL",
              "KL from the SFT model (nats per reply)", "replies ending with a period", (0, 1.05),
              styles={"SFT": "*", "best-of-n (KL bound)": "s-", "DPO (sampled KL)": "o-"})
    fmt_series = {"SFT": ([0.0], [rm["sft"]["format"]]),
                  "best-of-n (KL bound)": ([bon[n]["kl_bound"] for n in bon], [bon[n]["format"] for n in bon]),
                  "DPO (sampled KL)": ([d["kl"] for d in dpo], [d["format"] for d in dpo])}
    line_plot(run_dir / "frontier_format.png", fmt_series, "What it cost: the SFT format",
              "KL from the SFT model (nats per reply)", "replies starting with the word", (0, 1.05),
              styles={"SFT": "*", "best-of-n (KL bound)": "s-", "DPO (sampled KL)": "o-"})
    rows = [("SFT", pct(rm["sft"]["reward"]), "0", pct(rm["sft"]["format"]), "-", "")]
    rows += [(f"best-of-{n}", pct(v["reward"]), f"<= {fmt(v['kl_bound'])}", pct(v["format"]), "-", "")
             for n, v in bon.items()]
    rows += [(f"DPO beta={d['beta']:g}", pct(d["reward"]), fmt(d["kl"]), pct(d["format"]), pct(d["end_share"]),
              " / ".join(repr(e) for e in d["examples"][:2])) for d in dpo]
    return (f"## B3-B5: reward model, best-of-n, DPO\n\nReward model: held-out pair accuracy {pct(rm['rm_accuracy'])} "
            f"({rm['n_train_pairs']} training pairs, {rm['n_test_pairs']} held out).\n\n"
            + markdown_table(["method", "reward", "KL (nats)", "format", "log-ratio on last 2 tokens", "examples"],
                             rows)
            + "\n\n" + image(run_dir / "frontier.png", "frontier") + " "
            + image(run_dir / "frontier_format.png", "format"))


def rlvr_section(run_dir: Path, results: dict) -> str:
    """B6-B7: pass@k of the three calculators, the GRPO curve."""
    evals = {"before RL": results["coldstart"], "after GRPO": results["grpo"], "200 more SFT": results["sft_control"]}
    line_plot(run_dir / "pass_at_k.png",
              {k: ([int(j) for j in e["pass_at"]], list(e["pass_at"].values())) for k, e in evals.items()},
              "B6-B7: solved by at least one of k samples", "k (samples per problem)", "pass@k", (0, 1.02))
    curve = results["grpo"]["curve"]
    line_plot(run_dir / "grpo.png", {"mean reward": ([c[0] for c in curve], [c[1] for c in curve]),
                                     "groups with no signal": ([c[0] for c in curve], [c[2] for c in curve])},
              "B6: GRPO training", "RL step", "share", (0, 1.02),
              styles={"mean reward": "-", "groups with no signal": "-"})
    rows = [(k, pct(e["greedy"]), *(pct(v) for v in e["pass_at"].values()), fmt(e["distinct"], 1), fmt(e["entropy"]))
            for k, e in evals.items()]
    return ("## B6-B7: RL on a verifiable reward\n\n" + markdown_table(
        ["model", "greedy", *(f"pass@{j}" for j in results["grpo"]["pass_at"]),
         f"distinct answers in {max(map(int, results['grpo']['pass_at']))}", "first-digit entropy (nats)"], rows)
        + "\n\n" + image(run_dir / "pass_at_k.png", "pass@k") + " " + image(run_dir / "grpo.png", "GRPO"))


def chapter13_claims(results: dict, betas) -> list[Claim]:
    """The claims of whichever parts ran (B1-B2 instruct, B3-B5 preference, B6-B7 rlvr)."""
    return ((instruct_claims(results) if "pretrain" in results else [])
            + (preference_claims(results, betas) if "reward_model" in results else [])
            + (rlvr_claims(results) if "grpo" in results else []))


def write_chapter13_report(run_dir: Path, config, results: dict) -> tuple[Path, list[Claim]]:
    """claims.md and report.md (+ .html, plots) from the stages' results (whichever parts ran); `write_report` links
    view.html, which `run_and_report` wrote first: (report path, claims)."""
    claims, sections = chapter13_claims(results, config.dpo_betas), []
    if "pretrain" in results:
        sections.append(instruct_section(run_dir, results))
    if "reward_model" in results:
        sections.append(preference_section(run_dir, results, config.dpo_betas))
    if "grpo" in results:
        sections.append(rlvr_section(run_dir, results))
    timing = [(name, f"{r['time']['wall_s']:.0f}", f"{r['time']['cpu_s']:.0f}") for name, r in results.items()]
    sections.append("## Time per stage (seconds)\n\n" + markdown_table(["stage", "wall", "CPU"], timing))
    (run_dir / "claims.md").write_text(claims_table(claims) + "\n")
    intro = (f"Seed {config.seed}. {claims_verdict(claims)}. Claims from REPRODUCE.md part B; the seed's numbers are "
             "those of the seed post-training ch.13 (instruction tuning, preferences, RL on verifiable rewards; its "
             "seed 0; the repository's docs/seeds.md describes the seeds). A difference counts only when it clears "
             "twice its standard error (the column beside the verdict); one inside the noise is "
             "\"not distinguishable\". A claim that does not hold is reported, not tuned away.")
    return write_report(run_dir, "Post-training ch.13: instruction tuning -> preferences -> RLVR",
                        [intro, "## Claims\n\n" + claims_table(claims), *sections]), claims


SEED_ROWS = [  # (label, seed's "mean ± sd (seeds 0/1/2)", getter)
    ("SFT broad: unseen word copied whole", "6% ± 9% (16/3/0)", lambda r: r["sft_broad"]["unseen"]),
    ("SFT broad: right first letter", "82% ± 8% (81/75/91)", lambda r: r["sft_broad"]["unseen_letter"]),
    ("SFT narrow: seen words", "95% (seed 0)", lambda r: r["sft_narrow"]["seen"]),
    ("Best-of-8 reward", "92% ± 3% (88/94/94)", lambda r: r["reward_model"]["best_of_n"]["8"]["reward"]),
    ("DPO beta=1 reward", "68% ± 6% (62/68/74)", lambda r: r["dpo_beta1"]["reward"]),
    ("DPO beta=0.1 reward", "88% ± 6% (81/92/92)", lambda r: r["dpo_beta0.1"]["reward"]),
    ("DPO beta=0.1 format", "38% ± 12% (32/30/52)", lambda r: r["dpo_beta0.1"]["format"]),
    ("Before RL: pass@1", "57% ± 28% (25/68/77)", lambda r: r["coldstart"]["pass_at"]["1"]),
    ("After GRPO: pass@1", "75% ± 24% (47/86/92)", lambda r: r["grpo"]["pass_at"]["1"]),
    ("Before RL: pass@16", "95% ± 9% (84/100/100)", lambda r: r["coldstart"]["pass_at"]["16"]),
    ("After GRPO: pass@16", "93% ± 12% (80/100/100)", lambda r: r["grpo"]["pass_at"]["16"]),
    ("Before RL: distinct answers in 16", "4.3 ± 2.6 (7.3/3.2/2.4)", lambda r: r["coldstart"]["distinct"]),
    ("After GRPO: distinct answers in 16", "2.8 ± 1.4 (4.3/2.3/1.7)", lambda r: r["grpo"]["distinct"]),
    ("After 200 more SFT steps: pass@1", "83% ± 12% (75/77/97)", lambda r: r["sft_control"]["pass_at"]["1"]),
    ("After 200 more SFT steps: pass@16", "100% ± 1% (99/100/100)", lambda r: r["sft_control"]["pass_at"]["16"]),
]


def write_seed_table(run_dir: Path, per_seed: dict[int, dict], betas) -> Path:
    """B8: mean ± sd over seeds of every row of the seed's three-seed table, and every claim's verdict over the
    seeds (its estimate pooled over them, `runs.report.pooled_claims`); prints the claims' summary."""
    rows = []
    for label, theirs, get in SEED_ROWS:
        try:
            vals = [get(r) for r in per_seed.values()]
        except KeyError:  # a part that was not run
            continue
        scale, digits = (1, 1) if "distinct" in label else (100, 0)
        rows.append((label, theirs, mean_sd([scale * v for v in vals], digits),
                     " / ".join(f"{scale * v:.{digits}f}" for v in vals)))
    seeds = ", ".join(str(s) for s in per_seed)
    table = markdown_table(["run", "seed doc: mean ± sd (seeds 0/1/2)", f"ours: mean ± sd (seeds {seeds})",
                            "ours per seed"], rows)
    claims = {s: chapter13_claims(r, betas) for s, r in per_seed.items()}
    pooled = pooled_claims(claims)
    per_seed_claims = "\n\n".join(f"### seed {s}\n\n{claims_verdict(c)}\n\n" + claims_table(c)
                                  for s, c in claims.items())
    (Path(run_dir) / "seed_table.md").write_text(table + "\n")
    print(claims_summary(pooled))
    return write_report(run_dir, "Post-training ch.13 over seeds (B8)",
                        [f"{claims_verdict(pooled)} over seeds {seeds} (a claim decided by one difference is judged on "
                         "it pooled over the seeds, with its standard error; the others hold where they hold on every "
                         f"seed). Percentages in %, distinct answers as counts. Per-seed reports: "
                         f"{seed_links(list(per_seed))}.",
                         "## Claims over the seeds\n\n" + claims_table(pooled),
                         "## Three-seed table\n\n" + table, "## Claims per seed\n\n" + per_seed_claims])
