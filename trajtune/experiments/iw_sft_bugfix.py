"""iw-SFT on the BugFix gym (REPRODUCE C4): importance-weighted vs plain expert iteration.

Both start from the flagship's weak base (SFT on blind + random scripted play,
`experiments.agent.weak_base`, REPRODUCE A2) and spend the same sampling budget:
`rounds` x 20 train tasks x `samples_per_task` episodes, kept if the hidden tests pass,
then `steps_per_round` SFT steps on the kept episodes.

    rft     weight 1 on every kept episode (expert iteration, A5)
    iw_sft  weight q(tau) / pi_ref(tau): pi_ref = the policy that sampled the round,
            q = a lagged copy of the policy refreshed every `q_update_every` steps,
            per-step ratios clipped to (0.2, 1.8) (iw-SFT paper §3.4) or smoothed

Evaluated after every round on train and held-out tasks with common random numbers.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..algorithms.iw_sft import IWSFTConfig, train_iw_sft
from ..algorithms.rft import RFTConfig, train_rft
from ..config import check_ranges, to_dict
from ..metrics import MetricsLogger
from ..report import Claim, claims_table, fmt, image, line_plot, markdown_table, mean_sd, write_report
from ..resume import Checkpointer
from . import agent
from .agent_gym import Gym, evaluate
from .chapter13_stages import Stage, run_stages


@dataclass
class Config:
    seed: int = 0
    """one seed: weak base, sampling and batches"""
    workers: int = 2
    """processes: rft and iw_sft run side by side after the weak base"""
    threads: int = 1
    """torch threads per process"""
    rounds: int = 4
    """sample -> filter -> train rounds (A5: 4)"""
    samples_per_task: int = 16
    """episodes per train task and round (A5: 16 x 20 tasks = 320)"""
    steps_per_round: int = 15
    """SFT steps per round (A5: 15)"""
    batch_size: int = 32
    """kept episodes per step"""
    lr: float = 3e-3
    """learning rate (the flagship's sft_lr)"""
    variant: Literal["clip", "smooth"] = "clip"
    """iw-SFT weights: per-step clipped ratios or exp(alpha * mean log-ratio)"""
    step_clip_low: float = 0.2
    """per-step ratio clip, lower end (paper: 1 - 0.8)"""
    step_clip_high: float = 1.8
    """per-step ratio clip, upper end (paper: 1 + 0.8)"""
    alpha: float = 1.0
    """smoothing strength for variant = 'smooth'"""
    q_update_every: int = 5
    """refresh the lagged q every this many steps"""
    weak_steps: int = 150
    """SFT steps of the weak base (A2: 150)"""
    eval_samples: int = 4
    """episodes per task at every evaluation (80 train, 40 held-out)"""

    def __post_init__(self) -> None:
        check_ranges(self, "iw_sft_bugfix",
                     counts=("workers", "threads", "samples_per_task", "batch_size", "q_update_every", "eval_samples"),
                     non_negative=("rounds", "steps_per_round", "weak_steps", "alpha"), positive=("lr",))
        if not 0 <= self.step_clip_low <= self.step_clip_high:
            raise ValueError(f"iw_sft_bugfix: need 0 <= step_clip_low <= step_clip_high, got "
                             f"{self.step_clip_low}, {self.step_clip_high}")


def agent_config(config: Config) -> agent.Config:
    """The flagship's config for the weak base, with our seed, threads and weak-base steps."""
    base = agent.Config()
    return dataclasses.replace(base, seed=config.seed, threads=config.threads, workers=1,
                               weak=dataclasses.replace(base.weak, steps=config.weak_steps))


def stage_weak_base(config: Config, run_dir: Path) -> dict:
    acfg = agent_config(config)
    gym = Gym(acfg.max_turns, acfg.max_action_tokens)
    with MetricsLogger(run_dir / "weak_base") as log:
        out = agent.weak_base(acfg, run_dir, gym, log)
    return {"describe": out["describe"]}


def stage_method(config: Config, run_dir: Path, method: str) -> dict:
    """rft or iw_sft from the weak base; evaluation after every round."""
    acfg = agent_config(config)
    gym = Gym(acfg.max_turns, acfg.max_action_tokens)
    engine = agent.load_engine(run_dir, "weak_base/checkpoint", config.lr)
    seed = config.seed * 1_000_003 + 4  # the same sampling seed for both methods: round 1 samples the same episodes
    ev = lambda step: evaluate(engine, gym, config.eval_samples, acfg.eval_seed())  # noqa: E731
    ck = Checkpointer(run_dir / method / "resume")
    curve = ck.keep("curve", [])
    if not ck.has_checkpoint:  # a resumed stage has its step-0 evaluation in the checkpoint
        curve.append({"step": 0, **ev(0)})
    common = dict(rounds=config.rounds, samples_per_task=config.samples_per_task, steps_per_round=config.steps_per_round,
                  batch_size=config.batch_size, seed=seed)
    with MetricsLogger(run_dir / method, strict=True) as log, ck:
        if method == "rft":
            rows = train_rft(engine, gym.train, gym.collect(engine), RFTConfig(**common), gym.pad_id, log, ev, stage=method,
                             checkpointer=ck)
        else:
            iw = IWSFTConfig(**common, variant=config.variant, step_clip_low=config.step_clip_low,
                             step_clip_high=config.step_clip_high, alpha=config.alpha, q_update_every=config.q_update_every)
            rows = train_iw_sft(engine, gym.train, gym.collect(engine), iw, gym.pad_id, log, ev, stage=method,
                                checkpointer=ck)
    curve += [{"step": r["step"], **{k: v for k, v in r.items() if k.startswith("eval/")}} for r in rows]
    kept = [r.get("rft/kept", 0.0) for r in rows]
    return {"curve": curve, "kept": kept, "sampled": sum(r.get("rft/sampled", 0.0) for r in rows),
            "ess": [r.get("iw/ess") for r in rows]}


def run(config: Config, run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(to_dict(config), indent=1))
    print(f"iw-SFT vs expert iteration on BugFix (seed {config.seed}), {config.workers} worker(s)", flush=True)
    stages = [Stage("weak_base", stage_weak_base), Stage("rft", stage_method, ("rft",), after=("weak_base",)),
              Stage("iw_sft", stage_method, ("iw_sft",), after=("weak_base",))]
    results = run_stages(stages, config, run_dir, config.workers, config.threads)
    return write_bugfix_report(run_dir, config, results)


def final(results: dict, method: str, key: str) -> float:
    return results[method]["curve"][-1][key]


def write_bugfix_report(run_dir: Path, config: Config, results: dict) -> Path:
    rft, iw = results["rft"], results["iw_sft"]
    claim = Claim("C4", f"iw-SFT ({config.variant}) vs expert iteration, {config.rounds} rounds x "
                  f"{int(rft['sampled'] / config.rounds)} samples: train / held-out pass",
                  "— (extension; A5 RFT: 0.75 train, 0.10-0.23 held-out)",
                  f"iw-SFT {fmt(final(results, 'iw_sft', 'eval/pass_rate'))} / {fmt(final(results, 'iw_sft', 'eval/heldout_pass_rate'))}; "
                  f"RFT {fmt(final(results, 'rft', 'eval/pass_rate'))} / {fmt(final(results, 'rft', 'eval/heldout_pass_rate'))}",
                  "compare with plain RFT at equal sampling budget", None)
    for key, label in (("eval/pass_rate", "train"), ("eval/heldout_pass_rate", "held-out")):
        line_plot(run_dir / f"pass_{label}.png",
                  {m: ([c["step"] for c in results[m]["curve"]], [c[key] for c in results[m]["curve"]]) for m in ("rft", "iw_sft")},
                  f"C4: {label} pass rate", "SFT step (4 rounds)", "pass rate", (0, 1.02))
    rows = [(m, *(fmt(c[k]) for c in [results[m]["curve"][-1]] for k in ("eval/pass_rate", "eval/heldout_pass_rate",
                                                                          "eval/invalid_per_episode")),
             "/".join(f"{k:.0f}" for k in results[m]["kept"]), int(results[m]["sampled"])) for m in ("rft", "iw_sft")]
    ess = [e for e in iw["ess"] if e is not None]
    (run_dir / "claims.md").write_text(claims_table([claim]) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({m: {k: final(results, m, k) for k in ("eval/pass_rate", "eval/heldout_pass_rate")}
                                                      for m in ("rft", "iw_sft")}))
    print(claims_table([claim]))
    return write_report(run_dir, "iw-SFT vs expert iteration on the BugFix gym (C4)", [
        f"Seed {config.seed}. Weak base: `experiments.agent.weak_base` ({config.weak_steps} SFT steps on blind + random play). "
        f"iw-SFT weights: {config.variant}, q refreshed every {config.q_update_every} steps; ESS/K of the last step per round: "
        + ", ".join(fmt(e) for e in ess) + ".",
        "## Claim\n\n" + claims_table([claim]),
        "## Final numbers\n\n" + markdown_table(["method", "train pass", "held-out pass", "invalid/ep", "kept per round",
                                                 "sampled episodes"], rows),
        image(run_dir / "pass_train.png", "train") + " " + image(run_dir / "pass_held-out.png", "held-out")])


def run_seeds(config: Config, run_dir: Path, seeds: list[int]) -> Path:
    """C4 over seeds: mean ± sd of the final pass rates of both methods."""
    run_dir = Path(run_dir)
    per = {s: json.loads(run(dataclasses.replace(config, seed=s), run_dir / f"seed-{s}").with_name("summary.json").read_text())
           for s in seeds}
    rows = [(m, k.split("/")[1], mean_sd([per[s][m][k] for s in seeds]), " / ".join(fmt(per[s][m][k]) for s in seeds))
            for m in ("rft", "iw_sft") for k in ("eval/pass_rate", "eval/heldout_pass_rate")]
    gaps = [per[s]["iw_sft"]["eval/pass_rate"] - per[s]["rft"]["eval/pass_rate"] for s in seeds]
    table = markdown_table(["method", "metric", "mean ± sd", "per seed"], rows)
    print(table)
    return write_report(run_dir, "iw-SFT vs expert iteration on BugFix over seeds (C4)", [
        "## Final pass rates\n\n" + table,
        f"Train-pass gap iw-SFT - RFT: {mean_sd(gaps)} (mean {statistics.fmean(gaps):+.2f})."])
