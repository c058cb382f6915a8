"""The agent experiment's claims A1-A13 and the chapter's four conclusions, checked on the stages' results.

The claim checks are written out here (A1-A4, A5-A8, A9-A13: three functions), so
the thresholds are visible next to the REPRODUCE.md wording they test. Each claim is a list of `Part`s:
a comparison decided by `runs.verdicts.judge` on an `Estimate` (the difference and its standard error),
or an exact check; the claim holds when every part holds (`verdicts.both`), and is "not
distinguishable" when a comparison sits inside its noise. `experiments/agent/report.py` writes them
beside the seed's numbers.
"""

from __future__ import annotations

import math

from ...envs.bugfix_tasks import FAMILIES, make_tasks
from ...runs.report import Claim
from ...runs.verdicts import NOISE, Estimate, Holds, Part, deciding_part, share, shares, two_shares

RECIPES = {"SFT (oracle)": "oracle_sft", "RFT": "rft", "SFT -> RL": "sft_rl", "RL only": "rl_only"}
N_TRAIN, N_HELDOUT = 20, 10  # BugFix tasks (envs/bugfix_tasks.py)


def guess_level(split: str = "heldout") -> float:
    """What a blind guess passes: one op edits the tasks of its family only, so a policy that never reads passes at
    most the largest family's share of the split (2 of 10 held-out tasks, 4 of 20 train tasks: 0.2), whichever op
    it guesses and however it spreads its guesses over the ops (seed §15.3's "guess level")."""
    tasks = make_tasks(split)
    return max(sum(t.family == f for t in tasks) for f in FAMILIES) / len(tasks)


GUESS_LEVEL = guess_level()


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


# --- verdicts with their uncertainty (runs/verdicts.py) ----------------------------------------
# Each comparative part of a claim is an `Estimate` (the difference and its standard error) judged by
# `verdicts.judge`; a level read off an exact quantity (a loss at init, a gradient identity, the shares of one
# kept set before and after dedup, DPO's log-prob drift on its fixed pairs) is a plain True / False. A claim is
# `verdicts.both` of its parts, so it holds only when every comparison clears its noise, and is "not
# distinguishable" when one sits inside it. The seeds report pools every part over seeds (`pool_parts`).
def claim_of(id: str, what: str, seed: str, ours: str, claim: str, parts: list[Part]) -> Claim:
    """A Claim decided by its parts (`verdicts.deciding_part`): the estimate shown beside the verdict is the deciding
    part's, named
    ('+0.275 ± 0.200 (2 SE; held-out, SFT->RL - RL only > 0.2; binomial)'); `why` names a failed exact part."""
    holds, shown = deciding_part(*parts)
    why = "" if shown.estimate is not None or holds is True else shown.name
    est = None if shown.estimate is None else Estimate(
        shown.estimate.value, shown.estimate.se, shown.estimate.n,
        f"{shown.name} {shown.test} {shown.margin:g}; {shown.estimate.what.split(',')[0]}")
    c = Claim(id, what, seed, ours, claim, holds, est, why=why)
    c.parts = parts  # type: ignore[attr-defined]  # every part, for the report's detail and the seeds report
    return c


def rate(p: float, n: int, what: str = "") -> Estimate:
    """A share `p` of `n` episodes as an estimate of itself (`verdicts.share` from the share instead of the hits)."""
    return share(p * n, n, what=what or f"binomial, {n} episodes")


def minus(est: Estimate, level: float, what: str = "") -> Estimate:
    """est - a known level (same SE)."""
    return Estimate(est.value - level, est.se, est.n, what or est.what)


def counts(a: float, b: float, n: int, what: str = "") -> Estimate:
    """Mean count per episode a minus b, each over n episodes, with Poisson SEs (var = mean): malformed calls per
    episode are counts, and the evaluation records their mean only (a lower bound on their noise: the counts
    cluster in the episodes that run on to the turn limit)."""
    return Estimate(a - b, math.sqrt((a + b + 2 / n) / n), n, what or f"Poisson, {n} episodes each")


