"""iw-SFT paper §3.4-3.5 on the two-arm bandit (REPRODUCE C1-C3).

The paper's setup: data come from the uniform reference policy pi_ref, are filtered to
R = 1 and the policy is fitted to them. Each round draws a fresh batch from pi_ref,
filters it, and takes `steps` SGD steps on the shipped losses, warm-started from the
previous round; iw-SFT's q is the policy at the start of the round (a time-lagged copy,
paper eq. 10), so round 1 is plain SFT.

    C1  SFT on filtered data                     -> pi(right) = 2/3, reward 5/6
    C2  iw-SFT, per-step clip (0.2, 1.8), and smoothing exp(alpha rho) over an alpha sweep
    C3  the failure mode of too-peaked weights. With the always-paying right arm and
        20,000 samples a round, peaked weights only help (the filtered data always favour
        right). With few samples per round the filtered set is noisy, and the weight
        (q/pi_ref)^alpha feeds q's own noise back into the fit: log-odds_{r+1} =
        log(n_right/n_left) + alpha log-odds_r, stable for alpha < 1, explosive beyond.
        We measure the spread of the final pi(right) across 200 runs against alpha, and
        the clipped variant, whose bounded weights keep the feedback bounded.

Losses: `objectives.sft.weighted_sft_loss` (weight 1 for SFT) with `objectives.importance.iw_sft_weights`.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...config import check_ranges
from ...envs.bandit import RIGHT, TwoArmBandit
from ...objectives.importance import iw_sft_weights
from ...objectives.sft import weighted_sft_loss
from ...runs.plots import Panel, line_plot, panel_plot
from ...runs.report import Claim, claims_summary, claims_table, claims_verdict, fmt, image, markdown_table, write_report
from ...runs.rundir import RunDir, run_lock
from ...runs.verdicts import Estimate, bootstrap, decide, two_shares


@dataclass
class Config:
    seed: int = 0
    """seeds the data of C1-C2 (seed) and C3 (seed + 1)"""
    threads: int = 1
    """torch threads (2-element tensors: 1 is fastest)"""
    p_left: float = 0.5
    """P(R = 1 | left) (paper: 0.5)"""
    p_right: float = 1.0
    """P(R = 1 | right) (paper: 1.0)"""
    rounds: int = 8
    """collect -> filter -> fit rounds (C1, C2)"""
    n_per_round: int = 20_000
    """pi_ref samples per round (C1, C2)"""
    runs: int = 8
    """independent runs of C1-C2 (batched: one [runs, 2] logit table); a claim is judged on their mean with its
    standard error over the runs, the curves show the mean"""
    steps: int = 40
    """SGD steps per round"""
    lr: float = 4.0
    """SGD learning rate on the two logits"""
    step_clip: list[float] = field(default_factory=lambda: [0.2, 1.8])
    """per-step ratio clip of the clip variant (paper: 1 -/+ 0.8)"""
    alphas: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0])
    """smoothing strengths: weight exp(alpha * rho), alpha = 0 is plain SFT"""
    c3_n_per_round: int = 8
    """pi_ref samples per round in the little-data setting (C3)"""
    c3_rounds: int = 10
    """rounds in the little-data setting"""
    c3_runs: int = 200
    """independent runs per variant in the little-data setting (batched: one [runs, 2] logit table)"""

    def __post_init__(self) -> None:
        for name in ("p_left", "p_right"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"iw_sft_bandit: {name} is a probability, got {getattr(self, name)}")
        check_ranges(self, "iw_sft_bandit",
                     counts=("threads", "rounds", "n_per_round", "runs", "steps", "c3_n_per_round", "c3_rounds",
                             "c3_runs"),
                     positive=("lr",))
        if len(self.step_clip) != 2 or not 0 <= self.step_clip[0] <= self.step_clip[1]:
            raise ValueError(f"iw_sft_bandit: step_clip must be [low, high] with 0 <= low <= high, "
                             f"got {self.step_clip}")
        if not self.alphas:
            raise ValueError("iw_sft_bandit: alphas must not be empty")


def train_on_filtered(env: TwoArmBandit, variant: str, alpha: float, config: Config, n: int, rounds: int,
                      runs: int, seed: int) -> list[dict]:
    """`runs` independent runs at once; per round: pi(right) [runs], expected reward [runs], ESS.

    variant: "sft" (weight 1), "clip" (per-step clipped ratio), "smooth" (exp(alpha * rho)).
    Run s has its own two logits (row s of a [runs, 2] table) and its own data. The kept
    episodes of all runs form one batch; each episode's weight is multiplied by
    K_total / K_s so that the batch loss is the *sum* of the runs' own token-mean losses
    and every row gets exactly the gradient its run alone would get.
    """
    g = torch.Generator().manual_seed(seed)
    logits = torch.nn.Parameter(torch.zeros(runs, env.n_actions))  # [S, A] uniform start = pi_ref
    ref_probs = torch.full((env.n_actions,), 1.0 / env.n_actions)
    opt = torch.optim.SGD([logits], lr=config.lr)
    history = []
    for _ in range(rounds):
        q_logp = torch.log_softmax(logits.detach(), -1)  # [S, A] the time-lagged copy
        # 1. collect with pi_ref and filter to R = 1
        actions = torch.multinomial(ref_probs, runs * n, replacement=True, generator=g).view(runs, n)  # [S, N]
        keep = env.pull(actions.flatten(), g).view(runs, n) == 1  # [S, N]
        run_of, kept = keep.nonzero(as_tuple=True)[0], actions[keep]  # [K], [K]
        mask = torch.ones(len(kept), 1)  # one POLICY token per episode: [K, 1]
        ess = 1.0
        if len(kept):
            per_run = keep.sum(1).float()  # [S]
            scale = len(kept) / per_run[run_of]  # [K]
            weights = torch.ones(len(kept))
            if variant != "sft":
                ref_logp = ref_probs.log()[kept][:, None]  # [K, 1]
                weights, m = iw_sft_weights(q_logp[run_of, kept][:, None], ref_logp, mask,
                                            variant=variant, step_clip=tuple(config.step_clip), alpha=alpha)
                ess = float(m["iw/ess"])
            # 2. fit
            for _ in range(config.steps):
                logp = torch.log_softmax(logits, -1)[run_of, kept][:, None]  # [K, 1]
                loss = weighted_sft_loss(logp, mask, weights * scale)[0]
                opt.zero_grad()
                loss.backward()
                opt.step()
        p = torch.softmax(logits.detach(), -1)  # [S, A]
        history.append({"p_right": p[:, RIGHT].tolist(), "reward": [env.expected_reward(row) for row in p], "ess": ess})
    return history


def variants(config: Config) -> dict[str, tuple[str, float]]:
    out = {"SFT": ("sft", 0.0), "iw-SFT clip": ("clip", 0.0)}
    out.update({f"iw-SFT smooth a={a:g}": ("smooth", a) for a in config.alphas})
    return out


def run(config: Config, run_dir: Path) -> Path:
    """C1-C3 -> report.md. No stages: every run computes afresh (seconds); the run directory is held and its
    config.json written as every run's (`trajtune.runs.rundir.RunDir.begin`)."""
    run_dir = Path(run_dir)
    with run_lock(run_dir):
        RunDir(run_dir).begin(config)
        return _run(config, run_dir)


