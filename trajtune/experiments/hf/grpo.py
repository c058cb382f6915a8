"""`trajtune grpo` / experiment "hf_grpo": RL with a reward function (GRPO, RLOO, REINFORCE, PPO ...).

    trajtune grpo --model runs/sft/model --data prompts.jsonl --reward my_rewards.py:exact --out runs/grpo

    trajtune grpo ... --reward my_rewards.py:exact --reward my_rewards.py:short --reward-weights 1 0.2
    trajtune grpo ... --reward-model runs/rm/model --reward my_rewards.py:short --reward-weights 1 0.5

Data: rows with a 'prompt' (+ any columns the reward functions read, trajtune.sources.data). A reward is a
TRL-style function `fn(prompts, completions, completion_ids, **columns) -> list[float | None]`
called once per batch (trajtune.sources.rewards), or a reward model saved by `trajtune rm`; with several,
an episode's reward is their --reward-weights sum (trajtune.experiments.hf.sampling).
One stage, "grpo": `train_rl` with every setting of `RLConfig` (--advantage, --surrogate,
--epochs, --kl-coef, --length-buckets ...); completions are sampled with the sampling
section, sharded over processes under torchrun.

What differs from the GRPO paper: with one update per batch of samples (--epochs 1
--minibatches 1) the clipped ratio is 1 and the clipped objective has the plain policy
gradient, so the default surrogate is that (--surrogate reinforce, one forward fewer);
reusing a batch needs --surrogate ppo (or cispo). The KL to the reference is off by
default (--kl-coef 0; the paper uses 0.04).

Over-optimization (RLHF book ch.14): with --gold-reward, the run's evaluation is the probe of
`trajtune.overoptimization`, before the first step, every --eval-every steps and after the last:

    trajtune grpo ... --reward-model runs/rm/model --gold-reward judge.py:strict --eval-every 10

samples --eval-samples completions of each of the first --eval-prompts prompts from one fixed seed, and
logs overopt/proxy (the run's own reward: its --reward functions and --reward-model, weighted),
overopt/gold (the first --gold-reward; each one as overopt/gold/<name> when there are several) and
overopt/kl (sampled KL to the starting policy, nats per completion). The gold functions are never
trained on. The probe scores with its own copy of the run's reward sources (a --reward-model is loaded
once more) and samples with the built-in sampler under --backend vllm.

Offline difficulty filter (RLHF book ch.7.3): with --difficulty-filter LOW HIGH, before the first step the starting
policy samples --difficulty-samples completions of every prompt (the sampling section; the built-in sampler under
--backend vllm), the run's rewards score them, and only the prompts whose solve rate (reward >= --difficulty-solved-at)
lies in [LOW, HIGH] are trained on -- the book's 20-80%, `--difficulty-filter 0.2 0.8 --difficulty-samples 16`
(`trajtune.sources.difficulty.filter_by_difficulty`, seeded from --seed). The counts are printed, logged at step 0
(difficulty/kept, difficulty/dropped, difficulty/unscored, difficulty/mean_rate) and written with every prompt's
rate to grpo/difficulty.json. A resumed run filters again, the same way (the starting policy, the same seed).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar, get_type_hints

from ...algorithms.rl import RLConfig, train_rl
from ...engine import OptimConfig
from ...seeding import derive
from ...overoptimization import OverOptProbe, episode_rewards, graders_of
from ...sources.rewards import RewardFunction, check_columns, unique_names
from ...metrics import register
from .common import announce, check_run, finish, hf_optim, OutputConfig, stage_run
from .recipe import preflight, run_method
from .model import load_engine
from ...sources.endpoint.agents import AgentConfig, load_agent
from ...sources.sampling import SamplingConfig
from .graders import check_grader_inputs
from .sampling import PromptRewardRun, check_sampling, prompt_source
from .prepare import Prepared, fit, prompt_data

Advantage = get_type_hints(RLConfig)["advantage"]

register("difficulty/kept", "--difficulty-filter: prompts whose solve rate under the starting policy is in the range")
register("difficulty/dropped", "--difficulty-filter: prompts outside the range (or with no scored completion)")
register("difficulty/unscored", "--difficulty-filter: prompts none of whose completions could be scored (dropped)")
register("difficulty/mean_rate", "--difficulty-filter: mean solve rate of the scored prompts before filtering")


@dataclass
class GRPORun(PromptRewardRun):
    METHOD: ClassVar[str] = "grpo"
    RESUMABLE: ClassVar[tuple[str, ...]] = ("rl.steps", "rl.eval_every", "output.save_every", "model.device",
                                            "model.micro_batch_size", "reward_timeout")
    """options a resumed run may change (more steps, where it runs); any other change is a different run"""

    rl: RLConfig = field(default_factory=lambda: RLConfig(steps=100, advantage="grpo"))
    """the RL loop (steps, tasks_per_step: prompts per step, group_size: completions per prompt, advantage,
    surrogate, epochs, kl_coef, seed ...)"""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """how and where completions are sampled: here (default), in a sampler process (--sampler-process), or there
    one step ahead while this one trains (--max-staleness 1, with --tis-cap); --backend vllm: in vLLM"""
    optim: OptimConfig = field(default_factory=hf_optim)
    """AdamW (lr 1e-5)"""
    output: OutputConfig = field(default_factory=OutputConfig)
    """what the run writes and when (checkpoints every --save-every steps ...)"""
    gold_reward: list[str] = field(default_factory=list)
    """gold reward functions 'file.py:function' (one or more, as --reward), never trained on: with them the run's
    evaluation is the over-optimization probe (before the first step, every --eval-every steps and after the last:
    overopt/proxy, the run's reward; overopt/gold, the first of these; overopt/kl, to the starting policy)"""
    eval_prompts: int = 16
    """the over-optimization probe's prompts: the first this many prompt rows of --data, the same every evaluation"""
    eval_samples: int = 4
    """completions the over-optimization probe samples per prompt (from one fixed seed)"""
    ptx_data: str = ""
    """PPO-ptx's pretraining rows (RLHF book ch.15): 'messages' or 'prompt'+'completion' rows whose NLL, weighted by
    --ptx-coef, is added before every optimizer step (--ptx-batch-size rows each)"""
    difficulty_filter: list[float] = field(default_factory=list)
    """LOW HIGH: before training, keep only the prompts the starting policy solves a share in [LOW, HIGH] of the
    time over --difficulty-samples completions (RLHF book ch.7.3: 0.2 0.8); empty: every prompt"""
    difficulty_samples: int = 16
    """--difficulty-filter: completions sampled per prompt to measure its solve rate"""
    difficulty_solved_at: float = 1.0
    """--difficulty-filter: a completion solves its prompt when its reward is >= this"""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """--agent FILE.py:FUNCTION: each episode is that agent program's session with an OpenAI-compatible endpoint the
    run serves over its sampler (trajtune.sources.endpoint: run(task, base_url, session) -> reward, or None for the
    --reward sources to score its last reply); the prompt rows are its tasks"""

    def __post_init__(self) -> None:
        check_run(self, "grpo")
        if self.eval_prompts < 1 or self.eval_samples < 1:
            raise ValueError(f"grpo: --eval-prompts and --eval-samples must be >= 1, got {self.eval_prompts} and "
                             f"{self.eval_samples}")
        check_sampling(self, "grpo")
        if bool(self.rl.ptx_coef) != bool(self.ptx_data):
            raise ValueError("grpo: --ptx-coef and --ptx-data go together (PPO-ptx: the NLL of --ptx-data's rows, "
                             f"weighted by --ptx-coef); got --ptx-coef {self.rl.ptx_coef} and --ptx-data "
                             f"{self.ptx_data or 'none'}")
        if self.rl.opd_coef:
            raise ValueError(f"grpo: --opd-coef {self.rl.opd_coef} adds a teacher's log-ratio to the advantages, and "
                             "`trajtune grpo` loads no teacher model yet: leave --opd-coef 0 (from Python, give "
                             "train_rl a teacher engine: train_rl(..., teacher=...))")
        if self.difficulty_filter:
            low_high = self.difficulty_filter
            if len(low_high) != 2 or not 0.0 <= low_high[0] <= low_high[1] <= 1.0:
                raise ValueError(f"grpo: --difficulty-filter takes two solve rates LOW HIGH with 0 <= LOW <= HIGH <= 1 "
                                 f"(the book's 0.2 0.8), got {' '.join(map(str, low_high))}")
            if self.difficulty_samples < 1:
                raise ValueError(f"grpo: --difficulty-samples must be >= 1, got {self.difficulty_samples}")
            if not math.isfinite(self.difficulty_solved_at):
                raise ValueError(f"grpo: --difficulty-solved-at must be a finite number, got "
                                 f"{self.difficulty_solved_at}")

Config = GRPORun


def prepare(config: GRPORun, run_dir: Path) -> Prepared:
    prepared = prompt_data(config)
    check_grader_inputs(config, prepared.items)  # imports, columns, the reward model's files: before the model loads
    if config.agent.run:
        load_agent(config.agent.run)  # the agent imports and takes (task, base_url, session): before the model loads
    if config.ptx_data:
        ptx_trajectories(config, prepared)  # its rows parse and fit, before the model loads
    if config.gold_reward:  # the gold functions import and find their columns in the probe's prompts
        gold = unique_names([RewardFunction(spec=spec) for spec in config.gold_reward])
        check_columns(gold, prepared.items[: config.eval_prompts])
    return prepared


def train(ctx, c: GRPORun, data: Prepared, home: str = "") -> dict:
    """The stage: load the model (a value head for --advantage gae) behind ctx.engine, train_rl, save model/.
    `home`: where model/ and checkpoints/ go in the run directory ("" here; a pipeline of several
    methods would give each stage its own)."""
    policy, engine = load_engine(ctx, c.model, c.optim, value_head=c.rl.advantage == "gae", seed=c.rl.seed)
    announce(ctx, c, policy, len(data.items), "prompts")
    run = stage_run(ctx, policy, engine, data.tokenizer, c.output.save_every, home, config=c)
    with contextlib.ExitStack() as stack:
        if c.gold_reward:
            run.evaluate = overopt_probe(ctx, engine, data, c, stack)
            if not ctx.resuming:
                ctx.log(0, run.evaluate(0))  # the curve's starting point
        tasks = difficulty_filter(ctx, engine, data, c) if c.difficulty_filter else data.items
        source = stack.enter_context(prompt_source(ctx, engine, data, c, c.rl.steps))
        ptx = ptx_trajectories(c, data) if c.ptx_data else None
        history = train_rl(engine, tasks, source, c.rl, data.pad_id, run, ptx=ptx)
    return finish(ctx, engine, policy, data.tokenizer, history, home, start=c.model.path)


def ptx_trajectories(config: GRPORun, data: Prepared) -> list:
    """--ptx-data's rows rendered as SFT samples (every assistant turn trained), each within the length budget."""
    from ...sources import data as D

    def too_long(t):
        return f"{t.info['source']}: {len(t)} tokens" if len(t) > data.limit else None

    trajs = D.sft_trajectories(D.read_rows(config.ptx_data), data.renderer, "all")
    return fit(trajs, f"--max-length {data.limit} (--ptx-data)", config.model.drop_long, too_long, "ptx samples")


def here(c: GRPORun) -> GRPORun:
    """The run's config sampling on-policy, in the trainer (the built-in sampler for --backend vllm), neither
    recorded nor replayed: what the difficulty filter and the over-optimization probe sample with."""
    s = c.sampling
    if s.backend != "vllm" and not s.in_process and not s.record and not s.replay:
        return c
    backend = "sampler" if s.backend == "vllm" else s.backend
    return replace(c, sampling=s.in_trainer(backend=backend))


DIFFICULTY_STREAM = 7
"""the difficulty filter samples with seeds derived from (--seed, this): a stream of its own"""


def difficulty_filter(ctx, engine, data: Prepared, c: GRPORun) -> list:
    """The prompts of `data` the starting policy solves a share in [LOW, HIGH] of the time (module docstring):
    sampled with the run's own source (the built-in sampler under --backend vllm, not overlapped), scored by the run's
    rewards, `c.rl.tasks_per_step` prompts per draw. Prints, logs (step 0, not again on a resume) and writes
    grpo/difficulty.json; a filter that keeps no prompt fails the run."""
    import json

    from ...runs.stages import RunFailed
    from ...sources.difficulty import filter_by_difficulty

    low, high = c.difficulty_filter
    with prompt_source(ctx, engine, data, here(c), c.rl.steps) as source:
        kept, rates = filter_by_difficulty(source, data.items, c.difficulty_samples, low, high,
                                           seed=derive(c.rl.seed, DIFFICULTY_STREAM), solved_at=c.difficulty_solved_at,
                                           chunk=c.rl.tasks_per_step)
    n = len(data.items)
    said = (f"--difficulty-filter {low} {high}: kept {len(kept)} of {n} prompts (solve rate over "
            f"{c.difficulty_samples} completions, reward >= {c.difficulty_solved_at}); dropped {n - len(kept)}"
            + (f", {n - len(rates)} of them with no scored completion" if len(rates) < n else ""))
    metrics = {"difficulty/kept": float(len(kept)), "difficulty/dropped": float(n - len(kept)),
               "difficulty/unscored": float(n - len(rates)),
               "difficulty/mean_rate": sum(rates.values()) / len(rates) if rates else float("nan")}
    if ctx.logger is not None:  # rank 0
        where_of = {t.name: t.where or t.name for t in data.items}
        print(said, flush=True)
        ctx.dir.mkdir(parents=True, exist_ok=True)
        (ctx.dir / "difficulty.json").write_text(json.dumps(
            {"low": low, "high": high, "samples": c.difficulty_samples, "solved_at": c.difficulty_solved_at,
             **{k.split("/")[1]: v for k, v in metrics.items()}, "kept_prompts": [t.where or t.name for t in kept],
             "rates": {where_of[name]: r for name, r in rates.items()}}, indent=1) + "\n")
        if not ctx.resuming:
            ctx.log(0, metrics)
    if not kept:
        raise RunFailed(f"{said}: no prompt left to train on; widen the range, sample more (--difficulty-samples) "
                        "or start from a policy that solves some prompts sometimes")
    return kept


def overopt_probe(ctx, engine, data: Prepared, c: GRPORun, stack: contextlib.ExitStack) -> OverOptProbe:
    """The over-optimization probe (module docstring): the run's reward sources as the proxy, --gold-reward as gold,
    the starting policy as the reference (kept across a resume with the stage's checkpoint, as --kl-coef's). Its
    source and gold functions close with `stack`."""
    reference = ctx.checkpointer.reference(engine, 1 if ctx.resuming else 0)
    source = stack.enter_context(prompt_source(ctx, engine, data, here(c), c.rl.steps))
    gold = unique_names([RewardFunction(spec=spec, timeout=c.reward_timeout) for spec in c.gold_reward])
    for f in gold:
        stack.callback(f.close)
    return OverOptProbe(engine, reference, source, data.items[: c.eval_prompts], c.eval_samples, episode_rewards(),
                        graders_of(gold), data.pad_id, seed=derive(c.rl.seed, 14))


def dry_run(config: GRPORun, run_dir: Path) -> str:
    """Every check `run` makes before the model loads, nothing written (`--dry-run`, `trajtune run --dry-run`)."""
    return preflight(config, run_dir, prepare)


def run(config: GRPORun, run_dir: Path) -> Path:
    """Check, train, save model/ in the Hugging Face format; returns the report."""
    return run_method(config, run_dir, train, prepare)


# the experiment contract (`trajtune.experiments.base.Experiment`): what it offers beyond one run
run_over_seeds = None  # no report over seeds: `trajtune run --seeds` is refused
parse_options = None  # no options of its own
