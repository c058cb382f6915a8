"""TextArena games (https://github.com/LeonGuertler/TextArena, MIT) as trajtune multi-turn episodes.

One game is one episode: `reset(task)` starts game `task.env_id` with seed `task.seed` and returns
the player's first observation (the rules and the board: the user message); every policy action
goes to `game.step`, and what the game says back before the player's next turn is the TOOL message.
When the game ends, the episode's reward is the player's reward from `game.close()` (GuessTheNumber:
1 for the number, else how close the last guess was; an invalid move past the game's error
allowance ends it with the game's penalty).

    from trajtune.envs.adapters.textarena import TextArenaEnv, textarena_tasks
    tasks = textarena_tasks("GuessTheNumber-v0-raw", n=256, seed=0)
    make_env = lambda: TextArenaEnv(action_template="[{}]")   # the policy writes "7", the game reads "[7]"
    source = EpisodeSource(Decoder(engine.sample, settings), make_env, renderer,
                           max_turns=10)   # trajtune.sources.episodes

Use the "-raw" game ids: they give the game's own messages, one turn at a time (the other ids wrap
them for chat LLMs, repeating the whole history every turn, which the trajectory already holds).
Two-player games take an `opponent`: a Python function from its observation text to its action
(a scripted player), called whenever it is the opponent's turn. Installing: `pip install
trajtune[textarena]` (textarena 0.7 and a few small pure-Python packages, about 25 MB).

info: task, actions, n_invalid (invalid moves the game reported), turns (the game's turn count),
reason (why the game ended) and reward_note when the game's reward is not a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from ..base import StepResult
from . import require

INSTALL = "pip install 'trajtune[textarena]' (or: pip install textarena)"


@dataclass(frozen=True)
class TextArenaTask:
    """One game: a TextArena environment id and the seed of its deal."""

    env_id: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.env_id}/{self.seed}"


def textarena_tasks(env_id: str, n: int, seed: int = 0) -> list[TextArenaTask]:
    """`n` games of `env_id` with seeds seed, seed + 1, ... (an unknown id is a ValueError naming close ones)."""
    ta = require("textarena", INSTALL)
    from textarena.envs.registration import ENV_REGISTRY

    if env_id not in ENV_REGISTRY:
        import difflib

        close = difflib.get_close_matches(env_id, list(ENV_REGISTRY), n=3)
        raise ValueError(f"textarena {ta.__name__} has no game {env_id!r}"
                         + (f"; did you mean {close}?" if close else ""))
    if n < 1:
        raise ValueError(f"textarena_tasks: n must be >= 1, got {n}")
    return [TextArenaTask(env_id, seed + i) for i in range(n)]


class TextArenaEnv:
    """A TextArena game as a trajtune `Env` (one instance per concurrent episode).

    action_template: how the policy's text becomes the game's move ("{}": as written; "[{}]": the
                     policy writes only what goes inside the brackets the games parse)
    player:          which seat the policy plays (0: it moves first)
    opponent:        for games of two or more players: `opponent(observation_text) -> action`, playing
                     every other seat
    num_players:     players of the game (1 for single-player games)
    """

    def __init__(self, action_template: str = "{}", *, player: int = 0, num_players: int = 1,
                 opponent: Callable[[str], str] | None = None, **game_kwargs: Any):
        if "{}" not in action_template:
            raise ValueError(f"TextArenaEnv: action_template must contain '{{}}' (where the action goes), "
                             f"got {action_template!r}")
        if num_players > 1 and opponent is None:
            raise ValueError(f"TextArenaEnv: a {num_players}-player game needs an opponent (observation -> action)")
        if not 0 <= player < num_players:
            raise ValueError(f"TextArenaEnv: player must be in [0, {num_players}), got {player}")
        self.action_template, self.player, self.num_players = action_template, player, num_players
        self.opponent, self.game_kwargs = opponent, game_kwargs
        self.game: Any = None
        self.task: TextArenaTask | None = None
        self.done = True
        self.info: dict[str, Any] = {}

    def reset(self, task: TextArenaTask) -> str:
        ta = require("textarena", INSTALL)
        self.task, self.done = task, False
        self.game = ta.make(task.env_id, **self.game_kwargs)
        self.game.reset(num_players=self.num_players, seed=task.seed)
        self.info = {"task": task.name, "actions": [], "n_invalid": 0}
        if self._opponents_move():
            raise RuntimeError(f"textarena game {task.name} ended before player {self.player} moved")
        return self._observe()

    def step(self, action: str) -> StepResult:
        if self.done:
            raise RuntimeError("TextArenaEnv.step called after the game ended; call reset(task) first")
        self.info["actions"].append(action)
        done, _ = self.game.step(self.action_template.format(action.strip()))
        done = done or self._opponents_move()
        if done:
            return self._finish()
        return StepResult(self._observe(), 0.0, False, dict(self.info))

    # --- the game's side
    def _opponents_move(self) -> bool:
        """Let the other seats play until it is the policy's turn; True if the game ended meanwhile."""
        while self.game.state.current_player_id != self.player:
            _, observation = self.game.get_observation()
            done, _ = self.game.step(self.opponent(_text(observation, self.game.state.current_player_id)))
            if done:
                return True
        return False

    def _observe(self) -> str:
        """What the game told the policy's seat since its last move (its own echoed move left out)."""
        player, observation = self.game.get_observation()
        text = _text(observation, player)
        self.info["n_invalid"] += sum("invalid move" in m.lower() for _, m, kind in observation
                                      if getattr(kind, "name", "") == "GAME_ADMIN")
        return text or "(no message)"

    def _finish(self) -> StepResult:
        self.done = True
        rewards, game_info = self.game.close()
        mine = (game_info or {}).get(self.player, {})
        raw = (rewards or {}).get(self.player, 0.0)
        info = {**self.info, "turns": mine.get("turn_count", len(self.info["actions"])), "reason": mine.get("reason",
                                                                                                            "")}
        if mine.get("invalid_move"):
            info["n_invalid"] += 1
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
            info["reward_note"] = f"the game's reward was {raw!r}, not a number: scored 0"
            raw = 0.0
        return StepResult("", float(raw), True, info)


def _text(observation: Any, player: int) -> str:
    """A TextArena observation (a list of (sender, message, kind), or a string) -> one text, without
    the player's own moves (they are already in the trajectory as its actions)."""
    if isinstance(observation, str):
        return observation
    return "\n".join(str(m) for sender, m, *_ in observation if sender != player)
