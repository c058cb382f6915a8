"""The agent experiment's report: claims A1-A13 beside the seed's numbers, curves, costs, timings.

`write_agent_report` turns the stages' results (`experiments/agent/stages.py`) into
run_dir/report.md + report.html + PNG figures and a flat summary.json;
`write_seeds_report` puts several seeds' summaries side by side as mean +- sd.
The claim checks are written out here (A1-A4, A5-A8, A9-A13: three functions), so
the thresholds are visible next to the REPRODUCE.md wording they test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ...envs.bugfix_tasks import FAMILIES
from ...runs.report import (Claim, Panel, claims_table, claims_verdict, fmt, image, line_plot, markdown_table, mean_sd,
                            panel_plot, seed_links, write_report)

RECIPES = {"SFT (oracle)": "oracle_sft", "RFT": "rft", "SFT -> RL": "sft_rl", "RL only": "rl_only"}
GAP_COLUMNS = ("train", "heldout", "renamed", "novel")
GAP_HEADERS = ("train", "held-out (unseen names)", "train tasks renamed", "novel (unseen code)")
GAP_TEXT = ("Each final policy, 8 episodes per task: the held-out split is the seed's (training cues under function names "
            "no training task uses); *train tasks renamed* is the training code under held-out names (the train column's "
            "random numbers), so train -> renamed is what an unseen name alone costs; *novel* is code no training listing "
            "shows (an operator, a keyword, a loop-shaped `minmax` task), a probe beyond the seed.")
N_TRAIN, N_HELDOUT = 20, 10  # BugFix tasks (envs/bugfix_tasks.py)


def eval_points_text(c) -> str:
    """Which evaluation the curves, costs, rounds and DPO tables read (`bugfix.evaluate`)."""
    return (f"*Evaluation points*: {c.eval_samples} sampled episodes (temperature 1) per task, {N_TRAIN} train / "
            f"{N_HELDOUT} held-out tasks ({c.eval_samples * N_TRAIN} / {c.eval_samples * N_HELDOUT} episodes), the "
            "same random numbers at every point; a recipe's final numbers here are its last point.")


def final_policies_text(c) -> str:
    """Which evaluation the final-policy tables read (`bugfix.describe`): another draw than the curves' last point."""
    return (f"*Final-policy evaluation*: each stage's final policy re-run with {c.describe_samples} sampled episodes "
            f"(temperature 1) per task ({c.describe_samples * N_TRAIN} train / {c.describe_samples * N_HELDOUT} "
            "held-out episodes) on other random numbers than the evaluation points, so its pass rates differ from the "
            "curves' last point by sampling noise (the same policy, another draw).")


GUESS_LEVEL = 0.25  # blind play passes ~0.2 (envs/scripted.py)


def last(curve: list[dict], key: str) -> float:
    return curve[-1][key]


def final(results: dict, stage: str) -> tuple[float, float]:
    """(train, held-out) pass at a recipe's last evaluation point."""
    c = results[stage]["curve"]
    return last(c, "eval/pass_rate"), last(c, "eval/heldout_pass_rate")


def recipe_curve(results: dict, name: str) -> list[dict]:
    """A recipe's curve on the common gradient-step axis (SFT -> RL starts with SFT's first points)."""
    if name == "SFT -> RL":
        cold = results["sft_rl"]["curve"][0]["step"]
        return [p for p in results["oracle_sft"]["curve"] if p["step"] < cold] + results["sft_rl"]["curve"]
    return results[RECIPES[name]]["curve"]


def rl_only_stability(r: dict) -> tuple[bool, str]:
    """Did RL only keep the format and not end below where it started (issue 32's bar: malformed calls per episode
    at its last evaluation <= its first + 0.5, and the last train pass >= the first)? -> (ok, the numbers)."""
    cv = r["rl_only"]["curve"]
    inv0, inv1 = cv[0]["eval/invalid_per_episode"], cv[-1]["eval/invalid_per_episode"]
    p0, p1 = cv[0]["eval/pass_rate"], cv[-1]["eval/pass_rate"]
    ok = inv1 <= inv0 + 0.5 and p1 >= p0
    return ok, f"malformed calls {inv0:.2f} -> {inv1:.2f} per episode, train pass {p0:.2f} -> {p1:.2f}"


# --- claims ------------------------------------------------------------------------------------
def claims(c, r: dict) -> list[Claim]:
    """A1-A13 in order: each claim's check beside the seed's numbers and its REPRODUCE.md wording."""
    return _format_and_gradient_claims(r) + _expert_iteration_and_dpo_claims(c, r) + _recipe_claims(r)


