"""iw-SFT on the BugFix gym (REPRODUCE C4): importance-weighted vs plain expert iteration.

Both start from the flagship's weak base (SFT on blind + random scripted play,
`experiments.bugfix.train_weak_base`, REPRODUCE A2) and spend the same sampling budget:
`rounds` x 20 train tasks x `samples_per_task` episodes, kept if the hidden tests pass,
then `steps_per_round` SFT steps on the kept episodes (`rft` and `iw` must agree on these).

    rft     weight 1 on every kept episode (expert iteration, A5)
    iw_sft  weight q(tau) / pi_ref(tau): pi_ref = the policy that sampled the round,
            q = a lagged copy of the policy refreshed every `iw.q_update_every` steps,
            per-step ratios clipped to (0.2, 1.8) (iw-SFT paper §3.4) or smoothed

Both sample round 1 with the same seed, so they start from the same episodes. Evaluated
after every round on train and held-out tasks with common random numbers.

Stages: weak_base -> rft, iw_sft (side by side in `runner.workers` processes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ...algorithms.iw_sft import IWSFTConfig, train_iw_sft
from ...algorithms.rft import RFTConfig, train_rft
from ...algorithms.sft import SFTConfig
from ...config import check_ranges
from ...engine.distributed import is_main
from ...engine import OptimConfig
from ...runs.plots import line_plot
from ...runs.report import (Claim, claims_summary, claims_table, claims_verdict, fmt, image, markdown_table, mean_sd,
                            pooled_claims, write_report)
from ...runs.verdicts import Estimate, two_shares
from ...runs.view import write_view_if_recorded
from ...runs.stages import Stage, StageContext, StageOptions, run_stages
from ..bugfix import eval_seed, evaluate, load_engine, seeded, stage_gym, train_weak_base
from ..base import over_seeds

BUDGET = ("rounds", "samples_per_task", "steps_per_round", "batch_size")
"""the settings `rft` and `iw` must share: equal sampling and training budgets"""


@dataclass
class Config:
    RENAMED: ClassVar[dict[str, str]] = {
        "workers": "runner.workers",
        "threads": "runner.threads",
        "lr": "optim.lr",
        "weak_steps": "weak.steps",
        "rounds": "rft.rounds and iw.rounds",
        "samples_per_task": "rft.samples_per_task and iw.samples_per_task",
        "steps_per_round": "rft.steps_per_round and iw.steps_per_round",
        "batch_size": "rft.batch_size and iw.batch_size",
        "variant": "iw.variant",
        "step_clip_low": "iw.step_clip_low",
        "step_clip_high": "iw.step_clip_high",
        "alpha": "iw.alpha",
        "q_update_every": "iw.q_update_every",
    }
    """recipe keys of earlier versions -> where they went (a clear error names the new key)"""
    seed: int = 0
    """one seed: weak base, sampling and batches (the nested loop configs' seeds are derived from it)"""
    weak: SFTConfig = field(default_factory=lambda: SFTConfig(steps=150, batch_size=32, length_buckets=4))
    """SFT of the weak base on blind + random play (the flagship's A2 settings)"""
    rft: RFTConfig = field(default_factory=RFTConfig)
    """plain expert iteration (A5: 4 rounds x 16 samples per task x 15 steps, 32 episodes per step)"""
    iw: IWSFTConfig = field(default_factory=IWSFTConfig)
    """iw-SFT: the same budget as `rft`, per-step clipped (0.2, 1.8) or smoothed weights, q refreshed every 5 steps"""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=3e-3))
    """optimizer of all three stages (the flagship's sft_optim)"""
    eval_samples: int = 4
    """episodes per task at every evaluation (80 train, 40 held-out)"""
    runner: StageOptions = field(default_factory=StageOptions)
    """stage processes (workers=2: rft and iw_sft side by side), torch threads per process, checkpoint_every, rerun"""

    def __post_init__(self) -> None:
        check_ranges(self, "iw_sft_bugfix", counts=("eval_samples",))
        differ = [k for k in BUDGET if getattr(self.rft, k) != getattr(self.iw, k)]
        if differ:
            raise ValueError(f"iw_sft_bugfix: rft and iw must spend the same budget; they differ in "
                             f"{', '.join(differ)}")


def stage_weak_base(ctx: StageContext) -> dict:
    c = ctx.config
    out = train_weak_base(ctx, stage_gym(ctx), c.seed, seeded(c.weak, c.seed, 1), c.optim)
    return {"describe": out["describe"]}


