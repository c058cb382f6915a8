"""A Hugging Face model in a multi-turn gym: RL (`train_rl`) on the BugFix gym or a TextArena game.

    trajtune run hf_gym --set config.model.path=DIR                                  BugFix, the built-in sampler
    trajtune run hf_gym --set config.model.path=DIR --set config.sampling.backend=vllm     each turn from vLLM
    trajtune run hf_gym --set config.model.path=DIR --set config.gym=textarena        GuessTheNumber-v0-raw

Every episode is a conversation in the model's own chat template (`trajtune.text.chat.ChatRenderer`): an
optional system message (`system_prompt`; by default BugFix's actions), the gym's first message
as the user turn, then policy turns (the assistant's text is the action) and the environment's answers as
`tool` messages, appended by the renderer as the episode goes (`trajtune.sources.rollout.rollout_batch`).
The POLICY tokens are the sampled ids, never re-tokenized.

Where the training episodes are sampled (`sampling.backend`):

    sampler    trajtune's KV-cached sampler on the trainer's weights (default; `sampling.max_staleness` may move it
               to a sampler process, one update behind with max_staleness 1)
    generate   Hugging Face `model.generate` on the trainer's weights
    vllm       vLLM, colocated (started by the run) or `sampling.vllm_server` URLs: each assistant turn is one
               request whose prompt is the transcript's token ids so far, so vLLM's prefix cache serves the
               earlier turns; its weights are synced and checked after every update (sync/logprob_diff,
               `trajtune.sources.vllm`); with sampling.max_staleness 1 the next step is sampled there while
               this one trains

The held-out evaluation always samples with the built-in sampler on the trainer's weights. One stage,
"rl"; the report (report.md) is the task recipes' (`task_rl.write_task_report`): held-out reward and
pass@1 before -> after, the curve. `rollout/turns` (policy turns per episode) is logged every step.
A randomly initialised model (`trajtune.models.hf_random`) almost never solves a task: a check of the
machinery, not of learning.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Sequence

from ..algorithms.rl import RLConfig
from ..config import ConfigError, check_choices, check_ranges
from ..engine import OptimConfig
from ..metrics import register
from ..runs.stages import Stage, StageOptions, run_stages
from ..sources.sampling import MOVED, SamplingConfig, check_sampling
from .hf.model import ModelConfig
from .task_rl import GUESS_BAD_MOVES, GUESS_MOVES, game_vocabulary, train_and_score, write_task_report

register("rollout/turns", "mean policy turns per sampled episode (hf_gym: the multi-turn episodes' length)")

BUGFIX_SYSTEM = ("You fix a bug in a Python function. Each reply is one action: read (show the source), "
                 "edit <op> with op one of swap_minmax fix_range_end fix_compare guard_zero fix_init, "
                 "or submit (run the tests; the episode ends).")
"""the system message BugFix episodes open with by default (the gym's actions, `trajtune.envs.bugfix`)"""


@dataclass
class Config:
    RENAMED: ClassVar[dict[str, str]] = MOVED
    """the sections the sampling section replaced (recipes: [config.vllm], [config.overlap])"""

    model: ModelConfig = field(default_factory=ModelConfig)
    """the Hugging Face model (model.path: a local directory, required) and how it trains; max_length is the
    episode's token budget (capped at the model's positions; the environment's longest answer is kept free after
    the last turn)"""
    gym: Literal["bugfix", "textarena"] = "bugfix"
    """the environment: the built-in BugFix gym (20 train / 10 held-out tasks) or a TextArena game"""
    env_id: str = "GuessTheNumber-v0-raw"
    """textarena: the game (a single-player "-raw" id)"""
    game_kwargs: dict[str, Any] = field(default_factory=dict)
    """textarena: options of the game's constructor"""
    action_template: str = "[{}]"
    """textarena: the policy's text -> the game's move"""
    n_train: int = 64
    """textarena: training games (seeds seed ..)"""
    n_eval: int = 8
    """textarena: held-out games (seeds from 10_000 + seed)"""
    system_prompt: str = ""
    """a system message opening every episode; empty: the gym's (BugFix: `BUGFIX_SYSTEM`, its actions; TextArena:
    none, the game's first message states the rules); "none": no system message"""
    reward: Literal["hidden", "public"] = "hidden"
    """bugfix: which tests pay the reward"""
    max_turns: int = 6
    """policy turns per episode (the environment may end it sooner)"""
    eval_samples: int = 2
    """episodes per held-out task at each evaluation"""
    seed: int = 0
    """game seeds and the model's seed"""
    rl: RLConfig = field(default_factory=lambda: RLConfig(steps=4, tasks_per_step=4, group_size=4, advantage="grpo"))
    """the RL loop's settings"""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    """optimizer settings"""
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_new_tokens=16))
    """how and where the policy's turns are sampled: backend (sampler, generate, vllm: colocated, or vllm_server
    URLs), temperature, top_k, top_p, max_new_tokens (the token budget of one turn), max_staleness 1 (the next step
    ahead, with rl.tis_cap > 0)"""
    runner: StageOptions = field(default_factory=lambda: StageOptions(workers=1))
    """the stage runner (one stage)"""

    def __post_init__(self) -> None:
        check_choices(self)
        check_sampling(self.sampling, "hf_gym", rl=self.rl)
        check_ranges(self, "hf_gym", counts=("n_train", "n_eval", "eval_samples", "max_turns"))
        if "{}" not in self.action_template:
            raise ValueError(f"hf_gym: action_template must contain '{{}}' (where the move goes), got "
                             f"{self.action_template!r}")


