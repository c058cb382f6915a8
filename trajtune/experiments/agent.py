"""Agent post-training compared on one weak base in the BugFix gym (seed agent-rl ch.15; REPRODUCE A1-A13).

Every method below is the same weighted log-likelihood over POLICY tokens; they
differ in where the trajectories come from and what weight each gets. All start
from one *weak base* (format learned, no skill) and are measured the same way:

    weak_base          SFT on blind + random scripted play                      A2
    oracle_sft         SFT on 20 oracle demos, eval + snapshot every 10 steps   A3, A10
    rft                expert iteration, 4 rounds (own samples, 0/1 filter)     A5, A12
    dpo, dpo_nll       offline DPO on weak-base pairs, and DPO + NLL            A7, A8
    sft_rl, rl_only    REINFORCE with a group baseline from the step-20 SFT
                       snapshot, and from the weak base (equal total steps)     A9
    diagnostics        owners and masked loss at init; gradient identity;
                       dpo_loss sanity                                          A1, A4, A6
    template_mismatch  SFT on demos rendered without wrapper tokens             A11
    hacking            expert iteration filtered by the public tests            A13
    generalization     the final policies on the train tasks under held-out     (beyond the
                       names: unseen names vs unseen code                       seed)

Each stage writes its checkpoint to run_dir/<stage>/checkpoint, its results to
run_dir/<stage>/results.json and its metric rows (stage name in each) to
run_dir/metrics.jsonl; a stage whose results.json exists is reused (one cut
short by Ctrl-C resumes from run_dir/<stage>/resume), so a
rerun of one stage is `--set config.stages='["dpo"]'`. Stages that do not
depend on each other run in `workers` processes. `agent_report.py` writes the
report: claims beside the seed's numbers, learning curves, cost table.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Callable

import torch

from ..algorithms.dpo import DPOConfig, train_dpo
from ..algorithms.rft import RFTConfig, train_rft
from ..algorithms.rl import RLConfig, train_rl
from ..algorithms.sft import SFTConfig, train_sft
from ..checkpoint import load_model, save_model
from ..config import check_ranges, to_dict
from ..engine import LocalEngine, OptimConfig
from ..envs.bugfix_tasks import make_tasks
from ..metrics import MetricsLogger
from ..models.tiny import TinyConfig, TinyTransformer
from ..resume import Checkpointer, StageClock, forward_to_children
from . import agent_diagnostics as diag
from .agent_gym import (Gym, describe, episodes, evaluate, pass_rate, preference_pairs, probe, rft_round_summary,
                        scripted_play)


@dataclass
class Config:
    seed: int = 0
    """one seed: model init, scripted play, sampling and batches of every stage derive from it
    (the `seed` fields of the nested loop configs are overwritten with it)"""
    dim: int = 64
    """model width (TinyTransformer)"""
    n_layers: int = 2
    """transformer blocks"""
    n_heads: int = 4
    """attention heads"""
    max_turns: int = 6
    """policy turns per episode"""
    max_action_tokens: int = 8
    """token budget of one action (valid actions need at most 3)"""
    weak_play_seeds: int = 4
    """weak base data: this many seeds of the blind and of the random policy x 20 train tasks (4 -> 160 episodes)"""
    weak: SFTConfig = field(default_factory=lambda: SFTConfig(steps=150, batch_size=32, length_buckets=4))
    """SFT on blind + random play (A2)"""
    oracle: SFTConfig = field(default_factory=lambda: SFTConfig(steps=60, batch_size=32, eval_every=10, length_buckets=4))
    """SFT on the 20 oracle demos from the weak base (A3; also the A11 mismatch run); snapshot every eval"""
    sft_lr: float = 3e-3
    """learning rate of every SFT-style stage (weak base, oracle SFT, RFT rounds, A11, A13)"""
    cold_start_step: int = 20
    """the oracle-SFT snapshot that SFT -> RL starts from (A9) and A10 probes"""
    rft: RFTConfig = field(default_factory=lambda: RFTConfig(rounds=4, samples_per_task=16, steps_per_round=15,
                                                                    length_buckets=4))
    """expert iteration from the weak base (A5)"""
    hack_rounds: int = 3
    """rounds of expert iteration filtered by public tests (A13); other settings as `rft`"""
    dpo: DPOConfig = field(default_factory=lambda: DPOConfig(steps=100, beta=0.1, length_buckets=4))
    """offline DPO, full batch (A7); the DPO + NLL stage adds `dpo_nll_weight` (A8)"""
    dpo_nll_weight: float = 1.0
    """weight of the NLL on chosen episodes in the dpo_nll stage"""
    dpo_lr: float = 1e-3
    """DPO learning rate"""
    pair_samples: int = 16
    """weak-base episodes per train task from which preference pairs are made"""
    dpo_eval_every: int = 25
    """evaluate DPO every this many steps"""
    rl: RLConfig = field(default_factory=lambda: RLConfig(steps=60, tasks_per_step=8, group_size=8, length_buckets=4))
    """REINFORCE with a group-mean baseline; RL only runs `rl.steps`, SFT -> RL runs `rl.steps - cold_start_step`"""
    rl_lr: float = 1e-3
    """RL learning rate"""
    rl_eval_every: int = 10
    """evaluate RL every this many steps"""
    eval_samples: int = 4
    """episodes per task at every evaluation point (80 train, 40 held-out)"""
    describe_samples: int = 8
    """episodes per task for a stage's final description (pass, invalid, reads, entropy)"""
    probe_group: int = 8
    """A10: episodes per held-out task when counting groups with reward variance"""
    threads: int = 1
    """torch threads per process: the model is too small to gain from more, and OpenMP
    spin-waiting makes 2 threads many times slower whenever another process is busy"""
    checkpoint_every: int = 0
    """also checkpoint a stage every this many of its steps (0: only on Ctrl-C / SIGTERM); a rerun resumes it"""
    workers: int = 2
    """processes for independent stages (1: everything in this process)"""
    stages: list[str] = field(default_factory=list)
    """stages to (re)run even if their results exist; empty: run what is missing"""

    def __post_init__(self) -> None:
        unknown = set(self.stages) - set(STAGES)
        if unknown:
            raise ValueError(f"unknown stages {sorted(unknown)}; known: {', '.join(STAGES)}")
        if not 0 < self.cold_start_step < self.rl.steps:
            raise ValueError("cold_start_step must be between 0 and rl.steps")
        check_ranges(self, "agent",
                     counts=("workers", "threads", "dim", "n_layers", "n_heads", "max_turns", "max_action_tokens",
                             "weak_play_seeds", "pair_samples", "dpo_eval_every", "rl_eval_every", "eval_samples",
                             "describe_samples", "probe_group"),
                     non_negative=("hack_rounds", "dpo_nll_weight", "checkpoint_every"),
                     positive=("sft_lr", "dpo_lr", "rl_lr"))
        if self.dim % self.n_heads:
            raise ValueError(f"agent: dim={self.dim} is not divisible by n_heads={self.n_heads}")

    def eval_seed(self, k: int = 0) -> int:
        """Seed of evaluation k: the same episodes' random numbers at every evaluation point."""
        return self.seed * 1_000_003 + 17 + 2 * k


