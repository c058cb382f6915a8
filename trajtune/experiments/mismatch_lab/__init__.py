"""The train-inference mismatch lab: one task trained under injected, controlled mismatch, crossed with the
off-policy corrections, on replayed batches, over seeds -- and a verdict per mismatch on which correction keeps
learning closest to on-policy.

The task (`task.py`): name the first letter of a 3-letter word, the tiny char model from scratch, GRPO with the PPO
surrogate (one epoch: REINFORCE's gradient, a ratio for decoupled PPO to take) for `rl.steps` steps.

The mismatches (`MISMATCHES`; each a sampling section, `mismatch_sampling`):

    k1, k2, k4     sampling.max_staleness K: step s sampled with the weights after update s - K (exactly)
    bf16, fp8      the sampler process draws from its copy of the weights rounded to bf16 / float8 e4m3
                   (sampling.sampler_dtype) while the trainer trains fp32
    top_p          top-p 0.95, the sampler's processed log-probs (of the truncated distribution it drew from)
    top_p_raw      top-p 0.95, raw log-probs (the full softmax's, as vLLM's raw_logprobs): the cut is hidden

The corrections (`RLConfig.correction`, `trajtune.objectives.corrections`): none, tis, mis_token, mis_seq, mis_geo,
icepop, decoupled. Identical data: per seed and mismatch one live run (stage `seed<s>-<mismatch>-<recorded_with>`,
correction `recorded_with`, default tis) records the episodes it trained on (sampling.record); every other
correction trains on that recording (sampling.replay, stage `seed<s>-<mismatch>-<correction>`), so the corrections
differ only in the loss. A replay with the recorded correction would give the live run's weights bit for bit, so the
live run is that row. "none" on episodes sampled behind (k1..k4), which the loop refuses to train uncorrected, is
mis_token with the band [0, 1e30] (`KEEP_ALL`): weight 1 on every token, the same loss bit for bit. The reference:
the on-policy run (stage `seed<s>-onpolicy`: K = 0, fp32, no top-p, no correction), live.

Measured per run: the held-out mean reward after training (`eval_samples` sampled answers per held-out word, fp32,
full softmax, the same seed for every run), the mean training reward (the live runs'; a replay's is its recording's),
the sampler-trainer mismatch of the episodes trained on (mismatch/k3: the k3 estimate of KL(sampler || trainer) per
POLICY token, mismatch/abs_log_ratio: the mean |log pi_trainer - log pi_sampler|, both against the weights the step
trains, `measure_mismatch`), and the share of POLICY tokens the correction cut (pg/tis_capped_frac for tis,
pg/correction_masked_frac for the masks). `report.py` writes the tables and the verdicts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...algorithms.rl import RLConfig, train_rl
from ...config import check_ranges
from ...engine import OptimConfig
from ...evaluation import score_policy
from ...logprobs import masked_mean
from ...metrics import register
from ...models.tiny import TinyConfig, TinyTransformer
from ...runs.stages import Stage, StageContext, StageOptions, run_stages
from ...sources.build import episode_source
from ...sources.episodes import Measured
from ...sources.record import RECORDING
from ...sources.sampling import SamplingConfig
from ...text.render import Renderer
from ...trajectory import Trajectory, collate
from . import task as lab_task
from .report import write_lab_report

MISMATCHES = ("k1", "k2", "k4", "bf16", "fp8", "top_p", "top_p_raw")
"""the injected mismatches (module docstring)"""
CORRECTIONS = ("none", "tis", "mis_token", "mis_seq", "mis_geo", "icepop", "decoupled")
"""the corrections crossed with them"""
LAB_FIELDS = ("max_staleness", "sampler_process", "sampler_dtype", "sync_tolerance", "top_p", "logprobs", "record",
              "replay")
"""the sampling fields the lab sets per mismatch and run (`mismatch_sampling`, `stage_replay`)"""
CUT_METRICS = ("pg/tis_capped_frac", "pg/correction_masked_frac")
"""a correction's share of cut POLICY tokens: clipped (tis, tis_seq) or masked (the others)"""

