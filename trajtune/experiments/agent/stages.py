"""The agent experiment's stages: `fn(ctx) -> results`, run by `trajtune.runs.stages.run_stages`.

Each stage reads the checkpoints of the stages it waits for from `ctx.run_dir`, trains
through `ctx.engine` / `ctx.run` (metrics, evaluation, resume: the stage runner's job),
saves its policy with `ctx.save_model` and returns JSON-able results. What a stage keeps
beside its loop (curves, probes) goes through `ctx.keep`, so a stage cut short resumes
with it; what a draw cost comes with its episodes (a `Measured` source's cost/* metrics, in
the loop's rows). Every loop seed is `seeded(loop config, config.seed, offset)`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

from ...algorithms.dpo import train_dpo
from ...algorithms.rft import train_rft
from ...algorithms.rl import train_rl
from ...algorithms.sft import train_sft
from ...envs.bugfix_tasks import make_tasks
from ...runs.stages import StageContext
from ...runs.hooks import Hook
from ..bugfix import (Gym, costs, describe, measured, episodes, eval_seed, evaluate, load_engine, new_model, pass_rate,
                      pass_sources, preference_pairs, probe, rft_round_summary, scripted_play, seeded, stage_gym,
                      total_costs, train_weak_base)
from . import diagnostics as diag
from ...seeding import derive

if TYPE_CHECKING:
    from . import Config


def _gym(ctx: StageContext) -> Gym:
    return stage_gym(ctx, ctx.config.max_turns, ctx.config.max_action_tokens, ctx.config.episode_seeds)


def _model(config: Config, gym: Gym):
    return new_model(config.seed, gym, config.dim, config.n_layers, config.n_heads, config.tied, config.positions)


def _describe(engine, gym: Gym, config: Config) -> dict:
    return describe(engine, gym, config.describe_samples, eval_seed(config.seed, 1))


def evaluator(ctx: StageContext, engine, gym: Gym, curve: list, offset: int = 0) -> Callable[[int], dict]:
    """evaluate(step) for a loop; also appends (offset + step, metrics) to `curve`. Logs step 0 now
    (unless the stage resumes: the checkpoint's curve already has it)."""
    config = ctx.config

    def ev(step: int) -> dict:
        m = evaluate(engine, gym, config.eval_samples, eval_seed(config.seed))
        curve.append({"step": offset + step, **m})
        return m

    if not ctx.resuming:
        ctx.log(0, ev(0))
    return ev


# --- stages ---------------------------------------------------------------------------------
def weak_base(ctx: StageContext) -> dict:
    """A2: SFT a fresh model on format-correct, skill-free play (blind + random)."""
    c = ctx.config
    return train_weak_base(ctx, _gym(ctx), c.seed, seeded(c.weak, c.seed, 1), c.sft_optim, play_seeds=c.weak_play_seeds,
                           describe_samples=c.describe_samples, dim=c.dim, n_layers=c.n_layers, n_heads=c.n_heads,
                           tied=c.tied, positions=c.positions, blind_spot=c.weak_blind_spot or None,
                           coverage_samples=c.coverage_samples)


def oracle_sft(ctx: StageContext) -> dict:
    """A3 + A10: SFT on oracle demos, evaluating and snapshotting every `oracle.eval_every` steps."""
    c, gym = ctx.config, _gym(ctx)
    engine = load_engine(ctx, "weak_base/checkpoint", c.sft_optim)
    demos = scripted_play(gym, "oracle", [c.seed], gym.train)
    curve, probes = ctx.keep("curve", []), ctx.keep("probes", {})
    if not ctx.resuming:
        probes["0"] = probe(engine, gym, c.probe_group, eval_seed(c.seed, 2))
    ev = evaluator(ctx, engine, gym, curve)

    def ev_and_snapshot(step: int) -> dict:
        ctx.save_model(engine.model, gym.tok, name=f"step-{step}", meta={"stage": ctx.name, "step": step})
        if step in (c.cold_start_step, c.oracle.steps):
            probes[str(step)] = probe(engine, gym, c.probe_group, eval_seed(c.seed, 2))
        return ev(step)

    train_sft(engine, demos, seeded(c.oracle, c.seed, 2), gym.pad_id, run=ctx.run(ev_and_snapshot))
    ctx.save_model(engine.model, gym.tok, meta={"stage": ctx.name})
    return {"curve": curve, "probes": probes, "demos": len(demos), "describe": _describe(engine, gym, c)}


class RoundSummaries(Hook):
    """What every round of expert iteration sampled and kept (A5, A12): `rft_round_summary` of its episodes."""

    def __init__(self, summaries: list):
        self.summaries = summaries

    def on_episodes(self, engine, step, trajs, batch=None, kept=None, every=None) -> None:
        self.summaries.append(rft_round_summary(trajs))


def _expert_iteration(ctx: StageContext, gym: Gym, reward: str, rounds: int, evaluate_fn) -> tuple[dict, object]:
    """Expert iteration from the weak base; records what every round sampled and kept -> (results, engine)."""
    c = ctx.config
    engine = load_engine(ctx, "weak_base/checkpoint", c.sft_optim)
    summaries, curve = ctx.keep("summaries", []), ctx.keep("curve", [])
    if not ctx.resuming:
        first = evaluate_fn(engine)
        ctx.log(0, first)
        curve.append({"step": 0, **first})
    cfg = seeded(dataclasses.replace(c.rft, rounds=rounds), c.seed, 3 if reward == "hidden" else 4)
    run = ctx.run(lambda step: evaluate_fn(engine), hooks=[RoundSummaries(summaries)])
    rows = train_rft(engine, gym.train, gym.source(engine, reward, measure=costs), cfg, gym.pad_id, run=run)
    curve += [{"step": r["step"], **{k: v for k, v in r.items() if k.startswith("eval/")}} for r in rows]
    ctx.save_model(engine.model, gym.tok, meta={"stage": ctx.name})
    return {"curve": curve, "rounds": summaries, "costs": total_costs(rows)}, engine


def rft(ctx: StageContext) -> dict:
    """A5 + A12: 4 rounds of sample -> keep successes -> SFT, from the weak base, no demonstrations."""
    c, gym = ctx.config, _gym(ctx)
    out, engine = _expert_iteration(ctx, gym, "hidden", c.rft.rounds,
                                    lambda e: evaluate(e, gym, c.eval_samples, eval_seed(c.seed)))
    return {**out, "describe": _describe(engine, gym, c)}


def hacking(ctx: StageContext) -> dict:
    """A13: expert iteration whose filter is the public tests (the reward the exploit games)."""
    c, gym = ctx.config, _gym(ctx)

    def public_vs_hidden(engine) -> dict:
        trajs = episodes(engine, gym, gym.train, c.eval_samples, eval_seed(c.seed), reward="public")
        n = len(trajs)
        return {"eval/public_pass_rate": sum(t.info["public_pass"] for t in trajs) / n,
                "eval/hidden_pass_rate": sum(t.info["hidden_pass"] and t.info["submitted"] for t in trajs) / n}

    return _expert_iteration(ctx, gym, "public", c.hack_rounds, public_vs_hidden)[0]


def _dpo(ctx: StageContext, nll_weight: float) -> dict:
    """A7 / A8: pairs from one weak-base sample (same pairs for both stages), weak base as reference."""
    c, gym = ctx.config, _gym(ctx)
    engine = load_engine(ctx, "weak_base/checkpoint", c.dpo_optim)
    sample = episodes(engine, gym, gym.train, c.pair_samples, derive(c.seed, 5))
    pairs = preference_pairs(sample, gym.train, c.seed)
    curve = ctx.keep("curve", [])
    ev = evaluator(ctx, engine, gym, curve)
    cfg = seeded(dataclasses.replace(c.dpo, nll_weight=nll_weight), c.seed, 5)
    rows = train_dpo(engine, pairs, cfg, gym.pad_id, run=ctx.run(ev)) if pairs else []
    drift = {r["step"]: (r["dpo/chosen_logp_drift"], r["dpo/rejected_logp_drift"]) for r in rows}
    for point in curve:
        point["d_chosen"], point["d_rejected"] = drift.get(point["step"], (0.0, 0.0))
    ctx.save_model(engine.model, gym.tok, meta={"stage": ctx.name})
    return {"curve": curve, "pairs": len(pairs), "pair_tasks": len({ch.info["task"] for ch, _ in pairs}),
            "costs": {"sampled": len(sample), "verifier_calls": sum(t.info["submitted"] for t in sample)}}


def dpo(ctx: StageContext) -> dict:
    return _dpo(ctx, 0.0)


def dpo_nll(ctx: StageContext) -> dict:
    return _dpo(ctx, ctx.config.dpo_nll_weight)


def _rl(ctx: StageContext, start: str, offset: int) -> dict:
    """A9: REINFORCE with a group-mean baseline; curve steps count the SFT steps before it (`offset`)."""
    c, gym = ctx.config, _gym(ctx)
    engine = load_engine(ctx, start, c.rl_optim)
    curve = ctx.keep("curve", [])
    ev = evaluator(ctx, engine, gym, curve, offset)
    cfg = seeded(dataclasses.replace(c.rl, steps=c.rl.steps - offset), c.seed, 6 + offset)
    with gym.source(engine, sampling=c.sampling, measure=measured, rl=c.rl) as source:
        rows = train_rl(engine, gym.train, source, cfg, gym.pad_id, run=ctx.run(ev))
    ctx.save_model(engine.model, gym.tok, meta={"stage": ctx.name})
    return {"curve": curve, "costs": total_costs(rows), "describe": _describe(engine, gym, c)}


def sft_rl(ctx: StageContext) -> dict:
    return _rl(ctx, f"oracle_sft/step-{ctx.config.cold_start_step}", ctx.config.cold_start_step)


def rl_only(ctx: StageContext) -> dict:
    return _rl(ctx, "weak_base/checkpoint", 0)


def diagnostics(ctx: StageContext) -> dict:
    """A1 (owners, loss at init), A4 (gradient identity on a weak-base sample), A6 (dpo_loss values)."""
    c, gym = ctx.config, _gym(ctx)
    demos = scripted_play(gym, "oracle", [c.seed], gym.train)
    fresh = ctx.engine(_model(c, gym))
    weak = load_engine(ctx, "weak_base/checkpoint", c.sft_optim)
    sample = episodes(weak, gym, gym.train, c.eval_samples, derive(c.seed, 7))
    return {"a1": diag.owners_and_init_loss(fresh, demos, gym.pad_id, gym.tok.vocab_size),
            "a4": diag.gradient_identity(weak, sample, gym.pad_id), "a6": diag.dpo_values()}


def template_mismatch(ctx: StageContext) -> dict:
    """A11: the oracle SFT run on demos rendered without wrapper tokens, measured in the real format."""
    c, gym = ctx.config, _gym(ctx)
    engine = load_engine(ctx, "weak_base/checkpoint", c.sft_optim)
    wrong = scripted_play(gym, "oracle", [c.seed], gym.train, renderer=gym.renderer.__class__(gym.tok, wrappers=False))
    right = scripted_play(gym, "oracle", [c.seed], gym.train)
    cfg = dataclasses.replace(seeded(c.oracle, c.seed, 2), eval_every=0)
    train_sft(engine, wrong, cfg, gym.pad_id, run=ctx.run())
    ctx.save_model(engine.model, gym.tok, meta={"stage": ctx.name})
    return {"describe": _describe(engine, gym, c), "nll_right_format": diag.nll(engine, right, gym.pad_id),
            "example": gym.tok.decode(wrong[0].ids[:12])}


GENERALIZATION = ("oracle_sft", "rft", "sft_rl", "rl_only")


def generalization(ctx: StageContext) -> dict:
    """Two probes beside the held-out split (unseen names over the training cues), for each final policy:
    `renamed`, the training tasks under held-out names (code unchanged), with the random numbers of its
    `describe` train episodes, so train -> renamed is what an unseen name alone costs; `novel`,
    variants of unseen code (operators, keywords, shapes no training listing shows), with the random
    numbers of its `describe` held-out episodes; and `heldout_sources`, where its `describe` held-out
    episodes' passes come from (`bugfix.pass_sources`: blind guesses, stacked blind edits, edits after a read)."""
    c, gym = ctx.config, _gym(ctx)
    renamed, novel = make_tasks("renamed"), make_tasks("novel")
    out: dict[str, dict] = {"renamed": {}, "novel": {}, "heldout_sources": {}}
    for stage in GENERALIZATION:
        engine = load_engine(ctx, f"{stage}/checkpoint", c.sft_optim)
        out["renamed"][stage] = pass_rate(episodes(engine, gym, renamed, c.describe_samples, eval_seed(c.seed, 1)))
        out["novel"][stage] = pass_rate(episodes(engine, gym, novel, c.describe_samples, eval_seed(c.seed, 1) + 1))
        # the held-out episodes of the final-policy evaluation again (`describe`'s random numbers): where they pass
        held = episodes(engine, gym, gym.heldout, c.describe_samples, eval_seed(c.seed, 1) + 1)
        out["heldout_sources"][stage] = pass_sources(held)
    return out