def stage_method(ctx: StageContext, method: str) -> dict:
    """rft or iw_sft from the weak base; evaluation after every round."""
    c, gym = ctx.config, stage_gym(ctx)
    engine = load_engine(ctx, "weak_base/checkpoint", c.optim)
    ev = lambda step: evaluate(engine, gym, c.eval_samples, eval_seed(c.seed))  # noqa: E731
    curve = ctx.keep("curve", [])
    if not ctx.resuming:  # a resumed stage has its step-0 evaluation in the checkpoint
        curve.append({"step": 0, **ev(0)})
    # the same sampling seed for both methods: round 1 samples the same episodes
    if method == "rft":
        rows = train_rft(engine, gym.train, gym.source(engine), seeded(c.rft, c.seed, 4), gym.pad_id, run=ctx.run(ev))
    else:
        rows = train_iw_sft(engine, gym.train, gym.source(engine), seeded(c.iw, c.seed, 4), gym.pad_id, run=ctx.run(ev))
    curve += [{"step": r["step"], **{k: v for k, v in r.items() if k.startswith("eval/")}} for r in rows]
    kept = [r.get("rft/kept", 0.0) for r in rows]
    return {"curve": curve, "kept": kept, "sampled": sum(r.get("rft/sampled", 0.0) for r in rows),
            "ess": [r.get("iw/ess") for r in rows],
            "n_eval": {"train": len(gym.train) * c.eval_samples, "heldout": len(gym.heldout) * c.eval_samples}}


STAGES = [Stage("weak_base", stage_weak_base, reads=("seed", "weak", "optim")),
          Stage("rft", stage_method, after=("weak_base",), args=("rft",),
                reads=("seed", "rft", "optim", "eval_samples")),
          Stage("iw_sft", stage_method, after=("weak_base",), args=("iw_sft",),
                reads=("seed", "iw", "optim", "eval_samples"))]
"""`reads`: the config fields each stage reads (`Stage.reads`)"""