def pooled_points(points: list[dict], key: str, n: int) -> tuple[float, int]:
    """The share of `key` over several evaluation points of n episodes each -> (share, episodes)."""
    return sum(p[key] for p in points) / len(points), n * len(points)


# --- claims ------------------------------------------------------------------------------------
def claims(c, r: dict) -> list[Claim]:
    """A1-A13 in order: each claim's check beside the seed's numbers and its REPRODUCE.md wording."""
    return _format_and_gradient_claims(c, r) + _expert_iteration_and_dpo_claims(c, r) + _recipe_claims(c, r)


def _format_and_gradient_claims(c, r: dict) -> list[Claim]:
    """A1-A4: token owners and the loss at init, the weak base, oracle SFT, the gradient identity."""
    out = []
    a1 = r["diagnostics"]["a1"]
    pol, tool, tot = a1["owners"]["policy"], a1["owners"]["tool"], a1["total"]
    near = lambda x: abs(x - a1["log_vocab"]) / a1["log_vocab"] < 0.1  # noqa: E731
    out.append(claim_of("A1", "token owners, 20 oracle demos; init loss",
                        "policy 260 of 1,338 (19%), tool 838 (63%); masked 5.91 / unmasked 5.88, log V 5.76",
                        f"policy {pol} of {tot} ({pol / tot:.0%}), tool {tool} ({tool / tot:.0%}); masked "
                        f"{a1['masked_loss']:.2f} / unmasked {a1['unmasked_loss']:.2f}, log V {a1['log_vocab']:.2f}",
                        "a minority of tokens are actions; both losses about log V at init (exact counts and losses)",
                        [Part("actions a minority", exact=pol / tot < 0.5),
                         Part("losses within 10% of log V",
                              exact=near(a1["masked_loss"]) and near(a1["unmasked_loss"]))]))
    w = r["weak_base"]["describe"]
    nd_tr, nd_ho = c.describe_samples * N_TRAIN, c.describe_samples * N_HELDOUT
    out.append(claim_of("A2", "weak base (blind + random play)", "train 0.144, held-out 0.138, invalid/ep 0.06, "
                        "reads 0.29, entropy 0.25", _desc(w),
                        f"invalid/ep < 0.1; pass not above guess level ({GUESS_LEVEL:.2f}) by 2 SE",
                        [Part("invalid/ep < 0.1", exact=w["invalid"] < 0.1),
                         Part("train - guess level", minus(rate(w["train"], nd_tr), GUESS_LEVEL), "not >"),
                         Part("held-out - guess level", minus(rate(w["heldout"], nd_ho), GUESS_LEVEL), "not >")]))
    o, oc = r["oracle_sft"]["describe"], r["oracle_sft"]["curve"]
    ratio = w["entropy"] / max(o["entropy"], 1e-9)
    out.append(claim_of("A3", "oracle SFT, 60 steps", "0.16/0.05 -> 0.99/0.93; entropy 0.25 -> 0.02",
                        f"{oc[0]['eval/pass_rate']:.2f}/{oc[0]['eval/heldout_pass_rate']:.2f} -> {o['train']:.2f}/"
                        f"{o['heldout']:.2f}; entropy {w['entropy']:.3f} -> {o['entropy']:.3f} ({ratio:.0f}x)",
                        "train >= 0.95, held-out >= 0.85, entropy drops ~10x (we require >= 5x): levels, as the "
                        "seed's",
                        [Part("train >= 0.95", exact=o["train"] >= 0.95), Part("held-out >= 0.85",
                                                                               exact=o["heldout"] >= 0.85),
                         Part("entropy drops >= 5x", exact=ratio >= 5)]))
    a4 = r["diagnostics"]["a4"]
    ok4 = a4["max_abs_diff"] <= 1e-5 * a4["max_abs_grad"] if not math.isnan(a4["max_abs_diff"]) else None
    out.append(claim_of("A4", "gradient identity", "max abs diff 1.4e-9; cosine(baseline PG, RFT) 0.985",
                        f"kept {a4['kept']}/{a4['episodes']}, ratio {a4['ratio']:.4f}, max abs diff "
                        f"{a4['max_abs_diff']:.1e} "
                        f"(max grad {a4['max_abs_grad']:.1e}); cosine {a4['cosine_baseline']:.3f}",
                        "grad(0/1 PG) = ratio x grad(SFT on kept) to round-off (rel. 1e-5)",
                        [Part("gradients equal to round-off", exact=ok4)]))
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