def _run(config: Config, run_dir: Path) -> Path:
    torch.set_num_threads(config.threads)
    env = TwoArmBandit((config.p_left, config.p_right))
    print(f"iw-SFT bandit: {config.rounds} rounds x {config.n_per_round} samples; "
          f"C3: {config.c3_runs} runs x {config.c3_rounds} rounds x {config.c3_n_per_round} samples", flush=True)
    # C1, C2: plenty of data, `runs` runs (per round: pi(right) and reward of every run)
    curves = {name: train_on_filtered(env, v, a, config, config.n_per_round, config.rounds, config.runs, config.seed)
              for name, (v, a) in variants(config).items()}
    # C3: little data, many seeds
    spread = {}
    for name, (v, a) in variants(config).items():
        last = train_on_filtered(env, v, a, config, config.c3_n_per_round, config.c3_rounds, config.c3_runs,
                                 config.seed + 1)[-1]
        p = last["p_right"]
        sd = bootstrap(p, statistics.stdev, seed=config.seed) if len(p) > 1 else Estimate(0.0, 0.0, len(p))
        spread[name] = {"mean": statistics.fmean(p), "sd": sd.value, "sd_se": sd.se, "runs": len(p),
                        "wrong_arm": sum(x < 0.5 for x in p) / len(p), "reward": statistics.fmean(last["reward"])}
    return write_bandit_report(run_dir, config, env, curves, spread)


