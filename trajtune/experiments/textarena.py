"""TextArena on the built-in tiny model: GRPO on a multi-turn game, held-out reward before -> after.

The game is TextArena's own (trajtune.envs.adapters.textarena): by default `GuessTheNumber-v0-raw`, a
number between 1 and 20 in 10 guesses, where the game answers every guess with "The target number
is higher." / "lower." (the TOOL turns). The policy writes the number, the adapter sends "[n]"
(`action_template`). Reward is the game's: 1 for finding the number, otherwise how close the last
guess was; an invalid move (not a number in range, or a repeated guess) is the game's business (a
warning, then the end of the game). A randomly initialised word-level TinyTransformer starts near
chance; GRPO raises its held-out mean reward within a few CPU minutes.

The word vocabulary is built from the games' own messages, gathered by playing every training and
held-out game once with a scripted random player (valid and invalid moves, so every message the
game can send is seen). One stage, "rl"; needs `pip install 'trajtune[textarena]'`.

Measured (seed 0, `trajtune run textarena`, 64 s of CPU; 306 s wall on a 2-core machine shared with other
jobs): held-out mean reward 0.007 -> 0.379 in 60 steps (0.062 at step 20, 0.228 at 40), games won 0.000 -> 0.016.
It first learns to answer with a number (an invalid move twice in a row ends the game at reward 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from ..algorithms.rl import RLConfig
from ..sources.sampling import MOVED, SamplingConfig, check_sampling
from ..config import ConfigError, check_ranges
from ..engine import OptimConfig
from ..models.tiny import TinyConfig, TinyTransformer
from ..runs.stages import Stage, StageOptions, run_stages
from ..text.render import Renderer
from ..text.tokenizers import WordTokenizer
from .task_rl import GUESS_BAD_MOVES, GUESS_MOVES, game_vocabulary, train_and_score, write_task_report


@dataclass
class Config:
    RENAMED: ClassVar[dict[str, str]] = {"overlap": MOVED["overlap"], "max_action_tokens": "sampling.max_new_tokens"}
    """keys that moved (the one sampling section)"""

    env_id: str = "GuessTheNumber-v0-raw"
    """the TextArena game (a single-player "-raw" id)"""
    game_kwargs: dict[str, Any] = field(default_factory=dict)
    """options of the game's constructor (e.g. {max_turns = 6} for GuessTheNumber)"""
    action_template: str = "[{}]"
    """the policy's text -> the game's move"""
    moves: list[str] = field(default_factory=lambda: list(GUESS_MOVES))
    """the valid moves the scripted player tries while the vocabulary is gathered"""
    bad_moves: list[str] = field(default_factory=lambda: list(GUESS_BAD_MOVES))
    """invalid moves it tries too (a malformed one, one out of range), each followed by a valid one and a repeat"""
    n_train: int = 256
    """training games (seeds seed .. seed + n_train - 1)"""
    n_eval: int = 32
    """held-out games (seeds from 10_000 + seed)"""
    eval_samples: int = 4
    """episodes per held-out game"""
    max_turns: int = 10
    """policy turns per episode (the game may end sooner)"""
    seed: int = 0
    """model init, game seeds and sampling"""
    dim: int = 64
    """model width"""
    n_layers: int = 2
    """transformer blocks"""
    n_heads: int = 4
    """attention heads"""
    rl: RLConfig = field(default_factory=lambda: RLConfig(steps=60, tasks_per_step=8, group_size=8,
                                                          advantage="grpo", eval_every=20))
    """the RL loop's settings"""
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_new_tokens=2, draw="race",
                                                                            share_prompts=False))
    """how and where the RL loop samples: max_new_tokens, the tokens per move (a number and the end token);
    max_staleness 1: the next step in a sampler process while this one trains, with rl.tis_cap > 0"""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=2e-3))
    """optimizer settings"""
    runner: StageOptions = field(default_factory=lambda: StageOptions(workers=1))
    """the stage runner (one stage)"""

    def __post_init__(self) -> None:
        check_sampling(self.sampling, "textarena", rl=self.rl, backends=("sampler",))
        check_ranges(self, "textarena", counts=("n_train", "n_eval", "eval_samples", "max_turns", "dim", "n_layers",
                                                "n_heads"))
        if self.dim % self.n_heads:
            raise ValueError(f"textarena: dim={self.dim} is not divisible by n_heads={self.n_heads}")
        if not self.moves:
            raise ValueError("textarena: moves must list at least one move")


def stage_rl(ctx) -> dict:
    from ..envs.adapters.textarena import TextArenaEnv, textarena_tasks

    config = ctx.config
    torch.manual_seed(config.seed)
    try:
        train = textarena_tasks(config.env_id, config.n_train, config.seed)
    except ValueError as e:  # an unknown game: the adapter names close ones
        raise ConfigError(f"textarena: config.env_id: {e}") from None
    held_out = textarena_tasks(config.env_id, config.n_eval, 10_000 + config.seed)
    texts = game_vocabulary(train + held_out, config.action_template, config.game_kwargs, config.moves,
                            config.bad_moves, config.seed)
    tok = WordTokenizer.from_corpus(texts)
    renderer = Renderer(tok)
    opening = max(len(renderer.generation_prompt([{"role": "user", "content": TextArenaEnv(
        config.action_template, **config.game_kwargs).reset(t)}])) for t in train[:8])
    # a turn: the move, the longest message the game sends back, and the turn wrappers (<|end|>, headers)
    turn = config.sampling.max_new_tokens + max(len(tok.encode(t)) for t in texts) + 4
    max_tokens = opening + config.max_turns * turn
    model = TinyTransformer(TinyConfig(tok.vocab_size, config.dim, config.n_layers, config.n_heads,
                                       max_len=max_tokens + turn))  # + the observation after the last move

    def make_env():
        return TextArenaEnv(config.action_template, **config.game_kwargs)

    return train_and_score(
        ctx, model, tok, make_env, renderer, "textarena", train, held_out,
        f"textarena {config.env_id} ({tok.vocab_size} words)", max_turns=config.max_turns, max_tokens=max_tokens,
        episode_seeds=False, sharded=False)


def run(config: Config, run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    result = run_stages([Stage("rl", stage_rl)], config, run_dir, config.runner)["rl"]
    return write_task_report(run_dir, f"TextArena: GRPO on {config.env_id}",
                             f"Held-out mean reward (the game's, {config.eval_samples} episodes per held-out game)",
                             "won", result)


# the experiment contract (`trajtune.experiments.base.Experiment`): what it offers beyond one run
run_over_seeds = None  # no report over seeds: `trajtune run --seeds` is refused
dry_run = None  # `trajtune run --dry-run`: the run directory's checks alone
parse_options = None  # no options of its own
