"""RL on tasks from a task library (the adapters' recipes, `reasoning_gym.py` and `textarena.py`).

`train_and_score` trains the built-in model with the recipe's `rl` / `optim` settings on the train
tasks and scores the policy on the held-out ones (`evaluation.score_policy`) before, at every
`rl.eval_every` and after; `write_task_report` writes the report both recipes share; `game_vocabulary` gathers
what a TextArena game says to a scripted player (textarena.py and hf_gym.py build their vocabularies from it).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Callable, Sequence

from ..algorithms.rl import train_rl
from ..evaluation import score_policy
from ..runs.stages import StageContext
from ..sources.base import Source
from ..envs.base import Env
from ..sources.build import episode_source
from ..sources.sampling import SamplingConfig
from ..text.render import RendererProtocol


def train_and_score(ctx: StageContext, model, tok, make_env: Callable[[], Env], renderer: RendererProtocol,
                    experiment: str, train: Sequence, held_out: Sequence, describe: str, *, max_turns: int,
                    max_tokens: int, engine=None, measure: Callable[[list], dict[str, float]] | None = None,
                    episode_seeds: bool | None = None, sharded: bool = True, pad_id: int = 0, model_dir: str = "",
                    precision: str = "fp32", max_model_len: int | None = None) -> dict:
    """The stage's RL run on the task's episodes (`make_env`, `renderer`, `max_turns`, `max_tokens`), sampled as the
    recipe's sampling section says (`trajtune.sources.build.episode_source`; `measure`, `episode_seeds`, `sharded`,
    `pad_id` and, for vLLM, `model_dir`, `precision`, `max_model_len` go to it); `experiment` goes into the
    checkpoint's meta, `describe` heads the printed line. Optional: `engine`, the engine already built on `model`
    (default `ctx.engine(model, config.optim)`). The held-out evaluation samples with the built-in sampler on the
    trainer's weights, on-policy, drawing as the training sampler does.
    -> {"before", "after": held-out eval/reward and eval/pass@1, "curve": [(step, train reward, held-out
    reward, held-out pass@1), ...]}. The policy is saved as the stage's checkpoint."""
    config = ctx.config
    engine = engine if engine is not None else ctx.engine(model, config.optim)
    s = config.sampling
    drawn = s.settings()
    here = s.in_trainer(backend="sampler", draw=drawn.draw, share_prompts=drawn.share_prompts)
    seeds = s.own_seeds if episode_seeds is None else episode_seeds  # the evaluation draws as the training does

    def source(section: SamplingConfig) -> Source:
        return episode_source(section, engine, make_env, renderer, experiment, max_turns=max_turns,
                              max_tokens=max_tokens, pad_id=pad_id, measure=measure, rl=config.rl,
                              episode_seeds=seeds, sharded=sharded, model_dir=model_dir, precision=precision,
                              seed=config.rl.seed, max_model_len=max_model_len, stage_dir=ctx.dir)

    evaluation = source(here)  # the current weights, here

    def evaluate(step: int) -> dict:
        return score_policy(evaluation, held_out, n=config.eval_samples, ks=(1,), seed=1).metrics()

    before = evaluate(0)
    if engine.is_main:
        print(f"{describe}: {model.num_parameters():,} parameters, {len(train)} train / {len(held_out)} held-out "
              f"tasks; held-out reward {before['eval/reward']:.3f} before")
    with source(s) as training:
        history = train_rl(engine, train, training, config.rl, tok.pad_id, ctx.run(evaluate))
    ctx.save_model(model, tok, "checkpoint", meta={"experiment": experiment})
    curve = [(r["step"], r["rollout/reward"], r["eval/reward"], r["eval/pass@1"])
             for r in history if "eval/reward" in r]
    return {"before": before, "after": {k: history[-1][k] for k in ("eval/reward", "eval/pass@1")}, "curve": curve}


def write_task_report(run_dir: Path, title: str, headline: str, pass_label: str, result: dict,
                      extra: Sequence[str] = ()) -> Path:
    """report.md: the title, held-out reward and pass@1 before -> after, `extra` lines, the curve table, and the link
    to view.html (written here when the run recorded episodes); prints the headline and `extra`, no table."""
    b, a = result["before"], result["after"]
    lines = [f"# {title}", "",
             f"{headline}: **{b['eval/reward']:.3f} -> {a['eval/reward']:.3f}**; {pass_label} (pass@1) "
             f"{b['eval/pass@1']:.3f} -> {a['eval/pass@1']:.3f}", "", *extra,
             f"| step | train reward | held-out reward | held-out {pass_label} |", "|---|---|---|---|"]
    lines += [f"| {s} | {tr:.3f} | {ev:.3f} | {p:.3f} |" for s, tr, ev, p in result["curve"]]
    from ..runs.report import episodes_note
    from ..runs.view import write_view_if_recorded

    write_view_if_recorded(run_dir)  # the RL stage's episodes, token by token; the report links it
    note = episodes_note(Path(run_dir))
    lines += ["", note] if note else []
    report = Path(run_dir) / "report.md"
    report.write_text("\n".join(lines) + "\n")
    print("\n".join([lines[2].replace("**", ""), *extra]).rstrip() + "\n(the curve: report.md)")  # no markdown table
    return report


GUESS_MOVES = [str(n) for n in range(1, 21)]
"""the valid moves of GuessTheNumber (the textarena recipe's default game) a scripted player tries"""
GUESS_BAD_MOVES = ["?", "0"]
"""invalid ones it tries too (a malformed one, one out of range)"""


def game_vocabulary(tasks, action_template: str, game_kwargs: dict, moves: Sequence[str], bad_moves: Sequence[str],
                    seed: int) -> list[str]:
    """Every message the games sent to a scripted random player (seeded), plus the moves: it makes each
    invalid move of `bad_moves` (then a valid one, so the game goes on), repeats a guess, then plays valid
    moves in random order until the game ends."""
    from ..envs.adapters.textarena import TextArenaEnv

    rng, texts = random.Random(seed), list(moves)
    for task in tasks:
        env = TextArenaEnv(action_template, **game_kwargs)
        texts.append(env.reset(task))
        valid = rng.sample(moves, len(moves))
        moves_played = [m for bad in bad_moves for m in (bad, valid[0])] + valid  # every kind of warning, then play
        for move in moves_played:
            observation, _, done, info = env.step(move)
            texts += [observation, info.get("reason", "")]
            if done:
                break
    return texts