KEEP_ALL = 1e30
"""the upper bound of "none" on lagged episodes (mis_token [0, KEEP_ALL]): a ratio above it needs a sampled token the
sampler gave a probability below e^-69 times the trainer's"""

register("mismatch/k3", "mismatch lab: k3 estimate of KL(sampler || trainer) per POLICY token of the step's episodes, "
         "against the weights the step trains")
register("mismatch/abs_log_ratio", "mismatch lab: mean |log pi_trainer - log pi_sampler| over the step's POLICY "
         "tokens, against the weights the step trains")


@dataclass
class Config:
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    """every seed runs every mismatch x correction (model init, task order, sampling)"""
    mismatches: list[str] = field(default_factory=lambda: list(MISMATCHES))
    """the mismatches to inject (`MISMATCHES`)"""
    corrections: list[str] = field(default_factory=lambda: list(CORRECTIONS))
    """the corrections to cross them with (`CORRECTIONS`)"""
    recorded_with: str = "tis"
    """the correction each mismatch's live, recording run trains with (one of `corrections`; k1..k4 need one)"""
    top_p: float = 0.95
    """the nucleus of the top_p / top_p_raw mismatches"""
    tis_cap: float = 2.0
    """the cap C of tis and decoupled"""
    sync_tolerance: float = 20.0
    """the sync check's log-prob tolerance (nats) of the bf16 / fp8 sampler (its difference is logged)"""
    n_train: int = 48
    """training words"""
    n_eval: int = 24
    """held-out words (never trained on)"""
    eval_samples: int = 8
    """sampled answers per held-out word"""
    dim: int = 32
    """model width"""
    n_layers: int = 1
    """transformer blocks"""
    n_heads: int = 2
    """attention heads"""
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_new_tokens=2, draw="cdf"))
    """the sampling every run starts from (the built-in sampler, here); each mismatch sets its own fields of it
    (`LAB_FIELDS`), which stay at their defaults here"""
    rl: RLConfig = field(default_factory=lambda: RLConfig(steps=80, tasks_per_step=8, group_size=8,
                                                          advantage="grpo", surrogate="ppo", eval_every=20))
    """the RL loop's settings (its correction and tis_cap are the lab's, per run: leave them unset)"""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-2))
    """optimizer settings"""
    runner: StageOptions = field(default_factory=lambda: StageOptions(workers=2))
    """the stage runner"""

    def __post_init__(self) -> None:
        check_ranges(self, "mismatch_lab", counts=("n_train", "n_eval", "eval_samples", "dim", "n_layers",
                                                    "n_heads"), positive=("tis_cap", "sync_tolerance"))
        for key, given, known in (("mismatches", self.mismatches, MISMATCHES),
                                  ("corrections", self.corrections, CORRECTIONS)):
            bad = [x for x in given if x not in known]
            if bad or not given or len(set(given)) != len(given):
                raise ValueError(f"mismatch_lab: {key} must be distinct names among {', '.join(known)}, got {given}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"mismatch_lab: seeds must be distinct, got {self.seeds}")
        if self.recorded_with not in self.corrections or self.recorded_with == "none":
            raise ValueError(f"mismatch_lab: recorded_with {self.recorded_with!r} must be one of corrections other "
                             "than none (the recording runs of k1..k4 need a correction)")
        if self.rl.correction != "none" or self.rl.tis_cap:
            raise ValueError("mismatch_lab: rl.correction / rl.tis_cap are the lab's per run (corrections, tis_cap); "
                             "leave them unset")
        default = SamplingConfig()
        if set_here := [k for k in LAB_FIELDS if getattr(self.sampling, k) != getattr(default, k)]:
            raise ValueError(f"mismatch_lab: sampling.{', sampling.'.join(set_here)}: set per mismatch by the lab "
                             "(its top-p: top_p; its tolerance: sync_tolerance); leave unset")
        if self.sampling.backend != "sampler":
            raise ValueError("mismatch_lab: sampling.backend must be sampler (the built-in sampler and its process)")
        if not 0 < self.top_p < 1:
            raise ValueError(f"mismatch_lab: top_p must be in (0, 1), got {self.top_p}")
        if self.dim % self.n_heads:
            raise ValueError(f"mismatch_lab: dim={self.dim} is not divisible by n_heads={self.n_heads}")
        lab_task.tasks(self.n_train, self.n_eval)  # enough words


def mismatch_sampling(config: Any, mismatch: str) -> SamplingConfig:
    """The sampling section of `mismatch` ("onpolicy": none injected) of the lab's `config` (a `Config`)."""
    base = config.sampling
    if mismatch == "onpolicy":
        return base
    if mismatch.startswith("k"):
        return dataclasses.replace(base, max_staleness=int(mismatch[1:]))
    if mismatch in ("bf16", "fp8"):
        return dataclasses.replace(base, sampler_process=True, sampler_dtype=mismatch,  # type: ignore[arg-type]
                                   sync_tolerance=config.sync_tolerance)
    return dataclasses.replace(base, top_p=config.top_p, logprobs="raw" if mismatch == "top_p_raw" else "processed")


def correction_rl(config: Any, correction: str, behind: bool) -> RLConfig:
    """The RL settings of a run of the lab's `config` (a `Config`) under `correction` (`behind`: its episodes were
    sampled behind the policy)."""
    if correction == "none" and behind:  # the loop refuses uncorrected lag: keep every token at weight 1
        return dataclasses.replace(config.rl, correction="mis_token", correction_low=0.0, correction_high=KEEP_ALL)
    cap = config.tis_cap if correction in ("tis", "tis_seq", "decoupled") else 0.0
    return dataclasses.replace(config.rl, correction=correction, tis_cap=cap)  # type: ignore[arg-type]


def measure_mismatch(engine, pad_id: int):
    """-> measure(trajs) -> {mismatch/k3, mismatch/abs_log_ratio}: the episodes' sampler log-probs against the
    trainer's current weights (called as the loop takes the step's episodes, before it trains on them)."""

    def measure(trajs: list[Trajectory]) -> dict[str, float]:
        batch = collate(trajs, pad_id)
        with torch.no_grad():
            mine = engine.forward(batch).logprobs.float()  # [B, T-1]
        mask = batch.action_mask.double()  # [B, T-1]
        log_r = torch.where(mask > 0, mine.double() - batch.old_logprobs.double(), 0.0)  # [B, T-1]
        k3 = torch.expm1(log_r) - log_r  # [B, T-1] >= 0 (float64, expm1: no rounding below 0 for tiny ratios)
        return {"mismatch/k3": float(masked_mean(k3, mask)), "mismatch/abs_log_ratio": float(
            masked_mean(log_r.abs(), mask))}

    return measure


def train_one(ctx: StageContext, seed: int, sampling: SamplingConfig, rl: RLConfig) -> dict:
    """One training run of the lab: a fresh model of `seed`, `rl.steps` steps on `sampling`'s episodes -> its
    held-out reward before / after, mean training reward, and the means over steps of the mismatch and cut metrics."""
    config = ctx.config
    train, held_out = lab_task.tasks(config.n_train, config.n_eval, seed)
    tok = lab_task.tokenizer()
    renderer = Renderer(tok)
    longest = max(len(renderer.generation_prompt([{"role": "user", "content": t.prompt}])) for t in train + held_out)
    max_tokens = longest + sampling.max_new_tokens
    torch.manual_seed(seed)
    model = TinyTransformer(TinyConfig(tok.vocab_size, config.dim, config.n_layers, config.n_heads,
                                       max_len=max_tokens + 1))
    engine = ctx.engine(model, config.optim)
    rl = dataclasses.replace(rl, seed=seed)

    def source(section: SamplingConfig, measure=None):
        return episode_source(section, engine, lab_task.make_env, renderer, "mismatch_lab", max_turns=1,
                              max_tokens=max_tokens, pad_id=tok.pad_id, rl=rl, sharded=False, seed=seed,
                              stage_dir=ctx.dir, measure=measure)

    evaluation = source(config.sampling)  # on-policy, fp32, the full softmax: the same for every run

    def held_out_reward() -> float:
        return score_policy(evaluation, held_out, n=config.eval_samples, seed=1).mean_reward

    before = held_out_reward()
    with Measured(source(sampling), measure_mismatch(engine, tok.pad_id)) as training:
        history = train_rl(engine, train, training, rl, tok.pad_id,
                           ctx.run(lambda step: {"eval/reward": held_out_reward()}))
    curve = [r["eval/reward"] for r in history if "eval/reward" in r]
    means = {k: sum(r[k] for r in history if k in r) / max(1, sum(k in r for r in history))
             for k in ("rollout/reward", "mismatch/k3", "mismatch/abs_log_ratio", "sync/logprob_diff", *CUT_METRICS)
             if any(k in r for r in history)}
    cut = next((means[k] for k in CUT_METRICS if k in means), 0.0)
    return {"held_out_before": before, "held_out": history[-1]["eval/reward"], "held_out_mean": sum(curve) / len(curve),
            "curve": curve, "train_reward": means["rollout/reward"],
            "k3": means["mismatch/k3"], "abs_log_ratio": means["mismatch/abs_log_ratio"],
            "sync_logprob_diff": means.get("sync/logprob_diff", 0.0), "cut": cut, "steps": len(history)}


def stage_onpolicy(ctx: StageContext, seed: int) -> dict:
    """The reference: K = 0, fp32, no top-p, no correction."""
    return train_one(ctx, seed, mismatch_sampling(ctx.config, "onpolicy"), correction_rl(ctx.config, "none", False))


def stage_record(ctx: StageContext, seed: int, mismatch: str) -> dict:
    """`mismatch` injected, live, trained with `recorded_with`, its episodes recorded."""
    config = ctx.config
    sampling = dataclasses.replace(mismatch_sampling(config, mismatch), record=True)
    return train_one(ctx, seed, sampling, correction_rl(config, config.recorded_with, mismatch.startswith("k")))


def stage_replay(ctx: StageContext, seed: int, mismatch: str, correction: str) -> dict:
    """`correction` trained on the recording of `mismatch`'s live run."""
    config = ctx.config
    recording = Path(ctx.dir).parent / stage_name(seed, mismatch, config.recorded_with) / RECORDING
    sampling = dataclasses.replace(config.sampling, replay=str(recording))
    return train_one(ctx, seed, sampling, correction_rl(config, correction, mismatch.startswith("k")))


def stage_name(seed: int, mismatch: str, correction: str | None = None) -> str:
    """seed<s>-onpolicy, seed<s>-<mismatch>-<correction>."""
    return f"seed{seed}-{mismatch}" + (f"-{correction}" if correction else "")


def stages(config: Config) -> list[Stage]:
    """Per seed: the on-policy run, each mismatch's recording run, the replays under the other corrections."""
    out: list[Stage] = []
    for s in config.seeds:
        out.append(Stage(stage_name(s, "onpolicy"), stage_onpolicy, args=(s,)))
        for m in config.mismatches:
            rec = stage_name(s, m, config.recorded_with)
            out.append(Stage(rec, stage_record, args=(s, m)))
            out += [Stage(stage_name(s, m, c), stage_replay, after=(rec,), args=(s, m, c))
                    for c in config.corrections if c != config.recorded_with]
    return out


def run(config: Config, run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    results = run_stages(stages(config), config, run_dir, config.runner)
    return write_lab_report(config, run_dir, results)


# the experiment contract (`trajtune.experiments.base.Experiment`): what it offers beyond one run
run_over_seeds = None  # the seeds are the lab's own (config.seeds): `trajtune run --seeds` is refused
dry_run = None  # `trajtune run --dry-run`: the run directory's checks alone
parse_options = None  # no options of its own