def over_runs(values: list[float], minus: float, what: str) -> Estimate:
    """mean(values) - minus over independent runs, with the standard error of the mean over the runs."""
    n = len(values)
    return Estimate(statistics.fmean(values) - minus, statistics.stdev(values) / math.sqrt(n) if n > 1 else 0.0, n,
                    f"{what}, {n} run{'s' if n != 1 else ''}")


def bandit_claims(config: Config, env: TwoArmBandit, curves: dict, spread: dict) -> list[Claim]:
    """C1-C3 from the variants' curves (C1-C2: the last round's pi(right) and reward of every run, judged on their
    mean with its standard error over the runs) and the little-data spread (C3: each sd with its bootstrap SE over
    the runs, the wrong-arm shares binomial)."""
    fixed_p = float(env.filtered_action_distribution(torch.tensor([0.5, 0.5]))[RIGHT])
    fixed_r = env.expected_reward(torch.tensor([1 - fixed_p, fixed_p]))
    last = {name: c[-1] for name, c in curves.items()}
    sft, clip = last["SFT"], last["iw-SFT clip"]
    smooth = {a: last[f"iw-SFT smooth a={a:g}"] for a in config.alphas}
    sds = [spread[f"iw-SFT smooth a={a:g}"]["sd"] for a in config.alphas]
    a_peak = max(config.alphas)
    a_min = config.alphas[sds.index(min(sds))]
    s_peak, s_min, s_clip, s_sft = (spread[f"iw-SFT smooth a={a_peak:g}"], spread[f"iw-SFT smooth a={a_min:g}"],
                                    spread["iw-SFT clip"], spread["SFT"])
    mean = statistics.fmean
    c1 = [over_runs(sft["p_right"], fixed_p, "pi(right) - 2/3"), over_runs(sft["reward"], fixed_r, "reward - 5/6")]
    c2 = [over_runs(x["reward"], fixed_r, f"{name} - 5/6") for name, x in (("clip", clip),
                                                                                  ("a=1", smooth.get(1.0, sft)))]
    c3 = [Estimate(s_peak["sd"] - 2 * s_sft["sd"], math.sqrt(s_peak["sd_se"] ** 2 + 4 * s_sft["sd_se"] ** 2),
                   s_peak["runs"], f"sd a={a_peak:g} - 2 SFT, bootstrap"),
          two_shares(s_peak["wrong_arm"] * s_peak["runs"], s_peak["runs"], s_sft["wrong_arm"] * s_sft["runs"],
                     s_sft["runs"], f"wrong arm a={a_peak:g} - SFT"),
          Estimate(s_peak["sd"] - s_clip["sd"], math.sqrt(s_peak["sd_se"] ** 2 + s_clip["sd_se"] ** 2),
                   s_peak["runs"], f"sd a={a_peak:g} - clip, bootstrap")]
    return [
        Claim("C1", "SFT on filtered data: pi(right), reward", "2/3, 5/6 (0.667, 0.833)",
              f"{fmt(mean(sft['p_right']), 3)}, {fmt(mean(sft['reward']), 3)}",
              "the 2/3, 5/6 fixed point (each within 0.02)",
              *decide(*((e, test, bound) for e in c1 for test, bound in (("not >", 0.02), ("not <", -0.02))))),
        Claim("C2", "iw-SFT clip / smooth a=0.5 / a=1: reward", "tighter bound, better policy",
              f"{fmt(mean(clip['reward']), 3)} / {fmt(mean(smooth.get(0.5, sft)['reward']), 3)} / "
              f"{fmt(mean(smooth.get(1.0, sft)['reward']), 3)}",
              "reward clearly above 5/6 (by more than 0.05; clip, per-step ratios in (0.2, 1.8), and a=1)",
              *decide(*((e, ">", 0.05) for e in c2))),
        Claim("C3", f"{config.c3_n_per_round} samples/round, {config.c3_runs} runs: sd of final pi(right)",
              "too-peaked weights raise variance",
              f"alpha {'/'.join(f'{a:g}' for a in config.alphas)}: " + "/".join(fmt(x) for x in sds)
              + f"; plain SFT {fmt(s_sft['sd'])}; clip {fmt(s_clip['sd'])}. "
              f"Runs ending on the wrong arm: SFT {100 * s_sft['wrong_arm']:.0f}%, a={a_min:g} "
              f"{100 * s_min['wrong_arm']:.0f}%, "
              f"a={a_peak:g} {100 * s_peak['wrong_arm']:.0f}%, clip {100 * s_clip['wrong_arm']:.0f}%",
              "the most peaked weights raise the spread over plain SFT's (>= 2x) and put more runs on the wrong "
              "arm than plain SFT; clipping keeps the spread below the most peaked weights'",
              *decide(*((e, ">", 0.0) for e in c3))),
    ]


