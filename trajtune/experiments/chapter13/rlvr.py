"""Post-training ch.13 step 4 (REPRODUCE B6-B7): RL on a verifiable reward, and the SFT control.

    B6  coldstart  the calculator's cold start (`experiments.shared.calculator.stage_coldstart`)
        grpo       GRPO from it: 200 steps x 32 prompts x 8 samples, (R - mean)/(std + 1e-4),
                   one update per batch (nothing to clip), no KL -- as in the seed
    B7  control    200 more SFT steps on fresh worked examples instead of RL

Evaluation: `experiments.shared.calculator.math_eval`. GRPO also logs, per step, the share of groups whose 8
rewards are all equal (no signal for a group baseline).
"""

from __future__ import annotations

import copy

from ...algorithms.rl import train_rl
from ...algorithms.sft import train_sft
from ...envs.arithmetic import train_tasks
from ...models.tiny import load_model
from ...text.render import Renderer
from ...seeding import derive
from ..shared.calculator import answer_sampling, demos, math_eval, source_for


GRPO_READS = ("seed", "rl", "rl_optim", "sampling", "pass_k")
"""the config fields `stage_grpo` reads (`Stage.reads`)"""
CONTROL_READS = ("seed", "control", "calc_optim", "pass_k")
"""the config fields `stage_sft_control` reads"""


def stage_grpo(ctx) -> dict:
    """B6, second half: GRPO from the cold start; per-step reward and share of groups without signal
    (rollout/no_signal_share, in every step's row)."""
    config = ctx.config
    model, tok = load_model(ctx.run_dir / "coldstart" / "model")
    r = Renderer(tok)
    engine = ctx.engine(model, config.rl_optim)
    tasks = train_tasks(config.rl.steps * config.rl.tasks_per_step, seed=config.seed + 1)
    with source_for(engine, r, answer_sampling(config.sampling), rl=config.rl) as source:
        history = train_rl(engine, tasks, source, config.rl, tok.pad_id, ctx.run())
    return {**math_eval(engine, r, config.pass_k, derive(config.seed, 5, stride=7919)),
            "curve": [(h["step"], h["rollout/reward"], h["rollout/no_signal_share"]) for h in history]}


def stage_sft_control(ctx) -> dict:
    """B7: the same start, more SFT steps (200) on fresh worked examples instead of RL."""
    config = ctx.config
    model, tok = load_model(ctx.run_dir / "coldstart" / "model")
    r = Renderer(tok)
    engine = ctx.engine(copy.deepcopy(model), config.calc_optim)
    data = demos(r, train_tasks(config.control.steps * config.control.batch_size, seed=config.seed + 2))
    train_sft(engine, data, config.control, tok.pad_id, ctx.run())
    return math_eval(engine, r, config.pass_k, derive(config.seed, 5, stride=7919))