def _sources_text(r: dict) -> str:
    """Where the final RFT policy's held-out passes come from (the generalization stage's `heldout_sources`)."""
    x = r.get("generalization", {}).get("heldout_sources", {}).get("rft")
    if x is None:
        return ""
    return (f"; its final held-out passes ({x['passes']}): {x['blind_one']:.0%} one blind edit, "
            f"{x['blind_stacked']:.0%} stacked blind edits, {x['after_read']:.0%} an edit after a read "
            f"(first action a read in {x['first_read']:.0%} of its held-out episodes)")


def rft_parts(c, r: dict) -> dict[str, Part]:
    """A5's parts (conclusion 2 reads two of them): expert iteration rises, flattens, stays below what the base
    solves, its held-out stays at guess level, and its round-0 kept episodes are mostly blind guesses.

    rise:     last train point - first, > 0.2 by 2 SE (two evaluation points, binomial)
    flattens: the last round's gain is not above 0.1 by 2 SE, and the largest gain beats it by 2 SE
    bound:    no train point above the share of tasks the base solves by 2 SE
    held-out: the held-out pass over every evaluation after a round, pooled (rounds x eval_samples x 10 tasks
              episodes), not above guess level by 2 SE -- one 40-episode point is not the plateau
    blind:    the share of round-0 kept episodes that start with an edit > 0.5 by 2 SE (binomial over the kept)"""
    rounds, rc = r["rft"]["rounds"], r["rft"]["curve"]
    n_tr, n_ho = c.eval_samples * N_TRAIN, c.eval_samples * N_HELDOUT
    trains = [p["eval/pass_rate"] for p in rc]
    gains = [b - a for a, b in zip(trains, trains[1:])]
    big = max(range(len(gains)), key=lambda i: gains[i])
    g_last, g_big = (shares(trains[-1], trains[-2], n_tr), shares(trains[big + 1], trains[big], n_tr))
    held, n_held = pooled_points(rc[1:], "eval/heldout_pass_rate", n_ho)
    kept0 = rounds[0]["kept"]
    return {
        "rise": Part("train, last - first", shares(trains[-1], trains[0], n_tr), ">", 0.2),
        "flat": Part("last round's gain", g_last, "not >", 0.1),
        "slows": Part("largest gain - last", Estimate(g_big.value - g_last.value, math.hypot(g_big.se, g_last.se),
                                                      n_tr, "binomial, 4 points"), ">"),
        "bound": Part("best train - base's share", minus(rate(max(trains), n_tr), base_coverage(r) / N_TRAIN), "not >"),
        "held": Part("held-out (rounds pooled) - guess", minus(rate(held, n_held), GUESS_LEVEL), "not >"),
        "blind": Part("round-0 kept starting with an edit - 0.5",
                      minus(rate(rounds[0]["first_action_edit_share"], kept0, f"binomial, {kept0} kept"), 0.5), ">"),
    }