def write_bandit_report(run_dir: Path, config: Config, env: TwoArmBandit, curves: dict, spread: dict) -> Path:
    claims = bandit_claims(config, env, curves, spread)
    rounds = list(range(1, config.rounds + 1))
    shown = ["SFT", "iw-SFT clip"] + [f"iw-SFT smooth a={a:g}" for a in config.alphas if a in (0.5, 1.0, 2.0)]
    mean = statistics.fmean
    line_plot(run_dir / "p_right.png", {k: (rounds, [mean(h["p_right"]) for h in curves[k]]) for k in shown},
              f"C1-C2: pi(right) per round ({config.n_per_round:,} samples a round; mean of {config.runs} runs)",
              "round", "pi(right)", (0.4, 1.02))
    line_plot(run_dir / "reward.png", {k: (rounds, [mean(h["reward"]) for h in curves[k]]) for k in shown},
              f"C1-C2: expected reward per round (mean of {config.runs} runs)", "round", "expected reward", (0.7, 1.01))
    alphas = config.alphas
    flat = {"smooth (by alpha)": "-o", "clip (any alpha)": "--", "plain SFT": ":"}
    c3 = {key: {"smooth (by alpha)": (alphas, [spread[f"iw-SFT smooth a={a:g}"][key] for a in alphas]),
                "clip (any alpha)": (alphas, [spread["iw-SFT clip"][key]] * len(alphas)),
                "plain SFT": (alphas, [spread["SFT"][key]] * len(alphas))} for key in ("sd", "wrong_arm")}
    panel_plot(run_dir / "c3_spread.png", [Panel("sd of final pi(right) over runs", c3["sd"], styles=flat),
                                           Panel("share of runs on the wrong arm", c3["wrong_arm"], (0, 1.02), flat)],
               f"C3: {config.c3_n_per_round} samples per round, {config.c3_runs} runs", "alpha (weight exp(alpha rho))")
    rows = [(k, fmt(mean(c[-1]["p_right"]), 3), fmt(mean(c[-1]["reward"]), 3), fmt(mean(h["ess"] for h in c), 2),
             fmt(spread[k]["mean"], 3), fmt(spread[k]["sd"], 3), f"{100 * spread[k]['wrong_arm']:.0f}%",
             fmt(spread[k]["reward"], 3)) for k, c in curves.items()]
    table = markdown_table(["variant", f"pi(right), mean of {config.runs} runs", f"reward, mean of {config.runs} runs",
                            "mean ESS/K", "C3 mean pi(right)", "C3 sd",
                            "C3 wrong arm", "C3 reward"], rows)
    (run_dir / "claims.md").write_text(claims_table(claims) + "\n")
    print(claims_summary(claims))
    return write_report(run_dir, "iw-SFT on the two-arm bandit (iw-SFT paper §3.5)", [
        f"{claims_verdict(claims)}. Arms pay with P = ({config.p_left}, {config.p_right}); data from the uniform "
        "pi_ref, filtered to R = 1. "
        f"C1-C2: {config.runs} runs x {config.rounds} rounds x {config.n_per_round} samples, {config.steps} SGD steps "
        f"(lr {config.lr}) per round; the table gives their mean, a claim is judged on it with its standard error "
        "over the runs (the column beside the verdict; inside twice that, \"not distinguishable\"). "
        f"C3: {config.c3_runs} runs x {config.c3_rounds} rounds x {config.c3_n_per_round} samples.",
        "## Claims\n\n" + claims_table(claims), "## All variants\n\n" + table,
        image(run_dir / "p_right.png", "pi(right)") + " " + image(run_dir / "reward.png", "reward") + " "
        + image(run_dir / "c3_spread.png", "C3")])


# the experiment contract (`trajtune.experiments.base.Experiment`): what it offers beyond one run
run_over_seeds = None  # no report over seeds: `trajtune run --seeds` is refused
dry_run = None  # `trajtune run --dry-run`: the run directory's checks alone
parse_options = None  # no options of its own