def check_model(config: Config) -> None:
    """model.path is given and is a model directory (a ConfigError, one line, before anything loads)."""
    from ..models.hf import ModelPathError, check_model_dir

    if not config.model.path:
        raise ConfigError("hf_gym: config.model.path is empty; give a local Hugging Face model directory: "
                          "trajtune run hf_gym --set config.model.path=DIR")
    try:  # a hub id / .gguf / catalog name -> its folder, once: what loads and what vLLM is given
        folder = check_model_dir(config.model.path)
    except ModelPathError as e:
        raise ConfigError(f"hf_gym: config.model.path: {e}") from None
    if folder != Path(config.model.path).expanduser():
        config.model.path = str(folder)


# --- the gym's pieces (picklable: a sampler process builds its environments from them) ----------
class Opening:
    """An environment whose first message comes after a system message (`system`; empty: none)."""

    def __init__(self, env: Any, system: str = ""):
        self.env, self.system = env, system
        self.task_attributes = getattr(env, "task_attributes", ())

    def reset(self, task):
        first = self.env.reset(task)
        if not self.system:
            return first
        return [{"role": "system", "content": self.system}, {"role": "user", "content": first}]

    def step(self, action: str):
        return self.env.step(action)


@dataclass(frozen=True)
class MakeEnv:
    """`make_env`: a fresh environment of the config's gym per episode."""

    gym: str
    system: str = ""
    reward: str = "hidden"
    action_template: str = "[{}]"
    game_kwargs: tuple = ()

    def __call__(self) -> Opening:
        if self.gym == "bugfix":
            from ..envs.bugfix import BugFixEnv

            return Opening(BugFixEnv(reward=self.reward), self.system)
        from ..envs.adapters.textarena import TextArenaEnv

        return Opening(TextArenaEnv(self.action_template, **dict(self.game_kwargs)), self.system)


def gym_tasks(config: Config) -> tuple[list, list, list[str]]:
    """(train tasks, held-out tasks, every text the environment may answer with: for the token budget)."""
    if config.gym == "bugfix":
        from ..envs.bugfix import bugfix_corpus, results_text
        from ..envs.bugfix_tasks import make_tasks

        train, held_out = make_tasks("train"), make_tasks("heldout")
        tasks = train + held_out
        texts = bugfix_corpus(tasks) + [results_text(t, ["forbidden"] * len(t.public)) for t in tasks]
        return train, held_out, texts
    from ..envs.adapters.textarena import textarena_tasks

    try:
        train = textarena_tasks(config.env_id, config.n_train, config.seed)
    except ValueError as e:  # an unknown game: the adapter names close ones
        raise ConfigError(f"hf_gym: config.env_id: {e}") from None
    held_out = textarena_tasks(config.env_id, config.n_eval, 10_000 + config.seed)
    return train, held_out, game_vocabulary(train + held_out, config.action_template, dict(config.game_kwargs),
                                            GUESS_MOVES, GUESS_BAD_MOVES, config.seed)