def _expert_iteration_and_dpo_claims(c, r: dict) -> list[Claim]:
    """A5-A8: expert iteration's rise and plateau, dpo_loss values, DPO's drift, DPO + NLL."""
    out = []
    rounds, rc = r["rft"]["rounds"], r["rft"]["curve"]
    solvable = base_coverage(r) / N_TRAIN
    trains, helds = [p["eval/pass_rate"] for p in rc], [p["eval/heldout_pass_rate"] for p in rc]
    never = sorted({f for f in FAMILIES} - {t.split("/")[0] for rd in rounds for t in rd["solved"]})
    gains = [b - a for a, b in zip(trains, trains[1:])]
    held, _ = pooled_points(rc[1:], "eval/heldout_pass_rate", c.eval_samples * N_HELDOUT)
    out.append(claim_of("A5", "expert iteration, 4 rounds",
                        "pass 0.15 -> 0.33 -> 0.68 -> 0.75, held-out 0.10-0.23; `init` never solved",
                        "train " + " -> ".join(f"{x:.2f}" for x in trains) + f" (last round {gains[-1]:+.2f}, largest "
                        f"{max(gains):+.2f}); held-out " + " -> ".join(f"{x:.2f}" for x in helds[1:])
                        + f" (pooled {held:.2f}, guess level {GUESS_LEVEL:.2f}); base solves {solvable * 20:.0f}/20 "
                        f"tasks{coverage_note(r)}; never solved: {', '.join(never) or 'none'}; round-0 kept starting "
                        f"with an edit {rounds[0]['first_action_edit_share']:.0%}, with a read "
                        f"{rounds[0].get('first_action_read_share', 0.0):.0%}" + _sources_text(r),
                        "train rises > 0.2 and flattens (last round's gain <= 0.1, below the largest) at or below the "
                        f"share of tasks the base solves; held-out at guess level ({GUESS_LEVEL:.2f}: not above it by "
                        "2 SE, pooled over the rounds); kept mostly blind guesses (each part by 2 SE)",
                        list(rft_parts(c, r).values())))
    a6 = r["diagnostics"]["a6"]
    out.append(claim_of("A6", "dpo_loss, beta 0.5, margins 0/+4/-4", "0.6931 / 0.1269 / 2.1269",
                        " / ".join(f"{v:.4f}" for v in a6.values()), "exactly these values",
                        [Part("the three values", exact=[round(v, 4) for v in a6.values()] == [0.6931, 0.1269,
                                                                                               2.1269])]))
    d, dn = r["dpo"]["curve"], r["dpo_nll"]["curve"]
    n_tr, n_ho = c.eval_samples * N_TRAIN, c.eval_samples * N_HELDOUT
    inv = lambda cv, i: cv[i]["eval/invalid_per_episode"]  # noqa: E731
    peak = max(range(1, len(d)), key=lambda i: inv(d, i))
    out.append(claim_of("A7", f"offline DPO, {c.dpo.steps} steps",
                        "d_rejected -45, d_chosen +0.7, train 0.41, held-out 0.00, invalid/ep 2.0", _dpo_text(d),
                        "rejected log-prob falls without bound (exact, on its pairs), malformed calls rise many-fold "
                        "(peak > 3x the start and > 0.3, by 2 SE), held-out does not improve (not up by 2 SE)",
                        [Part("d_rejected <= -10 and still falling",
                              exact=last(d, "d_rejected") <= -10 and last(d,
                                                                          "d_rejected") < d[len(d) // 2]["d_rejected"]),
                         Part("peak malformed/ep - 3x start",
                              counts(inv(d, peak), 3 * inv(d, 0), n_tr), ">", 0.0),
                         Part("peak malformed/ep", counts(inv(d, peak), 0.0, n_tr), ">", 0.3),
                         Part("held-out, last - first", shares(last(d, "eval/heldout_pass_rate"),
                                                               d[0]["eval/heldout_pass_rate"], n_ho), "not >")]))
    out.append(claim_of("A8", "DPO + NLL on chosen", "train 0.69, held-out 0.17, invalid/ep 0.61",
                        _dpo_text(dn) + f"; DPO (A7) ends at train {last(d, 'eval/pass_rate'):.2f}, invalid/ep "
                        f"{last(d, 'eval/invalid_per_episode'):.2f}",
                        "fewer malformed calls and higher train pass than A7 at the last point (each by 2 SE)",
                        [Part("malformed/ep, DPO - DPO+NLL", counts(last(d, "eval/invalid_per_episode"),
                                                                          last(dn, "eval/invalid_per_episode"), n_tr)),
                         Part("train, DPO+NLL - DPO", shares(last(dn, "eval/pass_rate"), last(d, "eval/pass_rate"),
                                                             n_tr))]))
    return out


def recipe_parts(c, r: dict) -> dict[str, Part]:
    """A9's parts (conclusion 3 reads two): the recipes' last evaluation points, binomial over their episodes."""
    f = {name: final(r, stage) for name, stage in RECIPES.items()}
    n = (c.eval_samples * N_TRAIN, c.eval_samples * N_HELDOUT)
    low = min(f["SFT (oracle)"][1], f["SFT -> RL"][1])
    gap = shares(f["SFT (oracle)"][1], f["SFT -> RL"][1], n[1])
    return {
        "sft~rl high": Part("held-out, SFT - SFT->RL", gap, "not >", 0.15),
        "sft~rl low": Part("held-out, SFT - SFT->RL", gap, "not <", -0.15),
        "vs rft": Part("held-out, min(SFT, SFT->RL) - RFT", shares(low, f["RFT"][1], n[1]), ">", 0.3),
        "cold train": Part("train, SFT->RL - RL only", shares(f["SFT -> RL"][0], f["RL only"][0], n[0]), ">", 0.2),
        "cold held": Part("held-out, SFT->RL - RL only", shares(f["SFT -> RL"][1], f["RL only"][1], n[1]), ">", 0.2),
    }


def _recipe_claims(c, r: dict) -> list[Claim]:
    """A9-A13: the four recipes, informative groups, template mismatch, dedup, reward hacking."""
    out = []
    o, rounds = r["oracle_sft"]["describe"], r["rft"]["rounds"]
    f = {name: final(r, stage) for name, stage in RECIPES.items()}
    cold = r["sft_rl"]["curve"][0]
    out.append(claim_of("A9", "four recipes",
                        "SFT 0.99/0.93; RFT 0.74/0.15; SFT->RL 0.96/0.95; RL only 0.36/0.30",
                        "; ".join(f"{k} {a:.2f}/{b:.2f}" for k, (a, b) in f.items())
                        + f"; the cold start (SFT step {cold['step']}) {cold['eval/pass_rate']:.2f}/"
                        f"{cold['eval/heldout_pass_rate']:.2f} (seed 0.80/0.85)",
                        "SFT ~ SFT->RL (held-out within 0.15) > RFT + 0.3; SFT->RL > RL only + 0.2 (train and "
                        "held-out); each by 2 SE", list(recipe_parts(c, r).values())))
    p = r["oracle_sft"]["probes"]
    ks = sorted(p, key=int)
    inf = [p[k]["informative"] for k in ks]
    out.append(claim_of("A10", "informative groups (probe)", "0.60 / 0.70 / 0.10",
                        " / ".join(f"{x:.2f}" for x in inf),
                        "long SFT leaves few groups with reward variance (below SFT@20 by 2 SE over the 10 groups; <= "
                        "0.3)",
                        [Part("SFT@20 - SFT@60", shares(inf[1], inf[-1], N_HELDOUT, f"binomial, {N_HELDOUT} groups")),
                         Part("SFT@60 <= 0.3", exact=inf[-1] <= 0.3)]))
    t = r["template_mismatch"]["describe"]
    nd_tr = c.describe_samples * N_TRAIN
    mechanism = ("; the seed's mechanism (malformed calls, 0.62/ep) reproduces" if t["invalid"] >= 0.3 else
                 f"; NOT by the seed's mechanism: malformed calls {t['invalid']:.2f}/ep (seed 0.62), so the "
                 "mis-rendered demos break what the policy chooses, not the call syntax")
    out.append(claim_of("A11", "SFT without wrapper tokens", "train 0.075, invalid/ep 0.62",
                        f"train {t['train']:.2f}, held-out {t['heldout']:.2f}, invalid/ep {t['invalid']:.2f}, reads "
                        f"{t['reads']:.2f}; NLL on correctly rendered demos "
                        f"{r['template_mismatch']['nll_right_format']:.2f}"
                        + mechanism,
                        "fails in the real rollout format (train <= 0.3, and below oracle SFT by > 0.5 by 2 SE)",
                        [Part("train <= 0.3", exact=t["train"] <= 0.3),
                         Part("train, SFT - mismatched", shares(o["train"], t["train"], nd_tr), ">", 0.5)]))
    rd = rounds[1] if len(rounds) > 1 else rounds[0]
    tv = share_shift(rd["shares_raw"], rd["shares_dedup"])
    out.append(claim_of("A12", "dedup of RFT's kept set",
                        "84 kept -> 21 distinct action sequences; shares raw minmax 0.21 range 0.37 compare 0.35 zero "
                        "0.07, deduped 0.43 / 0.24 / 0.19 / 0.14 (total variation 0.29)",
                        f"{rd['kept']} kept -> {rd['distinct']} distinct; shares raw " + _shares(rd["shares_raw"])
                        + "; deduped " + _shares(rd["shares_dedup"]) + f" (total variation {tv:.2f})",
                        "dedup changes the family shares: fewer distinct than kept and total variation distance >= 0.1 "
                        "(exact: dedup of one kept set, no sampling between the two)",
                        [Part("fewer distinct than kept", exact=rd["distinct"] < rd["kept"]),
                         Part("total variation >= 0.1", exact=tv >= 0.1)]))
    hr, hc = r["hacking"]["rounds"], r["hacking"]["curve"]
    pub, hid = [x["eval/public_pass_rate"] for x in hc], [x["eval/hidden_pass_rate"] for x in hc]
    n_tr = c.eval_samples * N_TRAIN
    pub_gain, hid_gain = shares(pub[-1], pub[1], n_tr), shares(hid[-1], hid[1], n_tr)
    out.append(claim_of("A13", "RFT filtered by public tests",
                        "kept hacks 42% -> 64%; public 0.97 vs hidden 0.36",
                        "kept hacks " + " -> ".join(f"{x['hack_share']:.0%}" for x in hr)
                        + f"; public {' -> '.join(f'{x:.2f}' for x in pub[1:])} vs hidden "
                        f"{' -> '.join(f'{x:.2f}' for x in hid[1:])}",
                        "filter pass climbs while hidden pass stalls (public gain beats hidden gain, public ends > 0.3 "
                        "above hidden); hack share of the kept set grows (each by 2 SE)",
                        [Part("public, last round - first", pub_gain),
                         Part("public gain - hidden gain", Estimate(pub_gain.value - hid_gain.value,
                                                                    math.hypot(pub_gain.se, hid_gain.se), n_tr,
                                                                    "binomial, 4 points")),
                         Part("public - hidden, last round", rate(pub[-1] - hid[-1], n_tr), ">", 0.3),
                         Part("kept hack share, last round - first",
                              two_shares(hr[-1]["hack_share"] * hr[-1]["kept"], hr[-1]["kept"],
                                         hr[0]["hack_share"] * hr[0]["kept"], hr[0]["kept"],
                                         "binomial over the kept"))]))
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


def rising(curve: list[dict], key: str, n: int) -> Estimate:
    """The trend of a curve's end: the mean of its last third of evaluation points minus the mean of the third
    before (k = max(1, points // 3) points each, n episodes a point), binomial over the pooled episodes. Unpaired,
    though every point samples with the same random numbers: those correlate the points, so this SE is, if
    anything, too large. One dip or one jump at a single point does not make a trend."""
    k = max(1, len(curve) // 3)
    late, mid = curve[-k:], curve[-2 * k:-k] or curve[:1]
    a, na = pooled_points(late, key, n)
    b, nb = pooled_points(mid, key, n)
    return two_shares(a * na, na, b * nb, nb, f"binomial, last {len(late)} vs previous {len(mid)} points")


def conclusion_parts(c, r: dict) -> dict[str, list[Part]]:
    """Seed §15.5's four conclusions, each judged from the claims' parts it rests on (every part by 2 SE):

    1. oracle SFT reaches train >= 0.95 / held-out >= 0.85 (A3's levels) and no other recipe's held-out ends above
       SFT's by 2 SE (whether SFT -> RL also catches up is A9's)
    2. RFT stays at or below what the base solves and its held-out at guess level (A5's `bound` and `held`)
    3. SFT(20) -> RL(40) beats RL only (60) by > 0.2 on train and held-out (A9's `cold train`, `cold held`)
    4. RL only's train pass still rises: its last third of evaluation points above the third before (`rising`)
    """
    f = {name: final(r, stage) for name, stage in RECIPES.items()}
    n_ho = c.eval_samples * N_HELDOUT
    a3 = next(x for x in _format_and_gradient_claims(c, r) if x.id == "A3").parts  # type: ignore[attr-defined]
    rft, rec = rft_parts(c, r), recipe_parts(c, r)
    return {
        CONCLUSIONS[0]: a3[:2] + [Part(f"held-out, {k} - SFT", shares(f[k][1], f["SFT (oracle)"][1], n_ho), "not >")
                                  for k in f if k != "SFT (oracle)"],
        CONCLUSIONS[1]: [rft["bound"], rft["held"]],
        CONCLUSIONS[2]: [rec["cold train"], rec["cold held"]],
        CONCLUSIONS[3]: [Part("RL only train, last third - the third before",
                              rising(r["rl_only"]["curve"], "eval/pass_rate", c.eval_samples * N_TRAIN))],
    }


def conclusions(c, r: dict) -> dict[str, Holds]:
    """Each conclusion's verdict: True, False or NOISE (a part inside its noise), `decided` over its parts
    (`verdicts.deciding_part`)."""
    return {k: deciding_part(*parts)[0] for k, parts in conclusion_parts(c, r).items()}


PHRASE: dict[Holds, str] = {True: "holds", False: "does not hold", NOISE: "is not distinguishable from noise",
                            None: "is not judged"}


def conclusions_text(verdicts: dict[str, list[Holds]], pooled: dict[str, tuple[Holds,
                                                                               Part | None]] | None = None) -> str:
    """One sentence per conclusion: what it says, on how many seeds it holds (and where it was inside the noise),
    and with `pooled` (conclusion -> its verdict over the seeds and the deciding part, `verdicts.deciding_part`) the
    verdict over the seeds; on one seed, `pooled` gives the deciding difference beside the verdict.
    `verdicts`: conclusion -> its verdict on every seed."""
    n = len(next(iter(verdicts.values())))
    out = [f"The chapter's four conclusions (§15.5) on our gym, {'on this seed' if n == 1 else f'over {n} seeds'}:"]
    for i, k in enumerate(CONCLUSIONS):
        vs = verdicts[k]
        held, noise = sum(v is True for v in vs), sum(v == NOISE for v in vs)
        head = f"({i + 1}) {k[0].upper()}{k[1:]}"
        if n == 1:
            body = f"{head}: this {PHRASE[vs[0]]}"
            part = pooled[k][1] if pooled is not None else None
            if part is not None and part.estimate is not None:
                body += f" ({part.name} {part.estimate})"
        else:
            body = (f"{head}: this holds on {held} of {n} seeds"
                    + (f" and is not distinguishable from noise on {noise}" if noise else ""))
            if pooled is not None:
                v, part = pooled[k]
                body += f"; over the seeds it {PHRASE[v]}"
                if part is not None and part.estimate is not None:
                    body += f" ({part.name} {part.estimate})"
        out.append(body + ".")
    return " ".join(out) + " The claims table gives the numbers."


def _desc(d: dict) -> str:
    return (f"train {d['train']:.3f}, held-out {d['heldout']:.3f}, invalid/ep {d['invalid']:.2f}, "
            f"reads {d['reads']:.2f}, entropy {d['entropy']:.3f}")


def _dpo_text(curve: list[dict]) -> str:
    """A DPO run's last point, and the peak of its malformed calls (what A7 judges) beside the last value."""
    x = curve[-1]
    peak = max(curve[1:] or curve, key=lambda p: p["eval/invalid_per_episode"])
    return (f"d_rejected {x['d_rejected']:+.1f}, d_chosen {x['d_chosen']:+.2f}, train {x['eval/pass_rate']:.2f}, "
            f"held-out {x['eval/heldout_pass_rate']:.2f} (start {curve[0]['eval/heldout_pass_rate']:.2f}), invalid/ep "
            f"{x['eval/invalid_per_episode']:.2f} (start {curve[0]['eval/invalid_per_episode']:.2f}, peak "
            f"{peak['eval/invalid_per_episode']:.2f} at step {peak['step']})")


def _shares(s: dict) -> str:
    return " ".join(f"{k} {v:.2f}" for k, v in s.items())