def run(config: Config, run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    print(f"iw-SFT vs expert iteration on BugFix (seed {config.seed}), {config.runner.workers} worker(s)", flush=True)
    results = run_stages(STAGES, config, run_dir, config.runner)
    if not is_main():
        return run_dir / "report.md"
    return write_bugfix_report(run_dir, config, results)


BOUND_TEXT = (
    "What the paper's bound predicts here. SFT on the kept set maximises a lower bound on the RL objective that "
    "loosens as the policy moves away from the data's sampler pi_ref; iw-SFT tightens it with weights q / pi_ref, q a "
    "lagged copy of the policy (paper §3.2-3.4). The gain is largest when the policy trains far from a fixed pi_ref, "
    "as in the bandit (C2: one fixed 50/50 reference, many SFT steps). In expert iteration pi_ref is re-set to the "
    "policy at every round and each round takes only a few SFT steps, so the policy stays close to pi_ref, the SFT "
    "bound is already nearly tight and the weights stay near 1 (the ESS/K below): the bound predicts little to gain. "
    "And with a 0/1 reward every kept episode has R = 1, so the weights only move mass between successes, towards "
    "the ones the current policy already favours (often blind guesses), which helps no held-out task.")


def final(results: dict, method: str, key: str) -> float:
    return results[method]["curve"][-1][key]


def c4_claim(summary: dict, what: str) -> Claim:
    """C4 from one seed's final pass rates (`summary.json`: {method: {metric: rate}, "n": {"train", "heldout"}}):
    iw-SFT's train pass against plain RFT's, two binomial shares of the evaluation episodes."""
    rft, iw, n = summary["rft"], summary["iw_sft"], summary["n"]

    def gap(key: str, split: str) -> Estimate:
        return two_shares(iw[key] * n[split], n[split], rft[key] * n[split], n[split],
                          f"{split}, binomial {n[split]}")

    held = gap("eval/heldout_pass_rate", "heldout")
    return Claim.compare("C4", what, "— (extension; A5 RFT: 0.75 train, 0.10-0.23 held-out)",
                         f"iw-SFT {fmt(iw['eval/pass_rate'])} / {fmt(iw['eval/heldout_pass_rate'])}; RFT "
                         f"{fmt(rft['eval/pass_rate'])} / {fmt(rft['eval/heldout_pass_rate'])} (held-out gap {held})",
                         "iw-SFT beats plain expert iteration on train pass at equal sampling budget (the paper's "
                         "claim for SFT on curated data; the bound predicts little to gain here)",
                         gap("eval/pass_rate", "train"), ">")


def write_bugfix_report(run_dir: Path, config: Config, results: dict) -> Path:
    rft, iw = results["rft"], results["iw_sft"]
    summary = {**{m: {k: final(results, m, k) for k in ("eval/pass_rate", "eval/heldout_pass_rate")}
                  for m in ("rft", "iw_sft")}, "n": rft["n_eval"]}
    claim = c4_claim(summary, f"iw-SFT ({config.iw.variant}) vs RFT, {config.iw.rounds} x "
                     f"{int(rft['sampled'] / max(config.rft.rounds, 1))} samples: train pass")
    for key, label in (("eval/pass_rate", "train"), ("eval/heldout_pass_rate", "held-out")):
        line_plot(run_dir / f"pass_{label}.png",
                  {m: ([c["step"] for c in results[m]["curve"]], [c[key] for c in results[m]["curve"]])
                   for m in ("rft", "iw_sft")},
                  f"C4: {label} pass rate", "SFT step (4 rounds)", "pass rate", (0, 1.02))
    rows = [(m, *(fmt(c[k]) for c in [results[m]["curve"][-1]] for k in ("eval/pass_rate", "eval/heldout_pass_rate",
                                                                          "eval/invalid_per_episode")),
             "/".join(f"{k:.0f}" for k in results[m]["kept"]), int(results[m]["sampled"])) for m in ("rft", "iw_sft")]
    ess = [e for e in iw["ess"] if e is not None]
    (run_dir / "claims.md").write_text(claims_table([claim]) + "\n")
    (run_dir / "summary.json").write_text(json.dumps(summary))
    write_view_if_recorded(run_dir)
    print(claims_summary([claim]))
    return write_report(run_dir, "iw-SFT vs expert iteration on the BugFix gym (C4)", [
        f"Seed {config.seed}. {claims_verdict([claim])}. Weak base: `experiments.bugfix.train_weak_base` "
        f"({config.weak.steps} SFT steps on blind + random play). "
        f"iw-SFT weights: {config.iw.variant}, q refreshed every {config.iw.q_update_every} steps; "
        "ESS/K of the last step per round: "
        + ", ".join(fmt(e) for e in ess) + ".",
        "## Claim\n\n" + claims_table([claim]) + "\n\n" + BOUND_TEXT,
        "## Final numbers\n\n" + markdown_table(["method", "train pass", "held-out pass", "invalid/ep",
                                                 "kept per round", "sampled episodes"], rows),
        image(run_dir / "pass_train.png", "train") + " " + image(run_dir / "pass_held-out.png", "held-out")])


def seeds_report(config: Config, run_dir: Path, per_seed: dict[int, Path]) -> Path:
    """C4 over seeds: mean ± sd of the final pass rates of both methods, and C4 judged on the train-pass gap pooled
    over the seeds with its standard error (`runs.report.pooled_claims`), from the per-seed runs' summary.json
    (`trajtune.runs.rundir.run_seeds`: seed -> its run directory)."""
    run_dir, seeds = Path(run_dir), list(per_seed)
    per = {s: json.loads((Path(d) / "summary.json").read_text()) for s, d in per_seed.items()}
    rows = [(m, k.split("/")[1], mean_sd([per[s][m][k] for s in seeds]), " / ".join(fmt(per[s][m][k]) for s in seeds))
            for m in ("rft", "iw_sft") for k in ("eval/pass_rate", "eval/heldout_pass_rate")]
    table = markdown_table(["method", "metric", "mean ± sd", "per seed"], rows)
    pooled = pooled_claims({s: [c4_claim(per[s], "iw-SFT vs RFT: train pass")] for s in seeds})
    print(claims_summary(pooled))
    return write_report(run_dir, "iw-SFT vs expert iteration on BugFix over seeds (C4)", [
        f"{claims_verdict(pooled)} over seeds {', '.join(map(str, seeds))}: the train-pass gap iw-SFT - RFT pooled "
        "over the seeds, with its standard error. Per-seed reports: "
        + ", ".join(f"[seed {s}]({_relative(per_seed[s], run_dir)}/report.html)" for s in seeds) + ".\n\n" + BOUND_TEXT,
        "## Claim over the seeds\n\n" + claims_table(pooled),
        "## Final pass rates\n\n" + table])


def _relative(path: Path, root: Path) -> str:
    """path relative to root, as a link ('seed-1'); the absolute path when it is not under root."""
    try:
        return Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return Path(path).resolve().as_posix()


# the experiment contract (`trajtune.experiments.base.Experiment`): what it offers beyond one run
run_over_seeds = over_seeds(run, seeds_report)  # `trajtune run --seeds`
dry_run = None  # `trajtune run --dry-run`: the run directory's checks alone
parse_options = None  # no options of its own