def token_budget(config: Config, renderer, texts: Sequence[str]) -> int:
    """An episode's max_tokens: model.max_length within the model's positions, less room for the environment's
    longest answer after the last turn (so a whole episode fits the trainer's and vLLM's context)."""
    from .hf.prepare import budget

    limit, _ = budget(config.model)  # --max-length within the model's context
    tok = renderer.tokenizer
    longest = max((len(ids) for ids in tok(list(texts), add_special_tokens=False)["input_ids"]), default=0)
    wrapper = len(tok(renderer.text([{"role": "user", "content": "x"}, {"role": "tool", "content": ""}]),
                      add_special_tokens=False)["input_ids"])
    return limit - longest - wrapper - 2  # + the template's tail of an unfinished turn


@dataclass
class _Tokenizer:
    """The HF tokenizer as `train_and_score` reads it: pad_id, and save_pretrained for the checkpoint."""

    tokenizer: Any
    pad_id: int

    def save_pretrained(self, path) -> None:
        self.tokenizer.save_pretrained(path)


def policy_turns(trajs) -> dict[str, float]:
    return {"rollout/turns": sum(t.info.get("n_turns", 0) for t in trajs) / max(1, len(trajs))}


def stage_rl(ctx) -> dict:
    from ..models import hf
    from ..text.chat import ChatRenderer
    from .hf.recipe import user_errors
    from .hf.model import load_engine
    from .hf.prepare import budget

    config = ctx.config
    s = config.sampling
    with user_errors():
        renderer = ChatRenderer(hf.load_tokenizer(config.model.path))
        policy, engine = load_engine(ctx, config.model, config.optim, seed=config.seed)
    train, held_out, texts = gym_tasks(config)
    max_tokens = token_budget(config, renderer, texts)
    system = config.system_prompt or (BUGFIX_SYSTEM if config.gym == "bugfix" else "")
    make_env = MakeEnv(config.gym, "" if system == "none" else system, config.reward, config.action_template,
                       tuple(sorted(config.game_kwargs.items())))
    where = f"{config.env_id}" if config.gym == "textarena" else "BugFix"
    return train_and_score(ctx, policy, _Tokenizer(renderer.tokenizer, renderer.pad_id), make_env, renderer, "hf_gym",
                           train, held_out, f"hf_gym {where} ({Path(config.model.path).name}, {s.backend})",
                           max_turns=config.max_turns, max_tokens=max_tokens, engine=engine, measure=policy_turns,
                           pad_id=renderer.pad_id, model_dir=config.model.path, precision=config.model.precision,
                           max_model_len=budget(config.model)[0])


def dry_run(config: Config, run_dir: Path) -> str:
    """The checks before the model loads: the model directory (`trajtune run hf_gym --dry-run`)."""
    check_model(config)
    return (f"dry run: {config.model.path} is a model directory; {config.rl.steps} RL steps on {config.gym} with "
            f"the {config.sampling.backend} sampler would run in {run_dir} (nothing trained)")


def run(config: Config, run_dir: Path) -> Path:
    check_model(config)
    run_dir = Path(run_dir)
    result = run_stages([Stage("rl", stage_rl)], config, run_dir, config.runner)["rl"]
    where = f"TextArena {config.env_id}" if config.gym == "textarena" else "the BugFix gym"
    return write_task_report(run_dir, f"hf_gym: {config.rl.advantage} on {where}, {Path(config.model.path).name}, "
                             f"{config.sampling.backend} sampler",
                             f"Held-out mean reward ({config.eval_samples} episodes per held-out task)",
                             "solved" if config.gym == "bugfix" else "won", result)


# the experiment contract (`trajtune.experiments.base.Experiment`): what it offers beyond one run
run_over_seeds = None  # no report over seeds: `trajtune run --seeds` is refused
parse_options = None  # no options of its own
