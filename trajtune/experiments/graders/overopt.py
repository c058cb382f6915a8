"""Graders recipe, part 'overopt': RL against a proxy reward model, with the verifier as gold (RLHF book ch.14).

The book: over-optimization is "when optimizing the proxy objective causes the true objective to get better,
then get worse"; "the training reward keeps climbing, but downstream quality eventually peaks and declines",
seen against training steps or "with the KL distance of the optimization on the x-axis"; Bai et al. split the
preference data in half into a train RM and a test RM; reward-model ensembles are a mitigation (Coste et al.).

The demo, its design fixed up front (not tuned to make a claim hold):

    pairs        chapter 13's pairs of the instruct gym (`preference_pairs`: its train and test lists
                 together, 640 pairs of real lines for the 16 seen words, chosen ends with '.'), split in
                 half by a seeded shuffle: half A trains the proxy reward models, half B the test RM
    overopt_rm*  Bradley-Terry reward models from chapter 13's `sft_narrow` network with a fresh scalar
                 head (chapter 13's reward model, `train_reward_model`), each for ONE epoch over its half
                 (`rm_epochs`; chapter 13's trains 60 steps x 32 pairs on 512 pairs, 3.75 epochs, and orders
                 100% of held-out pairs): overopt_rm0 .. overopt_rm{k-1} on half A with seeds 0 .. k-1 (head
                 init and batch order; Coste et al. train their members on the same data with other seeds),
                 overopt_rm_test on half B
    overopt_*    GRPO (`train_rl`, chapter 13's advantage, no KL penalty) of the `sft_narrow` policy on the 16
                 seen words; the reward is the proxy, through `sources.scoring.Scored`:
                   overopt_single    overopt_rm0 alone
                   overopt_ensemble  the min over overopt_rm0 .. rm{k-1} (`sources.ensemble.RewardEnsemble`)
                 every `eval_every` steps (and before the first) the probe (`trajtune.overoptimization`)
                 samples 4 replies per seen word from one fixed seed and logs overopt/proxy (what the run
                 optimizes), overopt/gold (the verifier `ends_with_period`), overopt/gold/test_rm (the
                 held-out-half RM), overopt/gold/format (the reply starts with the word: chapter 13's format,
                 which the pairs never vary: chosen and rejected both start with the word), overopt/gold/
                 instruction (format and period: the whole instruction) and overopt/kl (sampled KL to the
                 `sft_narrow` policy)

All of this was written before the first run except the instruction gold and its claims O5-O6, added after
the first run showed the format collapsing while the period held (the claims table says so). Every rise, fall and
gap a claim reads is judged against the noise of the probe's replies (`runs.verdicts`: a share binomial over
them, an RM score or the KL by its sd over them, `overopt/sd/*`); O3 and O6 compare the two runs' levels at the
same evaluations after one RM's peak, not each run against its own peak. On seed 0 the reward models order
99-100% of the other half's pairs and the period never falls (O1 not distinguishable: 1.00 at its peak and at the
end; O3 not judged); the format, which no pair taught, collapses (docs/overoptimization.md has the numbers).

What differs from the book's setting: the "human" preference is a rule the gym can check, so the gold reward
is exact; the reward models are 355k-parameter character models; the policy is never KL-penalised (the
book's curve is the unregularised one; a KL penalty would slow it, ch.14.3).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator
import torch

from ...algorithms.reward_model import RewardModelConfig, train_reward_model
from ...algorithms.rl import RLConfig, train_rl
from ...config import check_ranges
from ...engine import OptimConfig
from ...envs.instruct import SEEN, InstructTask, ends_with_period, format_ok, preference_pairs
from ...models.tiny import TinyTransformer, load_model
from ...overoptimization import OverOptProbe, batch_grader, episode_rewards, fit_scaling_law, peak, verifier_grader
from ...runs.report import Claim, fmt, image, markdown_table
from ...runs.verdicts import Estimate, Holds, decide, judge, paired
from ...runs.stages import Stage
from ...seeding import derive
from ...sources.ensemble import RewardEnsemble
from ...sources.episodes import sample_episodes
from ...sources.graders import Grades, Weighted
from ...sources.scoring import Scored, pair_accuracy, reward_model_scores
from ...trajectory import Owner, Trajectory
from ..shared.recipe import adam
from ..shared.instruct import corpus, instruct_source, renderer
from ..shared.preference import rendered_pairs, sft_model

RUNS = ("single", "ensemble")


@dataclass
class Demo:
    """Over-optimization (ch.14): RL against a proxy reward model, the verifier as gold; one RM vs a min-ensemble."""

    members: int = 3
    """reward models trained on half A (seeds 0 .. members-1); overopt_single uses the first, overopt_ensemble the
    min over all"""
    rm_epochs: float = 1.0
    """passes of each reward model over its half of the pairs (batches of `rm_batch`)"""
    rm_batch: int = 32
    """pairs per reward-model step"""
    rm_optim: OptimConfig = field(default_factory=lambda: adam(3e-4))
    """reward-model optimizer (chapter 13's)"""
    rl: RLConfig = field(default_factory=lambda: RLConfig(steps=40, tasks_per_step=8, group_size=8,
                                                          advantage="grpo", eval_every=5))
    """GRPO against the proxy: steps, words per step, replies per word, the probe's cadence (eval_every); its seed
    is derived from the recipe's `seed`"""
    rl_optim: OptimConfig = field(default_factory=lambda: adam(3e-4))
    """the policy's optimizer (chapter 13's GRPO learning rate)"""
    eval_samples: int = 4
    """replies per seen word the probe samples (16 words: 64 replies), from one fixed seed; every rise, fall and
    gap the claims read is judged against the standard error of these replies (`runs.verdicts`)"""

    def __post_init__(self) -> None:
        check_ranges(self, "graders.overopt", counts=("members", "rm_batch", "eval_samples"), positive=("rm_epochs",))


def demo(config) -> Demo:
    return config.overopt


def stages(config) -> list[Stage]:
    d = demo(config)
    rm_reads, rl_reads = ("seed", "overopt"), ("seed", "overopt", "max_reply")  # `Stage.reads`
    rms = [Stage(f"overopt_rm{k}", stage_rm, after=("sft_narrow",), args=(k,), reads=rm_reads)
           for k in range(d.members)]
    rms.append(Stage("overopt_rm_test", stage_rm, after=("sft_narrow",), args=("test",), reads=rm_reads))
    after = tuple(s.name for s in rms)
    return [*(Stage(f"overopt_{which}", stage_rl, after=after, args=(which,), reads=rl_reads) for which in RUNS), *rms]


# --- the pairs, the reward models -----------------------------------------------------------------

def halves(seed: int) -> tuple[list, list]:
    """Chapter 13's pairs (train and test lists together) split in half by a seeded shuffle: (A, B)."""
    train, test = preference_pairs(corpus()[3], seed=seed)
    pairs = train + test
    random.Random(derive(seed, 14, stride=7919)).shuffle(pairs)
    return pairs[: len(pairs) // 2], pairs[len(pairs) // 2 :]


@dataclass(frozen=True)
class RatedTask(InstructTask):
    """An instruct task as a prompt row (`columns`, `where`): what `Scored` hands its reward models."""

    columns: dict = field(default_factory=dict, hash=False, compare=False)
    where: str = field(default="", hash=False, compare=False)


class TinyRewardModel:
    """A chapter-13 reward model as a `RewardBatch` scorer: the value head at the last token of the prompt + reply.
    The reply goes in as the tokens the policy sampled (`completion_ids`, its <|end|> included when it stopped),
    after the prompt as the one renderer writes it: token for token what the pairs were (`shared.instruct.demo`)."""

    finished_only, main_only = True, False  # a grader (trajtune.sources.graders.Grader)

    def __init__(self, engine, name: str):
        self.engine, self.name, self.renderer = engine, name, renderer()

    def start(self, batch, state):
        return lambda: Grades(self(batch))

    def close(self) -> None:
        pass

    def __call__(self, batch) -> list[float]:
        trajs = []
        for prompt, ids in zip(batch.prompts, batch.completion_ids, strict=True):
            t = Trajectory()
            t.append(self.renderer.generation_prompt([{"role": "user", "content": prompt}]), Owner.PROMPT, 0)
            t.append(ids, Owner.POLICY, 0)
            trajs.append(t)
        return reward_model_scores(self.engine, trajs, self.renderer.tokenizer.pad_id)


def stage_rm(ctx, which) -> dict:
    """One reward model: member `which` (0, 1, ...) on half A with seed `which`, or 'test' on half B; its
    accuracy on the other half's pairs."""
    config, d = ctx.config, demo(ctx.config)
    a, b = halves(config.seed)
    train, held_out = (b, a) if which == "test" else (a, b)
    seed = derive(config.seed, 1000 + (0 if which == "test" else int(which) + 1), stride=7919)
    tok = corpus()[0]
    sft = sft_model(ctx.run_dir)
    torch.manual_seed(seed)
    rm = TinyTransformer(dataclasses.replace(sft.config, value_head=True))
    rm.load_state_dict(sft.state_dict(), strict=False)  # the SFT network plus a fresh scalar head
    engine = ctx.engine(rm, d.rm_optim)
    steps = max(1, round(d.rm_epochs * len(train) / d.rm_batch))
    rm_config = RewardModelConfig(steps=steps, batch_size=d.rm_batch, seed=seed)
    held_r = rendered_pairs(held_out)
    history = train_reward_model(engine, rendered_pairs(train), rm_config, tok.pad_id,
                                 ctx.run(lambda s: {"eval/pair_accuracy": pair_accuracy(engine, held_r, tok.pad_id)}))
    ctx.save_model(rm, tok, "model", meta={"stage": ctx.name})
    return {"accuracy": history[-1]["eval/pair_accuracy"], "train_loss": history[-1]["train/loss"],
            "steps": steps, "n_train_pairs": len(train), "n_held_out_pairs": len(held_out)}


def load_rm(ctx, stage: str) -> TinyRewardModel:
    model, _ = load_model(ctx.run_dir / stage / "model")
    return TinyRewardModel(ctx.engine(model, None, frozen=True), stage.removeprefix("overopt_"))


# --- RL against the proxy ---------------------------------------------------------------------------

def stage_rl(ctx, which: str) -> dict:
    """GRPO of the sft_narrow policy against the proxy (one RM, or the min-ensemble), probed every eval_every steps."""
    config, d = ctx.config, demo(ctx.config)
    tok = corpus()[0]
    members = [load_rm(ctx, f"overopt_rm{k}") for k in range(d.members)]
    proxy = members[0] if which == "single" else RewardEnsemble(members, how="min", name="ensemble_min")
    test_rm = load_rm(ctx, "overopt_rm_test")
    sft = sft_model(ctx.run_dir)
    reference = ctx.engine(copy.deepcopy(sft), None, frozen=True)  # the starting policy
    torch.manual_seed(config.seed)
    engine = ctx.engine(sft, d.rl_optim)
    rl = dataclasses.replace(d.rl, seed=derive(config.seed, 1400, stride=7919))
    source = instruct_source(engine, "preference", config.max_reply,
                             score=lambda episodes: Scored(episodes, engine, [Weighted(proxy)]))
    gold = {"ends_with_period": verifier_grader(lambda task, reply: float(ends_with_period(reply))),
            "test_rm": batch_grader(test_rm),
            "format": verifier_grader(lambda task, reply: float(format_ok(task.word, reply))),
            "instruction": verifier_grader(lambda task, reply: float(format_ok(task.word, reply)
                                                                     and ends_with_period(reply)))}
    tasks = [RatedTask(w) for w in SEEN]
    probe = OverOptProbe(engine, reference, source, tasks, d.eval_samples, episode_rewards(), gold, tok.pad_id,
                         seed=derive(config.seed, 1401, stride=7919))
    start = probe(0)  # the starting point of the curve (the engine holds the SFT weights until train_rl resumes)
    if not ctx.resuming:
        ctx.log(0, start)
    history = train_rl(engine, tasks, source, rl, tok.pad_id, ctx.run(probe))
    curve = [{"step": 0, **start}]
    curve += [{k: r[k] for k in r if k == "step" or k.startswith("overopt/")} for r in history if "overopt/kl" in r]
    examples = sample_episodes(source, tasks[:4], 1, derive(config.seed, 1402, stride=7919))
    return {"proxy": proxy.name, "curve": curve,
            "examples": [f"{t.info['word']} -> {t.info['reply']!r} (proxy {t.reward:.2f})" for t in examples]}



# --- claims ---------------------------------------------------------------------------------------

PROXY, GOLD, TEST, INSTR, FORMAT, KL = ("overopt/proxy", "overopt/gold", "overopt/gold/test_rm",
                                       "overopt/gold/instruction", "overopt/gold/format", "overopt/kl")
GRADED = "overopt/graded"
SHARES = (GOLD, INSTR, FORMAT, "overopt/gold/ends_with_period")
"""the probe's numbers that are shares of its replies (binomial noise)"""


def series(curve: list[dict], key: str) -> tuple[list[int], list[float]]:
    return [c["step"] for c in curve], [c[key] for c in curve]


def sd_key(key: str) -> str:
    """The probe's standard deviation of `key` over its replies: overopt/proxy -> overopt/sd/proxy."""
    return "overopt/sd/" + key.removeprefix("overopt/")


def noise(row: dict, key: str) -> float:
    """The sampling variance of `key` at one evaluation (a row of a curve), over its n = overopt/graded replies: for
    a share the binomial p (1 - p) / n, p taken at (hits + 1) / (n + 2) as `verdicts.two_shares` does (so 64/64 is
    not a zero); for a score or the KL sd^2 / n, sd the probe's overopt/sd/*."""
    n = row[GRADED]
    if key in SHARES:
        p = (row[key] * n + 1) / (n + 2)
        return p * (1 - p) / n
    if sd_key(key) not in row:
        raise ValueError(f"graders overopt: the curve has no {sd_key(key)} (results from before the probe logged it: "
                         "rerun the overopt stages)")
    return row[sd_key(key)] ** 2 / n


def change(a: dict, b: dict, key: str) -> Estimate:
    """b[key] - a[key] between two evaluations (rows of a curve), its SE from both evaluations' replies (`noise`).
    Unpaired: the probe draws the same prompts and random numbers at every evaluation, so the two are positively
    correlated and this SE errs on the large side."""
    return Estimate(b[key] - a[key], math.sqrt(noise(a, key) + noise(b, key)), int(min(a[GRADED], b[GRADED])),
                    f"step {b['step']} - step {a['step']}, {int(b[GRADED])} replies each")


def peak_row(curve: list[dict], key: str) -> dict:
    """The evaluation where `key` is highest (the first on a tie: `overoptimization.peak`)."""
    at, _ = peak(*series(curve, key))
    return next(c for c in curve if c["step"] == at)


def rise_and_fall_parts(curve: list[dict], key: str) -> list[tuple[Estimate, str, float]]:
    """The book's curve on `key` as three comparisons (`verdicts.deciding` parts): it rises from step 0 to its peak,
    falls from the peak to the end, and the proxy is higher at the end than at that peak; each a difference of two
    evaluations against the noise of the probe's replies (`change`). A peak at step 0 or at the end is no rise or
    no fall: a difference of 0, which no noise level makes a clear one."""
    start, top, end = curve[0], peak_row(curve, key), curve[-1]
    return [(change(start, top, key), ">", 0.0), (change(end, top, key), ">", 0.0), (change(top, end, PROXY), ">", 0.0)]


def rise_and_fall(curve: list[dict], key: str) -> tuple[Holds, Estimate]:
    """(verdict, the estimate that decided it) of the book's whole curve on `key` (`rise_and_fall_parts`)."""
    return decide(*rise_and_fall_parts(curve, key))


def _curve(results: dict, which: str) -> list[dict] | None:
    r = results.get(f"overopt_{which}")
    return r["curve"] if r and r.get("curve") else None


def _rise_and_fall(curve: list[dict], key: str, name: str) -> tuple[str, Holds, Estimate]:
    top, end = peak_row(curve, key), curve[-1]
    ours = (f"{name} {fmt(curve[0][key])} at step 0, peak {fmt(top[key])} at step {top['step']}, "
            f"{fmt(end[key])} at step {end['step']}; proxy {fmt(top[PROXY])} at that peak, {fmt(end[PROXY])} at the "
            "end")
    holds, est = rise_and_fall(curve, key)
    return ours, holds, est


def level_gap(single: list[dict], ensemble: list[dict], key: str, after: int) -> Estimate:
    """The min-ensemble's `key` minus one RM's at the same evaluations, those after step `after` (one RM's peak):
    the mean of the per-evaluation differences, its SE the larger of the paired SE over the evaluations and the
    binomial SE of the pooled replies (k evaluations of n replies each; successive evaluations of one run are not
    independent, so k paired differences alone can look far surer than the replies allow)."""
    s = [c for c in single if c["step"] > after]
    e = [c for c in ensemble if c["step"] > after]
    if [c["step"] for c in s] != [c["step"] for c in e]:
        raise ValueError(f"graders overopt: the two runs were probed at different steps ({[c['step'] for c in s]} vs "
                         f"{[c['step'] for c in e]})")
    by_eval = paired([c[key] for c in s], [c[key] for c in e])
    k = len(s)
    pooled = math.sqrt(statistics.fmean([noise(a, key) + noise(b, key) for a, b in zip(s, e, strict=True)]) / k)
    return Estimate(by_eval.value, max(by_eval.se, pooled), k,
                    f"paired over the {k} evaluations at steps {s[0]['step']}-{s[-1]['step']}, "
                    f"{int(s[0][GRADED])} replies each")


def _delay(single: list[dict], ensemble: list[dict], key: str) -> tuple[str, Holds, Estimate | None, str]:
    """O3 / O6: (ours, verdict, estimate, why). The ensemble delays the fall when, at the same evaluations after
    one RM's peak, its level is above one RM's; not judged when one RM's `key` did not rise and fall beyond the
    noise (the proxy's part of O1 / O5 is not needed: there is a fall to delay or there is not)."""
    top = peak_row(single, key)
    after = [c for c in single if c["step"] > top["step"]]
    if len(after) < 2 or decide(*rise_and_fall_parts(single, key)[:2])[0] is not True:
        levels = ", ".join(f"{fmt(a[key])} vs {fmt(b[key])}" for a, b in zip(single[1:], ensemble[1:], strict=True))
        return (f"one RM vs min-ensemble at steps {single[1]['step']}-{single[-1]['step']}: {levels}", None, None,
                "one RM's curve did not rise and fall beyond the noise: nothing to delay")
    est = level_gap(single, ensemble, key, top["step"])
    e_after = [c for c in ensemble if c["step"] > top["step"]]
    ours = (f"one RM peaks at step {top['step']}; over steps {after[0]['step']}-{after[-1]['step']}: one RM "
            + ", ".join(fmt(c[key]) for c in after) + "; min-ensemble " + ", ".join(fmt(c[key]) for c in e_after)
            + f" (mean {fmt(statistics.fmean(c[key] for c in after))} vs "
              f"{fmt(statistics.fmean(c[key] for c in e_after))})")
    return ours, judge(est, ">"), est, ""


def kl_grows(curves: list[list[dict]]) -> tuple[Holds, Estimate]:
    """O4: the sampled KL rises from step 0 to the end of every run beyond the noise, and never falls beyond it
    between two evaluations (a dip inside the noise is not a fall). When it holds, the estimate shown is the
    smaller rise (in SE) of step 0 -> the end: the headline, not a step that did not fall."""
    rises = [(change(curve[0], curve[-1], KL), ">", 0.0) for curve in curves]
    steps = [(change(a, b, KL), "not <", 0.0) for curve in curves for a, b in zip(curve, curve[1:])]
    holds, est = decide(*rises + steps)
    return (holds, decide(*rises)[1]) if holds is True else (holds, est)


def claims(results: dict, config) -> list[Claim]:
    single, ensemble = _curve(results, "single"), _curve(results, "ensemble")
    if single is None or ensemble is None:
        return []
    out = []
    ours, holds, est = _rise_and_fall(single, GOLD, "gold (ends with '.')")
    out.append(Claim("O1", "RL vs one proxy RM", "proxy rises, gold peaks then falls", ours,
                     '"the training reward keeps climbing, but downstream quality eventually peaks and declines" '
                     "(RLHF book ch.14 §14.1): gold = the verifier ends_with_period; it gets better, then worse: its "
                     "peak above step 0, the end below the peak, the proxy higher at the end than at gold's peak, each "
                     "by more than 2 SE of the probe's replies", holds, est))
    half = single[len(single) // 2]
    holds, est = decide(*[(change(half, single[-1], PROXY), ">", 0.0), (change(half, single[-1], TEST), "not >", 0.0)])
    out.append(Claim("O2", "train RM vs test RM (halves)", "train-RM gains stop transferring to the test RM",
                     f"from step {half['step']} to {single[-1]['step']}: proxy (train RM) "
                     f"{single[-1][PROXY] - half[PROXY]:+.2f}, test RM {single[-1][TEST] - half[TEST]:+.2f} (test RM "
                     f"{fmt(single[0][TEST])} at step 0)",
                     '"improvements on the training RM eventually fail to transfer to the test PM" (Bai et al., '
                     "RLHF book ch.14 §14.2): over the second half of the run the proxy still rises (by more than 2 "
                     "SE) and the test RM does not", holds, est))
    ours, holds, est, why = _delay(single, ensemble, GOLD)
    out.append(Claim("O3", "min-ensemble of RMs", "an ensemble delays the fall", "gold (ends with '.'): " + ours,
                     '"reward model ensembles" mitigate over-optimization (Coste et al., RLHF book ch.14 §14.4b): '
                     "after one RM's gold peak, the min-ensemble's gold is above one RM's at the same steps (the mean "
                     "difference by more than 2 SE)", holds, est, why=why))
    holds, est = kl_grows([single, ensemble])
    out.append(Claim("O4", "KL as the x-axis", "KL from the reference grows with steps",
                     f"KL (nats per reply) {fmt(single[0][KL])} -> {fmt(single[-1][KL])} (one RM), "
                     f"{fmt(ensemble[0][KL])} -> {fmt(ensemble[-1][KL])} (ensemble)",
                     '"the relationship ... can also be seen with the KL distance of the optimization on the '
                     'x-axis rather than training steps" (RLHF book ch.14 §14.1): the sampled KL to the reference '
                     "rises from step 0 to the end of both runs and never falls between two evaluations, beyond 2 SE",
                     holds, est))
    ours, holds, est = _rise_and_fall(single, INSTR, "instruction (starts with the word and ends with '.')")
    out.append(Claim("O5", "RL vs one proxy RM, gold = the whole instruction", "proxy rises, gold peaks then falls",
                     ours, "as O1 with gold = the whole instruction, format_ok and ends_with_period (added after the "
                     "first run showed the format collapse; the pairs never vary the format, so the RM never "
                     "learnt it)", holds, est))
    ours, holds, est, why = _delay(single, ensemble, INSTR)
    out.append(Claim("O6", "min-ensemble, gold = the whole instruction", "an ensemble delays the fall",
                     "instruction: " + ours, "as O3 with O5's gold (added after the first run)", holds, est, why=why))
    return out


# --- report ---------------------------------------------------------------------------------------

def plot_curves(path: Path, single: list[dict], ensemble: list[dict]) -> Path:
    """2 x 2: reward-model scores (top) and verifier shares (bottom) against steps (left) and KL (right); one RM
    solid, the min-ensemble dashed; the legend outside the axes."""
    fig, axes = plt.subplots(2, 2, figsize=(10.5, 6.4), dpi=110)
    rows = [[(PROXY, "proxy (the reward optimized)", "C0"), (TEST, "test RM (held-out half)", "C1")],
            [(GOLD, "gold: ends with '.'", "C2"), (INSTR, "starts with the word and ends with '.'", "C3"),
             (FORMAT, "starts with the word", "C4")]]
    for r, keys in enumerate(rows):
        for c, x in enumerate(("step", KL)):
            ax = axes[r][c]
            for run, curve, style in (("one RM", single, "-o"), ("min-ensemble", ensemble, "--s")):
                xs = [p[x] for p in curve]
                for key, label, color in keys:
                    ax.plot(xs, [p[key] for p in curve], style, color=color, markersize=3, label=f"{label}, {run}")
            ax.set_xlabel("RL step" if x == "step" else "KL(policy || sft_narrow), nats per reply")
            if x == "step":
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel("reward-model score" if r == 0 else "share of 64 replies")
            ax.grid(alpha=0.3)
        axes[r][1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.suptitle("Over-optimization: GRPO against a proxy reward model (graders / overopt)")
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def scaling_fits(single: list[dict], ensemble: list[dict]) -> str:
    """Gao et al.'s RL form R(d) = d (alpha - beta log d), d = sqrt(KL), fitted to each run's instruction curve
    (`trajtune.overoptimization.fit_scaling_law`; checklist 14.8): where the fitted gold peaks."""
    rows = []
    for run, curve in (("one RM", single), ("min-ensemble", ensemble)):
        try:
            f = fit_scaling_law([c[KL] for c in curve], [c[INSTR] for c in curve], "rl")
        except ValueError as e:
            rows.append([run, "-", "-", "-", str(e)])
            continue
        rows.append([run, fmt(f["alpha"]), fmt(f["beta"]), fmt(f["d_peak"] ** 2, 1) if f["d_peak"] < 1e6 else "none",
                     fmt(f["r2"])])
    return ("Gao et al.'s RL form (checklist 14.8 [EXT]) fitted to the instruction share against d = sqrt(KL): "
            "R(d) = d (alpha - beta log d), R the gain over step 0; the KL where the fit peaks:\n\n"
            + markdown_table(["run", "alpha", "beta", "fitted peak at KL (nats)", "R^2"], rows))


def section(run_dir: Path, results: dict, config) -> str:
    d = demo(config)
    single, ensemble = _curve(results, "single"), _curve(results, "ensemble")
    if single is None or ensemble is None:
        return "## Over-optimization (ch.14)\n\nThe RL stages did not finish."
    rms = [(name, fmt(results[f"overopt_{name}"]["accuracy"]), results[f"overopt_{name}"]["n_train_pairs"],
            results[f"overopt_{name}"]["steps"]) for name in [f"rm{k}" for k in range(d.members)] + ["rm_test"]
           if f"overopt_{name}" in results]
    keys = [("proxy (RM score)", PROXY), ("gold: ends with '.'", GOLD), ("test RM (score)", TEST),
            ("starts with the word", FORMAT), ("starts with the word and ends with '.'", INSTR),
            ("KL (nats per reply)", KL)]
    table = [[run, c["step"], *(fmt(c[k]) for _, k in keys)] for run, curve in (("one RM", single),
                                                                             ("min-ensemble", ensemble))
             for c in curve]
    plot_curves(Path(run_dir) / "overopt.png", single, ensemble)
    examples = "\n".join(f"- {run}: " + "; ".join("`" + e.replace("`", "'") + "`"
                                                  for e in results[f"overopt_{run}"]["examples"])
                         for run in RUNS)
    return "\n\n".join([
        "## Over-optimization (ch.14)",
        f"GRPO of the `sft_narrow` policy ({d.rl.steps} steps x {d.rl.tasks_per_step} words x {d.rl.group_size} "
        f"replies, lr {d.rl_optim.lr:g}, no KL penalty) against a proxy reward model: one RM (`overopt_rm0`) or "
        f"the min over {d.members} RMs trained on the same half of the pairs with other seeds. Every "
        f"{d.rl.eval_every} steps the probe (`trajtune.overoptimization`) samples {d.eval_samples} replies per seen "
        "word from one fixed seed and scores them with the proxy, the verifier (gold: ends with '.'), the test RM "
        "(trained on the other half) and the format check; KL is sampled from the same replies. The pairs never "
        "vary the format (chosen and rejected are both real lines that start with the word), so no reward model "
        "here was taught it.",
        "Reward models (Bradley-Terry, one epoch over their half of chapter 13's pairs; accuracy on the other "
        "half):\n\n" + markdown_table(["RM", "held-out pair accuracy", "pairs", "steps"], rms),
        image("overopt.png", "proxy, test RM and verifier shares against steps and KL, one RM and the ensemble"),
        markdown_table(["run", "step", *(n for n, _ in keys)], table),
        scaling_fits(single, ensemble),
        "Replies at the end (a fixed seed, with the proxy's score):\n\n" + examples,
    ])