def _format_and_gradient_claims(r: dict) -> list[Claim]:
    """A1-A4: token owners and the loss at init, the weak base, oracle SFT, the gradient identity."""
    out = []
    a1 = r["diagnostics"]["a1"]
    pol, tool, tot = a1["owners"]["policy"], a1["owners"]["tool"], a1["total"]
    near = lambda x: abs(x - a1["log_vocab"]) / a1["log_vocab"] < 0.1  # noqa: E731
    out.append(Claim("A1", "owners of predicted tokens, 20 oracle demos; loss at init",
                     "policy 260 of 1,338 (19%), tool 838 (63%); masked 5.91 / unmasked 5.88, log V 5.76",
                     f"policy {pol} of {tot} ({pol / tot:.0%}), tool {tool} ({tool / tot:.0%}); masked "
                     f"{a1['masked_loss']:.2f} / unmasked {a1['unmasked_loss']:.2f}, log V {a1['log_vocab']:.2f}",
                     "a minority of tokens are actions; both losses about log V at init",
                     pol / tot < 0.5 and near(a1["masked_loss"]) and near(a1["unmasked_loss"])))
    w = r["weak_base"]["describe"]
    out.append(Claim("A2", "weak base: SFT on blind + random play", "train 0.144, held-out 0.138, invalid/ep 0.06, "
                     "reads 0.29, entropy 0.25", _desc(w), "invalid/ep < 0.1 and pass <= 0.25 (guess level)",
                     w["invalid"] < 0.1 and w["train"] <= GUESS_LEVEL and w["heldout"] <= GUESS_LEVEL))
    o, oc = r["oracle_sft"]["describe"], r["oracle_sft"]["curve"]
    ratio = w["entropy"] / max(o["entropy"], 1e-9)
    out.append(Claim("A3", "oracle SFT from the weak base, 60 steps", "0.16/0.05 -> 0.99/0.93; entropy 0.25 -> 0.02",
                     f"{oc[0]['eval/pass_rate']:.2f}/{oc[0]['eval/heldout_pass_rate']:.2f} -> {o['train']:.2f}/"
                     f"{o['heldout']:.2f}; entropy {w['entropy']:.3f} -> {o['entropy']:.3f} ({ratio:.0f}x)",
                     "train >= 0.95, held-out >= 0.85, entropy drops ~10x (we require >= 5x)",
                     o["train"] >= 0.95 and o["heldout"] >= 0.85 and ratio >= 5))
    a4 = r["diagnostics"]["a4"]
    ok4 = a4["max_abs_diff"] <= 1e-5 * a4["max_abs_grad"] if not math.isnan(a4["max_abs_diff"]) else None
    out.append(Claim("A4", "gradient identity on one weak-base batch", "max abs diff 1.4e-9; cosine(baseline PG, RFT) 0.985",
                     f"kept {a4['kept']}/{a4['episodes']}, ratio {a4['ratio']:.4f}, max abs diff {a4['max_abs_diff']:.1e} "
                     f"(max grad {a4['max_abs_grad']:.1e}); cosine {a4['cosine_baseline']:.3f}",
                     "grad(0/1 PG) = ratio x grad(SFT on kept) to round-off (rel. 1e-5)", ok4))
    return out


def base_coverage(r: dict) -> int:
    """How many train tasks the weak base solves: any of its `coverage_samples` episodes per task (weak_base's
    `coverage`), else (coverage_samples 0, or a run from before it) any of RFT's first-round samples, as the seed."""
    cov = r["weak_base"].get("coverage")
    return len(cov) if cov is not None else len(r["rft"]["rounds"][0]["solved"])


def coverage_note(r: dict) -> str:
    """Where base_coverage's count comes from, for the A5 line."""
    w = r["weak_base"]
    if w.get("coverage") is None:
        return " (in RFT's first round)"
    return (f" (in {w['coverage_samples']} samples each; {len(r['rft']['rounds'][0]['solved'])} in RFT's first round "
            "of 16)")