# --- shared pieces ---------------------------------------------------------------------
def new_model(config: Config, gym: Gym) -> TinyTransformer:
    torch.manual_seed(config.seed)
    return TinyTransformer(TinyConfig(gym.tok.vocab_size, config.dim, config.n_layers, config.n_heads, max_len=512))


def load_engine(run_dir: Path, checkpoint: str, lr: float) -> LocalEngine:
    """A fresh optimizer on the weights of run_dir/<checkpoint> (a stage's checkpoint or a snapshot)."""
    model, _ = load_model(run_dir / checkpoint)
    return LocalEngine(model, OptimConfig(lr=lr))


def seeded(loop_config, config: Config, offset: int):
    """The loop's config with its seed derived from the experiment's one seed."""
    return dataclasses.replace(loop_config, seed=config.seed * 1_000_003 + offset)


def evaluator(engine: LocalEngine, gym: Gym, config: Config, logger: MetricsLogger, stage: str,
              curve: list, offset: int = 0, resuming: bool = False) -> Callable[[int], dict]:
    """evaluate(step) for a loop; also appends (offset + step, metrics) to `curve`. Logs step 0 now
    (unless `resuming`: the checkpoint's curve already has it)."""

    def ev(step: int) -> dict:
        m = evaluate(engine, gym, config.eval_samples, config.eval_seed())
        curve.append({"step": offset + step, **m})
        return m

    if not resuming:
        logger.log(0, ev(0), stage=stage)
    return ev


