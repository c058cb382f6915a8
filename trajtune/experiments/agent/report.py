"""The agent experiment's report: claims A1-A13 beside the seed's numbers, curves, costs, timings.

`write_agent_report` turns the stages' results (`experiments/agent/stages.py`) into
run_dir/report.md + report.html + PNG figures and a flat summary.json (numbers, verdicts, and every
claim's parts with their estimates); `write_seeds_report` puts several seeds' summaries side by side
as mean +- sd and judges every claim again on its parts pooled over the seeds.
The claims and the chapter's conclusions are checked in `experiments/agent/claims.py` (`claims`,
`conclusions`); each is a list of `Part`s, and the seeds report pools every part over the seeds (`pool_parts`).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from ...runs.plots import Panel, line_plot, panel_plot
from ...runs.report import (VERDICT_WORDS, Claim, claims_summary, claims_table, claims_verdict, fmt, image,
                            markdown_table, mean_sd, seed_links, write_report)
from ...runs.verdicts import NOISE, Z, Holds, Part, deciding_part, over_seeds
from .claims import (CONCLUSIONS, N_HELDOUT, N_TRAIN, RECIPES, claim_of, claims, conclusion_parts, conclusions,
                     conclusions_text, final, last, recipe_curve, rl_only_stability)

GAP_COLUMNS = ("train", "heldout", "renamed", "novel")
GAP_HEADERS = ("train", "held-out (unseen names)", "train tasks renamed", "novel (unseen code)")
GAP_TEXT = ("Each final policy, 8 episodes per task: the held-out split is the seed's (training cues under function "
            "names "
            "no training task uses); *train tasks renamed* is the training code under held-out names (the train "
            "column's "
            "random numbers), so train -> renamed is what an unseen name alone costs; *novel* is code no training "
            "listing "
            "shows (an operator, a keyword, a loop-shaped `minmax` task), a probe beyond the seed.")


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
    parts = conclusion_parts(c, r)
    out = {"numbers": s, "holds": {x.id: x.holds for x in cl},
           "claims": {x.id: {"what": x.what, "claim": x.claim} for x in cl},
           "parts": {x.id: [p.to_json() for p in x.parts] for x in cl},  # type: ignore[attr-defined]
           "conclusions": {k: deciding_part(*v)[0] for k, v in parts.items()},
           "conclusion_parts": {k: [p.to_json() for p in v] for k, v in parts.items()}}
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
    curves = [[name] + [f"{p['step']}: {p['eval/pass_rate']:.2f}/{p['eval/heldout_pass_rate']:.2f}"
                        for p in recipe_curve(r, name)]
              for name in RECIPES]
    width = max(len(x) for x in curves)
    curves = [row + [""] * (width - len(row)) for row in curves]
    describes = [[st, *[fmt(d[k], 3) for k in ("train", "heldout", "invalid", "reads", "entropy")]]
                 for st in ("weak_base", "oracle_sft", "rft", "sft_rl", "rl_only", "template_mismatch")
                 for d in [r[st]["describe"]]]
    rft_rows = [[i, fmt(x["sample_pass"]), x["kept"], x["distinct"], f"{len(x['solved'])}/20",
                 f"{x['first_action_edit_share']:.0%}",
                 fmt(p["eval/pass_rate"]), fmt(p["eval/heldout_pass_rate"])]
                for i, (x, p) in enumerate(zip(r["rft"]["rounds"], r["rft"]["curve"][1:], strict=True))]
    dpo_rows = [[n, p["step"], f"{p['d_chosen']:+.2f}", f"{p['d_rejected']:+.2f}", fmt(p["eval/pass_rate"]),
                 fmt(p["eval/heldout_pass_rate"]), fmt(p["eval/invalid_per_episode"])]
                for n, st in (("DPO", "dpo"), ("DPO+NLL", "dpo_nll")) for p in r[st]["curve"]]
    hack_rows = [[i + 1, x["kept"], f"{x['hack_share']:.0%}", fmt(p["eval/public_pass_rate"]),
                  fmt(p["eval/hidden_pass_rate"])]
                 for i, (x, p) in enumerate(zip(r["hacking"]["rounds"], r["hacking"]["curve"][1:], strict=True))]
    probes = r["oracle_sft"]["probes"]
    probe_rows = [[f"SFT step {k}" if int(k) else "weak base", fmt(v["heldout"]), fmt(v["informative"]),
                   fmt(v["entropy"], 3)]
                  for k, v in sorted(probes.items(), key=lambda kv: int(kv[0]))]
    gen = summary(c, r, cl).get("generalization", {})
    gap_rows = [[st] + [fmt(g[k]) for k in GAP_COLUMNS] for st, g in gen.items()]
    times = [[st, f"{x['time']['wall_s']:.1f}", f"{x['time']['cpu_s']:.1f}",
              f"{x['time'].get('sampling_s', 0.0) / max(x['time']['wall_s'], 1e-9):.0%}"]
             for st, x in r.items()]
    concl = conclusions(c, r)
    decisions = [[x.id, x.verdict, "; ".join(p.text() for p in x.parts)] for x in cl]  # type: ignore[attr-defined]
    stable, rl_numbers = rl_only_stability(r)
    warning = ("" if stable else
               f"\n\n**RL only collapsed on this seed**: {rl_numbers} (the bar: malformed calls end at most 0.5 above "
               "where they started, and train pass does not end below its start).")
    sections = [
        f"Seed {c.seed}; TinyTransformer dim {c.dim} x {c.n_layers} layers; BugFix gym, 20 train / 10 held-out tasks "
        f"(unseen names; 10 more of unseen code as a probe). {claims_verdict(cl)}. Whole run "
        f"{wall:.0f}s wall ({c.runner.workers} worker process(es)).\n\n"
        + conclusions_text({k: [v] for k, v in concl.items()}, {k: deciding_part(*v) for k,
                                                                v in conclusion_parts(c, r).items()})
        + " A single seed: `trajtune run agent --seeds 0,1,2,3,4` judges them over five." + warning,
        "## Claims (REPRODUCE.md part A)\n\n" + claims_table(cl) + "\n\nA3 (start), A5, A7-A9 and A13 read the "
        "evaluation points; A2, A3 (end) and A11 the final-policy evaluation (both described below the tables "
        "that use them); A10 its own probe.",
        f"## How each verdict was decided\n\nEvery comparison is judged with its uncertainty (`runs/verdicts.py`): "
        f"a difference ± {Z:g} standard errors (binomial over the episodes evaluated, Poisson for malformed-call "
        "counts); a '>' part holds when the difference clears its margin by 2 SE, is *not distinguishable* inside "
        "them, fails beyond them the other way; a 'not >' / 'not <' part (an effect absent, a level at most / at "
        "least) holds unless the difference clears the margin the wrong way -- it says the numbers do not contradict "
        "the bound, not that they establish it (a strict '<=' would need the whole 2-SE band below the margin: see "
        "docs/experiments.md for which verdicts that would change). Exact parts (losses, gradients, dedup of one "
        "kept set) are checked as they are. A claim holds when every part holds.\n\n"
        + markdown_table(["claim", "verdict", "parts"], decisions),
        "## The four recipes: pass rate vs gradient steps (train/held-out)\n\n" + eval_points_text(c) + "\n\n"
        + markdown_table(["recipe"] + [f"point {i}" for i in range(width - 1)],
                         curves) + "\n\n" + "\n".join(plots(run_dir, c, r)),
        "## Cost (training-time episodes; evaluation episodes not counted)\n\nTrain / held-out: the last evaluation "
        "point (as in the curves).\n\n" + markdown_table(["recipe", "demos", "sampled episodes", "verifier calls",
                                                          "train", "held-out"], cost_rows(r)),
        f"## Final policies ({c.describe_samples} episodes per task)\n\n" + final_policies_text(c) + "\n\n"
        + markdown_table(["stage", "train", "held-out", "invalid/ep", "reads", "action entropy"], describes),
        "## Expert iteration rounds (A5)\n\nSample pass, kept, distinct, solved: the round's own training samples; "
        "train / held-out: the evaluation point after the round.\n\n" + markdown_table(
            ["round", "sample pass", "kept", "distinct", "tasks solved", "kept starting with edit", "train",
             "held-out"], rft_rows),
        "## DPO drift and behaviour (A7, A8)\n\nTrain / held-out / invalid: the evaluation points.\n\n"
        + markdown_table(
            ["run", "step", "d_chosen", "d_rejected", "train", "held-out", "invalid/ep"], dpo_rows),
        f"## Informative groups on the held-out probe (A10)\n\nThe probe: a group of {c.probe_group} sampled episodes "
        f"(temperature 1) per held-out task ({c.probe_group * N_HELDOUT} episodes), its own random numbers.\n\n"
        + markdown_table(
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
    rows = [[st] + [mean_sd([summaries[s]["generalization"][st].get(k,
                                                                    float("nan")) for s in seeds]) for k in GAP_COLUMNS]
            for st in stages]
    return ["## Unseen names, unseen code (mean ± sd)\n\n" + GAP_TEXT + "\n\n" + markdown_table(["policy",
                                                                                                 *GAP_HEADERS], rows)]


def pool_parts(per_seed: list[list[Part]]) -> list[Part]:
    """One claim's parts on several seeds -> the parts over the seeds: each estimate pooled by `verdicts.over_seeds`
    (the between-seed sd, never below the seeds' own sampling noise) and judged again; an exact part holds over the
    seeds where it holds on every seed (not judged where any seed could not judge it)."""
    out = []
    for parts in zip(*per_seed, strict=True):
        p = parts[0]
        if p.estimate is not None:
            out.append(Part(p.name, over_seeds([x.estimate for x in parts]), p.test, p.margin))  # type: ignore[misc]
        else:
            ex = [x.exact for x in parts]
            out.append(Part(p.name, exact=None if any(e is None for e in ex) else all(ex)))
    return out


def pooled_claims(summaries: dict[int, dict]) -> list[Claim]:
    """Every claim decided over the seeds (`pool_parts` of its parts on every seed): what `trajtune run --seeds`
    prints (`runs.report.claims_summary`) and the seeds report's 'over the seeds' column."""
    seeds = sorted(summaries)
    first = summaries[seeds[0]]
    out = []
    for cid, meta in first["claims"].items():
        parts = pool_parts([[Part.from_json(d) for d in summaries[s]["parts"][cid]] for s in seeds])
        out.append(claim_of(cid, meta["what"], "", f"over seeds {', '.join(map(str, seeds))}", meta["claim"], parts))
    return out


def pooled_conclusions(summaries: dict[int, dict]) -> dict[str, tuple[Holds, Part | None]]:
    """Each conclusion's verdict over the seeds and the part shown beside it."""
    seeds = sorted(summaries)
    return {k: deciding_part(*pool_parts([[Part.from_json(d) for d in summaries[s]["conclusion_parts"][k]]
                                          for s in seeds]))
            for k in CONCLUSIONS}


WORD = {True: "holds", False: "no", NOISE: "noise", None: "n/a"}
"""a verdict in a narrow table cell ('noise': not distinguishable from noise)"""


def robustness(paths: dict[str, dict[int, dict]]) -> tuple[str, str]:
    """Each claim's verdict on every (seed, float path), and over the seeds on each float path: `paths` is CPU kernel
    set (`--kernels`) -> seed -> summary. -> (first-screen line, table section). A claim whose verdict changes with
    the kernel set alone (same seed) flips with float rounding."""
    kernels = list(paths)
    seeds = sorted(paths[kernels[0]])
    ids = list(paths[kernels[0]][seeds[0]]["holds"])
    cols = [(s, k) for s in seeds for k in kernels]
    pooled = {k: {c.id: c for c in pooled_claims(paths[k])} for k in kernels}
    rows, flips, every = [], [], []
    for i in ids:
        v = {(s, k): paths[k][s]["holds"].get(i) for s, k in cols}
        flipped = [s for s in seeds if len({v[(s, k)] for k in kernels}) > 1]
        if flipped:
            flips.append(f"{i} (seed {', '.join(map(str, flipped))})")
        if all(x is True for x in v.values()):
            every.append(i)
        noise = sum(x == NOISE for x in v.values())
        rows.append([i, f"{sum(x is True for x in v.values())}/{len(cols)}" + (f" ({noise} noise)" if noise else ""),
                     ", ".join(map(str, flipped)) or "-", *[WORD[v[c]] for c in cols],
                     *[f"{VERDICT_WORDS[pooled[k][i].holds]}: {pooled[k][i].evidence or '-'}" for k in kernels]])
    held = {k: sum(c.holds is True for c in pooled[k].values()) for k in kernels}
    line = (f"Over seeds {', '.join(map(str, seeds))} under the {' and '.join(kernels)} CPU kernels ({len(cols)} "
            "runs): "
            f"{len(every)} of {len(ids)} claims hold on every run; pooled over the seeds, "
            + ", ".join(f"{held[k]} of {len(ids)} hold on {k}" for k in kernels) + "; "
            + (f"verdicts that flip with the float path alone: {'; '.join(flips)}." if flips
               else "no verdict flips with the float path alone."))
    table = markdown_table(["claim", "held", "flips on seed"] + [f"seed {s}, {k}" for s, k in cols]
                           + [f"over the seeds, {k}" for k in kernels], rows)
    return line, ("## Robustness: every claim on every seed and float path\n\nThe same seeds run again under another "
                  "set of torch's CPU kernels (ATEN_CPU_CAPABILITY), which sums floats in another order, as another "
                  "CPU "
                  f"does (`--kernels {','.join(kernels)}`; those runs are in kernels-K/seed-S). 'noise': not "
                  "distinguishable from noise on that run. The last columns pool each claim's parts over the seeds "
                  "of one float path (`verdicts.over_seeds`) and show the deciding difference ± 2 SE.\n\n" + table)


def wrap(text: str, width: int = 120, indent: str = "  ") -> str:
    """A terminal paragraph in lines of at most `width` characters."""
    return textwrap.fill(text, width=width, subsequent_indent=indent, break_on_hyphens=False)


def write_seeds_report(run_dir: Path, summaries: dict[int, dict],
                       float_paths: dict[str, dict[int, dict]] | None = None) -> Path:
    """Mean +- sd over seeds of the headline numbers, every claim on every seed and pooled over the seeds with its
    uncertainty; with `float_paths` (CPU kernel set -> seed -> summary, `--kernels`) each claim's verdict on every
    seed and float path. Prints `claims_summary` of the pooled claims (never a markdown table)."""
    seeds = sorted(summaries)
    keys = list(summaries[seeds[0]]["numbers"])
    rows = [[k, mean_sd([summaries[s]["numbers"][k] for s in seeds])] + [fmt(summaries[s]["numbers"][k]) for s in seeds]
            for k in keys]
    pooled = pooled_claims(summaries)
    holds = [[c.id, f"{sum(summaries[s]['holds'][c.id] is True for s in seeds)}/{len(seeds)}"]
             + [WORD[summaries[s]["holds"][c.id]] for s in seeds] + [c.verdict, c.evidence or "-"] for c in pooled]
    recipes = [[n, mean_sd([summaries[s]["numbers"][f"{n} train"] for s in seeds]),
                mean_sd([summaries[s]["numbers"][f"{n} held-out"] for s in seeds])] for n in RECIPES]
    per_seed = {k: [summaries[s]["conclusions"][k] for s in seeds] for k in CONCLUSIONS}
    concl_pooled = pooled_conclusions(summaries)
    concl_rows = [[f"{i + 1}. {k}", f"{sum(v is True for v in per_seed[k])}/{len(seeds)}"]
                  + [WORD[v] for v in per_seed[k]]
                  + [VERDICT_WORDS[concl_pooled[k][0]], str(concl_pooled[k][1].estimate) if concl_pooled[k][1] and
                     concl_pooled[k][1].estimate else "-"]
                  for i, k in enumerate(CONCLUSIONS)]
    collapsed = [s for s in seeds if "RL only invalid/ep, last eval" in summaries[s]["numbers"] and not (
        summaries[s]["numbers"]["RL only invalid/ep, last eval"] <= summaries[s]["numbers"]["RL only invalid/ep, first "
                                                                                            "eval"] + 0.5
        and summaries[s]["numbers"]["RL only train"] >= summaries[s]["numbers"]["RL only train, first eval"])]
    collapse_text = "RL only collapsed on seed(s) " + ", ".join(
        f"{s} (malformed calls {summaries[s]['numbers']['RL only invalid/ep, first eval']:.2f} -> "
        f"{summaries[s]['numbers']['RL only invalid/ep, last eval']:.2f} per episode, train "
        f"{summaries[s]['numbers']['RL only train, first eval']:.2f} -> {summaries[s]['numbers']['RL only train']:.2f})"
        for s in collapsed) + "."
    warning = f"\n\n**{collapse_text}**" if collapsed else ""
    robust_line, robust_table = robustness(float_paths) if float_paths else ("", "")
    sections = [f"Seeds {', '.join(map(str, seeds))}; each seed's full report: {seed_links(seeds)}. "
                f"{claims_verdict(pooled)} over the seeds (each claim's parts pooled over the seeds with their "
                "uncertainty).\n\n" + conclusions_text(per_seed, concl_pooled) + warning
                + (f"\n\n{robust_line}" if robust_line else ""),
                "## The chapter's four conclusions (§15.5), per seed\n\n"
                + markdown_table(["conclusion", "held"] + [f"seed {s}" for s in seeds]
                                 + ["over the seeds", f"deciding difference ± {Z:g} SE"], concl_rows),
                "## The four recipes (final train / held-out pass, mean ± sd)\n\nEach recipe's last evaluation point "
                "(the per-seed reports' curves), not their final-policy evaluation.\n\n" + markdown_table(["recipe",
                                                                                                           "train",
                                                                                                           "held-out"],
                                                                                                          recipes),
                "## Claims held per seed, and over the seeds\n\n'noise': not distinguishable from noise on that seed. "
                "Over the seeds: every part of the claim pooled over the seeds (`verdicts.over_seeds`: their mean, "
                "with the between-seed SE, never below the seeds' own sampling SE) and judged again; the deciding "
                "difference is the part that failed or sat inside the noise.\n\n"
                + markdown_table(["claim", "held"] + [f"seed {s}" for s in seeds]
                                 + ["over the seeds", f"deciding difference ± {Z:g} SE"], holds),
                robust_table,
                *_seeds_generalization(summaries, seeds),
                "## Headline numbers\n\n" + markdown_table(["number", "mean ± sd"] + [f"seed {s}" for s in seeds],
                                                           rows)]
    print(f"over seeds {', '.join(map(str, seeds))}: " + claims_summary(pooled), flush=True)
    if collapsed:
        print(wrap(collapse_text), flush=True)
    if robust_line:
        print(wrap(robust_line), flush=True)
    return write_report(run_dir, f"Agent post-training over {len(seeds)} seeds", sections)