def _expert_iteration_and_dpo_claims(c, r: dict) -> list[Claim]:
    """A5-A8: expert iteration's rise and plateau, dpo_loss values, DPO's drift, DPO + NLL."""
    out = []
    rounds, rc = r["rft"]["rounds"], r["rft"]["curve"]
    solvable = base_coverage(r) / 20
    trains, helds = [p["eval/pass_rate"] for p in rc], [p["eval/heldout_pass_rate"] for p in rc]
    never = sorted({f for f in FAMILIES} - {t.split("/")[0] for rd in rounds for t in rd["solved"]})
    gains = [b - a for a, b in zip(trains, trains[1:])]
    flattens = len(gains) >= 2 and gains[-1] <= 0.5 * max(gains) and gains[-1] <= 0.1
    ok5 = (max(trains) >= trains[0] + 0.2 and flattens and max(trains) <= solvable and max(helds[1:]) <= GUESS_LEVEL
           and rounds[0]["first_action_edit_share"] > 0.5)
    out.append(Claim("A5", "expert iteration: 4 rounds x 320 samples x 15 steps",
                     "pass 0.15 -> 0.33 -> 0.68 -> 0.75, held-out 0.10-0.23; `init` never solved",
                     "train " + " -> ".join(f"{x:.2f}" for x in trains) + f" (last round {gains[-1]:+.2f}, largest "
                     f"{max(gains):+.2f}); held-out {min(helds[1:]):.2f}-{max(helds[1:]):.2f}; "
                     f"base solves {solvable * 20:.0f}/20 tasks{coverage_note(r)}; never solved: {', '.join(never) or 'none'}; "
                     f"round-0 kept starting with an edit {rounds[0]['first_action_edit_share']:.0%}"
                     + ("" if max(helds[1:]) <= GUESS_LEVEL else
                        f"; held-out above guess level ({rounds[0].get('first_action_read_share', 0.0):.0%} of round-0 "
                        "kept episodes read first)"),
                     f"train rises >= 0.2 and flattens (last round's gain <= half the largest and <= 0.1) below the "
                     f"share of tasks the base solves; held-out <= {GUESS_LEVEL} (guess level); kept mostly blind guesses",
                     ok5))
    a6 = r["diagnostics"]["a6"]
    out.append(Claim("A6", "dpo_loss at beta 0.5, margins 0 / +4 / -4", "0.6931 / 0.1269 / 2.1269",
                     " / ".join(f"{v:.4f}" for v in a6.values()), "exactly these values",
                     [round(v, 4) for v in a6.values()] == [0.6931, 0.1269, 2.1269]))
    d, dn = r["dpo"]["curve"], r["dpo_nll"]["curve"]
    ok7 = (last(d, "d_rejected") <= -10 and last(d, "d_rejected") < d[len(d) // 2]["d_rejected"]
           and max(p["eval/invalid_per_episode"] for p in d[1:]) >= max(3 * d[0]["eval/invalid_per_episode"], 0.3)
           and last(d, "eval/heldout_pass_rate") <= d[0]["eval/heldout_pass_rate"] + 0.05)
    out.append(Claim("A7", f"offline DPO, {c.dpo.steps} full-batch steps, beta {c.dpo.beta}",
                     "d_rejected -45, d_chosen +0.7, train 0.41, held-out 0.00, invalid/ep 2.0", _dpo_text(d),
                     "rejected log-prob falls without bound, malformed calls rise many-fold, held-out does not improve", ok7))
    out.append(Claim("A8", "DPO + NLL on chosen (weight 1)", "train 0.69, held-out 0.17, invalid/ep 0.61", _dpo_text(dn),
                     "fewer malformed calls and higher train pass than A7",
                     last(dn, "eval/invalid_per_episode") < last(d, "eval/invalid_per_episode")
                     and last(dn, "eval/pass_rate") > last(d, "eval/pass_rate")))
    return out


def _recipe_claims(r: dict) -> list[Claim]:
    """A9-A13: the four recipes, informative groups, template mismatch, dedup, reward hacking."""
    out = []
    o, rounds = r["oracle_sft"]["describe"], r["rft"]["rounds"]
    f = {name: final(r, stage) for name, stage in RECIPES.items()}
    ok9 = (abs(f["SFT (oracle)"][1] - f["SFT -> RL"][1]) <= 0.15 and min(f["SFT (oracle)"][1], f["SFT -> RL"][1]) >= f["RFT"][1] + 0.3
           and all(f["SFT -> RL"][i] >= f["RL only"][i] + 0.2 for i in (0, 1)))
    cold = r["sft_rl"]["curve"][0]
    out.append(Claim("A9", "four recipes from the weak base (train/held-out)",
                     "SFT 0.99/0.93; RFT 0.74/0.15; SFT->RL 0.96/0.95; RL only 0.36/0.30",
                     "; ".join(f"{k} {a:.2f}/{b:.2f}" for k, (a, b) in f.items())
                     + f"; the cold start (SFT step {cold['step']}) {cold['eval/pass_rate']:.2f}/"
                     f"{cold['eval/heldout_pass_rate']:.2f} (seed 0.80/0.85)",
                     "SFT ~ SFT->RL (held-out within 0.15) >= RFT + 0.3; SFT->RL >= RL only + 0.2 (train and held-out)", ok9))
    p = r["oracle_sft"]["probes"]
    ks = sorted(p, key=int)
    inf = [p[k]["informative"] for k in ks]
    out.append(Claim("A10", "informative groups on the held-out probe (weak, SFT@20, SFT@60)", "0.60 / 0.70 / 0.10",
                     " / ".join(f"{x:.2f}" for x in inf), "long SFT leaves few groups with reward variance (< SFT@20, <= 0.3)",
                     inf[-1] < inf[1] and inf[-1] <= 0.3))
    t = r["template_mismatch"]["describe"]
    mechanism = ("; the seed's mechanism (malformed calls, 0.62/ep) reproduces" if t["invalid"] >= 0.3 else
                 f"; NOT by the seed's mechanism: malformed calls {t['invalid']:.2f}/ep (seed 0.62), so the "
                 "mis-rendered demos break what the policy chooses, not the call syntax")
    out.append(Claim("A11", "SFT on demos rendered without wrapper tokens", "train 0.075, invalid/ep 0.62",
                     f"train {t['train']:.2f}, held-out {t['heldout']:.2f}, invalid/ep {t['invalid']:.2f}, reads {t['reads']:.2f}; "
                     f"NLL on correctly rendered demos {r['template_mismatch']['nll_right_format']:.2f}" + mechanism,
                     "fails in the real rollout format (train <= 0.3, far below oracle SFT)",
                     t["train"] <= 0.3 and t["train"] <= o["train"] - 0.5))
    rd = rounds[1] if len(rounds) > 1 else rounds[0]
    tv = share_shift(rd["shares_raw"], rd["shares_dedup"])
    out.append(Claim("A12", "dedup of the RFT kept set (round 1)",
                     "84 kept -> 21 distinct action sequences; shares raw minmax 0.21 range 0.37 compare 0.35 zero 0.07, "
                     "deduped 0.43 / 0.24 / 0.19 / 0.14 (total variation 0.29)",
                     f"{rd['kept']} kept -> {rd['distinct']} distinct; shares raw " + _shares(rd["shares_raw"])
                     + "; deduped " + _shares(rd["shares_dedup"]) + f" (total variation {tv:.2f})",
                     "dedup changes the family shares: fewer distinct than kept and total variation distance >= 0.1",
                     rd["distinct"] < rd["kept"] and tv >= 0.1))
    hr, hc = r["hacking"]["rounds"], r["hacking"]["curve"]
    pub, hid = [x["eval/public_pass_rate"] for x in hc], [x["eval/hidden_pass_rate"] for x in hc]
    ok13 = (pub[-1] > pub[1] and hr[-1]["hack_share"] > hr[0]["hack_share"]
            and hid[-1] - hid[1] < pub[-1] - pub[1] and pub[-1] - hid[-1] >= 0.3)
    out.append(Claim("A13", "RFT filtered by public tests (reward hacking)", "kept hacks 42% -> 64%; public 0.97 vs hidden 0.36",
                     "kept hacks " + " -> ".join(f"{x['hack_share']:.0%}" for x in hr)
                     + f"; public {' -> '.join(f'{x:.2f}' for x in pub[1:])} vs hidden {' -> '.join(f'{x:.2f}' for x in hid[1:])}",
                     "filter pass climbs while hidden pass stalls; hack share of the kept set grows", ok13))
    return out


def share_shift(raw: dict, dedup: dict) -> float:
    """Total variation distance between two family-share dicts: half the summed absolute differences."""
    return 0.5 * sum(abs(raw.get(f, 0.0) - dedup.get(f, 0.0)) for f in set(raw) | set(dedup))


# --- the chapter's four conclusions (seed §15.5) ---------------------------------------------
CONCLUSIONS = (
    "SFT on a perfect demonstrator is hard to beat (no recipe ends above it)",
    "RFT from a weak base is bounded by the base",
    "a cold start makes RL work",
    "the RL-only curve is still rising",
)


def conclusions(r: dict) -> dict[str, bool]:
    """Seed §15.5's four conclusions, each judged from the recipes' curves (the claims they rest on):

    1. oracle SFT reaches train >= 0.95 / held-out >= 0.85 (A3) and no other recipe ends more than 0.1 (the
       seed's noise level) above its held-out pass (whether SFT -> RL also catches up is A9's)
    2. RFT plateaus below what the base solves and its held-out stays at guess level (A5)
    3. SFT(20) -> RL(40) beats RL only (60) by >= 0.2 on train and held-out (A9)
    4. RL only's train pass still rises over its second half (last point >= mid point + 0.05)
    """
    f = {name: final(r, stage) for name, stage in RECIPES.items()}
    o = r["oracle_sft"]["describe"]
    rl = r["rl_only"]["curve"]
    rc = r["rft"]["curve"]
    solvable = base_coverage(r) / 20
    return {
        CONCLUSIONS[0]: o["train"] >= 0.95 and o["heldout"] >= 0.85
        and all(f[k][1] <= f["SFT (oracle)"][1] + 0.1 for k in f),
        CONCLUSIONS[1]: max(p["eval/pass_rate"] for p in rc) <= solvable
        and max(p["eval/heldout_pass_rate"] for p in rc[1:]) <= GUESS_LEVEL,
        CONCLUSIONS[2]: all(f["SFT -> RL"][i] >= f["RL only"][i] + 0.2 for i in (0, 1)),
        CONCLUSIONS[3]: rl[-1]["eval/pass_rate"] >= rl[len(rl) // 2]["eval/pass_rate"] + 0.05,
    }


def conclusions_text(held: dict[str, int], n_seeds: int) -> str:
    """Two or three sentences: which of the four conclusions hold on how many seeds."""
    yes = [f"({i + 1}) {k}" for i, k in enumerate(CONCLUSIONS) if held[k] * 2 > n_seeds]
    no = [f"({i + 1}) {k} ({held[k]}/{n_seeds})" for i, k in enumerate(CONCLUSIONS) if held[k] * 2 <= n_seeds]
    out = [f"Of the chapter's four conclusions (§15.5), on our gym over {n_seeds} seed(s): "
           + (f"{'; '.join(yes)} hold{'s' if len(yes) == 1 else ''} on most seeds" if yes else "none holds on most seeds")
           + "."]
    if no:
        out.append(f"Not on most seeds: {'; '.join(no)}; the claims table says why, with the numbers.")
    return " ".join(out)


def _desc(d: dict) -> str:
    return (f"train {d['train']:.3f}, held-out {d['heldout']:.3f}, invalid/ep {d['invalid']:.2f}, "
            f"reads {d['reads']:.2f}, entropy {d['entropy']:.3f}")


def _dpo_text(curve: list[dict]) -> str:
    x = curve[-1]
    return (f"d_rejected {x['d_rejected']:+.1f}, d_chosen {x['d_chosen']:+.2f}, train {x['eval/pass_rate']:.2f}, "
            f"held-out {x['eval/heldout_pass_rate']:.2f}, invalid/ep {x['eval/invalid_per_episode']:.2f} "
            f"(start {curve[0]['eval/invalid_per_episode']:.2f})")


def _shares(s: dict) -> str:
    return " ".join(f"{k} {v:.2f}" for k, v in s.items())


# --- report ------------------------------------------------------------------------------------
def summary(c, r: dict, cl: list[Claim]) -> dict:
    """Flat numbers for the multi-seed table."""
    s = {f"{k} {x}": v for k, st in RECIPES.items() for x, v in zip(("train", "held-out"), final(r, st), strict=True)}
    w, o = r["weak_base"]["describe"], r["oracle_sft"]["describe"]
    s.update({"weak train": w["train"], "weak held-out": w["heldout"], "weak invalid/ep": w["invalid"],
              "oracle entropy drop (x)": w["entropy"] / max(o["entropy"], 1e-9),
              "DPO d_rejected": last(r["dpo"]["curve"], "d_rejected"),
              "DPO invalid/ep": last(r["dpo"]["curve"], "eval/invalid_per_episode"),
              "DPO+NLL invalid/ep": last(r["dpo_nll"]["curve"], "eval/invalid_per_episode"),
              "DPO train": last(r["dpo"]["curve"], "eval/pass_rate"),
              "DPO+NLL train": last(r["dpo_nll"]["curve"], "eval/pass_rate"),
              "A10 informative SFT@20": r["oracle_sft"]["probes"][str(c.cold_start_step)]["informative"],
              "A11 mismatch train": r["template_mismatch"]["describe"]["train"],
              "A13 kept hack share, last round": r["hacking"]["rounds"][-1]["hack_share"],
              "RL only train, first eval": r["rl_only"]["curve"][0]["eval/pass_rate"],
              "RL only invalid/ep, first eval": r["rl_only"]["curve"][0]["eval/invalid_per_episode"],
              "RL only invalid/ep, last eval": r["rl_only"]["curve"][-1]["eval/invalid_per_episode"]})
    out = {"numbers": s, "holds": {x.id: x.holds for x in cl}, "conclusions": conclusions(r)}
    if "generalization" in r:  # train / held-out / train renamed / novel of each final policy
        g = r["generalization"]
        out["generalization"] = {st: {"train": r[st]["describe"]["train"], "heldout": r[st]["describe"]["heldout"],
                                      "renamed": v, "novel": g.get("novel", {}).get(st, float("nan"))}
                                 for st, v in g["renamed"].items()}
    return out


def cost_rows(r: dict) -> list[list]:
    rows = []
    for name, stage in RECIPES.items():
        costs = dict(r[stage].get("costs", {}))
        if name == "SFT -> RL":
            costs = r["sft_rl"]["costs"]
        demos = r["oracle_sft"]["demos"] if name in ("SFT (oracle)", "SFT -> RL") else 0
        a, b = final(r, stage)
        rows.append([name, demos, costs.get("sampled", 0), costs.get("verifier_calls", 0), fmt(a), fmt(b)])
    return rows


def plots(run_dir: Path, c, r: dict) -> list[str]:
    curves = {name: recipe_curve(r, name) for name in RECIPES}
    figs = []
    for key, label, fname in (("eval/pass_rate", "train pass rate", "curves_train.png"),
                              ("eval/heldout_pass_rate", "held-out pass rate", "curves_heldout.png")):
        series = {n: ([p["step"] for p in cv], [p[key] for p in cv]) for n, cv in curves.items()}
        figs.append(image(line_plot(run_dir / fname, series, f"{label} vs gradient steps (fig. 15.3)", "gradient step",
                                    label, ylim=(0, 1.02)), label))
    d, dn = r["dpo"]["curve"], r["dpo_nll"]["curve"]
    drift = {f"{n} {k}": ([p["step"] for p in cv[1:]], [p[f"d_{k}"] for p in cv[1:]])
             for n, cv in (("DPO", d), ("DPO+NLL", dn)) for k in ("chosen", "rejected")}
    figs.append(image(line_plot(run_dir / "dpo_drift.png", drift, "log-prob drift vs reference (fig. 15.2, left)",
                                "DPO step", "log pi - log ref (nats)"), "DPO drift"))
    beh = {unit: {f"{n} {lab}": ([p["step"] for p in cv], [p[k] for p in cv]) for n, cv in (("DPO", d), ("DPO+NLL", dn))
                  for k, lab in keys} for unit, keys in (("pass", (("eval/pass_rate", "train"),
                                                                   ("eval/heldout_pass_rate", "held-out"))),
                                                          ("invalid", (("eval/invalid_per_episode", "invalid"),)))}
    figs.append(image(panel_plot(run_dir / "dpo_behaviour.png", [Panel("pass rate", beh["pass"], (0, 1.02)),
                                                                 Panel("invalid calls per episode", beh["invalid"])],
                                 "what the policy does (fig. 15.2, right)", "DPO step"), "DPO behaviour"))
    hr, hc = r["hacking"]["rounds"], r["hacking"]["curve"]
    rounds = list(range(1, len(hr) + 1))
    hack = {"kept hack share": (rounds, [x["hack_share"] for x in hr]),
            "public pass (filter)": (rounds, [x["eval/public_pass_rate"] for x in hc[1:]]),
            "hidden pass": (rounds, [x["eval/hidden_pass_rate"] for x in hc[1:]])}
    figs.append(image(line_plot(run_dir / "hacking.png", hack, "RFT filtered by public tests (fig. 15.4)", "round",
                                "share", ylim=(0, 1.02)), "reward hacking"))
    return figs


def write_agent_report(c, run_dir: Path, r: dict, wall: float) -> Path:
    cl = claims(c, r)
    (run_dir / "summary.json").write_text(json.dumps(summary(c, r, cl), indent=1))
    curves = [[name] + [f"{p['step']}: {p['eval/pass_rate']:.2f}/{p['eval/heldout_pass_rate']:.2f}" for p in recipe_curve(r, name)]
              for name in RECIPES]
    width = max(len(x) for x in curves)
    curves = [row + [""] * (width - len(row)) for row in curves]
    describes = [[st, *[fmt(d[k], 3) for k in ("train", "heldout", "invalid", "reads", "entropy")]]
                 for st in ("weak_base", "oracle_sft", "rft", "sft_rl", "rl_only", "template_mismatch")
                 for d in [r[st]["describe"]]]
    rft_rows = [[i, fmt(x["sample_pass"]), x["kept"], x["distinct"], f"{len(x['solved'])}/20", f"{x['first_action_edit_share']:.0%}",
                 fmt(p["eval/pass_rate"]), fmt(p["eval/heldout_pass_rate"])]
                for i, (x, p) in enumerate(zip(r["rft"]["rounds"], r["rft"]["curve"][1:], strict=True))]
    dpo_rows = [[n, p["step"], f"{p['d_chosen']:+.2f}", f"{p['d_rejected']:+.2f}", fmt(p["eval/pass_rate"]),
                 fmt(p["eval/heldout_pass_rate"]), fmt(p["eval/invalid_per_episode"])]
                for n, st in (("DPO", "dpo"), ("DPO+NLL", "dpo_nll")) for p in r[st]["curve"]]
    hack_rows = [[i + 1, x["kept"], f"{x['hack_share']:.0%}", fmt(p["eval/public_pass_rate"]), fmt(p["eval/hidden_pass_rate"])]
                 for i, (x, p) in enumerate(zip(r["hacking"]["rounds"], r["hacking"]["curve"][1:], strict=True))]
    probes = r["oracle_sft"]["probes"]
    probe_rows = [[f"SFT step {k}" if int(k) else "weak base", fmt(v["heldout"]), fmt(v["informative"]), fmt(v["entropy"], 3)]
                  for k, v in sorted(probes.items(), key=lambda kv: int(kv[0]))]
    gen = summary(c, r, cl).get("generalization", {})
    gap_rows = [[st] + [fmt(g[k]) for k in GAP_COLUMNS] for st, g in gen.items()]
    times = [[st, f"{x['time']['wall_s']:.1f}", f"{x['time']['cpu_s']:.1f}", f"{x['time'].get('sampling_s', 0.0) / max(x['time']['wall_s'], 1e-9):.0%}"]
             for st, x in r.items()]
    concl = conclusions(r)
    stable, rl_numbers = rl_only_stability(r)
    warning = ("" if stable else
               f"\n\n**RL only collapsed on this seed**: {rl_numbers} (the bar: malformed calls end at most 0.5 above "
               "where they started, and train pass does not end below its start).")
    sections = [
        f"Seed {c.seed}; TinyTransformer dim {c.dim} x {c.n_layers} layers; BugFix gym, 20 train / 10 held-out tasks "
        f"(unseen names; 10 more of unseen code as a probe). {claims_verdict(cl)}. Whole run "
        f"{wall:.0f}s wall ({c.runner.workers} worker process(es)).\n\n"
        + conclusions_text({k: int(v) for k, v in concl.items()}, 1)
        + " A single seed: `trajtune run agent --seeds 0,1,2` judges them over three." + warning,
        "## Claims (REPRODUCE.md part A)\n\n" + claims_table(cl) + "\n\nA3 (start), A5, A7-A9 and A13 read the "
        "evaluation points; A2, A3 (end) and A11 the final-policy evaluation (both described below the tables "
        "that use them); A10 its own probe.",
        "## The four recipes: pass rate vs gradient steps (train/held-out)\n\n" + eval_points_text(c) + "\n\n"
        + markdown_table(["recipe"] + [f"point {i}" for i in range(width - 1)], curves) + "\n\n" + "\n".join(plots(run_dir, c, r)),
        "## Cost (training-time episodes; evaluation episodes not counted)\n\nTrain / held-out: the last evaluation "
        "point (as in the curves).\n\n" + markdown_table(["recipe", "demos", "sampled episodes", "verifier calls", "train", "held-out"], cost_rows(r)),
        f"## Final policies ({c.describe_samples} episodes per task)\n\n" + final_policies_text(c) + "\n\n"
        + markdown_table(["stage", "train", "held-out", "invalid/ep", "reads", "action entropy"], describes),
        "## Expert iteration rounds (A5)\n\nSample pass, kept, distinct, solved: the round's own training samples; "
        "train / held-out: the evaluation point after the round.\n\n" + markdown_table(
            ["round", "sample pass", "kept", "distinct", "tasks solved", "kept starting with edit", "train", "held-out"], rft_rows),
        "## DPO drift and behaviour (A7, A8)\n\nTrain / held-out / invalid: the evaluation points.\n\n" + markdown_table(
            ["run", "step", "d_chosen", "d_rejected", "train", "held-out", "invalid/ep"], dpo_rows),
        f"## Informative groups on the held-out probe (A10)\n\nThe probe: a group of {c.probe_group} sampled episodes "
        f"(temperature 1) per held-out task ({c.probe_group * N_HELDOUT} episodes), its own random numbers.\n\n" + markdown_table(
            ["policy", "held-out pass", "groups with signal", "action entropy"], probe_rows),
        f"## Reward hacking with the public-test filter (A13)\n\nPublic / hidden pass: {c.eval_samples} sampled "
        f"episodes per train task ({c.eval_samples * N_TRAIN}) after each round.\n\n" + markdown_table(
            ["round", "kept", "kept hacks", "public pass", "hidden pass"], hack_rows),
        "## Unseen names, unseen code (three held-out columns)\n\n" + GAP_TEXT + " Train and held-out: the "
        "final-policy evaluation (the table above).\n\n"
        + markdown_table(["policy", *GAP_HEADERS], gap_rows),
        "## Time per stage\n\n" + markdown_table(["stage", "wall s", "CPU s", "sampling share of wall"], times),
    ]
    print(claims_summary(cl), flush=True)
    if not stable:
        print(f"  RL only collapsed on this seed: {rl_numbers}", flush=True)
    return write_report(run_dir, "Agent post-training on one weak base (BugFix gym, seed ch.15)", sections)


def _seeds_generalization(summaries: dict[int, dict], seeds: list[int]) -> list[str]:
    """The unseen-names probe over seeds (when every seed ran it)."""
    if not all("generalization" in summaries[s] for s in seeds):
        return []
    stages = list(summaries[seeds[0]]["generalization"])
    rows = [[st] + [mean_sd([summaries[s]["generalization"][st].get(k, float("nan")) for s in seeds]) for k in GAP_COLUMNS]
            for st in stages]
    table = markdown_table(["policy", *GAP_HEADERS], rows)
    print(table, flush=True)
    return ["## Unseen names, unseen code (mean ± sd)\n\n" + GAP_TEXT + "\n\n" + table]


def claims_summary(cl: list[Claim]) -> str:
    return "\n".join(f"  {x.id:<4} {x.verdict.replace('*', ''):<15} {x.ours}" for x in cl)


def robustness(paths: dict[str, dict[int, dict]]) -> tuple[str, str]:
    """Each claim's verdict on every (seed, float path): `paths` is CPU kernel set (`--kernels`) -> seed -> summary.
    -> (first-screen line, table section). A claim whose verdict changes with the kernel set alone (same seed)
    flips with float rounding."""
    kernels = list(paths)
    seeds = sorted(paths[kernels[0]])
    ids = list(paths[kernels[0]][seeds[0]]["holds"])
    cols = [(s, k) for s in seeds for k in kernels]
    word = {True: "holds", False: "no", None: "n/a"}
    rows, flips, every = [], [], []
    for i in ids:
        v = {(s, k): paths[k][s]["holds"].get(i) for s, k in cols}
        flipped = [s for s in seeds if len({v[(s, k)] for k in kernels}) > 1]
        if flipped:
            flips.append(f"{i} (seed {', '.join(map(str, flipped))})")
        if all(x is True for x in v.values()):
            every.append(i)
        rows.append([i, f"{sum(x is True for x in v.values())}/{len(cols)}", ", ".join(map(str, flipped)) or "-",
                     *[word[v[c]] for c in cols]])
    line = (f"Over seeds {', '.join(map(str, seeds))} under the {' and '.join(kernels)} CPU kernels ({len(cols)} runs): "
            f"{len(every)} of {len(ids)} claims hold on every run; "
            + (f"verdicts that flip with the float path alone: {'; '.join(flips)}." if flips
               else "no verdict flips with the float path alone."))
    table = markdown_table(["claim", "held", "flips on seed"] + [f"seed {s}, {k}" for s, k in cols], rows)
    return line, ("## Robustness: every claim on every seed and float path\n\nThe same seeds run again under another "
                  "set of torch's CPU kernels (ATEN_CPU_CAPABILITY), which sums floats in another order, as another CPU "
                  f"does (`--kernels {','.join(kernels)}`; those runs are in kernels-K/seed-S).\n\n" + table)


def write_seeds_report(run_dir: Path, summaries: dict[int, dict],
                       float_paths: dict[str, dict[int, dict]] | None = None) -> Path:
    """Mean +- sd over seeds of the headline numbers, and how often each claim held; with `float_paths` (CPU kernel
    set -> seed -> summary, `--kernels`) each claim's verdict on every seed and float path."""
    seeds = sorted(summaries)
    keys = list(summaries[seeds[0]]["numbers"])
    rows = [[k, mean_sd([summaries[s]["numbers"][k] for s in seeds])] + [fmt(summaries[s]["numbers"][k]) for s in seeds]
            for k in keys]
    ids = list(summaries[seeds[0]]["holds"])
    holds = [[i, f"{sum(summaries[s]['holds'][i] is True for s in seeds)}/{len(seeds)}"]
             + [{True: "holds", False: "no", None: "n/a"}[summaries[s]["holds"][i]] for s in seeds] for i in ids]
    recipes = [[n, mean_sd([summaries[s]["numbers"][f"{n} train"] for s in seeds]),
                mean_sd([summaries[s]["numbers"][f"{n} held-out"] for s in seeds])] for n in RECIPES]
    held = {k: sum(bool(summaries[s].get("conclusions", {}).get(k)) for s in seeds) for k in CONCLUSIONS}
    concl_rows = [[f"{i + 1}. {k}", f"{held[k]}/{len(seeds)}"]
                  + [{True: "holds", False: "no"}[bool(summaries[s].get("conclusions", {}).get(k))] for s in seeds]
                  for i, k in enumerate(CONCLUSIONS)]
    collapsed = [s for s in seeds if "RL only invalid/ep, last eval" in summaries[s]["numbers"] and not (
        summaries[s]["numbers"]["RL only invalid/ep, last eval"] <= summaries[s]["numbers"]["RL only invalid/ep, first eval"] + 0.5
        and summaries[s]["numbers"]["RL only train"] >= summaries[s]["numbers"]["RL only train, first eval"])]
    warning = "" if not collapsed else "\n\n**RL only collapsed on seed(s) " + ", ".join(
        f"{s} (malformed calls {summaries[s]['numbers']['RL only invalid/ep, first eval']:.2f} -> "
        f"{summaries[s]['numbers']['RL only invalid/ep, last eval']:.2f} per episode, train "
        f"{summaries[s]['numbers']['RL only train, first eval']:.2f} -> {summaries[s]['numbers']['RL only train']:.2f})"
        for s in collapsed) + "**."
    robust_line, robust_table = robustness(float_paths) if float_paths else ("", "")
    sections = [f"Seeds {', '.join(map(str, seeds))}; each seed's full report: {seed_links(seeds)}.\n\n"
                + conclusions_text(held, len(seeds)) + warning + (f"\n\n{robust_line}" if robust_line else ""),
                "## The chapter's four conclusions (§15.5), per seed\n\n"
                + markdown_table(["conclusion", "held"] + [f"seed {s}" for s in seeds], concl_rows),
                "## The four recipes (final train / held-out pass, mean ± sd)\n\nEach recipe's last evaluation point "
                "(the per-seed reports' curves), not their final-policy evaluation.\n\n" + markdown_table(["recipe", "train", "held-out"], recipes),
                "## Claims held per seed\n\n" + markdown_table(["claim", "held"] + [f"seed {s}" for s in seeds], holds),
                robust_table,
                *_seeds_generalization(summaries, seeds),
                "## Headline numbers\n\n" + markdown_table(["number", "mean ± sd"] + [f"seed {s}" for s in seeds], rows)]
    print(markdown_table(["recipe", "train", "held-out"], recipes), flush=True)
    if robust_line:
        print(robust_line, flush=True)
    return write_report(run_dir, f"Agent post-training over {len(seeds)} seeds", sections)