def checkpointer(config: Config, run_dir: Path, stage: str) -> Checkpointer:
    """The stage's resume state, `run_dir/<stage>/resume` (removed once the stage's results are written)."""
    return Checkpointer(run_dir / stage / "resume", config.checkpoint_every)


def counting(collect, costs: dict) -> Callable:
    """Wrap a collect to count sampled episodes and verifier calls (submits) for the cost table."""

    def wrapped(tasks, n, g):
        trajs = collect(tasks, n, g)
        costs["sampled"] = costs.get("sampled", 0) + len(trajs)
        costs["verifier_calls"] = costs.get("verifier_calls", 0) + sum(t.info["submitted"] for t in trajs)
        return trajs

    return wrapped


# --- stages: (config, run_dir, gym, logger) -> results dict ------------------------------------
def weak_base(config: Config, run_dir: Path, gym: Gym, logger: MetricsLogger) -> dict:
    """A2: SFT a fresh model on format-correct, skill-free play (blind + random)."""
    seeds = [config.seed * 100 + s for s in range(config.weak_play_seeds)]
    play = scripted_play(gym, "blind", seeds, gym.train) + scripted_play(gym, "random", seeds, gym.train)
    engine = LocalEngine(new_model(config, gym), OptimConfig(lr=config.sft_lr))
    with checkpointer(config, run_dir, "weak_base") as ck:
        train_sft(engine, play, seeded(config.weak, config, 1), gym.pad_id, logger, stage="weak_base", checkpointer=ck)
    save_model(run_dir / "weak_base" / "checkpoint", engine.model, gym.tok, meta={"stage": "weak_base"})
    return {"describe": describe(engine, gym, config.describe_samples, config.eval_seed(1)),
            "scripted_episodes": len(play), "blind_pass": sum(t.reward for t in play[: len(play) // 2]) / (len(play) // 2)}


def oracle_sft(config: Config, run_dir: Path, gym: Gym, logger: MetricsLogger) -> dict:
    """A3 + A10: SFT on oracle demos, evaluating and snapshotting every `oracle.eval_every` steps."""
    engine = load_engine(run_dir, "weak_base/checkpoint", config.sft_lr)
    demos = scripted_play(gym, "oracle", [config.seed], gym.train)
    ck = checkpointer(config, run_dir, "oracle_sft")
    curve, probes = ck.keep("curve", []), ck.keep("probes", {})
    if not ck.has_checkpoint:
        probes["0"] = probe(engine, gym, config.probe_group, config.eval_seed(2))
    ev = evaluator(engine, gym, config, logger, "oracle_sft", curve, resuming=ck.has_checkpoint)

    def ev_and_snapshot(step: int) -> dict:
        save_model(run_dir / "oracle_sft" / f"step-{step}", engine.model, gym.tok, meta={"stage": "oracle_sft", "step": step})
        if step in (config.cold_start_step, config.oracle.steps):
            probes[str(step)] = probe(engine, gym, config.probe_group, config.eval_seed(2))
        return ev(step)

    with ck:
        train_sft(engine, demos, seeded(config.oracle, config, 2), gym.pad_id, logger, ev_and_snapshot,
                  stage="oracle_sft", checkpointer=ck)
    save_model(run_dir / "oracle_sft" / "checkpoint", engine.model, gym.tok, meta={"stage": "oracle_sft"})
    return {"curve": curve, "probes": probes, "demos": len(demos),
            "describe": describe(engine, gym, config.describe_samples, config.eval_seed(1))}


def _expert_iteration(config: Config, run_dir: Path, gym: Gym, logger: MetricsLogger, stage: str,
                      reward: str, rounds: int, evaluate_fn) -> dict:
    """Expert iteration from the weak base; records what every round sampled and kept."""
    engine = load_engine(run_dir, "weak_base/checkpoint", config.sft_lr)
    ck = checkpointer(config, run_dir, stage)
    summaries, costs, curve = ck.keep("summaries", []), ck.keep("costs", {}), ck.keep("curve", [])
    collect = counting(gym.collect(engine, reward), costs)

    def recording(tasks, n, g):
        trajs = collect(tasks, n, g)
        summaries.append(rft_round_summary(trajs))
        return trajs

    if not ck.has_checkpoint:
        first = evaluate_fn(engine)
        logger.log(0, first, stage=stage)
        curve.append({"step": 0, **first})
    cfg = seeded(dataclasses.replace(config.rft, rounds=rounds), config, 3 if reward == "hidden" else 4)
    with ck:
        rows = train_rft(engine, gym.train, recording, cfg, gym.pad_id, logger, lambda step: evaluate_fn(engine),
                         stage=stage, checkpointer=ck)
    curve += [{"step": r["step"], **{k: v for k, v in r.items() if k.startswith("eval/")}} for r in rows]
    save_model(run_dir / stage / "checkpoint", engine.model, gym.tok, meta={"stage": stage})
    return {"curve": curve, "rounds": summaries, "costs": costs, "engine": engine}


def rft(config: Config, run_dir: Path, gym: Gym, logger: MetricsLogger) -> dict:
    """A5 + A12: 4 rounds of sample -> keep successes -> SFT, from the weak base, no demonstrations."""
    out = _expert_iteration(config, run_dir, gym, logger, "rft", "hidden", config.rft.rounds,
                            lambda e: evaluate(e, gym, config.eval_samples, config.eval_seed()))
    engine = out.pop("engine")
    return {**out, "describe": describe(engine, gym, config.describe_samples, config.eval_seed(1))}


def hacking(config: Config, run_dir: Path, gym: Gym, logger: MetricsLogger) -> dict:
    """A13: expert iteration whose filter is the public tests (the reward the exploit games)."""

    def public_vs_hidden(engine: LocalEngine) -> dict:
        trajs = episodes(engine, gym, gym.train, config.eval_samples, config.eval_seed(), reward="public")
        n = len(trajs)
        return {"eval/public_pass_rate": sum(t.info["public_pass"] for t in trajs) / n,
                "eval/hidden_pass_rate": sum(t.info["hidden_pass"] and t.info["submitted"] for t in trajs) / n}

    out = _expert_iteration(config, run_dir, gym, logger, "hacking", "public", config.hack_rounds, public_vs_hidden)
    out.pop("engine")
    return out


def _dpo(config: Config, run_dir: Path, gym: Gym, logger: MetricsLogger, stage: str, nll_weight: float) -> dict:
    """A7 / A8: pairs from one weak-base sample (same pairs for both stages), weak base as reference."""
    engine = load_engine(run_dir, "weak_base/checkpoint", config.dpo_lr)
    sample = episodes(engine, gym, gym.train, config.pair_samples, config.seed * 1_000_003 + 5)
    pairs = preference_pairs(sample, gym.train, config.seed)
    ck = checkpointer(config, run_dir, stage)
    curve = ck.keep("curve", [])
    ev = evaluator(engine, gym, config, logger, stage, curve, resuming=ck.has_checkpoint)
    cfg = seeded(dataclasses.replace(config.dpo, nll_weight=nll_weight), config, 5)
    with ck:
        rows = train_dpo(engine, pairs, cfg, gym.pad_id, logger, ev, config.dpo_eval_every, stage=stage,
                         checkpointer=ck) if pairs else []
    drift = {r["step"]: (r["dpo/chosen_logp_drift"], r["dpo/rejected_logp_drift"]) for r in rows}
    for point in curve:
        point["d_chosen"], point["d_rejected"] = drift.get(point["step"], (0.0, 0.0))
    save_model(run_dir / stage / "checkpoint", engine.model, gym.tok, meta={"stage": stage})
    return {"curve": curve, "pairs": len(pairs), "pair_tasks": len({c.info["task"] for c, _ in pairs}),
            "costs": {"sampled": len(sample), "verifier_calls": sum(t.info["submitted"] for t in sample)}}


def dpo(config: Config, run_dir: Path, gym: Gym, logger: MetricsLogger) -> dict:
    return _dpo(config, run_dir, gym, logger, "dpo", 0.0)


def dpo_nll(config: Config, run_dir: Path, gym: Gym, logger: MetricsLogger) -> dict:
    return _dpo(config, run_dir, gym, logger, "dpo_nll", config.dpo_nll_weight)


def _rl(config: Config, run_dir: Path, gym: Gym, logger: MetricsLogger, stage: str, start: str, offset: int) -> dict:
    """A9: REINFORCE with a group-mean baseline; curve steps count the SFT steps before it (`offset`)."""
    engine = load_engine(run_dir, start, config.rl_lr)
    ck = checkpointer(config, run_dir, stage)
    costs, curve = ck.keep("costs", {}), ck.keep("curve", [])
    ev = evaluator(engine, gym, config, logger, stage, curve, offset, resuming=ck.has_checkpoint)
    cfg = seeded(dataclasses.replace(config.rl, steps=config.rl.steps - offset), config, 6 + offset)
    with ck:
        train_rl(engine, gym.train, counting(gym.collect(engine), costs), cfg, gym.pad_id, logger, ev,
                 config.rl_eval_every, stage=stage, checkpointer=ck)
    save_model(run_dir / stage / "checkpoint", engine.model, gym.tok, meta={"stage": stage})
    return {"curve": curve, "costs": costs, "describe": describe(engine, gym, config.describe_samples, config.eval_seed(1))}


def sft_rl(config: Config, run_dir: Path, gym: Gym, logger: MetricsLogger) -> dict:
    return _rl(config, run_dir, gym, logger, "sft_rl", f"oracle_sft/step-{config.cold_start_step}", config.cold_start_step)


def rl_only(config: Config, run_dir: Path, gym: Gym, logger: MetricsLogger) -> dict:
    return _rl(config, run_dir, gym, logger, "rl_only", "weak_base/checkpoint", 0)


def diagnostics(config: Config, run_dir: Path, gym: Gym, logger: MetricsLogger) -> dict:
    """A1 (owners, loss at init), A4 (gradient identity on a weak-base sample), A6 (dpo_loss values)."""
    demos = scripted_play(gym, "oracle", [config.seed], gym.train)
    fresh = LocalEngine(new_model(config, gym))
    weak = load_engine(run_dir, "weak_base/checkpoint", config.sft_lr)
    sample = episodes(weak, gym, gym.train, config.eval_samples, config.seed * 1_000_003 + 7)
    return {"a1": diag.owners_and_init_loss(fresh, demos, gym.pad_id, gym.tok.vocab_size),
            "a4": diag.gradient_identity(weak, sample, gym.pad_id), "a6": diag.dpo_values()}


def template_mismatch(config: Config, run_dir: Path, gym: Gym, logger: MetricsLogger) -> dict:
    """A11: the oracle SFT run on demos rendered without wrapper tokens, measured in the real format."""
    engine = load_engine(run_dir, "weak_base/checkpoint", config.sft_lr)
    wrong = scripted_play(gym, "oracle", [config.seed], gym.train, renderer=gym.renderer.__class__(gym.tok, wrappers=False))
    right = scripted_play(gym, "oracle", [config.seed], gym.train)
    cfg = dataclasses.replace(seeded(config.oracle, config, 2), eval_every=0)
    with checkpointer(config, run_dir, "template_mismatch") as ck:
        train_sft(engine, wrong, cfg, gym.pad_id, logger, stage="template_mismatch", checkpointer=ck)
    save_model(run_dir / "template_mismatch" / "checkpoint", engine.model, gym.tok, meta={"stage": "template_mismatch"})
    return {"describe": describe(engine, gym, config.describe_samples, config.eval_seed(1)),
            "nll_right_format": diag.nll(engine, right, gym.pad_id), "example": gym.tok.decode(wrong[0].ids[:12])}


GENERALIZATION = ("oracle_sft", "rft", "sft_rl", "rl_only")


def generalization(config: Config, run_dir: Path, gym: Gym, logger: MetricsLogger) -> dict:
    """Where the held-out gap comes from: each final policy on the training tasks renamed to held-out
    names (code unchanged; `make_tasks("renamed")`), with the random numbers of its `describe` train
    episodes, so train -> renamed is what unseen names cost and renamed -> held-out what unseen code costs."""
    renamed = make_tasks("renamed")
    out = {}
    for stage in GENERALIZATION:
        engine = load_engine(run_dir, f"{stage}/checkpoint", config.sft_lr)
        out[stage] = pass_rate(episodes(engine, gym, renamed, config.describe_samples, config.eval_seed(1)))
    return {"renamed": out}


# name -> (stage function, stages whose checkpoints it loads); dict order is scheduling priority
STAGES: dict[str, tuple[Callable, tuple[str, ...]]] = {
    "weak_base": (weak_base, ()),
    "oracle_sft": (oracle_sft, ("weak_base",)),
    "rl_only": (rl_only, ("weak_base",)),
    "sft_rl": (sft_rl, ("oracle_sft",)),
    "dpo": (dpo, ("weak_base",)),
    "dpo_nll": (dpo_nll, ("weak_base",)),
    "rft": (rft, ("weak_base",)),
    "hacking": (hacking, ("weak_base",)),
    "template_mismatch": (template_mismatch, ("weak_base",)),
    "diagnostics": (diagnostics, ("weak_base",)),
    "generalization": (generalization, GENERALIZATION),
}


def run_stage(name: str, config: Config, run_dir: Path) -> dict:
    """Run one stage in this process; writes and returns its results (plus wall / CPU / sampling seconds)."""
    torch.set_num_threads(config.threads)
    gym = Gym(config.max_turns, config.max_action_tokens)
    clock = StageClock(run_dir / name / "resume")  # times add up over a stage cut short and resumed
    with MetricsLogger(run_dir) as logger:
        if not checkpointer(config, run_dir, name).has_checkpoint:  # a (re)run from scratch replaces its rows
            logger.drop_after(name, -1)
        try:
            results = STAGES[name][0](config, run_dir, gym, logger)
        except KeyboardInterrupt:
            clock.save(sampling_s=gym.sampling_seconds)
            raise
    results["time"] = clock.totals(sampling_s=gym.sampling_seconds)
    (run_dir / name).mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=1)
    (run_dir / name / "results.json").write_text(text)
    shutil.rmtree(run_dir / name / "resume", ignore_errors=True)  # finished: a forced rerun starts afresh
    return json.loads(text)  # the same types whether a stage ran now or was read back


def run_stages(config: Config, run_dir: Path) -> dict[str, dict]:
    """Every stage, dependencies first; independent stages in `config.workers` processes."""
    results, todo = {}, []
    for name in STAGES:
        f = run_dir / name / "results.json"
        if f.exists() and name not in config.stages:
            results[name] = json.loads(f.read_text())
        else:
            todo.append(name)
    ready = lambda n: all(d in results for d in STAGES[n][1])  # noqa: E731
    if config.workers == 1:
        while todo:
            name = next(n for n in todo if ready(n))
            todo.remove(name)
            results[name] = _announce(name, run_stage(name, config, run_dir))
        return results
    with forward_to_children(), ProcessPoolExecutor(config.workers, mp_context=get_context("spawn")) as pool:
        running = {}
        while todo or running:
            for name in [n for n in todo if ready(n)][: config.workers - len(running)]:
                todo.remove(name)
                running[pool.submit(run_stage, name, config, run_dir)] = name
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                name = running.pop(fut)
                results[name] = _announce(name, fut.result())
    return results


def _announce(name: str, results: dict) -> dict:
    t = results["time"]
    print(f"  stage {name:<18} {t['wall_s']:6.1f}s wall, {t['cpu_s']:6.1f}s CPU, "
          f"{t['sampling_s'] / max(t['wall_s'], 1e-9):4.0%} sampling", flush=True)
    return results


def run(config: Config, run_dir: Path) -> Path:
    """The whole comparison for one seed -> path of report.md."""
    from .agent_report import write_agent_report

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(to_dict(config), indent=1))
    print(f"agent comparison (seed {config.seed}): {len(STAGES)} stages, {config.workers} worker(s)", flush=True)
    t0 = time.perf_counter()
    results = run_stages(config, run_dir)
    return write_agent_report(config, run_dir, results, time.perf_counter() - t0)


def run_seeds(config: Config, run_dir: Path, seeds: list[int]) -> Path:
    """The comparison once per seed (run_dir/seed-<s>/), then a mean +- sd report in run_dir."""
    from .agent_report import write_seeds_report

    run_dir = Path(run_dir)
    per_seed = {}
    for s in seeds:
        per_seed[s] = run(dataclasses.replace(config, seed=s), run_dir / f"seed-{s}")
        print(per_seed[s], flush=True)
    return write_seeds_report(run_dir, {s: json.loads((p.parent / "summary.json").read_text()) for s, p in per_seed.items()})
